// Scalar dtype conversions. The CPU hot loops use their own vectorised paths; these are for loading,
// transforming and testing.
#include "core/dtype.h"

#include <cmath>

namespace ingot {

DType parse_dtype(std::string_view n) {
  if (n == "f32" || n == "fp32" || n == "float32" || n == "float" || n == "F32") return DType::F32;
  if (n == "f16" || n == "fp16" || n == "float16" || n == "half" || n == "F16") return DType::F16;
  if (n == "bf16" || n == "bfloat16" || n == "BF16") return DType::BF16;
  throw Error("unknown dtype '" + std::string(n) + "' (expected f32, f16 or bf16)");
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | (exp + 112) << 23 | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t absb = bits & 0x7fffffffu;
  if (absb > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (absb >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow (incl. rounding) to inf
  if (absb < 0x38800000u) {  // result is subnormal or zero: round at the subnormal grid
    float a;
    std::memcpy(&a, &absb, 4);
    // 2^-24 is the f16 subnormal step; nearbyint rounds half to even in the default mode.
    uint32_t m = uint32_t(std::nearbyint(a * 16777216.0f));
    return uint16_t(sign | m);
  }
  uint32_t e = ((absb >> 23) - 112) << 10;
  uint32_t m = (absb >> 13) & 0x3ffu;
  uint32_t rest = absb & 0x1fffu;
  uint32_t h = e | m;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    default: throw Error("convert_to_f32: not a floating dtype: " + std::string(dtype_name(t)));
  }
}

void convert_from_f32(DType t, const float* src, void* dst, size_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    default: throw Error("convert_from_f32: not a floating dtype: " + std::string(dtype_name(t)));
  }
}

}  // namespace ingot
