#include "server/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "core/check.h"
#include "server/api_error.h"
#include "server/body_encoding.h"

namespace r3::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

// How long the answers that a shutdown's aborts produce have to reach their clients before every
// connection is closed.
constexpr std::chrono::milliseconds kLastWordsGrace{1500};

// A request the parser could not read as HTTP (answered 400), as opposed to a client that left
// or ran out of time (answered nothing).
bool malformed(const beast::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::bad_target).category() &&
         ec != http::error::end_of_stream && ec != http::error::partial_message;
}

}  // namespace

// Named, not anonymous: HttpServer::Impl, which has external linkage, holds them.
namespace http_parts {

// Wakes a connection waiting for its engine call, from any thread, for as long as the server
// lives (the engine thread may report on a request after its connection has gone).
class Waker {
 public:
  explicit Waker(asio::io_context& io) : io_(&io) {}
  void wake(const std::weak_ptr<asio::steady_timer>& timer) {
    std::lock_guard lock(mutex_);
    if (io_ == nullptr) return;
    asio::post(*io_, [timer] {
      if (auto t = timer.lock()) t->cancel();
    });
  }
  void detach() {
    std::lock_guard lock(mutex_);
    io_ = nullptr;
  }

 private:
  std::mutex mutex_;
  asio::io_context* io_;
};

struct Connection {
  explicit Connection(tcp::socket socket) : stream(std::move(socket)) {}
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  // Between a request's complete headers and its answer's last byte: a shutdown lets it finish.
  bool in_request = false;
  void close() {
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.socket().close(ignored);
  }
};

}  // namespace http_parts

using http_parts::Connection;
using http_parts::Waker;

struct HttpServer::Impl {
  EngineLoop& loop;
  ServerOptions options;
  ApiRoutes routes;
  asio::io_context io{1};
  asio::thread_pool workers;
  tcp::acceptor acceptor{io};
  std::shared_ptr<Waker> waker = std::make_shared<Waker>(io);
  std::set<std::shared_ptr<Connection>> connections;  // event-loop thread only
  std::atomic<bool> accepting{false}, draining{false};
  std::mutex serving_mutex;
  std::condition_variable serving_ended_cv;
  bool serving = false, serving_ended = false;

  Impl(EngineLoop& l, const models::ModelInfo& info, ServerOptions o)
      : loop(l),
        options(std::move(o)),
        routes(l, info, RouteOptions{options.model_name, options.api_key, options.limits}),
        workers(static_cast<std::size_t>(options.worker_threads > 0
                                             ? options.worker_threads
                                             : std::max<int64_t>(2, std::thread::hardware_concurrency() / 2))) {}

  ~Impl() {
    waker->detach();
    workers.join();
  }

  // `work` on a worker thread; the coroutine resumes on the event loop with its result (or its
  // exception).
  // (Callers pass a named lambda: GCC 12 destroys a temporary with captures inside a co_await
  // expression twice.)
  template <class Work>
  auto on_workers(const Work& work) {
    using Result = std::invoke_result_t<Work>;
    return asio::co_spawn(
        workers, [work]() mutable -> asio::awaitable<Result> { co_return work(); }, asio::use_awaitable);
  }

  asio::awaitable<void> accept_connections() {
    while (acceptor.is_open()) {
      auto [ec, socket] = co_await acceptor.async_accept(kTuple);
      if (ec) {
        if (!acceptor.is_open() || ec == asio::error::operation_aborted) break;
        // Out of descriptors, or a connection reset before it was taken: wait a little, go on.
        spdlog::warn("serve: accept failed: {}", ec.message());
        asio::steady_timer pause(io, std::chrono::milliseconds(50));
        co_await pause.async_wait(kTuple);
        continue;
      }
      auto c = std::make_shared<Connection>(std::move(socket));
      connections.insert(c);
      asio::co_spawn(io, serve_connection(*c), [this, c](std::exception_ptr failed) {
        connections.erase(c);
        c->close();
        if (!failed) return;
        try {
          std::rethrow_exception(failed);
        } catch (const std::exception& e) {
          spdlog::error("serve: a connection failed: {}", e.what());
        }
      });
    }
    accepting = false;
  }

