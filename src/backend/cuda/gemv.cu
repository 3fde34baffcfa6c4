// y = x w^T (+bias) for few tokens (one, kMaxGemvTokens, is what it runs): a weight-streaming kernel (cuBLASLt's GEMM tiles waste most of
// their work at this size). Each warp owns one output row, reads it with 16-byte loads, several
// in flight per lane, and keeps the tokens' partial sums in registers; x is re-read from L1/L2.
// With the SwiGLU epilogue a warp reads the gate row and the up row of one output, so the MLP's gate/up
// product and its activation are one kernel for decode.
// Weights depend on no earlier kernel, so the head of each row is prefetched into L2 before waiting
// for the previous kernel (programmatic dependent launch): the stream's ramp-up overlaps its drain.
// Accumulation is f32 in a fixed order, so results do not depend on launch or graph replay.
#include <type_traits>

#include "backend/cuda/vec.cuh"

namespace ingot::cuda {
namespace {

// 16-byte weight loads in flight per lane: four for a plain row (more registers would cost occupancy
// and leave a partial second wave of blocks for N = 4096), four per row for the gate/up pair.
constexpr int kLoadsPerRow = 4;
constexpr int kWarps = 4;
constexpr int kPrefetchBytes = 4096;  // per row, before the dependency wait

struct GemvArgs {
  const void* x;
  int64_t x_ld;
  const void* w;
  int64_t w_ld;
  const void* bias;
  void* y;
  int64_t y_ld;
  int T, N, K;
};

// kSwiglu: the warp computes gate row n and up row n + N of w ([2N, K]) and writes
// silu(gate) * up, each rounded to T first exactly as linear followed by swiglu would round them.
template <typename T, int NT, bool kSwiglu>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(GemvArgs a) {
  constexpr int V = 16 / int(sizeof(T));  // elements per 16-byte load
  constexpr int R = kSwiglu ? 2 : 1;      // weight rows per warp
  constexpr int U = kLoadsPerRow;         // loads in flight per row
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int n0 = blockIdx.x * kWarps + warp;
  const T* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    wr[r] = static_cast<const T*>(a.w) + (int64_t(min(n0, a.N - 1)) + int64_t(r) * a.N) * a.w_ld;
    const int64_t head = a.K < kPrefetchBytes / int(sizeof(T)) ? a.K : kPrefetchBytes / int(sizeof(T));
    for (int64_t k = int64_t(lane) * 128 / int(sizeof(T)); k < head; k += 32 * 128 / int(sizeof(T)))
      asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[r] + k));
  }
  pdl_wait();
  pdl_trigger();
  if (n0 >= a.N) return;
  const T* x = static_cast<const T*>(a.x);

  float acc[NT][R];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[t][r] = 0.f;

  // Each step issues all its loads before any math. Full steps run unpredicated (so the compiler keeps
  // every load in flight); one predicated step takes the tail (K is a multiple of V), so short rows
  // (K = 1024: one step) also have all their loads in flight at once.
  constexpr int step = 32 * V;
  auto body = [&](int k, auto tail) {
    float wv[U][R][V];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (!decltype(tail)::value || k + u * step < a.K) {
          load_f<T, V, true>(wr[r] + k + u * step, wv[u][r]);
        } else {
#pragma unroll
          for (int i = 0; i < V; ++i) wv[u][r][i] = 0.f;
        }
      }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= a.T) break;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (decltype(tail)::value && k + u * step >= a.K) break;
        float xv[V];
        load_f<T, V, true>(x + int64_t(t) * a.x_ld + k + u * step, xv);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int i = 0; i < V; ++i) acc[t][r] += wv[u][r][i] * xv[i];
      }
    }
  };
  int k = lane * V;
  for (; k + (U - 1) * step < a.K; k += U * step) body(k, std::false_type{});
  if (k < a.K) body(k, std::true_type{});
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int r = 0; r < R; ++r)
      for (int o = 16; o > 0; o >>= 1) acc[t][r] += __shfl_xor_sync(0xffffffffu, acc[t][r], o);
  if (lane == 0) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= a.T) break;
      float v;
      if constexpr (kSwiglu) {
        const float g = to_f(from_f<T>(acc[t][0])), u = to_f(from_f<T>(acc[t][1]));
        v = silu_mul(g, u);
      } else {
        v = acc[t][0];
        if (a.bias) v += to_f(static_cast<const T*>(a.bias)[n0]);
      }
      static_cast<T*>(a.y)[int64_t(t) * a.y_ld + n0] = from_f<T>(v);
    }
  }
}

template <typename T, int NT, bool kSwiglu>
void launch_nt(const GemvArgs& a, cudaStream_t s) {
  const unsigned blocks = unsigned((a.N + kWarps - 1) / kWarps);
  launch("gemv_kernel", gemv_kernel<T, NT, kSwiglu>, dim3(blocks), dim3(kWarps * 32), 0, s, a);
}

// Tokens the GEMV kernel takes. One: on the H200 (Qwen3-8B shapes, bf16, 2026-12-02) cuBLASLt was
// faster from two tokens on, and far faster at eight (decode tok/s at batch 2/4/8: 377/749/1,435
// with cuBLASLt against 358/605/596 with this kernel), whose per-token passes do not reuse a weight
// load across tokens well enough.
constexpr int kMaxGemvTokens = 1;

template <bool kSwiglu>
void launch_any(DType dt, const GemvArgs& a, cudaStream_t s) {
  dispatch(dt, "linear", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_nt<T, kMaxGemvTokens, kSwiglu>(a, s);
  });
}

// Whether the GEMV kernel takes x [T, K], w [rows, K] and y: one token, one dtype, 16-byte rows.
bool gemv_suits(const Mat& x, const Mat& w, const Mat& y) {
  if (x.rows < 1 || x.rows > kMaxGemvTokens || x.dtype != w.dtype || y.dtype != w.dtype) return false;
  const int64_t V = 16 / int64_t(dtype_size(w.dtype));
  const size_t es = dtype_size(w.dtype);
  return w.cols % V == 0 && aligned16(w.data, w.ld, es) && aligned16(x.data, x.ld, es) && w.rows <= INT32_MAX &&
         w.cols <= INT32_MAX;
}

}  // namespace

bool launch_gemv(const Mat& x, const Mat& w, const void* bias, const Mat& y, cudaStream_t s) {
  if (!gemv_suits(x, w, y)) return false;
  const GemvArgs a{x.data, x.ld, w.data, w.ld, bias, y.data, y.ld, int(x.rows), int(w.rows), int(w.cols)};
  launch_any<false>(w.dtype, a, s);
  return true;
}

bool launch_gemv_swiglu(const Mat& x, const Mat& w_gate_up, const Mat& out, cudaStream_t s) {
  if (!gemv_suits(x, w_gate_up, out) || w_gate_up.rows % 2 != 0) return false;
  const GemvArgs a{x.data, x.ld, w_gate_up.data, w_gate_up.ld, nullptr, out.data, out.ld,
                   int(x.rows), int(w_gate_up.rows / 2), int(w_gate_up.cols)};
  launch_any<true>(w_gate_up.dtype, a, s);
  return true;
}

}  // namespace ingot::cuda
