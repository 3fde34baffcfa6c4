// Tensor-core attention for prefill: many query tokens per cache row, fp16/bf16, head_dim 64, 128 or 256.
// Written by hand because no library here computes attention over our static cache with its mask
// (per-token cache row, causal slot, valid length, sliding window).
//
// The scheme is FlashAttention-2's, on warp-level mma.sync (m16n8k16, f32 accumulation): a block
// takes 64 consecutive packed query tokens and one query head; each of its four warps owns 16 of the
// tokens and keeps their Q fragments, running max, sum and output accumulator in registers. K and V
// tiles of 64 keys stream through shared memory with cp.async, double-buffered, so the next tile's
// loads overlap this tile's math. S = Q K^T comes out of the tensor cores in the accumulator layout,
// is masked and exponentiated in place (online softmax in base 2), and is fed back as the A operand
// of P V without leaving registers (the m16n8 accumulator layout of two adjacent key tiles is the
// m16n8k16 A layout). P is rounded to the activation dtype for that product, as other 16-bit engines
// do; everything else stays f32.
//
// Packed tokens of several rows can share a tile: the block handles each distinct cache row of its
// tile in turn (a "segment"), walking only the key range that row's tokens can see; tokens of other
// rows are masked in that pass and their softmax state is untouched. Keys outside the visible range
// are zero-filled on load, never read from memory past the valid length.
#include <cfloat>
#include <climits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/mma_tiles.cuh"

