// Residual add fused with RMSNorm: x += delta (optional), out = rmsnorm(x) * weight, one block per
// token. The sum of squares is taken over the stored (rounded) residual, accumulated in f32.
#include "backend/cuda/cuda_common.cuh"

namespace ingot::cuda {
namespace {

struct RmsNormArgs {
  void* x;
  int64_t x_ld;
  const void* delta;
  int64_t delta_ld;
  const void* weight;
  DType weight_dtype;
  float eps;
  void* out;
  int64_t out_ld, cols;
};

constexpr int kThreads = 512;

template <typename T>
__global__ void __launch_bounds__(kThreads) add_rmsnorm_kernel(RmsNormArgs a) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  T* x = static_cast<T*>(a.x) + t * a.x_ld;
  const T* d = a.delta ? static_cast<const T*>(a.delta) + t * a.delta_ld : nullptr;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < a.cols; i += kThreads) {
    float v = to_f(x[i]);
    if (d) {
      const T r = from_f<T>(v + to_f(d[i]));
      x[i] = r;
      v = to_f(r);
    }
    ss += v * v;
  }
  __shared__ float red[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < kThreads / 32 ? red[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  const float inv = rsqrtf(red[0] / float(a.cols) + a.eps);
  T* o = static_cast<T*>(a.out) + t * a.out_ld;
  // Each thread re-reads only the elements it wrote itself, so no barrier is needed for x.
  for (int64_t i = threadIdx.x; i < a.cols; i += kThreads)
    o[i] = from_f<T>(load_any(a.weight, a.weight_dtype, i) * (to_f(x[i]) * inv));
}

}  // namespace

void launch_add_rmsnorm(const Mat& x, const Mat* delta, const void* weight, DType wt, float eps, const Mat& out,
                        cudaStream_t s) {
  if (x.rows == 0) return;
  if (out.dtype != x.dtype || (delta && delta->dtype != x.dtype))
    throw Error("cuda backend: add_rmsnorm operands must share the activation dtype");
  RmsNormArgs a{x.data, x.ld, delta ? delta->data : nullptr, delta ? delta->ld : 0, weight, wt, eps,
                out.data, out.ld, x.cols};
  dispatch(x.dtype, "add_rmsnorm", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch("add_rmsnorm_kernel", add_rmsnorm_kernel<T>, dim3(unsigned(x.rows)), dim3(kThreads), 0, s, a);
  });
}

}  // namespace ingot::cuda
