// Vector loads of N consecutive elements widened to f32: one 4-, 8- or 16-byte transaction when the
// row is aligned for it (the callers check), element by element otherwise.
#pragma once
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

}  // namespace ingot::cuda
