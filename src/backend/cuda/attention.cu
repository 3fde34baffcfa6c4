// Masked attention over the KV cache. Split-KV ("flash-decoding"): a block takes one token, one kv
// head with the query heads that share it (GQA: each K/V load serves them all) and one slice of the
// key range; its four warps walk the slice with an online softmax, merge in shared memory, and either
// write the output (one slice) or an f32 partial (max, sum, unnormalised accumulator) that a combine
// kernel merges. Lengths, slots and rows are read from device memory, so a CUDA graph captured with
// max_kv_len = capacity stays valid as kv_len grows: slices past a token's visible range do no work.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/vec.cuh"

namespace ingot::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxHeadsPerBlock = 8;
constexpr int kKeysPerSlice = 64;

struct AttnArgs {
  const void* q;
  int64_t q_ld;
  void* out;
  int64_t out_ld;
  int q_heads, kv_heads, head_dim, heads_per_block, window;
  float scale;
  const int32_t* row;
  const int32_t* slot;
  const int32_t* kv_len;
  const void* k;
  const void* v;
  int64_t batch_stride, head_stride, slot_stride;
  int slice_len, slices;
  float* partial;  // [T, q_heads, slices, head_dim + 2] when slices > 1
};

// DPL: head dims per lane (head_dim <= 32 * DPL); kFull: head_dim == 32 * DPL (aligned vector loads).
template <typename T, int DPL, bool kFull>
__global__ void __launch_bounds__(kWarps * 32) attention_split_kernel(AttnArgs a) {
  pdl_wait();
  pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t t = blockIdx.x;
  const int groups = a.q_heads / a.kv_heads;
  const int blocks_per_kv = groups / a.heads_per_block;
  const int kvh = blockIdx.y / blocks_per_kv;
  const int qh0 = kvh * groups + (blockIdx.y % blocks_per_kv) * a.heads_per_block;
  const int H = a.heads_per_block;
  const int D = a.head_dim, d0 = lane * DPL;
  const bool lane_on = kFull || d0 < D;

  const int pos = a.slot[t], kvl = a.kv_len[t];
  const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int hi = min(pos, kvl - 1) + 1;  // exclusive
  const int s0 = max(lo, int(blockIdx.z) * a.slice_len), s1 = min(hi, int(blockIdx.z + 1) * a.slice_len);

  float q[kMaxHeadsPerBlock][DPL];
  float acc[kMaxHeadsPerBlock][DPL];
  float m[kMaxHeadsPerBlock], l[kMaxHeadsPerBlock];
#pragma unroll
  for (int g = 0; g < kMaxHeadsPerBlock; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[g][i] = 0.f, q[g][i] = 0.f;
    if (g < H && lane_on) {
      const T* qp = static_cast<const T*>(a.q) + t * a.q_ld + int64_t(qh0 + g) * D + d0;
      if (kFull) {
        load_f<T, DPL, true>(qp, q[g]);
      } else {
#pragma unroll
        for (int i = 0; i < DPL; ++i) q[g][i] = d0 + i < D ? to_f(qp[i]) : 0.f;
      }
    }
  }

  const int64_t base = int64_t(a.row[t]) * a.batch_stride + int64_t(kvh) * a.head_stride;
  const T* kb = static_cast<const T*>(a.k) + base + d0;
  const T* vb = static_cast<const T*>(a.v) + base + d0;
  for (int j = s0 + warp; j < s1; j += kWarps) {
    float kv[DPL], vv[DPL];
    if (lane_on) {
      if (kFull) {
        load_f<T, DPL, true>(kb + int64_t(j) * a.slot_stride, kv);
        load_f<T, DPL, true>(vb + int64_t(j) * a.slot_stride, vv);
      } else {
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          kv[i] = d0 + i < D ? to_f(kb[int64_t(j) * a.slot_stride + i]) : 0.f;
          vv[i] = d0 + i < D ? to_f(vb[int64_t(j) * a.slot_stride + i]) : 0.f;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < DPL; ++i) kv[i] = vv[i] = 0.f;
    }
#pragma unroll
    for (int g = 0; g < kMaxHeadsPerBlock; ++g) {
      if (g >= H) break;
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) s += q[g][i] * kv[i];
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      s *= a.scale;
      const float mn = fmaxf(m[g], s);
      const float corr = __expf(m[g] - mn), p = __expf(s - mn);
      l[g] = l[g] * corr + p;
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[g][i] = acc[g][i] * corr + p * vv[i];
      m[g] = mn;
    }
  }

  // Merge the warps: warp w's state goes to shared memory, then each thread owns (head, dim) pairs.
  extern __shared__ float sm[];  // [kWarps][H][D + 2]
  const int stride = D + 2;
  for (int g = 0; g < H; ++g) {
    float* e = sm + (warp * H + g) * stride;
    if (lane == 0) {
      e[0] = m[g];
      e[1] = l[g];
    }
    if (lane_on) {
#pragma unroll
      for (int i = 0; i < DPL; ++i)
        if (kFull || d0 + i < D) e[2 + d0 + i] = acc[g][i];
    }
  }
  __syncthreads();
  for (int k = threadIdx.x; k < H * D; k += kWarps * 32) {
    const int g = k / D, d = k - g * D;
    float M = -FLT_MAX;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[(w * H + g) * stride]);
    float L = 0.f, A = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      const float* e = sm + (w * H + g) * stride;
      if (e[1] == 0.f) continue;
      const float c = __expf(e[0] - M);
      L += e[1] * c;
      A += e[2 + d] * c;
    }
    const int qh = qh0 + g;
    if (a.slices == 1) {
      static_cast<T*>(a.out)[t * a.out_ld + int64_t(qh) * D + d] = from_f<T>(L > 0.f ? A / L : 0.f);
    } else {
      float* p = a.partial + ((t * a.q_heads + qh) * a.slices + blockIdx.z) * int64_t(stride);
      if (d == 0) {
        p[0] = M;
        p[1] = L;
      }
      p[2 + d] = A;
    }
  }
}