  asio::awaitable<bool> write_answer(Connection& c, HttpAnswer& answer, unsigned version, bool keep_alive) {
    http::response<http::string_body> res{static_cast<http::status>(answer.status), version};
    res.set(http::field::content_type, answer.content_type);
    for (const auto& [name, value] : answer.headers) res.set(name, value);
    res.body() = std::move(answer.body);
    res.keep_alive(keep_alive);
    res.prepare_payload();
    c.stream.expires_after(std::chrono::seconds(options.write_timeout_seconds));
    auto [ec, n] = co_await http::async_write(c.stream, res, kTuple);
    co_return !ec;
  }

  // Waits until `call` has something to take (woken through the waker).
  asio::awaitable<void> wait_for(const EngineCall& call, const std::shared_ptr<asio::steady_timer>& timer) {
    while (!call.ready()) {
      timer->expires_at(asio::steady_timer::time_point::max());
      co_await timer->async_wait(kTuple);
    }
  }

  // An engine endpoint: decode, parse and submit on a worker, then the answer (or the stream) as the
  // engine produces it. Returns whether the connection may serve another request.
  asio::awaitable<bool> serve_engine_call(Connection& c, HttpRequest& request, unsigned version, bool keep_alive) {
    auto timer = std::make_shared<asio::steady_timer>(io);
    const std::weak_ptr<asio::steady_timer> weak_timer = timer;
    std::shared_ptr<Waker> w = waker;
    const auto start = [this, &request, w, weak_timer]() -> std::pair<std::shared_ptr<EngineCall>, std::optional<HttpAnswer>> {
      try {
        request.body = decode_body(std::move(request.body), request.content_encoding, options.max_body_bytes);
        return {routes.start(request, [w, weak_timer] { w->wake(weak_timer); }), std::nullopt};
      } catch (const ApiError& e) {
        return {nullptr, error_answer(e.status(), e.what(), e.param())};
      } catch (const std::exception& e) {
        spdlog::error("serve: {}", e.what());
        return {nullptr, error_answer(500, e.what())};
      }
    };
    auto started = co_await on_workers(start);
    request.body.clear();
    request.body.shrink_to_fit();
    if (!started.first) {
      const bool written = co_await write_answer(c, *started.second, version, keep_alive);
      co_return written && keep_alive;
    }
    const std::shared_ptr<EngineCall> call = std::move(started.first);
    co_await wait_for(*call, timer);
    if (std::optional<HttpAnswer> refused = call->refusal()) {
      const bool written = co_await write_answer(c, *refused, version, keep_alive && !draining);
      co_return written && keep_alive;
    }
    if (!call->streamed()) {
      const auto format = [call] { return call->answer(); };
      HttpAnswer answer = co_await on_workers(format);
      const bool written = co_await write_answer(c, answer, version, keep_alive && !draining);
      co_return written && keep_alive;
    }
    // Server-sent events, chunked: each batch of events is one chunk, written within the write
    // deadline, or the client is dropped and its requests end.
    http::response<http::empty_body> head{http::status::ok, version};
    head.set(http::field::content_type, "text/event-stream");
    head.set(http::field::cache_control, "no-cache");
    head.keep_alive(keep_alive && !draining);
    head.chunked(true);
    http::response_serializer<http::empty_body> serializer{head};
    c.stream.expires_after(std::chrono::seconds(options.write_timeout_seconds));
    auto [head_ec, head_n] = co_await http::async_write_header(c.stream, serializer, kTuple);
    if (head_ec) {
      call->abandon("the client went away");
      co_return false;
    }
    const auto take_events = [call] {
      bool ended = false;
      std::string events = call->take_events(ended);
      return std::pair{std::move(events), ended};
    };
    for (;;) {
      const std::pair<std::string, bool> taken = co_await on_workers(take_events);
      beast::error_code ec;
      c.stream.expires_after(std::chrono::seconds(options.write_timeout_seconds));
      if (!taken.first.empty()) {
        const auto chunk = http::make_chunk(asio::buffer(taken.first));
        std::tie(ec, std::ignore) = co_await asio::async_write(c.stream, chunk, kTuple);
      }
      if (!ec && taken.second) {
        const auto last = http::make_chunk_last();
        std::tie(ec, std::ignore) = co_await asio::async_write(c.stream, last, kTuple);
        if (!ec) co_return keep_alive && !draining;
      }
      if (ec) {
        call->abandon(ec == beast::error::timeout ? "the client stopped reading" : "the client went away");
        co_return false;
      }
      co_await wait_for(*call, timer);
    }
  }