namespace ingot::cuda {
namespace {

using namespace mma;  // the tensor-core pieces both attention kernels share (mma_tiles.cuh)

constexpr int kBq = 64;  // query tokens per block, 16 per warp
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
// The kernel pays off once rows bring many query tokens; decode-like calls keep the split-KV kernel.
constexpr int kMinTokensPerRow = 16;

struct PrefillParams {
  const void* q;  // [T, q_ld]: query head h at columns [h * D, (h + 1) * D)
  int64_t q_ld;
  void* out;  // [T, out_ld], same column layout
  int64_t out_ld;
  const void* k;  // one layer's cache, strides in elements
  const void* v;
  int64_t batch_stride, head_stride, slot_stride;
  int capacity;
  const int32_t* row;     // [T]
  const int32_t* slot;    // [T]
  const int32_t* kv_len;  // [T]
  int T, q_heads, kv_heads, window;
  float scale_log2;  // softmax scale * log2(e): scores are exponentiated with exp2
};

// Per head size: keys per tile, and whether the Q fragments live in registers. At head_dim 256 the
// output accumulator alone takes 128 registers a thread, so Q is re-read from shared memory each tile
// (ldmatrix is cheap beside the mma it feeds) and tiles hold 32 keys, which keeps the kernel free of
// spills and its shared memory at 99 KiB (two blocks per SM).
template <int D>
struct Tile {
  static constexpr int kBk = D > 128 ? 32 : 64;
  static constexpr bool kQInRegisters = D <= 128;
};
template <int D>
__host__ __device__ constexpr int smem_stride() {
  return D + 8;  // 16 bytes of padding: the 8 rows an ldmatrix phase reads fall in distinct banks
}
template <typename T, int D>
constexpr size_t smem_bytes() {
  // Q, then K and V twice (double buffer)
  return size_t(kBq + 4 * Tile<D>::kBk) * smem_stride<D>() * sizeof(T);
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) attention_prefill_kernel(PrefillParams p) {
  constexpr int SD = smem_stride<D>();
  constexpr int CH = D / 8;  // 16-byte chunks per row
  constexpr int kBk = Tile<D>::kBk;
  constexpr bool kQReg = Tile<D>::kQInRegisters;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [kBq][SD]
  T* sK = sQ + kBq * SD;                   // [2][kBk][SD]
  T* sV = sK + 2 * kBk * SD;               // [2][kBk][SD]
  __shared__ int s_row[kBq], s_lo[kBq], s_hi[kBq];
  __shared__ bool s_done[kBq];
  __shared__ int s_seg_row, s_kmin, s_kmax;

  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  // Later tiles see more keys: start them first so the tail of the grid is short.
  const int tile = int(gridDim.x) - 1 - int(blockIdx.x);
  const int t0 = tile * kBq;
  const int qh = blockIdx.y, kvh = qh / (p.q_heads / p.kv_heads);

  pdl_wait();
  pdl_trigger();
  // Per-token visible key range [lo, hi) and cache row; tokens past T have row -1.
  if (threadIdx.x < kBq) {
    const int t = t0 + int(threadIdx.x);
    int r = -1, lo = 0, hi = 0;
    if (t < p.T) {
      const int slot = p.slot[t], kvl = min(p.kv_len[t], p.capacity);
      r = p.row[t];
      hi = max(0, min(slot, kvl - 1) + 1);
      lo = p.window > 0 ? max(0, slot - p.window + 1) : 0;
    }
    s_row[threadIdx.x] = r;
    s_lo[threadIdx.x] = lo;
    s_hi[threadIdx.x] = hi;
    s_done[threadIdx.x] = r < 0;
  }
  // Q tile into shared memory (rows past T zero).
  const T* qg = static_cast<const T*>(p.q);
  for (int i = threadIdx.x; i < kBq * CH; i += kThreads) {
    const int r = i / CH, c = i % CH, t = t0 + r;
    const bool ok = t < p.T;
    cp_async16(sQ + r * SD + c * 8, qg + (ok ? int64_t(t) * p.q_ld + int64_t(qh) * D + c * 8 : 0), ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // Q fragments (A operand, 16 rows x 16 dims per k-step): this thread's ldmatrix source row, and the
  // fragments kept in registers for the whole block when the head is small enough.
  const T* q_frag_src = sQ + (warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * SD + (lane >> 4) * 8;
  uint32_t qf[kQReg ? D / 16 : 1][4];
  if constexpr (kQReg) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], q_frag_src + kk * 16);
  }
  const int ra = warp * 16 + g, rb = ra + 8;  // the two query rows of this thread's accumulators

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;

  const T* kg = static_cast<const T*>(p.k);
  const T* vg = static_cast<const T*>(p.v);
  for (;;) {
    // Next segment: the first unprocessed token's cache row, and every token of the tile on it. Warp
    // 0 finds it, a lane per kBq / 32 tokens: a ballot names the first pending token, and the range of
    // the tokens on its row is a warp reduction (it was one thread walking all kBq tokens, at least twice a block).
    if (warp == 0) {
      constexpr int kPerLane = kBq / 32;
      int first = -1;
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) {
        const unsigned pending = __ballot_sync(0xffffffffu, !s_done[c * 32 + lane]);
        if (first < 0 && pending) first = c * 32 + __ffs(int(pending)) - 1;
      }
      const int r = first < 0 ? -1 : s_row[first];
      int kmin = INT_MAX, kmax = 0;
      if (r >= 0) {
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) {
          const int i = c * 32 + lane;
          if (!s_done[i] && s_row[i] == r) {
            s_done[i] = true;
            if (s_hi[i] > s_lo[i]) {
              kmin = min(kmin, s_lo[i]);
              kmax = max(kmax, s_hi[i]);
            }
          }
        }
#pragma unroll
        for (int o2 = 1; o2 < 32; o2 <<= 1) {
          kmin = min(kmin, __shfl_xor_sync(0xffffffffu, kmin, o2));
          kmax = max(kmax, __shfl_xor_sync(0xffffffffu, kmax, o2));
        }
      }
      if (lane == 0) {
        s_seg_row = r;
        s_kmin = kmin;
        s_kmax = kmax;
      }
    }
    __syncthreads();
    const int seg_row = s_seg_row, kmin = s_kmin, kmax = s_kmax;
    if (seg_row < 0) break;
    // This thread's rows in this segment (an empty range when on another row).
    const bool in_a = s_row[ra] == seg_row, in_b = s_row[rb] == seg_row;
    const int lo_a = s_lo[ra], hi_a = in_a ? s_hi[ra] : 0, lo_b = s_lo[rb], hi_b = in_b ? s_hi[rb] : 0;
    // The warp's key range: tiles outside it need no math from this warp.
    int w_lo = min(hi_a > lo_a ? lo_a : INT_MAX, hi_b > lo_b ? lo_b : INT_MAX), w_hi = max(hi_a, hi_b);
#pragma unroll
    for (int o2 = 1; o2 < 32; o2 <<= 1) {
      w_lo = min(w_lo, __shfl_xor_sync(0xffffffffu, w_lo, o2));
      w_hi = max(w_hi, __shfl_xor_sync(0xffffffffu, w_hi, o2));
    }

