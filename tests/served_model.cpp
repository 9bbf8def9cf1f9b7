#include "served_model.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "test_support.h"

namespace r3::test {

using nlohmann::json;

std::vector<int32_t> base64_int32(const std::string& text) {
  std::vector<unsigned char> bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (const char c : text) {
    if (c == '=') break;
    const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const auto v = alphabet.find(c);
    EXPECT_NE(v, std::string::npos) << "not base64: " << c;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<unsigned char>((acc >> bits) & 0xff));
    }
  }
  EXPECT_EQ(bytes.size() % 4, 0u);
  std::vector<int32_t> ids(bytes.size() / 4);
  std::memcpy(ids.data(), bytes.data(), ids.size() * 4);
  return ids;
}

Served::Served(server::ServerOptions options, engine::EngineOptions engine_options)
    : model_(models::load_model(family_dir("qwen3_moe"))), ctx_(2) {
  engine_ = std::make_unique<engine::Engine>(*model_, ctx_, engine_options);
  loop_ = std::make_unique<server::EngineLoop>(*engine_);
  options.model_name = "qwen3_moe";
  server_ = std::make_unique<server::HttpServer>(*loop_, model_->info(), options);
  port_ = server_->bind("127.0.0.1", 0);
  thread_ = std::thread([this] { server_->serve(); });
  while (!server_->running()) std::this_thread::yield();
}

Served::~Served() {
  server_->stop();
  thread_.join();
}

httplib::Client Served::client() const {
  httplib::Client c("127.0.0.1", port_);
  c.set_read_timeout(300, 0);
  return c;
}

json post(httplib::Client& c, const std::string& path, const std::string& body, int expected_status,
          const httplib::Headers& headers) {
  const auto res = c.Post(path, headers, body, "application/json");
  EXPECT_TRUE(res) << "no response from " << path << ": " << httplib::to_string(res.error());
  if (!res) return {};
  EXPECT_EQ(res->status, expected_status) << res->body;
  return json::parse(res->body);
}

RawConnection::RawConnection(int port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) close();
}

RawConnection::~RawConnection() { close(); }

void RawConnection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RawConnection::send_all(const std::string& bytes) {
  std::size_t sent = 0;
  while (fd_ >= 0 && sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;  // the server closed it: what it answered is still readable
    sent += static_cast<std::size_t>(n);
  }
}

std::string RawConnection::read_until(const std::string& marker, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (fd_ >= 0 && (marker.empty() || received_.find(marker) == std::string::npos) &&
         std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buffer[65536];
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    if (n <= 0) {  // closed by the server
      peer_closed_ = true;
      break;
    }
    received_.append(buffer, static_cast<std::size_t>(n));
  }
  return received_;
}

std::string RawConnection::read_to_end(double seconds) { return read_until("", seconds); }

std::string raw_post(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::vector<json> sse_events(const std::string& stream) {
  std::vector<json> events;
  std::size_t at = 0;
  while ((at = stream.find("data: ", at)) != std::string::npos) {
    const std::size_t end = stream.find("\n\n", at);
    if (end == std::string::npos) break;
    const std::string payload = stream.substr(at + 6, end - at - 6);
    if (payload != "[DONE]") events.push_back(json::parse(payload));
    at = end + 2;
  }
  return events;
}

}  // namespace r3::test
