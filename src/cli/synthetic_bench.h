// `r3 bench --device cuda --synthetic NAME`: whole steps of the device model at a real model's
// shape, with random weights made on the GPU (models/device_decoder.h), against the memory
// bandwidth floor. No checkpoint file is read.
#pragma once

#include <string>
#include <vector>

#include "backend/context.h"

namespace r3::cli {

// Decode steps at each of `batches` (r3 bench: 1, 8, 64 and 256 unless --synthetic-batches) with
// `context` positions per sequence (1024 unless --synthetic-context; step time, the bytes
// the step must read, achieved bandwidth and its share of the copy bandwidth measured in the
// same run), the same steps with routing capture off and with the batch-invariant kernels, and a
// 4k-token prefill. json: one JSON object; otherwise a table.
// weights: "bf16" or "fp8" (models::SyntheticShape::fp8).
// Batches that fit are run; one whose KV cache does not fit in the device memory left beside the
// weights is skipped with a warning and listed under "skipped" (an H100's 80 GB holds the bf16
// weights, 61 GB, and the KV cache of 64 sequences of 1k positions, not that of 256).
int run_synthetic_bench(backend::Context& ctx, const std::string& name, const std::string& weights,
                        const std::vector<int64_t>& batches, int64_t context, bool json);


}  // namespace r3::cli
