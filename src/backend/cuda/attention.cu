// Masked attention over the KV cache for decode and other calls with few query tokens per row (the
// tensor-core prefill kernel of attention_prefill.cu takes calls with many, and the tensor-core decode
// kernel of attention_decode_mma.cu 16-bit calls of many one-token rows; batch-invariant mode keeps
// every call of few tokens per row here). Split-KV
// ("flash-decoding"): a block takes one token, one kv head with the query heads that share it (GQA:
// each K/V byte read serves them all) and one slice of the token's visible keys, runs an online
// softmax in f32 over them, merges its four warps in shared memory, and either writes the output (the
// token's only slice) or an f32 partial (max, sum, unnormalised accumulator). The last slice of a
// (token, head group) to finish merges all partials in slice order: no second launch, and the result
// does not depend on which block finished last.
//
// The grid depends only on max_kv_len and the device; rows, slots and lengths are read from device
// memory and the visible keys are split into equal runs at run time, so a CUDA graph captured with
// max_kv_len = capacity stays valid as kv_len grows and short contexts still spread over every slice.
// Slices past the visible range read nothing and exit.
//
// Two kernels share that scheme. The fast one (head_dim 64/128/256, 16-byte aligned rows) streams K and
// V through shared memory with cp.async, several chunks in flight per block, and gives each key to
// eight lanes (three-step shuffle reductions). The generic one (any head_dim up to 256) gives each key
// a whole warp and loads it directly; it is the fallback, not tuned. Scores are kept in base-2 units
// (the query is pre-multiplied by scale * log2 e) so every exponential is one ex2.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/vec.cuh"

namespace ingot::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxHeadsPerBlock = 8;
// One chunk per slice at least: at short decode contexts (~190 keys, Qwen3 shapes, batch 1) two chunks
// per slice left 3 of the 12 slices busy and one slice had to stream 64 keys alone; with one, 6 slices
// share them. Measured on the H200 (2026-12-02, bf16, prompt 128 + 256 new, `ingot bench`, one call):
// Qwen3-0.6B 1,095.0 -> 1,117.6 tok/s, Qwen3-8B 226.1 -> 228.1 (with the early K/V copies below).
constexpr int kMinChunksPerSlice = 1;
// Slices per (token, head group): the merging block reads every partial, so more slices lengthen
// the serial tail of the call.
constexpr int kMaxSlices = 128;
constexpr float kLog2e = 1.4426950408889634f;

struct AttnArgs {
  const void* q;
  int64_t q_ld;
  void* out;
  int64_t out_ld;
  int q_heads, kv_heads, head_dim, heads_per_block, window;
  float qscale;  // softmax scale * log2(e)
  const int32_t* row;
  const int32_t* slot;
  const int32_t* kv_len;
  const void* k;
  const void* v;
  int64_t batch_stride, head_stride, slot_stride;
  int slices;      // blocks per (token, head group) along z
  int chunk;       // slice lengths are multiples of this many keys
  // Longest first (see block_work): [T] the call's tokens by visible keys, descending, ties by index
  // (TokenMeta::order; order[0] = -1 when every token sees as many keys), or null: launch order.
  const int32_t* order;
  float* part_acc;  // [T, q_heads, slices, head_dim] unnormalised accumulators of the slices
  float* part_ml;   // [T, q_heads, slices, 2] their (max, sum), max in base-2 units
  int* counters;    // [T, q_heads / heads_per_block] finished slices, zero between uses
  int min_chunks;     // each active slice gets at least this many chunks (kMinChunksPerSlice by default)
  // 1: every row brings one token (decode), so the only key this call wrote is the row's last (slot[t]);
  // the fast kernel issues the copies of the other keys before waiting for the previous kernel, so
  // their DRAM round trip overlaps that kernel's tail (same call as kMinChunksPerSlice's figures:
  // Qwen3-0.6B 1,081.1 -> 1,095.0 tok/s, Qwen3-8B 225.2 -> 226.1; both changes 1,117.6 and 228.1).
  int early_kv;
};

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 16-byte asynchronous copy global -> shared; fill = false writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool fill) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(fill ? 16 : 0) : "memory");
#else
  *static_cast<uint4*>(dst) = fill ? *static_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

