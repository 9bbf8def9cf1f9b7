// One sample of a request as the engine runs it: its tokens, how many of them the KV cache holds,
// its cache slot and block table, its routed-experts rows and what it has streamed so far.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/request.h"
#include "engine/sampler.h"

namespace r3::engine {

struct Sequence {
  Sequence(RequestId request_id, int64_t sample_index, std::shared_ptr<const RequestParams> request_params,
           int64_t ids_per_row)
      : request(request_id),
        index(sample_index),
        params(std::move(request_params)),
        tokens(params->prompt),
        prompt_len(static_cast<int64_t>(tokens.size())),
        sampler([&] {
          SamplingParams s = params->sampling;
          s.seed = sample_seed(s.seed, sample_index);
          return s;
        }()),
        per_row(ids_per_row) {}

  RequestId request;
  int64_t index;
  std::shared_ptr<const RequestParams> params;
  std::vector<int32_t> tokens;  // prompt, then outputs
  int64_t prompt_len;
  Sampler sampler;
  int64_t per_row;  // routed ids per row: MoE layers x top_k

  // KV state: positions [0, computed) are in the cache, in blocks[p / block_size] of slot `slot`.
  int64_t computed = 0;
  int32_t slot = -1;
  std::vector<int32_t> blocks;
  std::vector<uint64_t> block_keys;  // chain hash of each full block registered or hit so far
  int64_t admitted = -1;             // admission counter: preemption takes the newest first
  int64_t cached_prompt_tokens = 0;  // served by the prefix cache at the first admission
  int64_t preemptions = 0;

  // Routed experts: ids of rows [0, routed_rows()) (row i: token i was the input).
  std::vector<int32_t> rows;
  std::vector<float> margins;  // [routed_rows(), MoE layers]: each row's routing margins
  int64_t routed_rows() const { return static_cast<int64_t>(rows.size()) / per_row; }

  // Streaming: what was computed but not yet handed out.
  SampleOutput pending;
  FinishReason finish = FinishReason::kNone;

  int64_t outputs() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
  bool finished() const { return finish != FinishReason::kNone; }
  // Tokens to run before the next sample: everything not in the cache yet.
  int64_t uncomputed() const { return static_cast<int64_t>(tokens.size()) - computed; }
};

}  // namespace r3::engine
