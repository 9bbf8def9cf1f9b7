// A request body's Content-Encoding undone within a bound: gzip and deflate (zlib, Debian's
// zlib1g-dev) inflated piece by piece, so a small body that expands past the limit is refused
// once the limit is passed, never held whole.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace r3::server {

// The body as sent, decoded by `encoding` (a Content-Encoding value: empty or "identity": as
// is; "gzip", "x-gzip" or "deflate"). Throws ApiError: 413 when the decoded body would pass
// `limit` bytes, 400 for a body that is not what its encoding says, 415 for another encoding.
std::string decode_body(std::string body, std::string_view encoding, int64_t limit);

}  // namespace r3::server
