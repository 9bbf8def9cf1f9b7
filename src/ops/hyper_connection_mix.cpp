#include "ops/hyper_connection_mix.h"

#include <algorithm>
#include <vector>

namespace r3::ops {

void hc_collapse(const Tensor& streams, const float* pre, Tensor& x) {
  R3_CHECK(streams.rank() == 3 && x.rank() == 2 && streams.dim(0) == x.dim(0) && streams.dim(2) == x.dim(1),
           "hc_collapse: streams ", shape_to_string(streams.shape()), " x ", shape_to_string(x.shape()));
  const int64_t tokens = x.dim(0), hc = streams.dim(1), hidden = x.dim(1);
  for (int64_t t = 0; t < tokens; ++t) {
    float* out = x.data<float>() + t * hidden;
    std::fill(out, out + hidden, 0.0f);
    for (int64_t i = 0; i < hc; ++i) {
      const float w = pre[t * hc + i];
      const float* s = streams.data<float>() + (t * hc + i) * hidden;
      for (int64_t d = 0; d < hidden; ++d) out[d] += w * s[d];
    }
  }
}

namespace {

void check_expand(const Tensor& sublayer_out, const Tensor& streams) {
  R3_CHECK(streams.rank() == 3 && sublayer_out.rank() == 2 && streams.dim(0) == sublayer_out.dim(0) &&
               streams.dim(2) == sublayer_out.dim(1),
           "hc_expand: streams ", shape_to_string(streams.shape()), " out ", shape_to_string(sublayer_out.shape()));
}

// Token t's streams; mixed: hc * hidden floats of scratch.
void expand_token(const float* post, const float* comb, const Tensor& sublayer_out, Tensor& streams, int64_t t,
                  float* mixed) {
  const int64_t hc = streams.dim(1), hidden = sublayer_out.dim(1);
  float* s = streams.data<float>() + t * hc * hidden;
  const float* y = sublayer_out.data<float>() + t * hidden;
  const float* c = comb + t * hc * hc;
  for (int64_t k = 0; k < hc; ++k) {
    for (int64_t d = 0; d < hidden; ++d) {
      float v = post[t * hc + k] * y[d];
      for (int64_t j = 0; j < hc; ++j) v += c[j * hc + k] * s[j * hidden + d];
      mixed[k * hidden + d] = v;
    }
  }
  std::copy(mixed, mixed + hc * hidden, s);
}

}  // namespace

void hc_expand(backend::Context& ctx, const float* post, const float* comb, const Tensor& sublayer_out,
               Tensor& streams) {
  check_expand(sublayer_out, streams);
  backend::Workspace::Scope scope(ctx.workspace());
  const auto mixed = ctx.per_thread<float>(streams.dim(1) * streams.dim(2));
  ctx.parallel_for(sublayer_out.dim(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) expand_token(post, comb, sublayer_out, streams, t, mixed.mine().data());
  });
}

void hc_expand(const float* post, const float* comb, const Tensor& sublayer_out, Tensor& streams) {
  check_expand(sublayer_out, streams);
  std::vector<float> mixed(static_cast<std::size_t>(streams.dim(1) * streams.dim(2)));
  for (int64_t t = 0; t < sublayer_out.dim(0); ++t) expand_token(post, comb, sublayer_out, streams, t, mixed.data());
}

}  // namespace r3::ops
