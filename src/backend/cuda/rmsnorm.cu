// Residual add fused with RMSNorm: x += delta (optional), out = rmsnorm(x) * weight, one block per
// token. The sum of squares is taken over the stored (rounded) residual, accumulated in f32.
//
// Decode runs this on one token between two weight-streaming products, so its latency is on the step's
// critical path (ncu on the H200, Qwen3-8B shapes: 9.8 us a call for 4,096 values when each thread
// walked its values one scalar load at a time, the in-place stores of x keeping the next loads from
// being issued early). The vector kernel gives each thread whole 16-byte vectors, issues every load of
// its row (weight, x, delta) before any arithmetic or store, and so waits out one memory round trip;
// rows it does not take (a width that is not whole vectors, unaligned rows, more than kMaxVecs vectors
// a thread) go to the scalar kernel.
#include "backend/cuda/vec.cuh"

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
constexpr int kMaxVecs = 4;  // 16-byte vectors a thread holds: up to 16,384 16-bit or 8,192 f32 columns

// The block's sum of ss (every thread's), the same value returned to every thread.
__device__ __forceinline__ float block_sum(float ss) {
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
  return red[0];
}

template <typename T>
__global__ void __launch_bounds__(kThreads) add_rmsnorm_kernel(RmsNormArgs a) {
  pdl_trigger_then_wait();
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
  const float inv = rsqrtf(block_sum(ss) / float(a.cols) + a.eps);
  T* o = static_cast<T*>(a.out) + t * a.out_ld;
  // Each thread re-reads only the elements it wrote itself, so no barrier is needed for x.
  for (int64_t i = threadIdx.x; i < a.cols; i += kThreads)
    o[i] = from_f<T>(load_any(a.weight, a.weight_dtype, i) * (to_f(x[i]) * inv));
}

// Thread i takes vectors i, i + kThreads, ... (at most NV of them) of its row.
template <typename T, int NV>
__global__ void __launch_bounds__(kThreads) add_rmsnorm_vec_kernel(RmsNormArgs a) {
  constexpr int V = 16 / int(sizeof(T));
  const int64_t t = blockIdx.x;
  const int nvec = int(a.cols / V);
  // The weight depends on no earlier kernel: loaded before the wait.
  float w[NV][V];
#pragma unroll
  for (int c = 0; c < NV; ++c) {
    const int vi = int(threadIdx.x) + c * kThreads;
#pragma unroll
    for (int i = 0; i < V; ++i) w[c][i] = vi < nvec ? load_any(a.weight, a.weight_dtype, int64_t(vi) * V + i) : 0.f;
  }
  pdl_trigger_then_wait();
  T* x = static_cast<T*>(a.x) + t * a.x_ld;
  const T* d = a.delta ? static_cast<const T*>(a.delta) + t * a.delta_ld : nullptr;
  uint4 xr[NV], dr[NV];
#pragma unroll
  for (int c = 0; c < NV; ++c) {
    const int vi = int(threadIdx.x) + c * kThreads;
    if (vi < nvec) {
      xr[c] = *reinterpret_cast<const uint4*>(x + int64_t(vi) * V);
      if (d) dr[c] = *reinterpret_cast<const uint4*>(d + int64_t(vi) * V);
    }
  }
  float v[NV][V];
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < NV; ++c) {
    const int vi = int(threadIdx.x) + c * kThreads;
    if (vi >= nvec) break;
    widen16<T>(xr[c], v[c]);
    if (d) {
      float dv[V];
      widen16<T>(dr[c], dv);
      alignas(16) T r[V];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        r[i] = from_f<T>(v[c][i] + dv[i]);
        v[c][i] = to_f(r[i]);
      }
      *reinterpret_cast<uint4*>(x + int64_t(vi) * V) = *reinterpret_cast<const uint4*>(r);
    }
#pragma unroll
    for (int i = 0; i < V; ++i) ss += v[c][i] * v[c][i];
  }
  const float inv = rsqrtf(block_sum(ss) / float(a.cols) + a.eps);
  T* o = static_cast<T*>(a.out) + t * a.out_ld;
#pragma unroll
  for (int c = 0; c < NV; ++c) {
    const int vi = int(threadIdx.x) + c * kThreads;
    if (vi >= nvec) break;
    alignas(16) T r[V];
#pragma unroll
    for (int i = 0; i < V; ++i) r[i] = from_f<T>(w[c][i] * (v[c][i] * inv));
    *reinterpret_cast<uint4*>(o + int64_t(vi) * V) = *reinterpret_cast<const uint4*>(r);
  }
}

}  // namespace

void launch_add_rmsnorm(const Mat& x, const Mat* delta, const void* weight, DType wt, float eps, const Mat& out,
                        cudaStream_t s) {
  if (x.rows == 0) return;
  if (out.dtype != x.dtype || (delta && delta->dtype != x.dtype))
    throw Error("cuda backend: add_rmsnorm operands must share the activation dtype");
  RmsNormArgs a{x.data, x.ld, delta ? delta->data : nullptr, delta ? delta->ld : 0, weight, wt, eps,
                out.data, out.ld, x.cols};
  const size_t es = dtype_size(x.dtype);
  const int64_t V = 16 / int64_t(es);
  const int64_t vecs_per_thread = (x.cols / V + kThreads - 1) / kThreads;
  const bool vec = x.cols % V == 0 && vecs_per_thread <= kMaxVecs && aligned16(x.data, x.ld, es) &&
                   aligned16(out.data, out.ld, es) && (!delta || aligned16(delta->data, delta->ld, es));
  dispatch(x.dtype, "add_rmsnorm", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const dim3 grid(unsigned(x.rows)), block(kThreads);
    if (!vec) return launch("add_rmsnorm_kernel", add_rmsnorm_kernel<T>, grid, block, 0, s, a);
    if (vecs_per_thread <= 1) return launch("add_rmsnorm_vec_kernel", add_rmsnorm_vec_kernel<T, 1>, grid, block, 0, s, a);
    if (vecs_per_thread <= 2) return launch("add_rmsnorm_vec_kernel", add_rmsnorm_vec_kernel<T, 2>, grid, block, 0, s, a);
    launch("add_rmsnorm_vec_kernel", add_rmsnorm_vec_kernel<T, kMaxVecs>, grid, block, 0, s, a);
  });
}

}  // namespace ingot::cuda