__device__ __forceinline__ float* dyn_smem() {
  extern __shared__ float4 attn_smem[];
  return reinterpret_cast<float*>(attn_smem);
}

// What one block does: its token, kv head and query heads, and its keys [s0, s1).
struct Work {
  int64_t t;
  int kvh, qh0, H;
  int s0, s1;
  int active;  // slices of this token that have keys (0: nothing visible)
};

// The keys token t sees: [lo, hi) of its cache row (causal, valid length, sliding window).
struct Visible {
  int lo, hi;
};
__device__ __forceinline__ Visible visible_keys(const AttnArgs& a, int64_t t) {
  const int pos = a.slot[t], kvl = a.kv_len[t];
  return {a.window > 0 ? max(0, pos - a.window + 1) : 0, min(pos + 1, kvl)};
}

// Longest first: with more (token, head group) items than the device runs at once and one slice per
// token, blocks start in launch order, so rows of unequal lengths (as continuous batching leaves them)
// would end with the longest rows started last and running alone. With a.order, block i (in launch
// order: x, then y) takes instead the head group i % gridDim.y of token order[i / gridDim.y]: the host
// ranks the call's tokens by visible keys, descending, ties by index, when it uploads their metadata
// (TokenMeta::order), so every head group of the long rows starts first and the short rows fill the
// gaps. order[0] = -1 says the tokens are of one length: launch order then. Only which block computes
// an item changes, not its arithmetic, so results are the same bits (and stay batch-invariant). The
// ranking used to be made by every block from shared memory: a quadratic count that cost every block
// its latency, wave after wave (H200, Qwen3-8B shapes, bf16, batch 256 of one length, prompt 128 + 256
// new: 18,451 tok/s against 20,413 in launch order, even with the count skipped for one length).
__device__ Work block_work(const AttnArgs& a) {
  Work w;
  w.t = blockIdx.x;
  int hg = blockIdx.y;  // head group
  if (a.order && a.order[0] >= 0) {
    const int i = int(blockIdx.y * gridDim.x + blockIdx.x);
    hg = i % int(gridDim.y);
    w.t = a.order[i / int(gridDim.y)];
  }
  const int groups = a.q_heads / a.kv_heads;
  const int per_kv = groups / a.heads_per_block;
  w.kvh = hg / per_kv;
  w.qh0 = w.kvh * groups + (hg % per_kv) * a.heads_per_block;
  w.H = a.heads_per_block;
  const Visible v = visible_keys(a, w.t);
  const int lo = v.lo, hi = v.hi;  // hi exclusive
  const int n = hi - lo;
  w.s0 = w.s1 = lo;
  w.active = 0;
  if (n <= 0) return w;
  // Equal runs of whole chunks over what is visible now, so every slice gets work when the context is
  // short and the grid was sized for the capacity.
  // At least min_chunks (kMinChunksPerSlice) chunks per slice: below that, each slice's fixed cost (pipeline fill,
  // partial write, its share of the merge) outweighs the keys it reads.
  const int per_slice = (n + a.slices - 1) / a.slices;
  const int per = max((per_slice + a.chunk - 1) / a.chunk, a.min_chunks) * a.chunk;
  w.active = (n + per - 1) / per;
  const int64_t s0 = lo + int64_t(blockIdx.z) * per;
  w.s0 = s0 < hi ? int(s0) : hi;
  w.s1 = s0 + per < hi ? int(s0 + per) : hi;
  return w;
}

template <typename T>
__device__ void write_zeros(const AttnArgs& a, const Work& w) {
  T* o = static_cast<T*>(a.out) + w.t * a.out_ld + int64_t(w.qh0) * a.head_dim;
  for (int k = threadIdx.x; k < w.H * a.head_dim; k += kThreads) o[k] = from_f<T>(0.f);
}