  // c: kept alive by the handler of the coroutine's end.
  asio::awaitable<void> serve_connection(Connection& connection) {
    Connection* const c = &connection;
    for (;;) {
      c->in_request = false;
      if (draining) co_return;
      http::request_parser<http::string_body> parser;
      parser.header_limit(static_cast<std::uint32_t>(std::min<int64_t>(options.max_header_bytes, UINT32_MAX)));
      parser.body_limit(static_cast<std::uint64_t>(options.max_body_bytes));
      // One deadline for the request's headers and body together.
      c->stream.expires_after(std::chrono::seconds(options.read_timeout_seconds));
      auto [head_ec, head_n] = co_await http::async_read_header(c->stream, c->buffer, parser, kTuple);
      if (head_ec == http::error::header_limit) {
        HttpAnswer refusal = error_answer(431, "the request's headers are larger than the server accepts (" +
                                                        std::to_string(options.max_header_bytes) + " bytes)");
        co_await write_answer(*c, refusal, 11, false);
        co_return;
      }
      if (head_ec == http::error::body_limit) {
        HttpAnswer refusal = error_answer(413, "the request body is larger than the server accepts (" +
                                                        std::to_string(options.max_body_bytes) + " bytes)");
        co_await write_answer(*c, refusal, 11, false);
        co_return;
      }
      if (head_ec) {
        // A parse error gets a 400; a client that left, or that sent too slowly, nothing.
        if (malformed(head_ec)) {
          HttpAnswer refusal = error_answer(400, "malformed HTTP request: " + head_ec.message());
          co_await write_answer(*c, refusal, 11, false);
        }
        co_return;
      }
      c->in_request = true;
      const auto& head = parser.get();
      const unsigned version = head.version();
      const int64_t fields = std::distance(head.begin(), head.end());
      if (fields > options.max_header_fields) {
        HttpAnswer refusal = error_answer(431, "the request has " + std::to_string(fields) +
                                                        " header fields; the server accepts " +
                                                        std::to_string(options.max_header_fields));
        co_await write_answer(*c, refusal, version, false);
        co_return;
      }
      HttpRequest request;
      request.method = std::string(head.method_string());
      const std::string_view target = head.target();
      request.path = std::string(target.substr(0, target.find('?')));
      request.authorization = std::string(head[http::field::authorization]);
      bool keep_alive = head.keep_alive() && !draining;
      // Refusals that need no body are answered before it is read (and the connection closed
      // when a body was coming, rather than read for nothing).
      if (std::optional<HttpAnswer> at_once = routes.answer_at_once(request)) {
        const bool body_pending = !parser.is_done();
        const bool written = co_await write_answer(*c, *at_once, version, keep_alive && !body_pending);
        if (!written || body_pending || !keep_alive) co_return;
        continue;
      }
      if (beast::iequals(head[http::field::expect], "100-continue")) {
        http::response<http::empty_body> go_on{http::status::continue_, version};
        auto [ec, n] = co_await http::async_write(c->stream, go_on, kTuple);
        if (ec) co_return;
      }
      auto [body_ec, body_n] = co_await http::async_read(c->stream, c->buffer, parser, kTuple);
      if (body_ec == http::error::body_limit) {
        HttpAnswer refusal = error_answer(413, "the request body is larger than the server accepts (" +
                                                        std::to_string(options.max_body_bytes) + " bytes)");
        co_await write_answer(*c, refusal, version, false);
        co_return;
      }
      if (body_ec) {
        if (malformed(body_ec)) {
          HttpAnswer refusal = error_answer(400, "malformed HTTP request: " + body_ec.message());
          co_await write_answer(*c, refusal, version, false);
        }
        co_return;
      }
      http::request<http::string_body> message = parser.release();
      request.body = std::move(message.body());
      request.content_encoding = std::string(message[http::field::content_encoding]);
      if (!co_await serve_engine_call(*c, request, version, keep_alive)) co_return;
    }
  }

