// Reading a whole JSON file, with errors that name the file.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace r3 {

// Throws r3::Error "cannot read PATH" or "PATH: malformed JSON: ...".
nlohmann::json read_json_file(const std::string& path);

}  // namespace r3