// Merges the warps' states, sm = [kWarps][H][head_dim + 2] of (max, sum, accumulator), and writes the
// output (the token's only slice) or this slice's partial.
template <typename T>
__device__ void merge_warps(const AttnArgs& a, const Work& w, const float* sm) {
  const int D = a.head_dim, H = w.H, stride = D + 2;
  for (int k = threadIdx.x; k < H * D; k += kThreads) {
    const int g = k / D, d = k - g * D;
    float M = -FLT_MAX;
    for (int i = 0; i < kWarps; ++i) {
      const float* e = sm + (i * H + g) * stride;
      if (e[1] > 0.f) M = fmaxf(M, e[0]);
    }
    float L = 0.f, A = 0.f;
    for (int i = 0; i < kWarps; ++i) {
      const float* e = sm + (i * H + g) * stride;
      if (e[1] == 0.f) continue;  // a warp that saw no key
      const float c = ex2(e[0] - M);
      L += e[1] * c;
      A += e[2 + d] * c;
    }
    const int qh = w.qh0 + g;
    if (w.active == 1) {
      static_cast<T*>(a.out)[w.t * a.out_ld + int64_t(qh) * D + d] = from_f<T>(A / L);
    } else {
      const int64_t at = (w.t * a.q_heads + qh) * a.slices + blockIdx.z;
      a.part_acc[at * D + d] = A;
      if (d == 0) {
        a.part_ml[at * 2] = M;
        a.part_ml[at * 2 + 1] = L;
      }
    }
  }
}

template <int VW>
__device__ __forceinline__ void load_cg(const float* p, float (&v)[VW]) {
  if constexpr (VW == 4) {
    const float4 x = __ldcg(reinterpret_cast<const float4*>(p));
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else {
#pragma unroll
    for (int e = 0; e < VW; ++e) v[e] = __ldcg(p + e);
  }
}

// out = sum_z wt[g][z] acc_z / L[g] over the n partials of each head, VW dims per thread; the loads
// of 16 slices are issued before their products so the L2 round trips overlap (one block reads every
// partial of its head group, so this latency is the serial tail of the call).
template <typename T, int VW>
__device__ void merge_columns(const AttnArgs& a, const Work& w, const float* wt, const float* L, int n) {
  constexpr int kBatch = 16;
  const int D = a.head_dim, per_head = D / VW;
  for (int c = threadIdx.x; c < w.H * per_head; c += kThreads) {
    const int g = c / per_head, d = (c - g * per_head) * VW;
    const float* src = a.part_acc + ((w.t * a.q_heads + w.qh0 + g) * a.slices) * D + d;
    const float* wg = wt + g * n;
    float acc[VW] = {};
    int z = 0;
    for (; z + kBatch <= n; z += kBatch) {
      float v[kBatch][VW];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) load_cg<VW>(src + int64_t(z + i) * D, v[i]);
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
#pragma unroll
        for (int e = 0; e < VW; ++e) acc[e] += wg[z + i] * v[i][e];
    }
    for (; z < n; ++z) {
      float v[VW];
      load_cg<VW>(src + int64_t(z) * D, v);
#pragma unroll
      for (int e = 0; e < VW; ++e) acc[e] += wg[z] * v[e];
    }
    T* o = static_cast<T*>(a.out) + w.t * a.out_ld + int64_t(w.qh0 + g) * D + d;
#pragma unroll
    for (int e = 0; e < VW; ++e) o[e] = from_f<T>(acc[e] / L[g]);
  }
}

// Counts this block's slice as finished; the last of the token's active slices merges them all (in
// slice order) into the output and resets the counter. Every active slice has at least one key, so
// every partial has a sum >= 1. Uses H * (active + 1) floats of shared memory at sm.
template <typename T>
__device__ void finish_slices(const AttnArgs& a, const Work& w, float* sm) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* ctr = a.counters + w.t * gridDim.y + blockIdx.y;
    last = atomicAdd(ctr, 1) == w.active - 1;
    if (last) *ctr = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int n = w.active, H = w.H, warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  float* wt = sm;        // [H][n] weight of each slice
  float* L = sm + H * n;  // [H] total sum
  for (int g = warp; g < H; g += kWarps) {
    const float* ml = a.part_ml + (w.t * a.q_heads + w.qh0 + g) * int64_t(a.slices) * 2;
    float M = -FLT_MAX;
    for (int z = lane; z < n; z += 32) M = fmaxf(M, __ldcg(ml + 2 * z));
    M = warp_max(M);
    float s = 0.f;
    for (int z = lane; z < n; z += 32) {
      const float c = ex2(__ldcg(ml + 2 * z) - M);
      wt[g * n + z] = c;
      s += __ldcg(ml + 2 * z + 1) * c;
    }
    s = warp_sum(s);
    if (lane == 0) L[g] = s;
  }
  __syncthreads();
  if (a.head_dim % 4 == 0) merge_columns<T, 4>(a, w, wt, L, n);
  else merge_columns<T, 1>(a, w, wt, L, n);
}

