// Tensor-core decode attention for many rows of one token each (continuous batching's decode steps):
// fp16/bf16, head_dim 64 or 128, up to 16 query heads per kv head. Written by hand for the same reason
// as attention_prefill.cu (our static cache and its mask), on the same warp-level pieces (mma_tiles.cuh).
//
// Why a second decode kernel: the split-KV kernel of attention.cu is shaped for one long row (four query
// heads' q and accumulators in registers, a key per eight lanes, keys streamed through 48 KiB of
// stages); with hundreds of short rows each of its blocks runs a long dependent chain per key, 168
// registers leave three blocks an SM, and ncu read 23% of DRAM bandwidth at batch 64 (Qwen3-8B shapes,
// ~140 keys a row; docs/performance.md). Here a block takes one token and one kv head, and the query
// heads that share that kv head are the rows of one 16-row MMA tile (GQA: 4 of 16 rows for Llama-3.1-8B
// and Qwen3-8B, the rest zeros), so every K and V byte is read once and multiplied on the tensor cores.
// Keys stream in tiles of 64 through double-buffered shared memory (cp.async); warp w takes keys
// [16w, 16w + 16) of each tile: S = Q K^T for its 16 keys (one 16x16 tile), the masked online softmax
// in base 2, and O += P V with P rounded to the activation dtype (as the prefill kernel does), each
// warp keeping its own running max, sum and accumulator. At the end the four warps' states meet in
// shared memory and are merged in warp order (a fixed order: the result does not depend on timing).
//
// Blocks are handed out as attention.cu's are: token x and kv head y in launch order, or longest row
// first when the host's ranking (TokenMeta::order) is given. Not batch-invariant (its roundings differ
// from the split-KV kernel's, which a token decoded alone would take), so launch_attention uses it only
// outside that mode.
#include <cfloat>
#include <climits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/mma_tiles.cuh"

namespace ingot::cuda {
namespace {

using namespace mma;  // the tensor-core pieces both attention kernels share (mma_tiles.cuh)

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16;               // the MMA tile's rows: query heads of one kv head, zero-padded
constexpr int kBk = 16 * kWarps;        // keys per tile, 16 per warp
constexpr int kMaxGroup = kRows;        // query heads per kv head this kernel takes

struct DecodeParams {
  const void* q;  // [T, q_ld]: query head h at columns [h * D, (h + 1) * D)
  int64_t q_ld;
  void* out;  // [T, out_ld], same column layout
  int64_t out_ld;
  const void* k;  // one layer's cache, strides in elements
  const void* v;
  int64_t batch_stride, head_stride, slot_stride;
  const int32_t* row;     // [T]
  const int32_t* slot;    // [T]
  const int32_t* kv_len;  // [T]
  const int32_t* order;   // [T] longest first (TokenMeta::order), or null
  int group;              // query heads per kv head (1..kMaxGroup)
  int window;
  float scale_log2;  // softmax scale * log2(e)
};

template <int D>
__host__ __device__ constexpr int row_stride() {
  return D + 8;  // 16 bytes of padding: the 8 rows an ldmatrix phase reads fall in distinct banks
}
template <typename T, int D>
constexpr size_t smem_bytes() {
  return size_t(kRows + 4 * kBk) * row_stride<D>() * sizeof(T);  // Q, then K and V twice
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) attention_decode_mma_kernel(DecodeParams p) {
  constexpr int SD = row_stride<D>();
  constexpr int CH = D / 8;  // 16-byte chunks per row
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [kRows][SD]
  T* sK = sQ + kRows * SD;                 // [2][kBk][SD]
  T* sV = sK + 2 * kBk * SD;               // [2][kBk][SD]

  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, mi = lane >> 3;
  // The item: token t, kv head kvh (the host's ranking when given; metadata the host wrote before the
  // step, so read before the dependency wait).
  int t = int(blockIdx.x), kvh = int(blockIdx.y);
  if (p.order && p.order[0] >= 0) {
    const int i = int(blockIdx.y * gridDim.x + blockIdx.x);
    kvh = i % int(gridDim.y);
    t = p.order[i / int(gridDim.y)];
  }
  const int pos = p.slot[t];
  const int hi = min(pos + 1, p.kv_len[t]), lo = p.window > 0 ? max(0, pos - p.window + 1) : 0;
  const int64_t base = int64_t(p.row[t]) * p.batch_stride + int64_t(kvh) * p.head_stride;
  const T* kg = static_cast<const T*>(p.k) + base;
  const T* vg = static_cast<const T*>(p.v) + base;
  const int h0 = kvh * p.group;  // first query head of the group
  T* og = static_cast<T*>(p.out) + int64_t(t) * p.out_ld + int64_t(h0) * D;

  pdl_trigger_then_wait();
  if (hi <= lo) {  // nothing visible: zeros, as the other kernels give
    for (int i = threadIdx.x; i < p.group * D; i += kThreads) og[i] = from_f<T>(0.f);
    return;
  }
  // The group's query rows into shared memory (rows past the group zero).
  const T* qg = static_cast<const T*>(p.q) + int64_t(t) * p.q_ld + int64_t(h0) * D;
  for (int i = threadIdx.x; i < kRows * CH; i += kThreads) {
    const int r = i / CH, c = i % CH;
    const bool ok = r < p.group;
    cp_async16(sQ + r * SD + c * 8, qg + (ok ? r * D + c * 8 : 0), ok);
  }
  cp_async_commit();
  auto load_tile = [&](int buf, int k0) {  // keys before lo are read (they exist) and masked
    cp_async_kv_tile<kBk, CH, SD, kThreads>(sK + buf * kBk * SD, sV + buf * kBk * SD, kg, vg, 0, p.slot_stride, k0, hi);
  };
  const int first = (lo / kBk) * kBk;
  load_tile(0, first);
  cp_async_wait<1>();  // Q has landed (this thread's copies)
  __syncthreads();
  uint32_t qf[D / 16][4];  // A operand: the 16 rows x 16 dims of each k-step
  {
    const T* src = sQ + (((lane >> 3) & 1) * 8 + (lane & 7)) * SD + (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], src + kk * 16);
  }

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;  // rows g and g + 8

