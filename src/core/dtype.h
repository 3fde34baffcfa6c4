// Element types and scalar conversions shared by the host code and the backends.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/error.h"

namespace ingot {

// U8 holds packed INT4 weights (two 4-bit values a byte, src/quant/int4.h); no activation is ever U8.
enum class DType : uint8_t { F32, F16, BF16, I32, I64, U8, I8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::I8: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
    case DType::I8: return "i8";
  }
  return "?";
}

// Accepts our short names and the usual long spellings (fp16, float16, bfloat16, ...).
DType parse_dtype(std::string_view name);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of a floating dtype to f32.
void convert_to_f32(DType src_type, const void* src, float* dst, size_t n);
// Converts n f32 values to a floating dtype.
void convert_from_f32(DType dst_type, const float* src, void* dst, size_t n);

}  // namespace ingot