// The fast kernel's tiling for element type T and head_dim D.
template <typename T, int D>
struct Fast {
  // Query heads per block: q and the accumulators take 2 * HMAX * D / 8 = 128 registers per lane.
  static constexpr int HMAX = 512 / D;
  static constexpr int LPK = 8;                      // lanes per key
  static constexpr int EPL = D / LPK;                // elements per lane
  static constexpr int VEC = 16 / int(sizeof(T));    // elements per 16-byte vector
  static constexpr int NV = EPL / VEC;               // vectors per lane and row
  static constexpr int GROUPS = kThreads / LPK;      // key groups per block
  static constexpr int ROW = D * int(sizeof(T));     // bytes of one key (or value) row
  static constexpr int RV = ROW / 16;                // 16-byte vectors per row
  // Keys per group and chunk: scores take KPG * HMAX registers (at most 16), a K+V chunk about 16 KiB.
  static constexpr int KPG_REG = 16 / HMAX, KPG_SMEM = 16384 / (2 * GROUPS * ROW);
  static constexpr int KPG = KPG_REG < KPG_SMEM ? KPG_REG : (KPG_SMEM > 0 ? KPG_SMEM : 1);
  static constexpr int CHUNK = GROUPS * KPG;  // keys per chunk
  static constexpr int STAGE = 2 * CHUNK * ROW;  // bytes: K rows then V rows
  // Chunks resident per block: up to 48 KiB (the opt-in-free limit) and never fewer than two, so a
  // block always has STAGES - 1 chunks in flight while it scores one.
  static constexpr int STAGES = 49152 / STAGE > 6 ? 6 : (49152 / STAGE < 2 ? 2 : 49152 / STAGE);
  static constexpr int COPIES = CHUNK * RV / kThreads;  // 16-byte copies per thread for K (and as many for V)
  static constexpr size_t SMEM = size_t(STAGES) * STAGE;
  // Resident blocks per SM the registers must allow: three (at most 168 registers) keep about 100 KB
  // of loads in flight per SM; head_dim 64 carries eight heads' state and settles for two.
  static constexpr int MIN_BLOCKS = HMAX <= 4 ? 3 : 2;
  static_assert(NV >= 1 && EPL % VEC == 0, "a lane's share of a row must be whole 16-byte vectors");
  static_assert(COPIES >= 1 && (CHUNK * RV) % kThreads == 0 && kThreads % RV == 0, "copies must tile the chunk");
  static_assert(SMEM >= sizeof(float) * kWarps * HMAX * (D + 2), "warp states must fit the stage buffers");
  static_assert(SMEM >= sizeof(float) * HMAX * (kMaxSlices + 1), "slice weights must fit the stage buffers");
};

