// What the CUDA conformance tests share: a backend with the buffers a test placed on it (values cross
// as f32 vectors, rounded to the tested dtype on the way in), the per-dtype tolerances of a kernel
// against the CPU reference, and the elementwise comparison that reports the first and the worst
// difference.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"

namespace ingot::test {

// One backend plus the buffers a test placed on it.
struct Side {
  Backend& be;
  DType dt;
  std::vector<Buffer> keep;
  void* put(const std::vector<float>& v, DType as) {
    std::vector<uint8_t> raw(v.size() * dtype_size(as));
    convert_from_f32(as, v.data(), raw.data(), v.size());
    keep.emplace_back(be, std::max<size_t>(raw.size(), 1));
    be.upload(keep.back().get(), raw.data(), raw.size());
    return keep.back().get();
  }
  void* put(const std::vector<float>& v) { return put(v, dt); }
  float* put_f32(const std::vector<float>& v) { return static_cast<float*>(put(v, DType::F32)); }
  int32_t* put_i32(const std::vector<int32_t>& v) {
    keep.emplace_back(be, std::max<size_t>(v.size() * 4, 4));
    be.upload(keep.back().get(), v.data(), v.size() * 4);
    return keep.back().as<int32_t>();
  }
  std::vector<float> get(const void* p, size_t n, DType as) {
    std::vector<uint8_t> raw(n * dtype_size(as));
    be.download(raw.data(), p, raw.size());
    std::vector<float> out(n);
    convert_to_f32(as, raw.data(), out.data(), n);
    return out;
  }
  std::vector<float> get(const void* p, size_t n) { return get(p, n, dt); }
  std::vector<int32_t> get_i32(const int32_t* p, size_t n) {
    std::vector<int32_t> out(n);
    be.download(out.data(), p, n * 4);
    return out;
  }
  Mat m(void* p, int64_t rows, int64_t cols, int64_t ld = 0) { return {p, dt, rows, cols, ld ? ld : cols}; }
};

struct Tol {
  double atol, rtol;
};

Tol tol_for(DType dt) {
  switch (dt) {
    case DType::F32: return {2e-5, 1e-4};
    case DType::F16: return {3e-3, 3e-3};
    default: return {2e-2, 2e-2};
  }
}
void expect_close(const std::vector<float>& got, const std::vector<float>& want, Tol t, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(want[i]));
    if (!(d <= t.atol + t.rtol * std::fabs(double(want[i])))) {
      if (bad++ == 0) first = i;
    }
    if (!(d <= worst)) worst = d;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ; first at " << first
                     << " (got " << got[first] << ", want " << want[first] << "), max |diff| " << worst;
}

#ifdef INGOT_WITH_CUDA
// A conformance fixture over one dtype: the CUDA backend in that dtype beside the f32 CPU reference,
// each with its Side; skips without a GPU.
class CudaVsCpu : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: the CUDA backend's conformance tests need a GPU";
    dt_ = GetParam();
    gpu_be_ = make_cuda_backend(dt_);
    cpu_be_ = make_cpu_backend(2);
    gpu_ = std::make_unique<Side>(Side{*gpu_be_, dt_, {}});
    cpu_ = std::make_unique<Side>(Side{*cpu_be_, DType::F32, {}});
  }
  void TearDown() override {
    gpu_.reset();
    cpu_.reset();
  }

  DType dt_ = DType::F32;
  std::unique_ptr<Backend> gpu_be_, cpu_be_;
  std::unique_ptr<Side> gpu_, cpu_;
};
#endif

}  // namespace ingot::test
