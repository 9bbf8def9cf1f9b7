// A batch-1 decode layer of Qwen3-30B-A3B's shape as a chain of stages, without r3's arithmetic:
// what running the chain as separate kernels costs against one persistent kernel, the structural
// step bench/RESULTS.md names for batch 1. The stages, in a layer's order: RMSNorm (small), q/k/v
// (streams 21.0 MB), q/k norms + rotary (small), attention (streams the 2.1 MB of a 1k context's
// keys and values), merge (small), o (16.8 MB), RMSNorm (small), router (1.0 MB), routing
// (small), experts' gate/up (50.3 MB), down (25.2 MB). Each streaming stage reads its own slice
// of one buffer of every layer's bytes (no layer finds its bytes in L2), 128-bit loads, four in
// flight a thread, the loaded words folded into a value each thread stores; a small stage is one
// block reading 8 KB, summing its squares in double and storing the sum (about an RMSNorm's
// work). Three ways to run it (stage_chain.h): a kernel a stage in one CUDA graph with
// programmatic dependent launch, as r3's decode step; one cooperative kernel with a grid barrier
// between stages; the same with each block loading its first share of the next streaming stage
// into registers before the barrier (weights do not depend on the step), so that the trip from
// memory overlaps the barrier and the small stages. And both with every small stage folded into
// the streaming stage after it (each of its blocks runs the small work after issuing its first
// loads, as a projection that normalised its own input would): six kernels or barriers a layer.
// And the kernel chain overlapped as r3's is (kKernelsEarly): its fixed cost against the bytes.
// Each with the projections' weights as bfloat16 or as FP8 (half their bytes): whether the
// chain's cost apart from its bytes stays the same when the bytes halve, which bounds the share
// of its floor FP8 decode can reach in this chain (issue 15's GPU criterion).
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "gpu_event_timer.h"
#include "ops/cuda/weight_rows.cuh"
#include "stage_chain.h"

namespace r3::bench {

namespace {

constexpr int kThreads = 256;
constexpr int kInFlight = 4;        // 128-bit loads a thread has in flight
constexpr int64_t kSmallFloats = 2048;  // a small stage's row (8 KB)

// A layer's stages: bytes streamed, 0 for a small stage; the projections' (stages 1, 5, 9 and
// 10) halved for FP8 weights.
constexpr int kStageCount = 11;
__host__ __device__ inline int64_t stage_bytes(int s, bool fp8) {
  constexpr int64_t kBytes[kStageCount] = {0,       20971520, 0, 2097152, 0, 16777216, 0, 1048576, 0,
                                           50331648, 25165824};
  const bool projection = s == 1 || s == 5 || s == 9 || s == 10;
  return fp8 && projection ? kBytes[s] / 2 : kBytes[s];
}

struct Chain {
  const uint4* bytes;  // every layer's streamed bytes, stage after stage
  float* small;        // [stages * layers, kSmallFloats]: each small stage's row, its sum stored at [0]
  uint32_t* sink;      // a word per thread of the widest grid
  int layers;
  bool fp8;            // the projections' weights at a byte a weight
};

// The first uint4 of stage s of layer l in the buffer, and its count.
__host__ __device__ inline int64_t stage_first(int layer, int s, bool fp8) {
  int64_t per_layer = 0, before = 0;
  for (int i = 0; i < kStageCount; ++i) {
    per_layer += stage_bytes(i, fp8) / 16;
    if (i < s) before += stage_bytes(i, fp8) / 16;
  }
  return layer * per_layer + before;
}

__device__ inline uint32_t fold(const uint4& v) { return v.x ^ v.y ^ v.z ^ v.w; }

// r3's weight loads (weight_rows.cuh: skipping L1).
__device__ inline uint4 load_stream(const uint4* p) { return ops::cuda::load_streaming(p); }

// A block's share [first, end) of a stage's uint4s: rounds of kInFlight loads a thread, the
// first round given when the block loaded it ahead.
__device__ inline uint32_t stream_share(const uint4* p, int64_t first, int64_t end, const uint4* ahead,
                                        bool have_ahead) {
  uint32_t folded = 0;
  int64_t i = first + threadIdx.x;
  if (have_ahead) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      if (i + u * kThreads < end) folded ^= fold(ahead[u]);
    }
    i += kInFlight * kThreads;
  }
  for (; i < end; i += kInFlight * kThreads) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) v[u] = i + u * kThreads < end ? load_stream(p + i + u * kThreads) : uint4{};
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) folded ^= fold(v[u]);
  }
  return folded;
}

__device__ inline void load_ahead(const uint4* p, int64_t first, int64_t end, uint4* ahead) {
  const int64_t i = first + threadIdx.x;
#pragma unroll
  for (int u = 0; u < kInFlight; ++u) ahead[u] = i + u * kThreads < end ? load_stream(p + i + u * kThreads) : uint4{};
}

