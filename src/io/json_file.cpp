#include "io/json_file.h"

#include <fstream>

#include "core/check.h"

namespace r3 {

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  R3_CHECK(in.good(), "cannot read ", path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    R3_FAIL(path, ": malformed JSON: ", e.what());
  }
}

}  // namespace r3