// D: head_dim. Lane sl of a key group owns the 16-byte vectors c * LPK + sl (c < NV) of every row, so
// the eight lanes of a group read 128 contiguous bytes of shared memory at a time (no bank conflicts).
// Key group kg scores keys kg, kg + GROUPS, ... of each chunk and keeps its own softmax state; the four
// groups of a warp merge by shuffles, the warps in shared memory.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads, Fast<T, D>::MIN_BLOCKS) attention_fast_kernel(AttnArgs a) {
  using C = Fast<T, D>;
  constexpr int HMAX = C::HMAX, EPL = C::EPL, VEC = C::VEC, NV = C::NV, LPK = C::LPK, KPG = C::KPG;
  // The work split reads only the call's metadata (rows, slots, lengths), which the host uploads
  // before the step and no kernel writes: it runs before the wait, under the previous kernel's tail.
  const Work w = block_work(a);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, kg = threadIdx.x / LPK, sl = lane % LPK;
  const int H = w.H;
  T* const stages = reinterpret_cast<T*>(dyn_smem());

  // Issue the copies of chunk `c` into its stage; rows past s1 are zero-filled, not read. part: 0 every
  // row; 1 only the rows below `fresh` (keys earlier steps wrote), nothing else written; 2 the rest.
  const int64_t base = int64_t(a.row[w.t]) * a.batch_stride + int64_t(w.kvh) * a.head_stride;
  const T* kb = static_cast<const T*>(a.k) + base;
  const T* vb = static_cast<const T*>(a.v) + base;
  const int cv = threadIdx.x % C::RV, cr = threadIdx.x / C::RV;
  const int fresh = a.early_kv ? a.slot[w.t] : 0;  // the one key this call wrote (decode)
  auto issue = [&](int c, int part) {
    T* sk = stages + size_t(c % C::STAGES) * (C::STAGE / sizeof(T));
    T* sv = sk + C::CHUNK * D;
    const int j0 = w.s0 + c * C::CHUNK;
#pragma unroll
    for (int i = 0; i < C::COPIES; ++i) {
      const int r = cr + i * (kThreads / C::RV);
      const bool ok = j0 + r < w.s1;
      const bool old = ok && j0 + r < fresh;
      if ((part == 1 && !old) || (part == 2 && old)) continue;
      const int64_t off = int64_t(ok ? j0 + r : w.s0) * a.slot_stride + cv * VEC;
      cp_async16(sk + r * D + cv * VEC, kb + off, ok);
      cp_async16(sv + r * D + cv * VEC, vb + off, ok);
    }
  };
  const int nch = (w.s1 - w.s0 + C::CHUNK - 1) / C::CHUNK;
  const bool mine = w.active > 0 && int(blockIdx.z) < w.active;
  // Decode: the keys earlier steps wrote depend on no kernel of this step, so their copies go out
  // before the wait (uncommitted: each joins its chunk's group below, so the waits' count is unchanged).
  if (a.early_kv && mine) {
#pragma unroll
    for (int c = 0; c < C::STAGES - 1; ++c)
      if (c < nch) issue(c, 1);
  }
  pdl_trigger_then_wait();
  if (w.active == 0) {
    if (blockIdx.z == 0) write_zeros<T>(a, w);
    return;
  }
  if (!mine) return;
#pragma unroll
  for (int c = 0; c < C::STAGES - 1; ++c) {
    if (c < nch) issue(c, a.early_kv ? 2 : 0);
    cp_async_commit();  // possibly empty: keeps the group count uniform for the waits below
  }

  float q[HMAX][EPL], acc[HMAX][EPL], m[HMAX], l[HMAX];
#pragma unroll
  for (int g = 0; g < HMAX; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < EPL; ++i) acc[g][i] = q[g][i] = 0.f;
    if (g < H) {
      const T* qp = static_cast<const T*>(a.q) + w.t * a.q_ld + int64_t(w.qh0 + g) * D;
#pragma unroll
      for (int c = 0; c < NV; ++c) {
        float tmp[VEC];
        load_f<T, VEC, true>(qp + (c * LPK + sl) * VEC, tmp);
#pragma unroll
        for (int i = 0; i < VEC; ++i) q[g][c * VEC + i] = tmp[i] * a.qscale;
      }
    }
  }

  for (int c = 0; c < nch; ++c) {
    cp_async_wait<C::STAGES - 2>();  // chunk c has landed (this thread's copies)
    __syncthreads();                 // everyone's copies, and everyone is done with chunk c - 1's stage
    if (c + C::STAGES - 1 < nch) issue(c + C::STAGES - 1, 0);
    cp_async_commit();
    const T* sk = stages + size_t(c % C::STAGES) * (C::STAGE / sizeof(T));
    const T* sv = sk + C::CHUNK * D;
    const int j0 = w.s0 + c * C::CHUNK;

    float sc[KPG][HMAX];
#pragma unroll
    for (int i = 0; i < KPG; ++i) {
      const T* kr = sk + (i * C::GROUPS + kg) * D;
#pragma unroll
      for (int g = 0; g < HMAX; ++g) sc[i][g] = 0.f;
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        float kf[VEC];
        load_f<T, VEC, true>(kr + (v * LPK + sl) * VEC, kf);
#pragma unroll
        for (int g = 0; g < HMAX; ++g)
          if (g < H) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) sc[i][g] += q[g][v * VEC + e] * kf[e];
          }
      }
    }