    const int64_t base = int64_t(seg_row) * p.batch_stride + int64_t(kvh) * p.head_stride;
    auto load_tile = [&](int buf, int k0) {  // kmax <= kv_len <= capacity; keys before kmin are masked anyway
      cp_async_kv_tile<kBk, CH, SD, kThreads>(sK + buf * kBk * SD, sV + buf * kBk * SD, kg, vg, base, p.slot_stride, k0,
                                              kmax);
    };
    const int first = kmin < kmax ? (kmin / kBk) * kBk : kmax;
    if (first < kmax) load_tile(0, first);
    int buf = 0;
    for (int k0 = first; k0 < kmax; k0 += kBk, buf ^= 1) {
      if (k0 + kBk < kmax) {
        load_tile(buf ^ 1, k0 + kBk);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      if (k0 < w_hi && k0 + kBk > w_lo) {
        const T* tk = sK + buf * kBk * SD;
        const T* tv = sV + buf * kBk * SD;
        // S = Q K^T for 16 rows x 64 keys: 8 accumulator tiles of 16x8.
        float s[kBk / 8][4];
#pragma unroll
        for (int n = 0; n < kBk / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
        const int mi = lane >> 3;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          uint32_t qa[4];
          if constexpr (kQReg) {
#pragma unroll
            for (int e = 0; e < 4; ++e) qa[e] = qf[kk][e];
          } else {
            ldmatrix_x4(qa, q_frag_src + kk * 16);
          }
#pragma unroll
          for (int np = 0; np < kBk / 16; ++np) {
            uint32_t b[4];
            ldmatrix_x4(b, tk + (np * 16 + (mi >> 1) * 8 + (lane & 7)) * SD + kk * 16 + (mi & 1) * 8);
            Mma<T>::run(s[2 * np], qa, b[0], b[1]);
            Mma<T>::run(s[2 * np + 1], qa, b[2], b[3]);
          }
        }
        // Mask, then the online softmax update of each row (4 lanes share a row: reduce over them).
        online_softmax_tile(s, o, m_a, m_b, l_a, l_b, p.scale_log2, k0, tq, [&](int j, int row) {
          return row == 0 ? j >= lo_a && j < hi_a : j >= lo_b && j < hi_b;
        });
        // O += P V: P's accumulator tiles 2c, 2c+1 form the A operand of k-step c.
#pragma unroll
        for (int c = 0; c < kBk / 16; ++c) {
          const uint32_t a[4] = {Mma<T>::pack(s[2 * c][0], s[2 * c][1]), Mma<T>::pack(s[2 * c][2], s[2 * c][3]),
                                 Mma<T>::pack(s[2 * c + 1][0], s[2 * c + 1][1]),
                                 Mma<T>::pack(s[2 * c + 1][2], s[2 * c + 1][3])};
#pragma unroll
          for (int np = 0; np < D / 16; ++np) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, tv + (c * 16 + (mi & 1) * 8 + (lane & 7)) * SD + np * 16 + (mi >> 1) * 8);
            Mma<T>::run(o[2 * np], a, b[0], b[1]);
            Mma<T>::run(o[2 * np + 1], a, b[2], b[3]);
          }
        }
      }
      __syncthreads();  // the buffer is refilled by the next iteration's prefetch
    }
    __syncthreads();  // everyone has read this segment's shared state before thread 0 moves on
  }