  int buf = 0;
  for (int k0 = first; k0 < hi; k0 += kBk, buf ^= 1) {
    if (k0 + kBk < hi) {
      load_tile(buf ^ 1, k0 + kBk);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int j0 = k0 + warp * 16;  // this warp's 16 keys
    if (j0 < hi && j0 + 16 > lo) {  // warp-uniform
      const T* tk = sK + buf * kBk * SD + warp * 16 * SD;
      const T* tv = sV + buf * kBk * SD + warp * 16 * SD;
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};  // keys j0 + [0, 8) and [8, 16)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t b[4];
        ldmatrix_x4(b, tk + ((mi >> 1) * 8 + (lane & 7)) * SD + kk * 16 + (mi & 1) * 8);
        Mma<T>::run(s[0], qf[kk], b[0], b[1]);
        Mma<T>::run(s[1], qf[kk], b[2], b[3]);
      }
      online_softmax_tile(s, o, m_a, m_b, l_a, l_b, p.scale_log2, j0, tq,
                          [&](int j, int) { return j >= lo && j < hi; });
      // O += P V: the two 16x8 score tiles are the A operand of one k-step over the warp's 16 keys.
      const uint32_t a[4] = {Mma<T>::pack(s[0][0], s[0][1]), Mma<T>::pack(s[0][2], s[0][3]),
                             Mma<T>::pack(s[1][0], s[1][1]), Mma<T>::pack(s[1][2], s[1][3])};
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, tv + ((mi & 1) * 8 + (lane & 7)) * SD + np * 16 + (mi >> 1) * 8);
        Mma<T>::run(o[2 * np], a, b[0], b[1]);
        Mma<T>::run(o[2 * np + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // the buffer is refilled by the next iteration's prefetch
  }

#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, o2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, o2);
  }
  // The warps' states into shared memory (the K/V buffers, free after the loop's last barrier):
  // sm_o [kWarps][kRows][D], then sm_m and sm_l [kWarps][kRows]. Rows past the group are not kept.
  float* sm_o = reinterpret_cast<float*>(sK);
  float* sm_m = sm_o + kWarps * kRows * D;
  float* sm_l = sm_m + kWarps * kRows;
  const int ra = g, rb = g + 8;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const int col = n * 8 + tq * 2;
    if (ra < p.group) {
      sm_o[(warp * kRows + ra) * D + col] = o[n][0];
      sm_o[(warp * kRows + ra) * D + col + 1] = o[n][1];
    }
    if (rb < p.group) {
      sm_o[(warp * kRows + rb) * D + col] = o[n][2];
      sm_o[(warp * kRows + rb) * D + col + 1] = o[n][3];
    }
  }
  if (tq == 0) {
    sm_m[warp * kRows + ra] = m_a;
    sm_l[warp * kRows + ra] = l_a;
    sm_m[warp * kRows + rb] = m_b;
    sm_l[warp * kRows + rb] = l_b;
  }
  __syncthreads();
  // Merge in warp order: out[r, d] = sum_w o_w[r, d] 2^(m_w - M) / sum_w l_w 2^(m_w - M), M = max_w m_w.
  for (int i = threadIdx.x; i < p.group * D; i += kThreads) {
    const int r = i / D, d = i % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w * kRows + r]);
    float L = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = sm_m[w * kRows + r];
      const float f = mw == -INFINITY ? 0.f : exp2f(mw - M);  // a warp that saw no visible key adds nothing
      L += sm_l[w * kRows + r] * f;
      acc += sm_o[(w * kRows + r) * D + d] * f;
    }
    og[int64_t(r) * D + d] = from_f<T>(L > 0.f ? acc / L : 0.f);
  }
}