#pragma unroll
    for (int i = 0; i < KPG; ++i) {
      const bool valid = j0 + i * C::GROUPS + kg < w.s1;
#pragma unroll
      for (int g = 0; g < HMAX; ++g)
        if (g < H) {
          float s = sc[i][g];
          s += __shfl_xor_sync(0xffffffffu, s, 1);
          s += __shfl_xor_sync(0xffffffffu, s, 2);
          s += __shfl_xor_sync(0xffffffffu, s, 4);
          sc[i][g] = valid ? s : -INFINITY;
        }
    }
    // One rescale per chunk and head: the new maximum over this group's KPG keys.
#pragma unroll
    for (int g = 0; g < HMAX; ++g)
      if (g < H) {
        float mx = m[g];
#pragma unroll
        for (int i = 0; i < KPG; ++i) mx = fmaxf(mx, sc[i][g]);
        const float corr = ex2(m[g] - mx);
        m[g] = mx;
        float ps = 0.f;
#pragma unroll
        for (int i = 0; i < KPG; ++i) {
          sc[i][g] = ex2(sc[i][g] - mx);
          ps += sc[i][g];
        }
        l[g] = l[g] * corr + ps;
        // Once a group's maximum has settled corr is exactly 1: skip the rescale when no lane of the
        // warp needs it (a warp-uniform branch; the result is the same bits).
        if (__any_sync(0xffffffffu, corr != 1.f)) {
#pragma unroll
          for (int e = 0; e < EPL; ++e) acc[g][e] *= corr;
        }
      }
#pragma unroll
    for (int i = 0; i < KPG; ++i) {
      const T* vr = sv + (i * C::GROUPS + kg) * D;
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        float vf[VEC];
        load_f<T, VEC, true>(vr + (v * LPK + sl) * VEC, vf);
#pragma unroll
        for (int g = 0; g < HMAX; ++g)
          if (g < H) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[g][v * VEC + e] += sc[i][g] * vf[e];
          }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the stage buffers become the warp states below

  // Merge the four key groups of each warp (lanes 8 and 16 apart hold the same dims).
#pragma unroll
  for (int o = LPK; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < HMAX; ++g)
      if (g < H) {
        const float mo = __shfl_xor_sync(0xffffffffu, m[g], o), lo = __shfl_xor_sync(0xffffffffu, l[g], o);
        const float M = fmaxf(m[g], mo);
        const float cs = l[g] > 0.f ? ex2(m[g] - M) : 0.f, co = lo > 0.f ? ex2(mo - M) : 0.f;
        l[g] = l[g] * cs + lo * co;
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
          const float ao = __shfl_xor_sync(0xffffffffu, acc[g][e], o);
          acc[g][e] = acc[g][e] * cs + ao * co;
        }
        m[g] = M;
      }
  }
  float* sm = dyn_smem();
  if (lane < LPK) {
#pragma unroll
    for (int g = 0; g < HMAX; ++g) {
      if (g >= H) break;
      float* e = sm + (warp * H + g) * (D + 2);
      if (sl == 0) {
        e[0] = m[g];
        e[1] = l[g];
      }
#pragma unroll
      for (int v = 0; v < NV; ++v)
#pragma unroll
        for (int i = 0; i < VEC; ++i) e[2 + (v * LPK + sl) * VEC + i] = acc[g][v * VEC + i];
    }
  }
  __syncthreads();
  merge_warps<T>(a, w, sm);
  if (w.active > 1) finish_slices<T>(a, w, sm);
}

