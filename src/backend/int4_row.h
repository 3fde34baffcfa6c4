// Dequantization of one packed INT4 row (layout in quant/int4.h): here, below the models, because
// every backend's reference path and the quantizer share it.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace ingot {

// out[k] = (nibble k - zero) * scale of k's group, exactly (one f32 product per value); packed holds
// cols/2 bytes (value 2i in the low nibble of byte i), scales cols/group_size values in scale_dtype,
// zeros (null: every zero is 8) cols/group_size bytes in 0..15.
inline void dequantize_int4_row(const uint8_t* packed, const void* scales, DType scale_dtype, int64_t cols,
                                int64_t group_size, float* out, const uint8_t* zeros = nullptr) {
  const int64_t groups = cols / group_size;
  for (int64_t k = 0; k < groups; ++k) {
    float s;
    convert_to_f32(scale_dtype, static_cast<const uint8_t*>(scales) + size_t(k) * dtype_size(scale_dtype), &s, 1);
    const int z = zeros ? int(zeros[k]) : 8;
    const uint8_t* p = packed + k * group_size / 2;
    float* o = out + k * group_size;
    for (int64_t i = 0; i < group_size / 2; ++i) {
      o[2 * i] = float(int(p[i] & 0xf) - z) * s;
      o[2 * i + 1] = float(int(p[i] >> 4) - z) * s;
    }
  }
}

}  // namespace ingot
