// The one-token weight-streaming product kernel of gemv.cu (y = x w^T, optionally with the SwiGLU
// epilogue), a template over its split of the row: S warps per output row, U 16-byte loads in flight
// per lane, R rows per block, kPipe the next step's loads issued before this step's math. gemv.cu picks
// the instance by K; bench/gemv_lab.cu times the instances against each other (how gemv.cu's choice
// was made). Accumulation is f32 in a fixed order, so results do not depend on launch or graph replay.
// Tx is the activation type of x and y: T itself, or f32 with 16-bit weights (the CUDA backend of f32
// activations), where x is read unrounded and the weight widened in registers as the CPU backend does.
#pragma once
#include "backend/cuda/vec.cuh"

namespace ingot::cuda::gemv {

constexpr int kPrefetchBytes = 4096;  // per row, before the dependency wait (without a bulk prefetch)

struct GemvArgs {
  const void* x;     // [K] Tx
  const void* w;     // [N (2N with SwiGLU), K] T, w_ld elements between rows
  int64_t w_ld;
  const void* bias;  // [N] T or null
  void* y;           // [N] Tx
  int N, K;
  // Bulk prefetch before the wait (gemv.cu, prefetch_plan): block b streams bytes
  // [b * pf_share, min((b + 1) * pf_share, pf_bytes)) of every weight region (the gate and the up rows
  // are two regions) into L2, an empty range past the first blocks: the head of the weight the first
  // waves read. pf_bytes 0: no bulk prefetch; each block then prefetches the head of its own rows.
  int64_t pf_bytes, pf_share;
};

// kSwiglu: the warp computes gate row n and up row n + N of w ([2N, K]) and writes
// silu(gate) * up, each rounded to Tx first exactly as linear followed by swiglu would round them.
// kPipe: the next step's loads are issued before this step's math (two register buffers).
template <typename T, int S, int U, int R, bool kPipe, bool kSwiglu, bool kEarly, typename Tx = T>
__global__ void __launch_bounds__(R * S * 32) kernel(GemvArgs a) {
  constexpr int V = 16 / int(sizeof(T));  // elements per 16-byte load
  constexpr int RW = kSwiglu ? 2 : 1;     // weight rows per output
  constexpr int step = S * 32 * V;        // elements the row's S warps cover per load slot
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) & 31;
  const int r = warp / S, part = warp % S;
  const int n = int(blockIdx.x) * R + r;
  const int nn = n < a.N ? n : a.N - 1;
  const T* wr[RW];
#pragma unroll
  for (int q = 0; q < RW; ++q) {
    wr[q] = static_cast<const T*>(a.w) + (int64_t(nn) + int64_t(q) * a.N) * a.w_ld;
    if (a.pf_bytes > 0) {
      prefetch_l2_share(static_cast<const char*>(a.w) + int64_t(q) * a.N * a.w_ld * int64_t(sizeof(T)), blockIdx.x,
                        a.pf_share, a.pf_bytes);
      continue;
    }
    const int head = a.K < kPrefetchBytes / int(sizeof(T)) ? a.K : kPrefetchBytes / int(sizeof(T));
    for (int k = (part * 32 + lane) * (128 / int(sizeof(T))); k < head; k += S * 32 * (128 / int(sizeof(T))))
      prefetch_l2_line(wr[q] + k);
  }
  const Tx* x = static_cast<const Tx*>(a.x);  // read only after the wait
  float acc[RW];
#pragma unroll
  for (int q = 0; q < RW; ++q) acc[q] = 0.f;

  // Loads of one step: U slots per row, predicated past K when `tail` (K is a multiple of V). Full
  // steps run unpredicated so the compiler keeps every load in flight.
  auto load = [&](uint4 (&raw)[U][RW], int k, bool tail) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int q = 0; q < RW; ++q) {
        const int kk = k + u * step;
        raw[u][q] = !tail || kk < a.K ? __ldg(reinterpret_cast<const uint4*>(wr[q] + kk)) : make_uint4(0, 0, 0, 0);
      }
  };
  auto math = [&](const uint4 (&raw)[U][RW], int k, bool tail) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kk = k + u * step;
      if (tail && kk >= a.K) break;
      float xv[V];
      load_row<Tx, V>(x + kk, xv);  // one 16-byte load for Tx = T, two for f32 x beside 16-bit w
#pragma unroll
      for (int q = 0; q < RW; ++q) {
        float wv[V];
        widen16<T>(raw[u][q], wv);
#pragma unroll
        for (int i = 0; i < V; ++i) acc[q] += wv[i] * xv[i];
      }
    }
  };
  const int k0 = (part * 32 + lane) * V;
  // The first step's weights: with kEarly they are loaded before the wait, so a block made
  // resident while the kernel before still runs (that kernel triggers first: pdl_trigger_then_wait)
  // has its first loads in flight by the time x is ready (for K up to U * step, its whole rows).
  // A full first step loads unpredicated, as the loop's full steps do. Without kEarly the kernel is
  // the one before early loads, instruction for instruction (gemv.cu's A/B knob).
  uint4 A[U][RW];
  [[maybe_unused]] const bool full0 = !kPipe && k0 + (U - 1) * step < a.K;
  if constexpr (kEarly) {
    if (full0) load(A, k0, false);
    else load(A, k0, true);
  }
  pdl_wait();
  pdl_trigger();
  if constexpr (!kPipe) {
    int k = k0;
    if constexpr (kEarly) {
      if (full0) math(A, k0, false);
      else math(A, k0, true);
      k += U * step;
    }
    for (; k + (U - 1) * step < a.K; k += U * step) {
      uint4 raw[U][RW];
      load(raw, k, false);
      math(raw, k, false);
    }
    if (k < a.K) {
      uint4 raw[U][RW];
      load(raw, k, true);
      math(raw, k, true);
    }
  } else {
    uint4 B[U][RW];
    int k = k0;
    if constexpr (!kEarly) load(A, k, true);
    while (k < a.K) {
      const int kb = k + U * step;
      if (kb < a.K) load(B, kb, true);
      math(A, k, true);
      k = kb;
      if (k >= a.K) break;
      const int ka = k + U * step;
      if (ka < a.K) load(A, ka, true);
      math(B, k, true);
      k = ka;
    }
  }
#pragma unroll
  for (int q = 0; q < RW; ++q)
    for (int o = 16; o > 0; o >>= 1) acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], o);
  if constexpr (S > 1) {
    __shared__ float partial[R][S][RW];  // the row's S warp sums, added in warp order below
    if (lane == 0)
#pragma unroll
      for (int q = 0; q < RW; ++q) partial[r][part][q] = acc[q];
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int q = 0; q < RW; ++q) {
      float s = 0.f;
#pragma unroll
      for (int p = 0; p < S; ++p) s += partial[r][p][q];
      acc[q] = s;
    }
  }
  if (lane != 0 || n >= a.N) return;
  float v;
  if constexpr (kSwiglu) {
    const float g = to_f(from_f<Tx>(acc[0])), u = to_f(from_f<Tx>(acc[1]));
    v = silu_mul(g, u);
  } else {
    v = acc[0];
    if (a.bias) v += to_f(static_cast<const T*>(a.bias)[n]);
  }
  static_cast<Tx*>(a.y)[n] = from_f<Tx>(v);
}

}  // namespace ingot::cuda::gemv