template <typename T, int D>
int resident_blocks() {
  return resident_blocks_per_sm(attention_decode_mma_kernel<T, D>, kThreads, smem_bytes<T, D>(),
                                "attention_decode_mma_kernel occupancy");
}

// Launches when the call has more (token, kv head) items than the device holds at once; false otherwise.
template <typename T, int D>
bool launch_decode(const DecodeParams& dp, int64_t ntok, int kv_heads, cudaStream_t s) {
  const int64_t wave = int64_t(resident_blocks<T, D>()) * device_sm_count();
  if (wave < 1 || ntok * kv_heads <= wave) return false;
  DecodeParams p = dp;
  launch("attention_decode_mma_kernel", attention_decode_mma_kernel<T, D>,
         dim3(unsigned(ntok), unsigned(kv_heads)), dim3(kThreads), smem_bytes<T, D>(), s, p);
  return true;
}

}  // namespace

bool launch_attention_decode_mma(const AttentionParams& p, cudaStream_t s) {
  // INGOT_CUDA_ATTN_MMA_DECODE=0 keeps every decode call on the split-KV kernel (A/B knob).
  static const bool on = env_knob("INGOT_CUDA_ATTN_MMA_DECODE", 1) != 0;
  const int64_t ntok = p.q.rows;
  const int D = p.head_dim;
  if (!on || (p.q.dtype != DType::F16 && p.q.dtype != DType::BF16)) return false;
  if (D != 64 && D != 128) return false;
  if (p.rows != ntok || ntok > INT_MAX || p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0) return false;
  const int group = p.q_heads / p.kv_heads;
  if (group > kMaxGroup) return false;
  auto aligned = [](const void* ptr, int64_t stride) { return aligned16(ptr, stride, 2); };  // 16-bit elements
  if (!aligned(p.q.data, p.q.ld) || !aligned(p.out.data, p.out.ld) || !aligned(p.cache.k, p.cache.batch_stride) ||
      !aligned(p.cache.v, p.cache.head_stride) || !aligned(p.cache.k, p.cache.slot_stride) ||
      !aligned(p.cache.v, p.cache.slot_stride) || !aligned(p.cache.k, p.cache.head_stride))
    return false;
  static const bool longest = env_knob("INGOT_CUDA_ATTN_LONGEST_FIRST", 1) != 0;
  const DecodeParams dp{p.q.data,
                        p.q.ld,
                        p.out.data,
                        p.out.ld,
                        p.cache.k,
                        p.cache.v,
                        p.cache.batch_stride,
                        p.cache.head_stride,
                        p.cache.slot_stride,
                        p.meta.row,
                        p.meta.slot,
                        p.meta.kv_len,
                        longest ? p.meta.order : nullptr,
                        group,
                        p.window,
                        p.scale * 1.4426950408889634f};
  if (p.q.dtype == DType::F16)
    return D == 64 ? launch_decode<__half, 64>(dp, ntok, p.kv_heads, s) : launch_decode<__half, 128>(dp, ntok, p.kv_heads, s);
  return D == 64 ? launch_decode<__nv_bfloat16, 64>(dp, ntok, p.kv_heads, s)
                 : launch_decode<__nv_bfloat16, 128>(dp, ntok, p.kv_heads, s);
}

}  // namespace ingot::cuda