// The generic kernel. DPL: head dims per lane (head_dim <= 32 * DPL); kFull: head_dim == 32 * DPL
// (aligned vector loads).
template <typename T, int DPL, bool kFull>
__global__ void __launch_bounds__(kThreads) attention_split_kernel(AttnArgs a) {
  // The work split reads only the call's metadata (rows, slots, lengths), which the host uploads
  // before the step and no kernel writes: it runs before the wait, under the previous kernel's tail.
  const Work w = block_work(a);
  pdl_trigger_then_wait();
  if (w.active == 0) {
    if (blockIdx.z == 0) write_zeros<T>(a, w);
    return;
  }
  if (int(blockIdx.z) >= w.active) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int H = w.H;
  const int D = a.head_dim, d0 = lane * DPL;
  const bool lane_on = kFull || d0 < D;

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
      const T* qp = static_cast<const T*>(a.q) + w.t * a.q_ld + int64_t(w.qh0 + g) * D + d0;
      if (kFull) {
        load_f<T, DPL, true>(qp, q[g]);
      } else {
#pragma unroll
        for (int i = 0; i < DPL; ++i) q[g][i] = d0 + i < D ? to_f(qp[i]) : 0.f;
      }
#pragma unroll
      for (int i = 0; i < DPL; ++i) q[g][i] *= a.qscale;
    }
  }

  const int64_t base = int64_t(a.row[w.t]) * a.batch_stride + int64_t(w.kvh) * a.head_stride;
  const T* kb = static_cast<const T*>(a.k) + base + d0;
  const T* vb = static_cast<const T*>(a.v) + base + d0;
  for (int j = w.s0 + warp; j < w.s1; j += kWarps) {
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
      s = warp_sum(s);
      const float mn = fmaxf(m[g], s);
      const float corr = ex2(m[g] - mn), p = ex2(s - mn);
      l[g] = l[g] * corr + p;
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[g][i] = acc[g][i] * corr + p * vv[i];
      m[g] = mn;
    }
  }

  float* sm = dyn_smem();  // [kWarps][H][D + 2]
#pragma unroll
  for (int g = 0; g < kMaxHeadsPerBlock; ++g) {
    if (g >= H) break;
    float* e = sm + (warp * H + g) * (D + 2);
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
  merge_warps<T>(a, w, sm);
  if (w.active > 1) finish_slices<T>(a, w, sm);
}

using Kernel = void (*)(AttnArgs);

// Blocks of `kernel` the device runs at once (SMs x resident blocks per SM). The kernel always opts in
// (allow_dynamic_smem): static shared memory counts against the 48 KiB default too, so a kernel with
// exactly 48 KiB of dynamic memory would not fit without it.
int wave_blocks(Kernel kernel, size_t smem) {
  const int per_sm = resident_blocks_per_sm(kernel, kThreads, smem, "attention kernel occupancy");
  if (per_sm < 1) throw Error("cuda backend: an attention kernel does not fit on a multiprocessor");
  return per_sm * device_sm_count();
}

// Sizes the grid (from max_kv_len and the device only) and launches.
void run(const char* name, Kernel kernel, AttnArgs a, int chunk, size_t smem, const AttentionParams& p,
         const Scratch& ws, cudaStream_t s) {
  const int64_t ntok = p.q.rows, head_groups = p.q_heads / a.heads_per_block;
  const int64_t base_blocks = ntok * head_groups;
  const int wave = wave_blocks(kernel, smem);
  // At most one wave of resident blocks (three per SM for the bf16 head_dim 128 kernel): every block
  // streams an equal run of keys with its own loads in flight, so the memory system stays busy until
  // the last runs drain; a few blocks more than a wave would start only when the first finish and
  // double the call. Fewer slices also keep the final merge (one block reading every partial of its
  // head group) short. Each slice holds at least one chunk; the partials must fit the scratch, and
  // the merge counts finished slices in one counter per (token, head group).
  // a.slices on entry: 1 = one slice per token (batch-invariant: a token's keys are then walked in one
  // order whatever the call's size), 0 = as many as fill a wave.
  int64_t slices = 1;
  if (a.slices == 0 && size_t(base_blocks) <= ws.n_counters) {
    slices = int64_t(wave) / base_blocks;
    slices = std::min<int64_t>(slices, (p.max_kv_len + chunk - 1) / chunk);
    slices = std::min<int64_t>(slices, kMaxSlices);
    slices = std::min<int64_t>(slices, int64_t(ws.n_floats) / (ntok * p.q_heads * int64_t(p.head_dim + 2)));
    slices = std::max<int64_t>(slices, 1);
  }
  a.slices = int(slices);
  // Longest first where it can matter: one token per row, one slice each, more items than a wave.
  // (finish_slices indexes its counters by blockIdx.y, so the remapping is for one slice only.)
  // INGOT_CUDA_ATTN_LONGEST_FIRST=0 keeps launch order (A/B knob, docs/cuda-backend.md).
  static const bool longest = env_knob("INGOT_CUDA_ATTN_LONGEST_FIRST", 1) != 0;
  a.order = longest && slices == 1 && p.rows == ntok && base_blocks > wave ? p.meta.order : nullptr;
  a.chunk = chunk;
  a.part_acc = ws.floats;
  a.part_ml = ws.floats + ntok * p.q_heads * slices * p.head_dim;
  a.counters = ws.counters;
  launch(name, kernel, dim3(unsigned(ntok), unsigned(head_groups), unsigned(slices)), dim3(kThreads), smem, s, a);
}