// One block: the sum of squares of an 8 KB row, in double, stored at the row's start (when
// `store`: a folded small stage runs in every block of the stage after it, one stores).
__device__ inline void small_stage(float* row, bool store = true) {
  __shared__ double partial[kThreads / 32];
  double sum = 0;
  for (int64_t i = threadIdx.x; i < kSmallFloats; i += kThreads) sum += static_cast<double>(row[i]) * row[i];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0 && store) {
    double total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
    row[0] = static_cast<float>(total);
  }
  __syncthreads();
}

// small_row >= 0: the small stage before this one folded in, every block running it after
// issuing its first loads (as a projection would normalise its own input). early: the first
// loads go out before the wait (the weights are no kernel's output), as r3's streaming kernels
// do; release: the next kernel is released once this one has waited (r3's gate/up releases down).
__global__ void stream_kernel(Chain c, int64_t first, int64_t count, int64_t small_row, bool early, bool release) {
  const int64_t share = (count + gridDim.x - 1) / gridDim.x;
  const int64_t begin = first + blockIdx.x * share, end = min(first + count, begin + share);
  uint4 ahead[kInFlight];
  const bool folded = small_row >= 0;
  if (early) load_ahead(c.bytes, begin, end, ahead);
  backend::cuda::wait_for_predecessor();
  if (release) backend::cuda::release_successor();
  if (folded) {
    if (!early) load_ahead(c.bytes, begin, end, ahead);
    small_stage(c.small + small_row * kSmallFloats, blockIdx.x == 0);
  }
  c.sink[blockIdx.x * kThreads + threadIdx.x] = stream_share(c.bytes, begin, end, ahead, folded || early);
}

// release: the next kernel is released once this one has waited (r3's norms release the next
// projection, which then loads its weights while the norm runs).
__global__ void small_kernel(Chain c, int64_t row, bool release) {
  backend::cuda::wait_for_predecessor();
  if (release) backend::cuda::release_successor();
  small_stage(c.small + row * kSmallFloats);
}

// Every block arrives; the last turns the generation, the others wait for it. The grid is
// co-resident (a cooperative launch), so this cannot deadlock.
__device__ inline void grid_barrier(unsigned* arrived, volatile unsigned* generation) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned seen = *generation;
    __threadfence();
    if (atomicAdd(arrived, 1u) == gridDim.x - 1) {
      *arrived = 0;
      __threadfence();
      atomicAdd(const_cast<unsigned*>(generation), 1u);
    } else {
      while (*generation == seen) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// kFold: each small stage runs in every block at the start of the streaming stage after it
// (no barrier of its own), after the block's first loads of that stage are issued.
template <bool kAhead, bool kFold>
__global__ void __launch_bounds__(kThreads) persistent_kernel(Chain c, unsigned* arrived, unsigned* generation) {
  uint4 ahead[kInFlight];
  bool have_ahead = false;
  uint32_t folded = 0;
  for (int l = 0; l < c.layers; ++l) {
    for (int s = 0; s < kStageCount; ++s) {
      const int64_t count = stage_bytes(s, c.fp8) / 16, first = stage_first(l, s, c.fp8);
      const int64_t share = (count + gridDim.x - 1) / gridDim.x;
      const int64_t begin = first + blockIdx.x * share, end = min(first + count, begin + share);
      const int64_t row = static_cast<int64_t>(l) * kStageCount + s;
      if (count > 0) {
        if (kFold && s > 0 && stage_bytes(s - 1, c.fp8) == 0) {
          if (!have_ahead) {
            load_ahead(c.bytes, begin, end, ahead);
            have_ahead = true;
          }
          small_stage(c.small + (row - 1) * kSmallFloats, blockIdx.x == 0);
        }
        folded ^= stream_share(c.bytes, begin, end, ahead, (kAhead || kFold) && have_ahead);
        have_ahead = false;
      } else if (kFold) {
        continue;  // runs with the next stage
      } else if (blockIdx.x == 0) {
        small_stage(c.small + row * kSmallFloats);
      }
      if constexpr (kAhead) {
        // The next streaming stage's first round, if not loaded yet, before the barrier.
        if (!have_ahead) {
          int nl = l, ns = s;
          do {
            if (++ns == kStageCount) {
              ns = 0;
              ++nl;
            }
          } while (nl < c.layers && stage_bytes(ns, c.fp8) == 0);
          if (nl < c.layers) {
            const int64_t ncount = stage_bytes(ns, c.fp8) / 16, nfirst = stage_first(nl, ns, c.fp8);
            const int64_t nshare = (ncount + gridDim.x - 1) / gridDim.x;
            const int64_t nbegin = nfirst + blockIdx.x * nshare, nend = min(nfirst + ncount, nbegin + nshare);
            load_ahead(c.bytes, nbegin, nend, ahead);
            have_ahead = true;
          }
        }
      }
      grid_barrier(arrived, generation);
    }
  }
  c.sink[blockIdx.x * kThreads + threadIdx.x] = folded;
}

}  // namespace

