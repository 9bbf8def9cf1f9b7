#include "cli/token_ids.h"

#include <charconv>
#include <limits>

#include "core/check.h"

namespace r3::cli {

std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& source) {
  std::vector<int32_t> ids;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int64_t value = -1;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    R3_CHECK(!item.empty() && ec == std::errc() && ptr == item.data() + item.size() && value >= 0 &&
                 value <= std::numeric_limits<int32_t>::max(),
             "bad token id '", item, "' in ", source, " (expected comma-separated non-negative integers)");
    ids.push_back(static_cast<int32_t>(value));
    start = end + 1;
  }
  R3_CHECK(!ids.empty(), source, " is empty");
  return ids;
}

std::string join_ids(const std::vector<int32_t>& ids, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) out += separator;
    out += std::to_string(ids[i]);
  }
  return out;
}

}  // namespace r3::cli
