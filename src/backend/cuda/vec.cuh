// Vector loads of N consecutive elements widened to f32: one 4-, 8- or 16-byte transaction when the
// row is aligned for it (the callers check), element by element otherwise.
#pragma once
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"

namespace ingot::cuda {

template <typename T, int N, bool kAligned>
__device__ __forceinline__ void load_f(const T* p, float (&out)[N]) {
  constexpr int bytes = int(sizeof(T)) * N;
  if constexpr (kAligned && (bytes == 16 || bytes == 8 || bytes == 4)) {
    alignas(16) T tmp[N];
    if constexpr (bytes == 16) *reinterpret_cast<uint4*>(tmp) = *reinterpret_cast<const uint4*>(p);
    else if constexpr (bytes == 8) *reinterpret_cast<uint2*>(tmp) = *reinterpret_cast<const uint2*>(p);
    else *reinterpret_cast<uint32_t*>(tmp) = *reinterpret_cast<const uint32_t*>(p);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_f(tmp[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_f(p[i]);
  }
}

// N consecutive elements (N * sizeof(T) a multiple of 16, 16-byte aligned) in 16-byte loads.
template <typename T, int N>
__device__ __forceinline__ void load_row(const T* p, float (&out)[N]) {
  constexpr int V = 16 / int(sizeof(T));
  static_assert(N % V == 0, "load_row needs whole 16-byte vectors");
#pragma unroll
  for (int c = 0; c < N / V; ++c) {
    float tmp[V];
    load_f<T, V, true>(p + c * V, tmp);
#pragma unroll
    for (int i = 0; i < V; ++i) out[c * V + i] = tmp[i];
  }
}

// The 16 bytes of one vector load already in registers, widened to f32 (16 / sizeof(T) elements).
template <typename T>
__device__ __forceinline__ void widen16(const uint4& raw, float (&out)[16 / sizeof(T)]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (sizeof(T) == 4) {
      out[i] = __uint_as_float(words[i]);
    } else {
      float2 f;
      if constexpr (std::is_same_v<T, __half>) f = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
      else f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
}

}  // namespace ingot::cuda
