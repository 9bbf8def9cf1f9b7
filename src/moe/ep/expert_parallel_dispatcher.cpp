#include "moe/ep/expert_parallel_dispatcher.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace r3::moe::ep {

namespace {

// A message of n pairs: n, then n pair indices (int64), n physical ids (int32, padded to 8
// bytes), then n rows of h floats. Combine's messages have no ids.
class Writer {
 public:
  Writer(int64_t n, int64_t h, bool with_ids)
      : n_(n), h_(h), buffer_(bytes(n, h, with_ids)), with_ids_(with_ids) {
    std::memcpy(buffer_.data(), &n_, sizeof n_);
  }
  static std::size_t bytes(int64_t n, int64_t h, bool with_ids) {
    const auto count = static_cast<std::size_t>(n);
    return sizeof(int64_t) * (1 + count) + (with_ids ? ids_bytes(count) : 0) + sizeof(float) * count * static_cast<std::size_t>(h);
  }
  static std::size_t ids_bytes(std::size_t n) { return (sizeof(int32_t) * n + 7) / 8 * 8; }
  void put(int64_t i, int64_t pair, int32_t physical, const float* row) {
    const auto at = static_cast<std::size_t>(i), count = static_cast<std::size_t>(n_);
    std::memcpy(buffer_.data() + sizeof(int64_t) * (1 + at), &pair, sizeof pair);
    std::size_t rows = sizeof(int64_t) * (1 + count);
    if (with_ids_) {
      std::memcpy(buffer_.data() + rows + sizeof(int32_t) * at, &physical, sizeof physical);
      rows += ids_bytes(count);
    }
    std::memcpy(buffer_.data() + rows + sizeof(float) * at * static_cast<std::size_t>(h_), row,
                sizeof(float) * static_cast<std::size_t>(h_));
  }
  Buffer take() { return std::move(buffer_); }

 private:
  int64_t n_, h_;
  Buffer buffer_;
  bool with_ids_;
};

class Reader {
 public:
  Reader(const Buffer& b, int64_t h, bool with_ids) : b_(b), h_(h), with_ids_(with_ids) {
    R3_CHECK(b.size() >= sizeof(int64_t), "expert parallelism: an empty message");
    std::memcpy(&n_, b.data(), sizeof n_);
    R3_CHECK(n_ >= 0 && b.size() == Writer::bytes(n_, h, with_ids), "expert parallelism: a message of ", b.size(),
             " bytes for ", n_, " rows of ", h);
  }
  int64_t size() const { return n_; }
  int64_t pair(int64_t i) const {
    int64_t v;
    std::memcpy(&v, b_.data() + sizeof(int64_t) * (1 + static_cast<std::size_t>(i)), sizeof v);
    return v;
  }
  int32_t physical(int64_t i) const {
    int32_t v;
    std::memcpy(&v, b_.data() + ids_at() + sizeof(int32_t) * static_cast<std::size_t>(i), sizeof v);
    return v;
  }
  void row(int64_t i, float* dst) const {
    const std::size_t rows = ids_at() + (with_ids_ ? Writer::ids_bytes(static_cast<std::size_t>(n_)) : 0);
    std::memcpy(dst, b_.data() + rows + sizeof(float) * static_cast<std::size_t>(i * h_),
                sizeof(float) * static_cast<std::size_t>(h_));
  }

 private:
  std::size_t ids_at() const { return sizeof(int64_t) * (1 + static_cast<std::size_t>(n_)); }
  const Buffer& b_;
  int64_t n_ = 0, h_;
  bool with_ids_;
};

}  // namespace

ExpertParallelDispatcher::ExpertParallelDispatcher(Transport& transport, std::vector<int32_t> owner_of,
                                                   DeviceExchange* device)
    : transport_(transport), owner_of_(std::move(owner_of)), device_(device) {
  for (std::size_t p = 0; p < owner_of_.size(); ++p) {
    R3_CHECK(owner_of_[p] >= 0 && owner_of_[p] < transport_.size(), "expert parallelism: physical expert ", p,
             " on rank ", owner_of_[p], " of ", transport_.size());
  }
}

