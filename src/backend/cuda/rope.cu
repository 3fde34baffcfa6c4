// Per-head q/k RMSNorm (Qwen3), RoPE (rotate-half on the first rot_dim dims of each head) on q in place
// and on k, and K/V written to their cache slots, in one kernel: one warp per (token, head); kv heads
// also copy V. cos/sin are evaluated in double from the f32 angle, as the CPU reference does.
// (ncu on the H200, Qwen3-8B decode: 8.4 us a call when each lane's loads, stores and the next loads
// alternated; the kernel now issues its loads first.)
// A token's angles are the same for every head, so a block evaluates each of its token's rot_dim / 2
// cos/sin pairs once, one per thread, into shared memory: the double-precision sincos was the kernel's
// cost when every lane of every head evaluated its own (8 per lane at head_dim 128; H200, Qwen3-8B
// shapes, 128-token prefill: 10.9 us a call by the per-op profiler's median).
#include "backend/cuda/cuda_common.cuh"

namespace ingot::cuda {
namespace {

struct RopeArgs {
  void* qkv;
  int64_t qkv_ld;
  const void* q_norm;
  const void* k_norm;
  DType norm_dtype;
  float norm_eps;
  const float* inv_freq;
  int rot_dim;
  float attn_scale;
  int q_heads, kv_heads, head_dim;
  const int32_t* row;
  const int32_t* slot;
  const int32_t* rope_pos;
  void* k_cache;
  void* v_cache;
  int64_t batch_stride, head_stride, slot_stride;
};

constexpr int kWarps = 4;
constexpr int kMaxHeadDim = 256;         // the CUDA attention kernels' limit too
constexpr int kPerLane = kMaxHeadDim / 32;  // a lane's elements of one head: i = lane + 32 k

// Every load a warp needs (the norm weight and inverse frequencies before the dependency wait, the
// head, its V and the token's meta after it) is issued before any arithmetic or store: decode runs
// this on one token, where each serialised memory round trip is on the step's critical path.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32) rope_cache_write_kernel(RopeArgs a) {
  extern __shared__ float smem[];  // [kWarps, head_dim] the warps' normed heads, then [2, rot_dim / 2] cos, sin
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int h = blockIdx.y * kWarps + warp;
  const int D = a.head_dim, half = a.rot_dim / 2;
  const bool is_q = h < a.q_heads;
  const void* nw = is_q ? a.q_norm : a.k_norm;
  float nwv[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int i = lane + 32 * k;
    nwv[k] = nw && i < D ? load_any(nw, a.norm_dtype, i) : 1.f;
  }
  // kWarps * 32 >= kMaxHeadDim / 2: one pair per thread at most.
  const float invf = int(threadIdx.x) < half ? a.inv_freq[threadIdx.x] : 0.f;
  pdl_trigger_then_wait();
  const int64_t t = blockIdx.x;
  float* cs = smem + kWarps * D;  // [half] cos * attn_scale, then [half] sin * attn_scale
  if (int(threadIdx.x) < half) {
    double sd, cd;
    sincos(double(float(a.rope_pos[t]) * invf), &sd, &cd);
    cs[threadIdx.x] = float(cd) * a.attn_scale;
    cs[half + threadIdx.x] = float(sd) * a.attn_scale;
  }
  __syncthreads();  // before any warp leaves: every thread takes part
  if (h >= a.q_heads + a.kv_heads) return;
  float* buf = smem + warp * D;
  T* row = static_cast<T*>(a.qkv) + t * a.qkv_ld;
  T* head = row + int64_t(h) * D;  // q heads, then k heads, contiguous
  const int kh = h - a.q_heads;
  const T* vsrc = row + int64_t(a.q_heads + a.kv_heads + kh) * D;
  int64_t off = 0;
  if (!is_q) off = int64_t(a.row[t]) * a.batch_stride + int64_t(kh) * a.head_stride + int64_t(a.slot[t]) * a.slot_stride;
  float hv[kPerLane];
  T vv[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int i = lane + 32 * k;
    hv[k] = i < D ? to_f(head[i]) : 0.f;
    if (!is_q && i < D) vv[k] = vsrc[i];
  }
  if (nw) {
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) ss += hv[k] * hv[k];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.0f / sqrtf(ss / float(D) + a.norm_eps);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) hv[k] = nwv[k] * (hv[k] * inv);
  }
#pragma unroll
  for (int k = 0; k < kPerLane; ++k)
    if (lane + 32 * k < D) buf[lane + 32 * k] = hv[k];
  __syncwarp();
  T* kdst = is_q ? nullptr : static_cast<T*>(a.k_cache) + off;
  T* vdst = is_q ? nullptr : static_cast<T*>(a.v_cache) + off;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int i = lane + 32 * k;
    if (i >= D) break;
    float r = hv[k];
    if (i < 2 * half) {
      const int j = i < half ? i : i - half;
      const float c = cs[j], s = cs[half + j];
      r = i < half ? hv[k] * c - buf[i + half] * s : hv[k] * c + buf[i - half] * s;
    }
    const T out = from_f<T>(r);
    head[i] = out;
    if (kdst) {
      kdst[i] = out;
      vdst[i] = vv[k];
    }
  }
}

}  // namespace

void launch_rope_cache_write(const RopeWriteParams& p, cudaStream_t s) {
  if (p.qkv.rows == 0) return;
  if (p.cache.dtype != p.qkv.dtype)
    throw Error("cuda backend: the KV cache dtype must equal the activation dtype");
  if (p.head_dim < 1 || p.head_dim > kMaxHeadDim)
    throw Error("cuda backend: head_dim " + std::to_string(p.head_dim) + " is outside the kernels' 1.." +
                std::to_string(kMaxHeadDim));
  if (p.rot_dim > p.head_dim || p.rot_dim % 2 != 0)
    throw Error("cuda backend: rotary dims " + std::to_string(p.rot_dim) + " do not fit head_dim " +
                std::to_string(p.head_dim));
  RopeArgs a{p.qkv.data, p.qkv.ld, p.q_norm, p.k_norm, p.norm_dtype, p.norm_eps, p.inv_freq, p.rot_dim, p.attn_scale,
             p.q_heads, p.kv_heads, p.head_dim, p.meta.row, p.meta.slot, p.meta.rope_pos, p.cache.k, p.cache.v,
             p.cache.batch_stride, p.cache.head_stride, p.cache.slot_stride};
  const dim3 grid(unsigned(p.qkv.rows), unsigned((p.q_heads + p.kv_heads + kWarps - 1) / kWarps));
  static_assert(kWarps * 32 >= kMaxHeadDim / 2, "a thread per cos/sin pair");
  const size_t smem = sizeof(float) * (size_t(kWarps) * size_t(p.head_dim) + size_t(p.rot_dim));
  dispatch(p.qkv.dtype, "rope_cache_write", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch("rope_cache_write_kernel", rope_cache_write_kernel<T>, dim3(grid), dim3(kWarps * 32), smem, s, a);
  });
}

}  // namespace ingot::cuda
