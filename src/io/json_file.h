// Reading JSON, with errors that name the file. Every JSON r3 reads from outside (config.json,
// the checkpoint index, safetensors headers, replay and load files) goes through parse_json:
// nesting deeper than kMaxJsonDepth is refused while parsing (a deep value would overflow the
// stack when copied or printed), and messages describe values with describe_json, never dump().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "io/input_file.h"

namespace r3 {

inline constexpr int kMaxJsonDepth = 64;

struct JsonOptions {
  bool unique_keys = false;  // refuse an object that repeats a key (otherwise the last one wins)
};

// Parses `text`; throws r3::Error "SOURCE: malformed JSON: ...", "SOURCE: JSON nested deeper than
// 64 levels" or (unique_keys) "SOURCE: duplicate key 'K'".
nlohmann::json parse_json(std::string_view text, const std::string& source, JsonOptions options = {});

// Opens `path` with InputFile (regular file, at most max_bytes, `what` names the kind of file in
// the size error) and parses it with parse_json. Throws "cannot read PATH: ..." or parse_json's errors.
nlohmann::json read_json_file(const std::string& path, uint64_t max_bytes = kMaxConfigBytes,
                              const char* what = "a JSON file", JsonOptions options = {});

// A short description of a value for messages: "a number 1.5", "a string \"abc...\"" (at most
// 40 characters of it), "a list of 3 elements", "an object of 2 keys", "true", "null".
std::string describe_json(const nlohmann::json& value);

}  // namespace r3
