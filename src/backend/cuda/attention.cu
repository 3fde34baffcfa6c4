// Masked attention over the KV cache. Split-KV ("flash-decoding"): a block takes one token, one kv
// head with the query heads that share it (GQA: each K/V load serves them all) and one slice of the
// key range; its four warps walk the slice with an online softmax, merge in shared memory, and either
// write the output (one slice) or an f32 partial (max, sum, unnormalised accumulator) that is merged
// afterwards. Lengths, slots and rows are read from device memory, so a CUDA graph captured with
// max_kv_len = capacity stays valid as kv_len grows: slices past a token's visible range do no work.
//
// Two kernels share that scheme. The fast one (head_dim 64/128/256 with 16-byte aligned rows) gives
// each key to eight lanes, so a warp scores four keys at once with three-step reductions, and the
// last block of a (token, head group) to finish merges the slices itself (no second launch). The
// generic one (any head_dim up to 256) gives each key a whole warp and merges in a combine kernel.
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
  int* counters;   // [T, q_heads / heads_per_block] finished slices (fast kernel), zero between uses
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

// The fast kernel. D: head_dim; HMAX: most query heads per block (registers: 2 * HMAX * D/8 floats).
template <typename T, int D, int HMAX>
__global__ void __launch_bounds__(kWarps * 32) attention_fast_kernel(AttnArgs a) {
  pdl_wait();
  pdl_trigger();
  constexpr int LPK = 8, EPL = D / LPK, KPW = 32 / LPK;  // lanes per key, elements per lane, keys per warp
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, sub = lane / LPK, sl = lane % LPK;
  const int64_t t = blockIdx.x;
  const int groups = a.q_heads / a.kv_heads;
  const int blocks_per_kv = groups / a.heads_per_block;
  const int kvh = blockIdx.y / blocks_per_kv;
  const int qh0 = kvh * groups + (blockIdx.y % blocks_per_kv) * a.heads_per_block;
  const int H = a.heads_per_block;

  const int pos = a.slot[t], kvl = a.kv_len[t];
  const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int hi = min(pos, kvl - 1) + 1;  // exclusive
  const int s0 = max(lo, int(blockIdx.z) * a.slice_len), s1 = min(hi, int(blockIdx.z + 1) * a.slice_len);

  float q[HMAX][EPL], acc[HMAX][EPL], m[HMAX], l[HMAX];
#pragma unroll
  for (int g = 0; g < HMAX; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < EPL; ++i) acc[g][i] = q[g][i] = 0.f;
    if (g < H) load_row<T, EPL>(static_cast<const T*>(a.q) + t * a.q_ld + int64_t(qh0 + g) * D + sl * EPL, q[g]);
  }
  const int64_t base = int64_t(a.row[t]) * a.batch_stride + int64_t(kvh) * a.head_stride + sl * EPL;
  const T* kb = static_cast<const T*>(a.k) + base;
  const T* vb = static_cast<const T*>(a.v) + base;
  for (int j0 = s0 + warp * KPW; j0 < s1; j0 += kWarps * KPW) {
    const int j = j0 + sub;
    const bool valid = j < s1;
    float kv[EPL], vv[EPL];
    if (valid) {
      load_row<T, EPL>(kb + int64_t(j) * a.slot_stride, kv);
      load_row<T, EPL>(vb + int64_t(j) * a.slot_stride, vv);
    }
#pragma unroll
    for (int g = 0; g < HMAX; ++g) {
      if (g >= H) break;
      float sc = 0.f;
      if (valid) {
#pragma unroll
        for (int i = 0; i < EPL; ++i) sc += q[g][i] * kv[i];
      }
      sc += __shfl_xor_sync(0xffffffffu, sc, 1);
      sc += __shfl_xor_sync(0xffffffffu, sc, 2);
      sc += __shfl_xor_sync(0xffffffffu, sc, 4);
      if (valid) {
        sc *= a.scale;
        const float mn = fmaxf(m[g], sc);
        const float corr = __expf(m[g] - mn), pj = __expf(sc - mn);
        l[g] = l[g] * corr + pj;
#pragma unroll
        for (int i = 0; i < EPL; ++i) acc[g][i] = acc[g][i] * corr + pj * vv[i];
        m[g] = mn;
      }
    }
  }
  // Merge the four key groups of each warp (lanes 8 and 16 apart hold the same dims).