Dispatch ExpertParallelDispatcher::dispatch(backend::Context& ctx, const Tensor& hidden, const PhysicalRouting& routing,
                                            int64_t num_physical) const {
  const int64_t pairs = routing.tokens * routing.top_k, h = hidden.dim(1);
  const int ranks = transport_.size(), me = transport_.rank();
  R3_CHECK(hidden.rank() == 2 && hidden.dim(0) == routing.tokens, "dispatch: hidden ",
           shape_to_string(hidden.shape()), " for ", routing.tokens, " tokens");
  R3_CHECK(num_physical == static_cast<int64_t>(owner_of_.size()), "expert parallelism: ", num_physical,
           " physical experts, owners for ", owner_of_.size());
  // Each destination's pairs in (token, choice) order.
  std::vector<int64_t> count(static_cast<std::size_t>(ranks), 0);
  for (const int32_t p : routing.physical_ids) {
    R3_CHECK(p >= 0 && p < num_physical, "dispatch: physical expert ", p, " of ", num_physical);
    ++count[static_cast<std::size_t>(owner_of_[static_cast<std::size_t>(p)])];
  }
  std::vector<Writer> out;
  for (int d = 0; d < ranks; ++d) out.emplace_back(count[static_cast<std::size_t>(d)], h, true);
  std::vector<int64_t> filled(static_cast<std::size_t>(ranks), 0);
  for (int64_t s = 0; s < pairs; ++s) {
    const int32_t p = routing.physical_ids[static_cast<std::size_t>(s)];
    const auto d = static_cast<std::size_t>(owner_of_[static_cast<std::size_t>(p)]);
    out[d].put(filled[d]++, s, p, hidden.data<float>() + (s / routing.top_k) * h);
  }
  for (int d = 0; d < ranks; ++d) {
    if (d != me) rows_sent_elsewhere_ += count[static_cast<std::size_t>(d)];
  }
  std::vector<Buffer> to_each;
  for (Writer& w : out) to_each.push_back(w.take());
  const std::vector<Buffer> received = transport_.all_to_all(std::move(to_each));

  // What arrived, grouped by physical expert (a counting sort: source rank, then its pair order).
  std::vector<Reader> from;
  int64_t rows = 0;
  for (const Buffer& b : received) {
    from.emplace_back(b, h, true);
    rows += from.back().size();
  }
  backend::Workspace& ws = ctx.workspace();
  const std::span<int64_t> start = ws.array<int64_t>(num_physical + 1);
  for (const Reader& r : from) {
    for (int64_t i = 0; i < r.size(); ++i) {
      const int32_t p = r.physical(i);
      R3_CHECK(p >= 0 && p < num_physical && owner_of_[static_cast<std::size_t>(p)] == me,
               "expert parallelism: rank ", me, " received a pair for physical expert ", p);
      ++start[static_cast<std::size_t>(p) + 1];
    }
  }
  for (std::size_t e = 1; e < start.size(); ++e) start[e] += start[e - 1];
  const std::span<int64_t> next = ws.array<int64_t>(num_physical);
  std::copy(start.begin(), start.end() - 1, next.begin());
  const std::span<int32_t> source_rank = ws.array<int32_t>(rows);
  const std::span<int64_t> source_pair = ws.array<int64_t>(rows);
  Tensor grouped = ctx.scratch(DType::F32, {rows, h});
  for (int s = 0; s < ranks; ++s) {
    const Reader& r = from[static_cast<std::size_t>(s)];
    for (int64_t i = 0; i < r.size(); ++i) {
      const int64_t at = next[static_cast<std::size_t>(r.physical(i))]++;
      source_rank[static_cast<std::size_t>(at)] = s;
      source_pair[static_cast<std::size_t>(at)] = r.pair(i);
      r.row(i, grouped.data<float>() + at * h);
    }
  }
  return {start, {}, grouped, source_rank, source_pair};
}

