// Parsing of token id lists given on the command line ("3,17,42").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace r3::cli {

// Throws r3::Error naming the bad entry and `source` (where the text came from, e.g. "--ids");
// empty lists and negative ids are errors.
std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& source = "--ids");

std::string join_ids(const std::vector<int32_t>& ids, const std::string& separator = ",");

}  // namespace r3::cli