  // Event-loop thread: no new connections; those between requests closed.
  void begin_draining() {
    draining = true;
    beast::error_code ignored;
    acceptor.close(ignored);
    for (const auto& c : connections) {
      if (!c->in_request) c->close();
    }
  }

  void close_everything() {
    beast::error_code ignored;
    acceptor.close(ignored);
    for (const auto& c : connections) c->close();
  }
};

int64_t raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return static_cast<int64_t>(limit.rlim_cur);
}

HttpServer::HttpServer(EngineLoop& loop, const models::ModelInfo& info, ServerOptions options)
    : impl_(std::make_unique<Impl>(loop, info, std::move(options))) {}

HttpServer::~HttpServer() {
  stop();
  std::unique_lock lock(impl_->serving_mutex);
  impl_->serving_ended_cv.wait(lock, [this] { return !impl_->serving || impl_->serving_ended; });
}

int HttpServer::bind(const std::string& host, int port) {
  beast::error_code ec;
  const asio::ip::address address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  R3_CHECK(!ec, "serve: ", host, " is not an IP address (", ec.message(), ")");
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  tcp::acceptor& acceptor = impl_->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  // A rollout step's requests come all at once: the system's largest backlog.
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  R3_CHECK(!ec, "serve: cannot listen on ", host, ":", port, " (", ec.message(), ")");
  impl_->accepting = true;
  return acceptor.local_endpoint().port();
}

void HttpServer::serve() {
  {
    std::lock_guard lock(impl_->serving_mutex);
    R3_CHECK(!impl_->serving, "serve: already serving");
    impl_->serving = true;
  }
  if (impl_->acceptor.is_open()) {
    asio::co_spawn(impl_->io, impl_->accept_connections(), asio::detached);
    impl_->io.run();
  }
  std::lock_guard lock(impl_->serving_mutex);
  impl_->serving_ended = true;
  impl_->serving_ended_cv.notify_all();
}

bool HttpServer::running() const { return impl_->accepting && !impl_->draining; }

void HttpServer::stop() {
  impl_->accepting = false;
  asio::post(impl_->io, [impl = impl_.get()] {
    impl->close_everything();
    impl->io.stop();
  });
}

void HttpServer::shutdown(std::chrono::milliseconds grace) {
  Impl& s = *impl_;
  asio::post(s.io, [&s] { s.begin_draining(); });
  const auto ended = [&s] { return !s.serving || s.serving_ended; };
  std::unique_lock lock(s.serving_mutex);
  if (s.serving_ended_cv.wait_for(lock, grace, ended)) return;
  lock.unlock();
  spdlog::warn("serve: requests still running after the shutdown grace of {} s; ending them",
               std::chrono::duration<double>(grace).count());
  s.loop.abort_every_request("the server is shutting down");
  lock.lock();
  if (s.serving_ended_cv.wait_for(lock, kLastWordsGrace, ended)) return;
  lock.unlock();
  stop();
  lock.lock();
  s.serving_ended_cv.wait(lock, ended);
}

}  // namespace r3::server
