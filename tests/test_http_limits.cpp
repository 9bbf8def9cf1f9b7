// The HTTP layer against clients that would hold a thread-per-connection server: slow headers,
// idle kept-alive connections, bodies that grow past the limit while they are read (chunked,
// compressed), a burst beyond the engine's queue, and a shutdown with such clients connected.
#include <gtest/gtest.h>
#include <zlib.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "served_model.h"
#include "test_support.h"

namespace r3::test {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// One GET /health on a new connection: its answer's status line, and how long it took.
std::pair<std::string, double> timed_health(int port) {
  const Clock::time_point start = Clock::now();
  RawConnection c(port);
  c.send_all("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string answer = c.read_to_end(30);
  return {answer.substr(0, answer.find("\r\n")), seconds_since(start)};
}

// The median of five /health round trips (each must answer 200).
double median_health_seconds(int port) {
  std::vector<double> times;
  for (int i = 0; i < 5; ++i) {
    const auto [status, took] = timed_health(port);
    EXPECT_EQ(status, "HTTP/1.1 200 OK");
    times.push_back(took);
  }
  std::sort(times.begin(), times.end());
  return times[2];
}

// Clients that opened a request and send its headers a line at a time, never finishing, and
// clients that finished a request and keep their connection open.
struct HeldConnections {
  std::vector<std::unique_ptr<RawConnection>> slow, idle;
  HeldConnections(int port, int slow_count, int idle_count) {
    for (int i = 0; i < slow_count; ++i) {
      slow.push_back(std::make_unique<RawConnection>(port));
      slow.back()->send_all("POST /generate HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n");
    }
    for (int i = 0; i < idle_count; ++i) {
      idle.push_back(std::make_unique<RawConnection>(port));
      idle.back()->send_all("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    for (auto& c : idle) c->read_until("\"ok\"}", 30);
  }
  // Another header line from every slow client.
  void trickle() {
    for (auto& c : slow) c->send_all("X-More: 1\r\n");
  }
  int connected() const {
    int n = 0;
    for (const auto& c : slow) n += c->connected();
    for (const auto& c : idle) n += c->connected();
    return n;
  }
};

TEST(HttpLimits, SlowAndIdleClientsDelayNeitherHealthNorACompletion) {
  ASSERT_GE(server::raise_open_file_limit(), 4200) << "the test needs 4,000 descriptors";
  Served s;
  HeldConnections held(s.port(), 1000, 1000);
  ASSERT_EQ(held.connected(), 2000);
  held.trickle();
  EXPECT_LT(median_health_seconds(s.port()), 0.1);
  auto c = s.client();
  const Clock::time_point start = Clock::now();
  const json r = post(c, "/generate", R"({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}})", 200);
  EXPECT_EQ(r.at("output_ids").size(), 4u);
  EXPECT_LT(seconds_since(start), 5.0);
  held.trickle();
  EXPECT_LT(median_health_seconds(s.port()), 0.1);
}

// A request's headers and body have one deadline between them: trickling lines does not extend it.
TEST(HttpLimits, AClientTricklingHeadersIsDroppedAtTheRequestDeadline) {
  server::ServerOptions options;
  options.read_timeout_seconds = 2;
  Served s(options);
  RawConnection slow(s.port());
  slow.send_all("POST /generate HTTP/1.1\r\nHost: x\r\n");
  const Clock::time_point start = Clock::now();
  while (!slow.peer_closed() && seconds_since(start) < 10) {
    slow.send_all("X-More: 1\r\n");
    slow.read_until("never comes", 0.3);
  }
  const double took = seconds_since(start);
  EXPECT_GE(took, 1.5);
  EXPECT_LT(took, 5.0) << "the connection was still open after " << took << " s";
}

std::string chunked_post(const std::string& path, const std::string& body, std::size_t chunk) {
  std::string out = "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
  char size[32];
  for (std::size_t at = 0; at < body.size(); at += chunk) {
    const std::size_t n = std::min(chunk, body.size() - at);
    std::snprintf(size, sizeof(size), "%zx\r\n", n);
    out += size + body.substr(at, n) + "\r\n";
  }
  return out + "0\r\n\r\n";
}

std::string gzip(const std::string& data) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, 16 + 15, 9, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, data.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string status_line(const std::string& answer) { return answer.substr(0, answer.find("\r\n")); }

// A generate body of `tokens` prompt tokens (all 1) that asks for one new token.
std::string generate_body(int64_t tokens) {
  std::string body = R"({"sampling_params": {"max_new_tokens": 1}, "input_ids": [)";
  for (int64_t i = 0; i < tokens; ++i) body += i == 0 ? "1" : ",1";
  return body + "]}";
}

TEST(HttpLimits, ChunkedAndCompressedBodiesAreBoundedAfterDecoding) {
  server::ServerOptions options;
  options.max_body_bytes = 1 << 20;
  Served s(options);
  // Chunked, 4 MiB in 64 KiB chunks: refused once the limit is passed.
  {
    RawConnection c(s.port());
    c.send_all(chunked_post("/generate", std::string(4 << 20, ' '), 64 << 10));
    const std::string answer = c.read_to_end(30);
    EXPECT_EQ(status_line(answer), "HTTP/1.1 413 Payload Too Large") << answer.substr(0, 300);
    EXPECT_NE(answer.find("larger than the server accepts (1048576 bytes)"), std::string::npos);
  }
  // Chunked within the limit: served.
  {
    RawConnection c(s.port());
    c.send_all(chunked_post("/generate", generate_body(3), 7));
    const std::string answer = c.read_to_end(30);
    EXPECT_EQ(status_line(answer), "HTTP/1.1 200 OK") << answer;
  }
  // gzip: a few kilobytes that expand to 64 MiB are refused at 1 MiB decoded.
  const std::string bomb = gzip(std::string(64 << 20, ' '));
  ASSERT_LT(bomb.size(), 100u << 10);
  {
    RawConnection c(s.port());
    c.send_all("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nConnection: close\r\nContent-Length: " +
               std::to_string(bomb.size()) + "\r\n\r\n" + bomb);
    const std::string answer = c.read_to_end(30);
    EXPECT_EQ(status_line(answer), "HTTP/1.1 413 Payload Too Large") << answer.substr(0, 300);
    EXPECT_NE(answer.find("decodes to more than the server accepts"), std::string::npos);
  }
  // gzip within the limit: served as the plain body would be.
  {
    const std::string packed = gzip(generate_body(3));
    RawConnection c(s.port());
    c.send_all("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nConnection: close\r\nContent-Length: " +
               std::to_string(packed.size()) + "\r\n\r\n" + packed);
    const std::string answer = c.read_to_end(30);
    EXPECT_EQ(status_line(answer), "HTTP/1.1 200 OK") << answer;
    EXPECT_NE(answer.find("\"prompt_tokens\":3"), std::string::npos) << answer;
  }
  // Not gzip at all, and an encoding the server does not take.
  for (const auto& [encoding, status] : {std::pair{"gzip", "400"}, std::pair{"br", "415"}}) {
    RawConnection c(s.port());
    const std::string body = generate_body(3);
    c.send_all("POST /generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Encoding: " + std::string(encoding) +
               "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
    EXPECT_EQ(status_line(c.read_to_end(30)).substr(9, 3), status) << encoding;
  }
}

// Sixteen streams of eight samples, run one sample at a time, fill the engine (1 running, 127
// waiting); 200 more
// requests get a 503 with Retry-After at once, /health stays fast, and every admitted stream
// finishes as it would alone.
TEST(HttpLimits, RequestsBeyondTheQueueGet503AtOnceAndTheAdmittedFinish) {
  engine::EngineOptions engine_options;
  engine_options.scheduler.max_running = 1;
  engine_options.scheduler.max_waiting = 127;
  Served s({}, engine_options);
  const std::string stream = raw_post("/v1/completions", R"({"prompt": [1, 2], "n": 8, "max_tokens": 250, "ignore_eos": true,
                                                            "temperature": 1, "seed": 7, "stream": true})");
  std::vector<std::unique_ptr<RawConnection>> admitted;
  for (int i = 0; i < 16; ++i) {
    admitted.push_back(std::make_unique<RawConnection>(s.port()));
    admitted.back()->send_all(stream);
  }
  // Until the engine holds all of them.
  for (int i = 0; i < 300 && s.stats().running + s.stats().waiting < 128; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(s.stats().running + s.stats().waiting, 128);
  const Clock::time_point burst = Clock::now();
  std::vector<std::unique_ptr<RawConnection>> refused;
  for (int i = 0; i < 200; ++i) {
    refused.push_back(std::make_unique<RawConnection>(s.port()));
    refused.back()->send_all(stream);
  }
  int got_503 = 0;
  for (auto& c : refused) {
    const std::string answer = c->read_to_end(30);
    if (status_line(answer) == "HTTP/1.1 503 Service Unavailable" && answer.find("Retry-After: 1\r\n") != std::string::npos) {
      ++got_503;
    }
  }
  const double refusing = seconds_since(burst);
  EXPECT_EQ(got_503, 200) << refused.front()->read_to_end(1).substr(0, 400);
  EXPECT_LT(median_health_seconds(s.port()), 0.1);
  EXPECT_GT(s.stats().running + s.stats().waiting, 0) << "the refusals came only after the admitted finished";
  std::cout << "200 refusals in " << refusing << " s\n";
  // Every admitted stream: the same tokens as the same request alone on a fresh server.
  Served alone;
  RawConnection solo(alone.port());
  solo.send_all(stream);
  const auto tokens_of = [](const std::string& text) {  // each sample's tokens, by its index
    std::map<int64_t, std::vector<int64_t>> tokens;
    for (const json& event : sse_events(text)) {
      for (const json& choice : event.at("choices")) {
        for (const json& t : choice.at("token_ids")) tokens[choice.at("index")].push_back(t.get<int64_t>());
      }
    }
    return tokens;
  };
  const std::map<int64_t, std::vector<int64_t>> expected = tokens_of(solo.read_to_end(60));
  ASSERT_EQ(expected.size(), 8u);
  ASSERT_EQ(expected.at(7).size(), 250u);
  for (auto& c : admitted) EXPECT_EQ(tokens_of(c->read_to_end(120)), expected);
}

// `r3 serve` told to stop with hundreds of slow and idle clients connected and streams that
// outlive the grace: it exits within the grace plus 2 s, those streams ending with an abort; a
// second signal during a long grace exits at once.
pid_t start_serve(const std::string& log, const std::string& grace) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    const std::string model = family_dir("qwen3_moe");
    execl(R3_BINARY, R3_BINARY, "serve", "--model", model.c_str(), "--port", "0", "--threads", "1", "--max-running",
          "1", "--shutdown-timeout", grace.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

int port_in_log(const std::string& log) {
  for (int i = 0; i < 600; ++i) {
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string prefix = "on http://127.0.0.1:";
    const auto at = text.find(prefix);
    if (at != std::string::npos && at + prefix.size() < text.size() &&
        std::isdigit(static_cast<unsigned char>(text[at + prefix.size()]))) {
      return std::stoi(text.substr(at + prefix.size()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return 0;
}

// Waits up to `seconds` for the child; its exit status, or -1 if it is still running.
int wait_exit(pid_t pid, double seconds) {
  const Clock::time_point start = Clock::now();
  int status = 0;
  while (seconds_since(start) < seconds) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

TEST(HttpLimits, AShutdownEndsWithinItsGraceWhateverTheClientsDo) {
  TempDir tmp;
  const std::string log = tmp.path("serve.log");
  const pid_t pid = start_serve(log, "0.5");
  ASSERT_GT(pid, 0);
  const int port = port_in_log(log);
  ASSERT_GT(port, 0) << "no port in the log";
  HeldConnections held(port, 300, 300);
  const std::string long_stream = raw_post("/v1/completions", R"({"prompt": [1, 2], "n": 64, "max_tokens": 250,
                                                                 "ignore_eos": true, "stream": true})");
  std::vector<std::unique_ptr<RawConnection>> streams;
  for (int i = 0; i < 4; ++i) {
    streams.push_back(std::make_unique<RawConnection>(port));
    streams.back()->send_all(long_stream);
  }
  ASSERT_NE(streams.front()->read_until("data: ").find("data: "), std::string::npos);
  const Clock::time_point signalled = Clock::now();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const int status = wait_exit(pid, 10);
  const double took = seconds_since(signalled);
  if (status == -1) kill(pid, SIGKILL);
  ASSERT_NE(status, -1) << "still running 10 s after SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_LT(took, 2.5);
  int aborted = 0;
  for (auto& s : streams) aborted += s->read_to_end(5).find("\"finish_reason\":\"abort\"") != std::string::npos;
  EXPECT_GT(aborted, 0) << "no stream outlived the grace";

  // A second signal: out at once, though the grace is ten minutes.
  const std::string log2 = tmp.path("serve2.log");
  const pid_t again = start_serve(log2, "600");
  ASSERT_GT(again, 0);
  const int port2 = port_in_log(log2);
  ASSERT_GT(port2, 0);
  RawConnection running(port2);
  running.send_all(long_stream);
  ASSERT_NE(running.read_until("data: ").find("data: "), std::string::npos);
  ASSERT_EQ(kill(again, SIGTERM), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const Clock::time_point second = Clock::now();
  ASSERT_EQ(kill(again, SIGTERM), 0);
  const int status2 = wait_exit(again, 10);
  if (status2 == -1) kill(again, SIGKILL);
  ASSERT_NE(status2, -1);
  EXPECT_LT(seconds_since(second), 2.0);
  EXPECT_TRUE(WIFEXITED(status2) && WEXITSTATUS(status2) == 128 + SIGTERM) << "status " << status2;
}

}  // namespace
}  // namespace r3::test
