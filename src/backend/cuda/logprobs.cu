// The logprobs op on the GPU (definition: backend/logprobs.h): one block per row. A pass for the
// largest finite logit, a pass for the sum of exp(l - max), then one pass per top-N entry, each a
// block max of the 64-bit rank below the previous entry's (N <= 20 passes over a row that sits in L2
// after the first; this op runs only for requests that ask for log-probabilities, outside the
// captured decode graph).
#include <cfloat>

#include "backend/cuda/cuda_common.cuh"
#include "backend/logprobs.h"

namespace ingot::cuda {
namespace {

namespace sp = ingot::sampling;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct LogprobsArgs {
  const void* logits;
  int64_t ld;
  uint32_t vocab;
  const int32_t* chosen;
  int top_n;
  float* chosen_lp;
  int32_t* top_ids;
  float* top_lp;
};

// Block reductions through shared memory; every thread gets the result.
template <typename V, typename Op>
__device__ __forceinline__ V block_reduce(V v, V identity, V* red, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // an earlier reduction's result has been read by every thread
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kWarps ? red[threadIdx.x] : identity;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  return red[0];
}

template <typename T>
__global__ void __launch_bounds__(kThreads) logprobs_kernel(LogprobsArgs a) {
  pdl_wait();
  pdl_trigger();
  __shared__ float redf[kWarps];
  __shared__ unsigned long long redu[kWarps];
  const int r = blockIdx.x;
  const T* row = static_cast<const T*>(a.logits) + int64_t(r) * a.ld;

  float m = -INFINITY;
  for (uint32_t j = threadIdx.x; j < a.vocab; j += kThreads) {
    const float l = to_f(row[j]);
    if (sp::is_finite(l)) m = fmaxf(m, l);
  }
  m = block_reduce(m, -INFINITY, redf, [](float x, float y) { return fmaxf(x, y); });
  float sum = 0.0f;
  if (sp::is_finite(m))
    for (uint32_t j = threadIdx.x; j < a.vocab; j += kThreads) sum += expf(to_f(row[j]) - m);
  sum = block_reduce(sum, 0.0f, redf, [](float x, float y) { return x + y; });
  const float z = sp::is_finite(m) ? logf(sum) : NAN;
  if (threadIdx.x == 0) {
    const int32_t c = a.chosen[r];
    a.chosen_lp[r] = c >= 0 && uint32_t(c) < a.vocab ? (to_f(row[c]) - m) - z : NAN;
  }
  // Entry k is the largest rank below entry k - 1's; ranks are distinct, so none repeats.
  unsigned long long below = ~0ull;
  for (int k = 0; k < a.top_n; ++k) {
    unsigned long long best = 0;
    for (uint32_t j = threadIdx.x; j < a.vocab; j += kThreads) {
      const unsigned long long c = sp::logit_rank(to_f(row[j]), j);
      if (c < below && c > best) best = c;
    }
    best = block_reduce(best, 0ull, redu, [](unsigned long long x, unsigned long long y) { return x > y ? x : y; });
    if (threadIdx.x == 0) {
      const bool real = best != 0;  // fewer tokens than top_n
      const int32_t id = real ? sp::composite_id(best) : sp::kNoToken;
      a.top_ids[int64_t(r) * a.top_n + k] = id;
      a.top_lp[int64_t(r) * a.top_n + k] = real ? (to_f(row[id]) - m) - z : NAN;
    }
    below = best;
  }
}

}  // namespace

void launch_logprobs(const Mat& logits, const int32_t* chosen, int top_n, float* chosen_lp, int32_t* top_ids,
                     float* top_lp, cudaStream_t s) {
  if (logits.rows == 0) return;
  if (top_n < 0 || top_n > sp::kMaxTopLogprobs)
    throw Error("cuda backend: logprobs top_n " + std::to_string(top_n) + " is outside [0, " +
                std::to_string(sp::kMaxTopLogprobs) + "]");
  if (logits.cols < 1 || logits.cols > INT32_MAX)
    throw Error("cuda backend: logprobs over a vocabulary of " + std::to_string(logits.cols) + " tokens");
  if (logits.rows > INT32_MAX) throw Error("cuda backend: logprobs over too many rows");
  LogprobsArgs a{logits.data, logits.ld, uint32_t(logits.cols), chosen, top_n, chosen_lp, top_ids, top_lp};
  dispatch(logits.dtype, "logprobs", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch("logprobs_kernel", logprobs_kernel<T>, dim3(unsigned(logits.rows)), dim3(kThreads), 0, s, a);
  });
}

}  // namespace ingot::cuda
