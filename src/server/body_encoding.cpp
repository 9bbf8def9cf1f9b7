#include "server/body_encoding.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>

#include "server/api_error.h"

namespace r3::server {

namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string inflate_within(const std::string& body, const std::string& encoding, int64_t limit) {
  z_stream z{};
  // 32 + 15: gzip or zlib headers, detected; -15: raw deflate (what some clients send as
  // "deflate") is tried when the zlib header is not there.
  const bool gzip = encoding != "deflate";
  const bool raw = !gzip && !body.empty() && (static_cast<unsigned char>(body[0]) & 0x0f) != 8;
  if (inflateInit2(&z, gzip ? 32 + 15 : raw ? -15 : 15) != Z_OK) throw ApiError(500, "zlib could not start");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(body.data()));
  z.avail_in = static_cast<uInt>(body.size());
  std::string out;
  char piece[1 << 16];
  int status = Z_OK;
  while (status != Z_STREAM_END) {
    z.next_out = reinterpret_cast<Bytef*>(piece);
    z.avail_out = sizeof(piece);
    status = inflate(&z, Z_NO_FLUSH);
    if (status != Z_OK && status != Z_STREAM_END) {
      inflateEnd(&z);
      throw ApiError(400, "the request body is not valid " + encoding + " data (Content-Encoding: " + encoding + ")");
    }
    const std::size_t produced = sizeof(piece) - z.avail_out;
    if (static_cast<int64_t>(out.size() + produced) > limit) {
      inflateEnd(&z);
      throw ApiError(413, "the request body decodes to more than the server accepts (" + std::to_string(limit) +
                              " bytes)");
    }
    out.append(piece, produced);
    if (status == Z_OK && z.avail_in == 0 && produced == 0) {
      inflateEnd(&z);
      throw ApiError(400, "the request body ends inside its " + encoding + " data");
    }
  }
  inflateEnd(&z);
  return out;
}

}  // namespace

std::string decode_body(std::string body, std::string_view encoding, int64_t limit) {
  const std::string name = lower(encoding);
  if (name.empty() || name == "identity") return body;
  if (name == "gzip" || name == "x-gzip" || name == "deflate") return inflate_within(body, name, limit);
  throw ApiError(415, "Content-Encoding " + std::string(encoding) + " is not supported (gzip, deflate or identity)");
}

}  // namespace r3::server
