#include "dist/reduce.h"

#include <cstring>
#include <string>

#include "core/error.h"

namespace ingot {

void check_reduce_dtype(DType dtype) {
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16)
    throw Error("all_reduce_sum: " + std::string(dtype_name(dtype)) + " buffers are not supported");
}

void sum_in_rank_order(const void* const* parts, int world, int64_t count, DType dtype, void* out,
                       std::vector<float>& sum, std::vector<float>& widened) {
  check_reduce_dtype(dtype);
  sum.assign(size_t(count), 0.0f);
  widened.resize(dtype == DType::F32 ? 0 : size_t(count));
  for (int r = 0; r < world; ++r) {
    const float* src = static_cast<const float*>(parts[r]);
    if (dtype != DType::F32) {
      convert_to_f32(dtype, parts[r], widened.data(), size_t(count));
      src = widened.data();
    }
    if (r == 0) {
      if (count > 0) std::memcpy(sum.data(), src, size_t(count) * sizeof(float));
    } else {
      for (int64_t i = 0; i < count; ++i) sum[size_t(i)] += src[i];
    }
  }
  convert_from_f32(dtype, sum.data(), out, size_t(count));
}

}  // namespace ingot