#pragma unroll
  for (int o = LPK; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < HMAX; ++g) {
      if (g >= H) break;
      const float mo = __shfl_xor_sync(0xffffffffu, m[g], o), lo_ = __shfl_xor_sync(0xffffffffu, l[g], o);
      const float M = fmaxf(m[g], mo);
      const float cs = l[g] > 0.f ? __expf(m[g] - M) : 0.f, co = lo_ > 0.f ? __expf(mo - M) : 0.f;
      l[g] = l[g] * cs + lo_ * co;
#pragma unroll
      for (int i = 0; i < EPL; ++i) {
        const float ao = __shfl_xor_sync(0xffffffffu, acc[g][i], o);
        acc[g][i] = acc[g][i] * cs + ao * co;
      }
      m[g] = M;
    }
  }
  extern __shared__ float sm[];  // [kWarps][H][D + 2]
  constexpr int stride = D + 2;
  if (sub == 0) {
    for (int g = 0; g < H; ++g) {
      float* e = sm + (warp * H + g) * stride;
      if (sl == 0) {
        e[0] = m[g];
        e[1] = l[g];
      }
#pragma unroll
      for (int i = 0; i < EPL; ++i) e[2 + sl * EPL + i] = acc[g][i];
    }
  }
  __syncthreads();
  float* part = a.partial + (t * a.q_heads + qh0) * a.slices * int64_t(stride);  // this block's head group
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
    if (a.slices == 1) {
      static_cast<T*>(a.out)[t * a.out_ld + int64_t(qh0 + g) * D + d] = from_f<T>(L > 0.f ? A / L : 0.f);
    } else {
      float* pp = part + (int64_t(g) * a.slices + blockIdx.z) * stride;
      if (d == 0) {
        pp[0] = M;
        pp[1] = L;
      }
      pp[2 + d] = A;
    }
  }
  if (a.slices == 1) return;
  // The last block of this (token, head group) merges every slice, in slice order.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* ctr = a.counters + t * gridDim.y + blockIdx.y;
    last = atomicAdd(ctr, 1) == a.slices - 1;
    if (last) *ctr = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int k = threadIdx.x; k < H * D; k += kWarps * 32) {
    const int g = k / D, d = k - g * D;
    const float* pg = part + int64_t(g) * a.slices * stride;
    float M = -FLT_MAX;
    for (int z = 0; z < a.slices; ++z)
      if (__ldcg(pg + z * stride + 1) > 0.f) M = fmaxf(M, __ldcg(pg + z * stride));
    float L = 0.f, A = 0.f;
    for (int z = 0; z < a.slices; ++z) {
      const float* e = pg + z * stride;
      const float ez = __ldcg(e + 1);
      if (ez == 0.f) continue;
      const float c = __expf(__ldcg(e) - M);
      L += ez * c;
      A += __ldcg(e + 2 + d) * c;
    }
    static_cast<T*>(a.out)[t * a.out_ld + int64_t(qh0 + g) * D + d] = from_f<T>(L > 0.f ? A / L : 0.f);
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
  if (a.head_dim == 32 * DPL)
    launch("attention_split_kernel", attention_split_kernel<T, DPL, true>, grid, dim3(kWarps * 32), smem, s, a);
  else
    launch("attention_split_kernel", attention_split_kernel<T, DPL, false>, grid, dim3(kWarps * 32), smem, s, a);
}

}  // namespace

void launch_attention(const AttentionParams& p, const Scratch& ws, cudaStream_t s) {
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
  if (launch_attention_prefill(p, s)) return;  // many query tokens per row, 16-bit: the tensor-core kernel
  const int groups = p.q_heads / p.kv_heads;
  const size_t es = dtype_size(p.q.dtype);
  auto aligned = [&](const void* ptr, int64_t stride) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (size_t(stride) * es) % 16 == 0;
  };
  const int D = p.head_dim;
  const bool fast = (D == 64 || D == 128 || D == 256) && aligned(p.q.data, p.q.ld) && aligned(p.out.data, p.out.ld) &&
                    aligned(p.cache.k, p.cache.batch_stride) && aligned(p.cache.v, p.cache.head_stride) &&
                    aligned(p.cache.k, p.cache.slot_stride) && aligned(p.cache.v, D);
  // Query heads per block: the largest divisor of the group size that fits the kernel's registers.
  const int hmax = fast ? 512 / D : kMaxHeadsPerBlock;
  int hpb = 1;
  for (int h = std::min(groups, hmax); h >= 1; --h)
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
  slices = std::min<int64_t>(slices, std::max<int64_t>(1, int64_t(ws.n_floats) / per_slice));
  // The fast kernel's merge counts finished slices per (token, head group).
  const bool use_fast = fast && size_t(base_blocks) <= ws.n_counters;
  const int slice_len = int((p.max_kv_len + slices - 1) / slices);
  slices = (p.max_kv_len + slice_len - 1) / slice_len;

  AttnArgs a{p.q.data, p.q.ld, p.out.data, p.out.ld, p.q_heads, p.kv_heads, p.head_dim, hpb, p.window, p.scale,
             p.meta.row, p.meta.slot, p.meta.kv_len, p.cache.k, p.cache.v, p.cache.batch_stride, p.cache.head_stride,
             p.cache.slot_stride, slice_len, int(slices), ws.floats, ws.counters};
  const dim3 grid(unsigned(ntok), unsigned(p.q_heads / hpb), unsigned(slices));
  const size_t smem = sizeof(float) * size_t(kWarps) * size_t(hpb) * size_t(p.head_dim + 2);
  dispatch(p.q.dtype, "attention", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (use_fast) {
      if (D == 64) launch("attention_fast_kernel", attention_fast_kernel<T, 64, 8>, grid, dim3(kWarps * 32), smem, s, a);
      else if (D == 128) launch("attention_fast_kernel", attention_fast_kernel<T, 128, 4>, grid, dim3(kWarps * 32), smem, s, a);
      else launch("attention_fast_kernel", attention_fast_kernel<T, 256, 2>, grid, dim3(kWarps * 32), smem, s, a);
      return;
    }
    if (p.head_dim <= 32) launch_split<T, 1>(a, grid, smem, s);
    else if (p.head_dim <= 64) launch_split<T, 2>(a, grid, smem, s);
    else if (p.head_dim <= 128) launch_split<T, 4>(a, grid, smem, s);
    else launch_split<T, 8>(a, grid, smem, s);
    if (slices > 1) {
      launch("attention_combine_kernel", attention_combine_kernel<T>, dim3(unsigned(ntok), unsigned(p.q_heads)),
             dim3(128), 0, s, a);
    }
  });
}

}  // namespace ingot::cuda