double stage_chain_bytes_per_layer(StageChainWeights weights) {
  double bytes = 0;
  for (int s = 0; s < kStageCount; ++s) bytes += static_cast<double>(stage_bytes(s, weights == StageChainWeights::kFp8));
  return bytes;
}

StageChainTiming time_stage_chain(backend::Context& gpu, StageChainRun run, StageChainWeights weights, int layers,
                                  int blocks_per_sm) {
  const backend::cuda::State& state = gpu.cuda_state();
  const cudaStream_t stream = state.stream;
  const bool fp8 = weights == StageChainWeights::kFp8;
  const int64_t total16 = stage_first(layers, 0, fp8);
  constexpr int64_t kSinkWords = int64_t{65536} * kThreads;
  Chain c{nullptr, nullptr, nullptr, layers, fp8};
  void* bytes = nullptr;
  R3_CUDA_CHECK(cudaMalloc(&bytes, total16 * 16));
  R3_CUDA_CHECK(cudaMemsetAsync(bytes, 0, total16 * 16, stream));
  c.bytes = static_cast<const uint4*>(bytes);
  R3_CUDA_CHECK(cudaMalloc(&c.small, static_cast<std::size_t>(layers) * kStageCount * kSmallFloats * sizeof(float)));
  R3_CUDA_CHECK(cudaMemsetAsync(c.small, 0, static_cast<std::size_t>(layers) * kStageCount * kSmallFloats * sizeof(float), stream));
  R3_CUDA_CHECK(cudaMalloc(&c.sink, kSinkWords * sizeof(uint32_t)));
  unsigned* barrier = nullptr;  // [arrived, generation]
  R3_CUDA_CHECK(cudaMalloc(&barrier, 2 * sizeof(unsigned)));
  R3_CUDA_CHECK(cudaMemsetAsync(barrier, 0, 2 * sizeof(unsigned), stream));
  double ms = 0;
  unsigned persistent_blocks = 0;
  if (run == StageChainRun::kKernels || run == StageChainRun::kKernelsFolded || run == StageChainRun::kKernelsEarly) {
    const bool fold = run == StageChainRun::kKernelsFolded, early = run == StageChainRun::kKernelsEarly;
    auto chain = [&] {
      for (int l = 0; l < layers; ++l) {
        for (int s = 0; s < kStageCount; ++s) {
          const int64_t count = stage_bytes(s, fp8) / 16, row = static_cast<int64_t>(l) * kStageCount + s;
          if (count > 0) {
            // A round of loads a thread, as r3's projections read a weight row in a few rounds.
            const auto blocks = static_cast<unsigned>(std::min<int64_t>(65535, (count + kThreads * kInFlight - 1) / (kThreads * kInFlight)));
            const int64_t small_row = fold && s > 0 && stage_bytes(s - 1, fp8) == 0 ? row - 1 : -1;
            const bool next_streams = s + 1 < kStageCount && stage_bytes(s + 1, fp8) > 0;  // gate/up, then down
            backend::cuda::launch_kernel(stream_kernel, blocks, kThreads, 0, stream, c, stage_first(l, s, fp8), count,
                                         small_row, early, early && next_streams);
          } else if (!fold) {
            backend::cuda::launch_kernel(small_kernel, 1, kThreads, 0, stream, c, row, early);
          }
        }
      }
    };
    ms = graph_mean_ms(gpu, chain, 1);  // the whole chain as one graph
  } else {
    const void* kernel = run == StageChainRun::kPersistent ? reinterpret_cast<const void*>(persistent_kernel<false, false>)
                         : run == StageChainRun::kPersistentAhead
                             ? reinterpret_cast<const void*>(persistent_kernel<true, false>)
                             : reinterpret_cast<const void*>(persistent_kernel<true, true>);
    int per_sm = 0;
    R3_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
    R3_CHECK(blocks_per_sm <= per_sm, "stage chain: ", blocks_per_sm, " blocks an SM, ", per_sm, " fit");
    const unsigned blocks = static_cast<unsigned>((blocks_per_sm > 0 ? blocks_per_sm : per_sm) * state.sm_count);
    persistent_blocks = blocks;
    unsigned* arrived = barrier;
    unsigned* generation = barrier + 1;
    void* args[] = {&c, &arrived, &generation};
    ms = mean_ms(
        gpu, [&] { R3_CUDA_CHECK(cudaLaunchCooperativeKernel(kernel, blocks, kThreads, args, 0, stream)); }, 2, 10);
  }
  R3_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaFree(barrier);
  cudaFree(c.sink);
  cudaFree(c.small);
  cudaFree(bytes);
  StageChainTiming t;
  t.ms_per_layer = ms / layers;
  t.tb_per_s = stage_chain_bytes_per_layer(weights) / (t.ms_per_layer * 1e-3) / 1e12;
  t.blocks = static_cast<int>(persistent_blocks);
  return t;
}

}  // namespace r3::bench
