#include "moe/dispatcher.h"

#include <algorithm>
#include <cstring>

namespace r3::moe {

Dispatch LocalDispatcher::dispatch(backend::Context& ctx, const Tensor& hidden, const PhysicalRouting& routing,
                                   int64_t num_physical) const {
  const int64_t pairs = routing.tokens * routing.top_k, h = hidden.dim(1);
  R3_CHECK(hidden.rank() == 2 && hidden.dim(0) == routing.tokens, "dispatch: hidden ",
           shape_to_string(hidden.shape()), " for ", routing.tokens, " tokens");
  backend::Workspace& ws = ctx.workspace();
  // A counting sort by physical expert keeps each expert's pairs in (token, choice) order.
  const std::span<int64_t> start = ws.array<int64_t>(num_physical + 1);
  for (int32_t e : routing.physical_ids) ++start[static_cast<std::size_t>(e) + 1];
  for (std::size_t e = 1; e < start.size(); ++e) start[e] += start[e - 1];
  const std::span<int64_t> next = ws.array<int64_t>(num_physical);
  std::copy(start.begin(), start.end() - 1, next.begin());
  const std::span<int64_t> row_of_pair = ws.array<int64_t>(pairs);
  for (int64_t s = 0; s < pairs; ++s) {
    row_of_pair[static_cast<std::size_t>(s)] = next[static_cast<std::size_t>(routing.physical_ids[static_cast<std::size_t>(s)])]++;
  }
  Tensor rows = ctx.scratch(DType::F32, {pairs, h});
  const float* x = hidden.data<float>();
  float* r = rows.data<float>();
  for (int64_t s = 0; s < pairs; ++s) {
    std::memcpy(r + row_of_pair[static_cast<std::size_t>(s)] * h, x + (s / routing.top_k) * h,
                sizeof(float) * static_cast<std::size_t>(h));
  }
  return {start, row_of_pair, rows, {}, {}};
}

void combine_in_choice_order(const PhysicalRouting& routing, const float* pair_rows,
                             std::span<const int64_t> row_of_pair, Tensor& out) {
  const int64_t h = out.dim(1), pairs = routing.tokens * routing.top_k;
  R3_CHECK(out.dim(0) == routing.tokens && (row_of_pair.empty() || static_cast<int64_t>(row_of_pair.size()) == pairs),
           "combine: shapes do not match the routing");
  float* o = out.data<float>();
  std::fill(o, o + routing.tokens * h, 0.0f);
  for (int64_t s = 0; s < pairs; ++s) {
    const float w = routing.weights[static_cast<std::size_t>(s)];
    const int64_t r = row_of_pair.empty() ? s : row_of_pair[static_cast<std::size_t>(s)];
    const float* row = pair_rows + r * h;
    float* ot = o + (s / routing.top_k) * h;
    for (int64_t d = 0; d < h; ++d) ot[d] += w * row[d];
  }
}

void LocalDispatcher::combine(backend::Context&, const Dispatch& dispatch, const Tensor& expert_out,
                              const PhysicalRouting& routing, Tensor& out) const {
  R3_CHECK(expert_out.dim(0) == routing.tokens * routing.top_k && expert_out.dim(1) == out.dim(1),
           "combine: shapes do not match the routing");
  combine_in_choice_order(routing, expert_out.data<float>(), dispatch.row_of_pair, out);
}

const Dispatcher& local_dispatcher() {
  static const LocalDispatcher dispatcher;
  return dispatcher;
}

}  // namespace r3::moe