template <typename T>
__global__ void attention_combine_kernel(AttnArgs a) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int qh = blockIdx.y, D = a.head_dim, stride = D + 2;
  const float* p = a.partial + (t * a.q_heads + qh) * a.slices * int64_t(stride);
  float M = -FLT_MAX;
  for (int s = 0; s < a.slices; ++s)
    if (p[s * stride + 1] > 0.f) M = fmaxf(M, p[s * stride]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float L = 0.f, A = 0.f;
    for (int s = 0; s < a.slices; ++s) {
      const float* e = p + s * stride;
      if (e[1] == 0.f) continue;  // an empty slice (outside the visible range)
      const float c = __expf(e[0] - M);
      L += e[1] * c;
      A += e[2 + d] * c;
    }
    static_cast<T*>(a.out)[t * a.out_ld + int64_t(qh) * D + d] = from_f<T>(L > 0.f ? A / L : 0.f);
  }
}

template <typename T, int DPL>
void launch_split(const AttnArgs& a, dim3 grid, size_t smem, cudaStream_t s) {
  if (a.head_dim == 32 * DPL) launch("attention_split_kernel", attention_split_kernel<T, DPL, true>, dim3(grid), dim3(kWarps * 32), smem, s, a);
  else launch("attention_split_kernel", attention_split_kernel<T, DPL, false>, dim3(grid), dim3(kWarps * 32), smem, s, a);
}

}  // namespace

void launch_attention(const AttentionParams& p, float* ws, size_t ws_floats, cudaStream_t s) {
  const int64_t ntok = p.q.rows;
  if (ntok == 0) return;
  if (p.cache.dtype != p.q.dtype || p.out.dtype != p.q.dtype)
    throw Error("cuda backend: attention operands and the KV cache must share the activation dtype");
  if (p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0)
    throw Error("cuda backend: attention needs q_heads to be a multiple of kv_heads");
  if (p.head_dim <= 0 || p.head_dim > 256)
    throw Error("cuda backend: attention supports head_dim up to 256, got " + std::to_string(p.head_dim));
  if (p.max_kv_len <= 0) {
    // Nothing visible to any token: zeros, like the all-masked row.
    for (int64_t t = 0; t < ntok; ++t)
      check(cudaMemsetAsync(static_cast<uint8_t*>(p.out.data) + size_t(t * p.out.ld) * dtype_size(p.out.dtype), 0,
                            size_t(p.out.cols) * dtype_size(p.out.dtype), s),
            "attention zero fill");
    return;
  }
  const int groups = p.q_heads / p.kv_heads;
  int hpb = 1;  // the largest divisor of the group size that fits a block
  for (int h = std::min(groups, kMaxHeadsPerBlock); h >= 1; --h)
    if (groups % h == 0) {
      hpb = h;
      break;
    }
  const int64_t base_blocks = ntok * int64_t(p.q_heads / hpb);
  // Enough slices to fill the GPU several times over, no more than the scratch holds, and slices of at
  // least kKeysPerSlice keys. The choice depends on max_kv_len only, never on device data.
  int64_t slices = std::max<int64_t>(1, (p.max_kv_len + kKeysPerSlice - 1) / kKeysPerSlice);
  slices = std::min<int64_t>(slices, std::max<int64_t>(1, 132 * 8 / base_blocks));
  const int64_t per_slice = ntok * p.q_heads * int64_t(p.head_dim + 2);
  slices = std::min<int64_t>(slices, std::max<int64_t>(1, int64_t(ws_floats) / per_slice));
  const int slice_len = int((p.max_kv_len + slices - 1) / slices);
  slices = (p.max_kv_len + slice_len - 1) / slice_len;

  AttnArgs a{p.q.data, p.q.ld, p.out.data, p.out.ld, p.q_heads, p.kv_heads, p.head_dim, hpb, p.window, p.scale,
             p.meta.row, p.meta.slot, p.meta.kv_len, p.cache.k, p.cache.v, p.cache.batch_stride, p.cache.head_stride,
             p.cache.slot_stride, slice_len, int(slices), ws};
  const dim3 grid(unsigned(ntok), unsigned(p.q_heads / hpb), unsigned(slices));
  const size_t smem = sizeof(float) * size_t(kWarps) * size_t(hpb) * size_t(p.head_dim + 2);
  dispatch(p.q.dtype, "attention", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (p.head_dim <= 32) launch_split<T, 1>(a, grid, smem, s);
    else if (p.head_dim <= 64) launch_split<T, 2>(a, grid, smem, s);
    else if (p.head_dim <= 128) launch_split<T, 4>(a, grid, smem, s);
    else launch_split<T, 8>(a, grid, smem, s);
    if (slices > 1) {
      launch("attention_combine_kernel", attention_combine_kernel<T>, dim3(unsigned(ntok), unsigned(p.q_heads)), dim3(128), 0, s, a);
    }
  });
}

}  // namespace ingot::cuda