#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, o2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, o2);
  }
  const float inv_a = l_a > 0.f ? 1.f / l_a : 0.f, inv_b = l_b > 0.f ? 1.f / l_b : 0.f;
  T* og = static_cast<T*>(p.out);
  const int ta = t0 + ra, tb = t0 + rb;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const int col = qh * D + n * 8 + tq * 2;
    if (ta < p.T)
      *reinterpret_cast<uint32_t*>(og + int64_t(ta) * p.out_ld + col) = Mma<T>::pack(o[n][0] * inv_a, o[n][1] * inv_a);
    if (tb < p.T)
      *reinterpret_cast<uint32_t*>(og + int64_t(tb) * p.out_ld + col) = Mma<T>::pack(o[n][2] * inv_b, o[n][3] * inv_b);
  }
}

template <typename T, int D>
void launch_prefill(const PrefillParams& pp, cudaStream_t s) {
  allow_dynamic_smem(attention_prefill_kernel<T, D>, smem_bytes<T, D>(), "attention_prefill_kernel shared memory");
  const dim3 grid(unsigned((pp.T + kBq - 1) / kBq), unsigned(pp.q_heads));
  launch("attention_prefill_kernel", attention_prefill_kernel<T, D>, grid, dim3(kThreads), smem_bytes<T, D>(), s, pp);
}

}  // namespace

bool launch_attention_prefill(const AttentionParams& p, cudaStream_t s) {
  const int64_t T = p.q.rows;
  const int D = p.head_dim;
  if (p.q.dtype != DType::F16 && p.q.dtype != DType::BF16) return false;
  if (D != 64 && D != 128 && D != 256) return false;
  if (p.rows <= 0 || T < kBq || T < int64_t(p.rows) * kMinTokensPerRow) return false;
  if (T > INT_MAX || p.cache.capacity > INT_MAX) return false;
  // 16-byte chunks of every row: base pointers and strides in whole 16-byte units.
  auto aligned = [](const void* ptr, int64_t stride) { return aligned16(ptr, stride, 2); };  // 16-bit elements
  if (!aligned(p.q.data, p.q.ld) || !aligned(p.out.data, p.out.ld) || !aligned(p.cache.k, p.cache.batch_stride) ||
      !aligned(p.cache.v, p.cache.head_stride) || !aligned(p.cache.k, p.cache.slot_stride) ||
      !aligned(p.cache.v, p.cache.slot_stride) || !aligned(p.cache.k, p.cache.head_stride))
    return false;
  PrefillParams pp{p.q.data,
                   p.q.ld,
                   p.out.data,
                   p.out.ld,
                   p.cache.k,
                   p.cache.v,
                   p.cache.batch_stride,
                   p.cache.head_stride,
                   p.cache.slot_stride,
                   int(p.cache.capacity),
                   p.meta.row,
                   p.meta.slot,
                   p.meta.kv_len,
                   int(T),
                   p.q_heads,
                   p.kv_heads,
                   p.window,
                   p.scale * 1.4426950408889634f};
  if (p.q.dtype == DType::F16) {
    if (D == 64) launch_prefill<__half, 64>(pp, s);
    else if (D == 128) launch_prefill<__half, 128>(pp, s);
    else launch_prefill<__half, 256>(pp, s);
  } else {
    if (D == 64) launch_prefill<__nv_bfloat16, 64>(pp, s);
    else if (D == 128) launch_prefill<__nv_bfloat16, 128>(pp, s);
    else launch_prefill<__nv_bfloat16, 256>(pp, s);
  }
  return true;
}

}  // namespace ingot::cuda