template <typename T, int D>
void run_fast(const AttnArgs& a, const AttentionParams& p, const Scratch& ws, cudaStream_t s) {
  run("attention_fast_kernel", attention_fast_kernel<T, D>, a, Fast<T, D>::CHUNK, Fast<T, D>::SMEM, p, ws, s);
}

template <typename T, int DPL>
void run_split(const AttnArgs& a, const AttentionParams& p, const Scratch& ws, cudaStream_t s) {
  const size_t H = size_t(a.heads_per_block);
  const size_t smem = sizeof(float) * std::max(kWarps * H * size_t(p.head_dim + 2), H * (kMaxSlices + 1));
  Kernel k = p.head_dim == 32 * DPL ? attention_split_kernel<T, DPL, true> : attention_split_kernel<T, DPL, false>;
  run("attention_split_kernel", k, a, kWarps, smem, p, ws, s);
}

}  // namespace

void launch_attention(const AttentionParams& p, const Scratch& ws, cudaStream_t s, bool batch_invariant) {
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
  // Many query tokens per row, 16-bit: the tensor-core kernel (not batch-invariant: its roundings differ
  // from the decode kernel's, so a prompt token would not match the same token decoded).
  if (!batch_invariant && launch_attention_prefill(p, s)) return;
  // Many rows of one token each, 16-bit: the tensor-core decode kernel (not batch-invariant either).
  if (!batch_invariant && launch_attention_decode_mma(p, s)) return;
  const int groups = p.q_heads / p.kv_heads;
  const size_t es = dtype_size(p.q.dtype);
  auto aligned = [&](const void* ptr, int64_t stride) { return aligned16(ptr, stride, es); };
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
  AttnArgs a{p.q.data, p.q.ld, p.out.data, p.out.ld, p.q_heads, p.kv_heads, p.head_dim, hpb, p.window,
             p.scale * kLog2e, p.meta.row, p.meta.slot, p.meta.kv_len, p.cache.k, p.cache.v, p.cache.batch_stride,
             p.cache.head_stride, p.cache.slot_stride, 1, 1, nullptr, nullptr, nullptr, nullptr};
  a.slices = batch_invariant ? 1 : 0;
  // A/B knobs (docs/cuda-backend.md): INGOT_CUDA_ATTN_MIN_CHUNKS (chunks per slice at least) and
  // INGOT_CUDA_ATTN_EARLY_KV=0 (every copy after the wait, as before).
  static const int min_chunks = std::max(1, env_knob("INGOT_CUDA_ATTN_MIN_CHUNKS", kMinChunksPerSlice));
  static const bool early_kv = env_knob("INGOT_CUDA_ATTN_EARLY_KV", 1) != 0;
  a.min_chunks = min_chunks;
  a.early_kv = early_kv && p.rows == ntok && pdl_enabled();
  dispatch(p.q.dtype, "attention", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (fast) {
      if (D == 64) run_fast<T, 64>(a, p, ws, s);
      else if (D == 128) run_fast<T, 128>(a, p, ws, s);
      else run_fast<T, 256>(a, p, ws, s);
    } else if (D <= 32) {
      run_split<T, 1>(a, p, ws, s);
    } else if (D <= 64) {
      run_split<T, 2>(a, p, ws, s);
    } else if (D <= 128) {
      run_split<T, 4>(a, p, ws, s);
    } else {
      run_split<T, 8>(a, p, ws, s);
    }
  });
}

}  // namespace ingot::cuda
