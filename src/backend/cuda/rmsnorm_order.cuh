// The one order in which the add + RMSNorm of a row sums its squares, shared by the standalone kernel
// (rmsnorm.cu, a block of 512 threads per row) and the products that normalise their input row in
// their own prologue (int4_gemv_kernel.cuh's kNorm instances, blocks of 64-512 threads), so that fusing
// the norm into a product changes no bit of its input. Written by hand (a reduction order is ours to
// fix; no library gives one).
//
// The order: the row's 16-byte vectors belong to 512 virtual threads, virtual thread v taking vectors
// v, v + 512, ... (at most kMaxVecs of them); each sums its squares vector by vector, element by element;
// each virtual warp (32 consecutive virtual threads) adds its 32 sums by an xor-shuffle tree; the 16
// warp sums are added by one more xor tree over 32 lanes (zeros past 16). A block of BT threads runs
// virtual threads threadIdx.x + k * BT for k < 512 / BT.
#pragma once
#include "backend/cuda/vec.cuh"

namespace ingot::cuda::rmsnorm {

constexpr int kVirtualThreads = 512;
constexpr int kMaxVecs = 4;  // 16-byte vectors a virtual thread takes: up to 16,384 16-bit columns
constexpr int kWarpSums = kVirtualThreads / 32;

// Vectors a virtual thread takes for a row of `nvec` vectors (0 when the row has more than
// kMaxVecs * 512: such rows take the scalar kernel, in its own order, and are never fused).
__host__ __device__ constexpr int vecs_per_thread(int64_t nvec) {
  const int64_t v = (nvec + kVirtualThreads - 1) / kVirtualThreads;
  return v <= kMaxVecs ? int(v) : 0;
}

// The row's sum of squares, returned to every thread of the block, from each virtual thread's own sum
// ss[k] (virtual thread threadIdx.x + k * BT). red: kWarpSums floats of shared memory. Two barriers;
// on return red may be reused after one more barrier.
template <int BT>
__device__ __forceinline__ float block_sum(const float (&ss)[kVirtualThreads / BT], float* red) {
  static_assert(BT % 32 == 0 && kVirtualThreads % BT == 0, "a block of whole warps dividing 512");
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) / 32;
#pragma unroll
  for (int k = 0; k < kVirtualThreads / BT; ++k) {
    float v = ss[k];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[warp + k * (BT / 32)] = v;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = lane < kWarpSums ? red[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[0] = v;
  }
  __syncthreads();
  return red[0];
}

// One row's add + RMSNorm into shared memory, as add_rmsnorm_vec_kernel<T, NV> computes it, for a
// block of BT threads: r = round(x + delta) (delta optional) into xs, then xs[i] = round(w[i] * (r[i]
// * inv)) with inv = rsqrt(sum of r^2 / K + eps). The weight w is in T. Every load of the row is issued
// before any arithmetic (one round trip to L2). x_out (or null): block 0's copy of r, the residual
// stream after the add, written to a buffer other than x (the other blocks of the grid still read x).
// xs: K elements of shared memory; red: kWarpSums floats. K a multiple of the vector width with
// vecs_per_thread(K / V) == NV. Ends with a barrier: xs is ready for every thread.
template <typename T, int NV, int BT>
__device__ __forceinline__ void add_rmsnorm_row(const T* x, const T* delta, const T* w, float eps, T* x_out, int K,
                                                T* xs, float* red) {
  constexpr int V = 16 / int(sizeof(T)), VT = kVirtualThreads / BT;
  const int nvec = K / V;
  uint4 xr[VT][NV], dr[VT][NV], wr[VT][NV];
#pragma unroll
  for (int k = 0; k < VT; ++k)
#pragma unroll
    for (int c = 0; c < NV; ++c) {
      const int vi = int(threadIdx.x) + k * BT + c * kVirtualThreads;
      if (vi < nvec) {
        xr[k][c] = reinterpret_cast<const uint4*>(x)[vi];
        if (delta) dr[k][c] = reinterpret_cast<const uint4*>(delta)[vi];
        wr[k][c] = reinterpret_cast<const uint4*>(w)[vi];
      }
    }
  float ss[VT];
#pragma unroll
  for (int k = 0; k < VT; ++k) {
    ss[k] = 0.f;
#pragma unroll
    for (int c = 0; c < NV; ++c) {
      const int vi = int(threadIdx.x) + k * BT + c * kVirtualThreads;
      if (vi >= nvec) break;
      float v[V];
      widen16<T>(xr[k][c], v);
      alignas(16) T r[V];
      if (delta) {
        float dv[V];
        widen16<T>(dr[k][c], dv);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          r[i] = from_f<T>(v[i] + dv[i]);
          v[i] = to_f(r[i]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) r[i] = from_f<T>(v[i]);
      }
      reinterpret_cast<uint4*>(xs)[vi] = *reinterpret_cast<const uint4*>(r);
      if (x_out && blockIdx.x == 0) reinterpret_cast<uint4*>(x_out)[vi] = *reinterpret_cast<const uint4*>(r);
#pragma unroll
      for (int i = 0; i < V; ++i) ss[k] += v[i] * v[i];
    }
  }
  const float inv = rsqrtf(block_sum<BT>(ss, red) / float(K) + eps);
  // Each thread rescales the vectors it wrote.
#pragma unroll
  for (int k = 0; k < VT; ++k)
#pragma unroll
    for (int c = 0; c < NV; ++c) {
      const int vi = int(threadIdx.x) + k * BT + c * kVirtualThreads;
      if (vi >= nvec) break;
      float v[V], wv[V];
      widen16<T>(reinterpret_cast<const uint4*>(xs)[vi], v);
      widen16<T>(wr[k][c], wv);
      alignas(16) T o[V];
#pragma unroll
      for (int i = 0; i < V; ++i) o[i] = from_f<T>(wv[i] * (v[i] * inv));
      reinterpret_cast<uint4*>(xs)[vi] = *reinterpret_cast<const uint4*>(o);
    }
  __syncthreads();
}

}  // namespace ingot::cuda::rmsnorm
