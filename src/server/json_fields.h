// Reading fields of a request body with the checks every endpoint shares: each failure is an
// ApiError (400) naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace r3::server {

int64_t integer(const nlohmann::json& v, const std::string& name);
double number(const nlohmann::json& v, const std::string& name);
// A list of token ids, each in [0, vocab).
std::vector<int32_t> token_ids(const nlohmann::json& v, const std::string& name, int64_t vocab);
// body[name] as a boolean; absent or null: false.
bool flag(const nlohmann::json& body, const char* name);
// For a field r3 does not implement and that would change the result (penalties, logit bias,
// best_of, minimum tokens, prompt logprobs, structured output): throws ApiError (400) naming it
// (as `name`) unless `value` is the neutral one, which leaves the result as it is (a penalty of
// 0, or 1 for repetition; an empty logit_bias; ...). Returns whether `key` is such a field.
bool refuse_unless_neutral(const std::string& key, const nlohmann::json& value, const std::string& name);

}  // namespace r3::server
