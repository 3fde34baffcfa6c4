// The warp-level tensor-core pieces the attention kernels share (attention_prefill.cu,
// attention_decode_mma.cu): mma.sync m16n8k16 with f32 accumulation for f16/bf16, packing two f32 into
// an operand register, ldmatrix (plain and transposed), 16-byte cp.async with zero fill and the online
// softmax over one tile of scores in accumulator layout; and the
// end of the few-token products whose 16-row tiles are split over warps by K (tc_gemv_kernel.cuh,
// int4_gemv_kernel.cuh).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace ingot::cuda::mma {

template <typename T> struct Mma;
template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, bypassing L1; zero-filled when !valid (src is then not read). The memory
// clobbers keep the compiler from moving shared-memory reads across the copies and the wait: a thread
// that reads back only what it copied itself needs no barrier beyond cp_async_wait.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Keys k0 .. k0 + ROWS - 1 of one head's K and V (rows of CH 16-byte chunks, `stride` elements apart,
// starting at k + base and v + base) into the shared tiles dk and dv (row pitch SD elements), copied by
// the block's THREADS threads as one commit group; rows at or past `end` are zero-filled, not read.
template <int ROWS, int CH, int SD, int THREADS, typename T>
__device__ __forceinline__ void cp_async_kv_tile(T* dk, T* dv, const T* k, const T* v, int64_t base, int64_t stride,
                                                 int k0, int end) {
  for (int i = threadIdx.x; i < ROWS * CH; i += THREADS) {
    const int r = i / CH, c = i % CH, j = k0 + r;
    const bool ok = j < end;
    const int64_t off = ok ? base + int64_t(j) * stride + c * 8 : 0;
    cp_async16(dk + r * SD + c * 8, k + off, ok);
    cp_async16(dv + r * SD + c * 8, v + off, ok);
  }
  cp_async_commit();
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// The online-softmax update of one tile of keys for the two query rows a lane's accumulators hold
// (row a = g: elements 0 and 1; row b = g + 8: elements 2 and 3; the 4 lanes of a quad share a row):
// the scores s[n][e | 2 + e] of key j0 + 8n + 2tq + e are scaled by scale_log2 where valid(key, row)
// (row 0 for a, 1 for b) and set to -inf elsewhere; the running maxima m_a / m_b take the tile's (over
// the quad), the lane's partial sums l_a / l_b and the output rows o are rescaled to them, and s is left
// holding exp2(score - max), the P of the P V product that follows. A row with nothing visible yet keeps
// max -inf and uses 0 in the exponent, so exp2 gives 0, never NaN.
template <int NS, int NO, class Valid>
__device__ __forceinline__ void online_softmax_tile(float (&s)[NS][4], float (&o)[NO][4], float& m_a, float& m_b,
                                                    float& l_a, float& l_b, float scale_log2, int j0, int tq,
                                                    Valid valid) {
  float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
  for (int n = 0; n < NS; ++n) {
    const int j = j0 + n * 8 + tq * 2;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      s[n][e] = valid(j + e, 0) ? s[n][e] * scale_log2 : -INFINITY;
      s[n][2 + e] = valid(j + e, 1) ? s[n][2 + e] * scale_log2 : -INFINITY;
      mx_a = fmaxf(mx_a, s[n][e]);
      mx_b = fmaxf(mx_b, s[n][2 + e]);
    }
  }
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, o2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, o2));
  }
  const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
  const float use_a = mn_a == -INFINITY ? 0.f : mn_a, use_b = mn_b == -INFINITY ? 0.f : mn_b;
  const float corr_a = exp2f(m_a - use_a), corr_b = exp2f(m_b - use_b);
  m_a = mn_a;
  m_b = mn_b;
  float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
  for (int n = 0; n < NS; ++n) {
    s[n][0] = exp2f(s[n][0] - use_a);
    s[n][1] = exp2f(s[n][1] - use_a);
    s[n][2] = exp2f(s[n][2] - use_b);
    s[n][3] = exp2f(s[n][3] - use_b);
    sum_a += s[n][0] + s[n][1];
    sum_b += s[n][2] + s[n][3];
  }
  l_a = l_a * corr_a + sum_a;  // per-lane partial sums, reduced over the quad at the end
  l_b = l_b * corr_b + sum_b;
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    o[n][0] *= corr_a;
    o[n][1] *= corr_a;
    o[n][2] *= corr_b;
    o[n][3] *= corr_b;
  }
}

// The sum of a 16-row tile split over S warps by K: c is the calling warp's C fragment (lane (g, t):
// rows g and g + 8, tokens 2t and 2t + 1). With S > 1 the tile's warps (part 0..S-1) meet in
// `partial`, the tile's [S][4][32] floats of shared memory, and are added in warp order, so the sums
// do not depend on scheduling; every warp of the block must call it then (it waits on the block's
// barrier). True for the warp that holds the sum in c (part 0).
template <int S>
__device__ __forceinline__ bool sum_tile(float (&c)[4], float (*partial)[4][32], int part, int lane) {
  if constexpr (S > 1) {
#pragma unroll
    for (int e = 0; e < 4; ++e) partial[part][e][lane] = c[e];
    __syncthreads();
    if (part != 0) return false;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = 0.f;
#pragma unroll
      for (int q = 0; q < S; ++q) v += partial[q][e][lane];
      c[e] = v;
    }
  }
  return true;
}

// The end of a product whose 16-row tile is split over S warps by K (sum_tile): outputs n0 + g and
// n0 + g + 8, tokens tok0 + 2t and tok0 + 2t + 1; warp 0 of the tile adds the bias and writes the
// outputs inside a.T x a.N. Args: the kernel's arguments (T, N, bias, y, y_ld).
template <typename T, int S, typename Args>
__device__ __forceinline__ void store_tile(const Args& a, float (&c)[4], float (*partial)[4][32], int part, int lane,
                                           int n0, int tok0) {
  if (!sum_tile<S>(c, partial, part, lane)) return;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int tok = tok0 + 2 * t + (e & 1), out = n0 + g + (e >= 2 ? 8 : 0);
    if (tok < a.T && out < a.N) {
      float v = c[e];
      if (a.bias) v += to_f(static_cast<const T*>(a.bias)[out]);
      static_cast<T*>(a.y)[int64_t(tok) * a.y_ld + out] = from_f<T>(v);
    }
  }
}

}  // namespace ingot::cuda::mma