void ExpertParallelDispatcher::combine(backend::Context& ctx, const Dispatch& dispatch, const Tensor& expert_out,
                                       const PhysicalRouting& routing, Tensor& out) const {
  const int64_t h = out.dim(1), rows = dispatch.rows.dim(0), pairs = routing.tokens * routing.top_k;
  const int ranks = transport_.size();
  R3_CHECK(expert_out.dim(0) == rows && expert_out.dim(1) == h &&
               static_cast<int64_t>(dispatch.source_rank.size()) == rows,
           "combine (expert parallel): shapes do not match the dispatch");
  // Each output row back to the rank its pair came from.
  std::vector<int64_t> count(static_cast<std::size_t>(ranks), 0);
  for (const int32_t s : dispatch.source_rank) ++count[static_cast<std::size_t>(s)];
  std::vector<Writer> back;
  for (int s = 0; s < ranks; ++s) back.emplace_back(count[static_cast<std::size_t>(s)], h, false);
  std::vector<int64_t> filled(static_cast<std::size_t>(ranks), 0);
  for (int64_t i = 0; i < rows; ++i) {
    const auto s = static_cast<std::size_t>(dispatch.source_rank[static_cast<std::size_t>(i)]);
    back[s].put(filled[s]++, dispatch.source_pair[static_cast<std::size_t>(i)], 0, expert_out.data<float>() + i * h);
  }
  std::vector<Buffer> to_each;
  for (Writer& w : back) to_each.push_back(w.take());
  const std::vector<Buffer> received = transport_.all_to_all(std::move(to_each));

  // This rank's pairs' outputs in pair order, then the same combine as on one rank.
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor pair_rows = ctx.scratch(DType::F32, {pairs, h});
  const std::span<uint8_t> seen = ctx.workspace().array<uint8_t>(pairs);
  for (const Buffer& b : received) {
    const Reader r(b, h, false);
    for (int64_t i = 0; i < r.size(); ++i) {
      const int64_t s = r.pair(i);
      R3_CHECK(s >= 0 && s < pairs && !seen[static_cast<std::size_t>(s)], "expert parallelism: pair ", s,
               " came back twice or out of range");
      seen[static_cast<std::size_t>(s)] = 1;
      r.row(i, pair_rows.data<float>() + s * h);
    }
  }
  for (int64_t s = 0; s < pairs; ++s) {
    R3_CHECK(seen[static_cast<std::size_t>(s)], "expert parallelism: pair ", s, " did not come back");
  }
  combine_in_choice_order(routing, pair_rows.data<float>(), {}, out);
}

std::vector<int32_t> contiguous_owners(int64_t num_physical, int ranks) {
  R3_CHECK(ranks >= 1 && num_physical >= ranks, "expert parallelism: ", num_physical, " physical experts over ", ranks,
           " ranks (each rank needs one)");
  std::vector<int32_t> owners(static_cast<std::size_t>(num_physical));
  for (int64_t p = 0; p < num_physical; ++p) owners[static_cast<std::size_t>(p)] = static_cast<int32_t>(p * ranks / num_physical);
  return owners;
}

ExpertSlice contiguous_slice(int64_t num_physical, int ranks, int rank) {
  const std::vector<int32_t> owners = contiguous_owners(num_physical, ranks);
  const auto first = std::find(owners.begin(), owners.end(), rank);
  R3_CHECK(first != owners.end(), "expert parallelism: rank ", rank, " of ", ranks, " owns no expert");
  return {static_cast<int32_t>(first - owners.begin()), static_cast<int32_t>(std::count(owners.begin(), owners.end(), rank))};
}

}  // namespace r3::moe::ep
