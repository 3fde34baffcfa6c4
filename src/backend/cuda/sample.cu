// The sample op on the GPU, no sort. The top candidate is a max of the candidate keys; top-k, top-p and
// the draw are radix selections over those keys (histograms of 10-bit digits from the top, counting
// candidates or summing their fixed-point weights); totals are sums of histogram bins. Sums are
// integers, so the order in which threads add them cannot change them, and the pick equals the CPU
// reference's (backend/sampling.h) bit for bit.
//
// A row is shared by the blocks of one thread block cluster (Hopper; up to 16 blocks, each a slice of
// the vocabulary). The blocks merge their partial sums and histograms through distributed shared
// memory and all reach the same decisions; rank 0 writes the results. On GPUs without clusters a row
// is one block. A histogram is merged one of two ways (histogram()), each a kernel instance:
//  - From 8 blocks per row on (a single row takes 16), by slices: block r sums slice r of the bins
//    over the blocks and publishes it, then every block copies the slices, 2 remote reads per thread
//    where summing every block's bins takes 2 per block per thread; in place in the merged histogram,
//    so with no shared memory beyond Shared (the key cache's room is the same). sample_lab figures
//    (bench/sample_lab.cu; H200, 2026-12-02, vocabulary 151,936, bf16 logits, µs per call, all bins
//    -> slices), rows=1: flat t0.7 p0.9 163.0 -> 108.3, flat t0.7 k50 p0.9 min-p 0.05 rep 1.1 72.4 ->
//    52.0, flat t1.0 106 -> 76, flat t0.7 k50 59.1 -> 36.0, peaked t0.7 p0.9 58.2 -> 53.2, peaked full
//    79.0 -> 48.6, peaked t1.0 63.1 -> 56.9, peaked k50 60.7 -> 37.2 (f32 logits alike). (Measured
//    with the summed slice in a separate 12 KiB of dynamic shared memory; the in-place form, timed
//    later with the 32-bit limbs below, is in docs/cuda-backend.md.)
//  - Below 8 (rows=64 runs 4 per row), every block sums all blocks' bins: there the slices measured
//    slightly slower (t0.7 p0.9 738 -> 747, the full setting 240 -> 261, peaked t0.7 p0.9 404 -> 418).
//  INGOT_CUDA_SAMPLE_SCATTER=0/1 forces either (scatter_mode()). Three other variants measured then
//  were dropped: warp-aggregated histogram updates (rows=1 flat t0.7 p0.9 163 -> 174; rows=64 t0.7
//  k50 187 -> 259), one cluster barrier per histogram over two sets of bins (163 -> 172), and gathers
//  of up to 256 candidates (163 -> 129 alone, behind the slices' 108.3; with them and the warp
//  aggregation mixed, 108.3 -> 100.3 and peaked 53.2 -> 47.2 but the full setting 52.0 -> 59.5;
//  mixed at rows=64; 6 KiB more static shared memory).
//
// Work per logit, which is what the op costs (one block on one SM took ~1 ms per 152k row when every
// pass recomputed everything):
//  - The only pass over global memory computes each score once and keeps its 32-bit order key in the
//    block's dynamic shared memory (the key cache; a slot per logit the block owns, the id implicit in
//    the slot). Every later pass reads keys from there. Where a block's slice does not fit (a huge
//    vocabulary, a row on one block), the passes recompute the key from the logit: same keys, same
//    picks, only slower.
//  - A score is recovered exactly from its key (order_key is a bijection but for -0 -> +0 and NaN,
//    neither of which changes a weight), so an exp() is only paid for a candidate that passed the
//    cheap key filters of its pass: once per candidate for the first digit, then only inside the
//    bucket being resolved.
//  - The first weighted histogram (over the candidates top-k keeps) is built once: its bins sum to the
//    total, the same pass finds the min-p cut, and both the top-p and the draw selections start from
//    it. The draw runs over the same set as top-p (its target, r + 1 <= the top-p prefix's mass, is
//    reached inside that prefix, where the running weights of the two sets agree), which is what lets
//    it reuse the histogram.
//  - Candidate keys are `key << id_bits | ~id` over just the bits the vocabulary needs (18 for 152k), so
//    a selection resolving ties between equal scores descends 5 digits, not 7; and once its bucket
//    holds at most kGather candidates it gathers them (gather) instead of resolving more digits.
#include <cooperative_groups.h>

#include <cfloat>
#include <cstdlib>
#include <map>
#include <mutex>

#include "backend/cuda/cuda_common.cuh"
#include "backend/sampling.h"

namespace ingot::cuda {
namespace {

namespace sp = ingot::sampling;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kDigitBits = 10;  // three histograms (a block's, the merged one, the first digit's) fit static shared memory
constexpr int kBins = 1 << kDigitBits;
constexpr int kBinsPerLane = kBins / 32;
constexpr int kMaxRanks = 16;  // blocks per row (the largest cluster Hopper allows, non-portable)
static_assert(kBins == kThreads, "a thread per bin: clears, merges and the total read one bin each");
// A selection whose bucket holds at most this many candidates (of nonzero weight, when weighted) ends by
// gathering them instead of resolving more digits: a thread per (block, entry) copies them.
constexpr int kGather = kThreads / kMaxRanks;
// From this many blocks per row on, a histogram is merged by slices (kScatter, histogram()); below it,
// every block sums all blocks' bins. INGOT_CUDA_SAMPLE_SCATTER (scatter_mode()) overrides the rule.
constexpr int kScatterRanks = 8;
// A weighted histogram's additions are the one hot spot of the op: the leading digit of nearly flat
// logits falls in a handful of bins, so a block's ~10k (one row, 16 blocks) to ~40k additions meet on
// a few addresses, and a 64-bit shared-memory atomic add is a compare-and-swap loop (the hardware adds
// 32 bits natively; see docs/cuda-backend.md). With limbs a weight W < 2^41 (a run of candidates of
// one digit: at most 2^40 each) is added as three native 32-bit atomics, W = hi 2^28 + mid 2^14 + lo
// (lo, mid < 2^14), and the block's sums are put together again before the merge: exact, so the bins
// are the same integers. A block owning fewer than 2^18 logits keeps every limb sum below 2^32.
constexpr int64_t kLimbMaxLogits = int64_t(1) << 18;

struct SampleArgs {
  const void* logits;
  int64_t ld;
  uint32_t vocab;
  uint32_t id_bits;  // bits of the vocabulary size: ids sit in the low id_bits of a candidate key
  SampleState st;
  int32_t* out;
  // Null but in the sample lab: [rows, kSamplePhases] %globaltimer readings of each row's rank-0
  // block at the phase boundaries (thread 0), so that one GPU run says where a row's time goes.
  unsigned long long* phase_ns;
  // 1: weighted histograms add 32-bit limbs of the weights (histogram's add_weight), 0: 64-bit
  // atomics. Set where a block owns fewer than kLimbMaxLogits logits (then no limb sum can overflow).
  int limbs;
};

struct Shared {
  // Per digit: this block's summed fixed-point weight (weighted selections). With limbs, while the
  // block adds, its first half holds the low limbs' sums and its second half the middle ones'.
  unsigned long long weight[kBins];
  unsigned int limb_hi[kBins];       // with limbs: the high limbs' sums, while the block adds
  unsigned int count[kBins];         // per digit: its candidates (counted selections) or those of nonzero weight
  unsigned long long merged_weight[kBins];  // the same over the row's blocks
  unsigned int merged_count[kBins];
  unsigned long long first_weight[kBins];  // the row's first-digit weighted histogram (top-p and the draw)
  unsigned int first_count[kBins];
  unsigned long long red[kWarps];  // block reductions
  unsigned long long part, part2;  // this block's share of a row reduction, read by the others
  unsigned long long pick_rest;
  int pick_digit;
  int found;
  // A small bucket gathered: this block's members, then the row's (same contents in every block).
  unsigned long long own_c[kGather], own_w[kGather];
  unsigned long long all_c[kGather], all_w[kGather];
  unsigned int own_n, gather_total;
  unsigned int gather_n[kMaxRanks], gather_off[kMaxRanks];
  unsigned long long pick_c, pick_mass;
};

// The blocks sharing a row: a cluster on Hopper, or the block alone.
struct Ranks {
  int n, rank;
  __device__ static Ranks here() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const cooperative_groups::cluster_group c = cooperative_groups::this_cluster();
    return {int(c.num_blocks()), int(c.block_rank())};
#else
    return {1, 0};
#endif
  }
  // Every thread of every block of the row (a block barrier too).
  __device__ void sync() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (n > 1) {
      cooperative_groups::this_cluster().sync();
      return;
    }
#endif
    __syncthreads();
  }
  // The same shared variable in block r of the row.
  template <typename V>
  __device__ V* at(V* p, int r) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (n > 1) return cooperative_groups::this_cluster().map_shared_rank(p, r);
#endif
    (void)r;
    return p;
  }
  __device__ uint32_t first(uint32_t tid) const { return uint32_t(rank) * kThreads + tid; }
  __device__ uint32_t stride() const { return uint32_t(n) * kThreads; }
};

// The score whose order key is k: exact for every key but the NaN's (any NaN comes back) and -0's
// (+0 comes back); weight() gives the same for either, so a weight may be computed from the key.
__device__ __forceinline__ float score_of_key(uint32_t k) {
  return sp::float_of((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// One row as every pass sees it; kCache: keys come from the block's key cache (a template argument, so
// that the cached passes carry none of the recomputation's registers). kScatter: histograms are merged
// by slices (histogram()); a template argument too, so that each kernel carries one merge.
template <typename T, bool kCache, bool kScatter>
struct Row {
  sp::RowScorer scorer;  // step 1 for the row's settings, as the CPU and the split ops score
  const T* logits;
  uint32_t* keys;  // kCache: the block's key cache, slot i = its i-th logit
  float top;       // score of the top candidate
  uint32_t vocab;
  uint32_t id_bits, id_mask;  // candidate = key << id_bits | (id_mask - id); never 0 (id < vocab <= id_mask)
  Ranks ranks;
  bool limbs;  // SampleArgs::limbs
  __device__ __forceinline__ bool scatter() const { return kScatter && ranks.n > 1; }

  __device__ __forceinline__ float score(float logit, uint32_t j) const { return scorer(logit, j); }
  __device__ __forceinline__ float score_at(uint32_t j) const { return score(to_f(logits[j]), j); }
  __device__ __forceinline__ uint32_t key_at(uint32_t j, uint32_t slot) const {
    if constexpr (kCache) return keys[slot];
    else return sp::order_key(score_at(j));
  }
  __device__ __forceinline__ uint64_t candidate(uint32_t key, uint32_t j) const {
    return (uint64_t(key) << id_bits) | (id_mask - j);
  }
  __device__ __forceinline__ int32_t id_of(uint64_t c) const { return int32_t(id_mask - (uint32_t(c) & id_mask)); }
  __device__ __forceinline__ int bits() const { return 32 + int(id_bits); }
  __device__ __forceinline__ float weight_of(uint32_t key) const { return sp::weight(score_of_key(key), top); }

  // f(j, slot) for each logit this thread owns: the same logits, in the same order, in every pass, so
  // a thread only ever reads the cache slots it wrote itself.
  template <typename F>
  __device__ __forceinline__ void for_each(F&& f) const {
    uint32_t slot = threadIdx.x;
    for (uint32_t j = ranks.first(threadIdx.x); j < vocab; j += ranks.stride(), slot += kThreads) f(j, slot);
  }
  // f(logit, j, slot) over the same logits, kLoads of them loaded before any is used: the pass over
  // global memory, whose loads would otherwise each wait out the latency of L2 or HBM in turn (a
  // block owns 10 to 40 logits per thread).
  template <typename F>
  __device__ __forceinline__ void for_each_logit(F&& f) const {
    constexpr int kLoads = 4;
    const uint32_t stride = ranks.stride();
    uint32_t slot = threadIdx.x, j = ranks.first(threadIdx.x);
    for (; uint64_t(j) + uint64_t(kLoads - 1) * stride < vocab; j += kLoads * stride, slot += kLoads * kThreads) {
      float l[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) l[u] = to_f(logits[j + u * stride]);
#pragma unroll
      for (int u = 0; u < kLoads; ++u) f(l[u], j + u * stride, slot + u * kThreads);
    }
    for (; j < vocab; j += stride, slot += kThreads) f(to_f(logits[j]), j, slot);
  }
};

__device__ __forceinline__ unsigned long long block_sum(unsigned long long v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // an earlier reduction's result has been read by every thread
  if ((threadIdx.x & 31) == 0) sh.red[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kWarps ? sh.red[threadIdx.x] : 0ull;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) sh.red[0] = v;
  }
  __syncthreads();
  return sh.red[0];
}

__device__ __forceinline__ unsigned long long block_max(unsigned long long v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kWarps ? sh.red[threadIdx.x] : 0ull;
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x == 0) sh.red[0] = v;
  }
  __syncthreads();
  return sh.red[0];
}

// Row-wide reductions of two values per block at once (a max of `mx`, a sum of `sm`), the same results
// in every block: one exchange, two cluster barriers.
struct MaxSum {
  unsigned long long mx, sm;
};
__device__ MaxSum across(const Ranks& rk, MaxSum block_value, Shared& sh) {
  if (rk.n == 1) return block_value;
  if (threadIdx.x == 0) {
    sh.part = block_value.mx;
    sh.part2 = block_value.sm;
  }
  rk.sync();
  if (threadIdx.x < 32) {
    const bool in = threadIdx.x < unsigned(rk.n);
    unsigned long long m = in ? *rk.at(&sh.part, int(threadIdx.x)) : 0ull;
    unsigned long long s = in ? *rk.at(&sh.part2, int(threadIdx.x)) : 0ull;
    for (int o = 16; o > 0; o >>= 1) {
      m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
      s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    if (threadIdx.x == 0) {
      sh.red[0] = m;
      sh.red[1] = s;
    }
  }
  rk.sync();  // every block has read every part (and sh.red is written) before any is reused
  return {sh.red[0], sh.red[1]};
}

template <typename R>
__device__ unsigned long long row_max(const R& row, unsigned long long v, Shared& sh) {
  return across(row.ranks, MaxSum{block_max(v, sh), 0ull}, sh).mx;
}

// The row's histogram of digit [shift, top_bit) of the candidates >= lo whose digits above top_bit are
// prefix's, into out_weight/out_count (the same bins in every block of the row). Counted
// (weighted = false): every candidate counts 1. Weighted: its fixed-point weight, and only candidates
// of nonzero weight are counted. With min_p > 0 (weighted) it also returns this thread's share of the
// min-p cut (row_max of it is the row's): the highest candidate other than `best` whose weight is
// below min_p.
template <typename R>
__device__ unsigned long long histogram(const R& row, uint64_t lo, uint64_t prefix, int top_bit, int shift,
                                        bool weighted, float min_p, uint64_t best, Shared& sh,
                                        unsigned long long* out_weight, unsigned int* out_count) {
  const uint64_t digit_mask = (1ull << (top_bit - shift)) - 1;
  const Ranks& rk = row.ranks;
  unsigned long long* const bin_weight = sh.weight;
  unsigned int* const bin_count = sh.count;
  unsigned int* const limb_lo = reinterpret_cast<unsigned int*>(sh.weight);  // [kBins], then limb_mid
  unsigned int* const limb_mid = limb_lo + kBins;
  const bool limbs = weighted && row.limbs;
  bin_weight[threadIdx.x] = 0;  // with limbs, the low and middle limbs' bins
  bin_count[threadIdx.x] = 0;
  sh.limb_hi[threadIdx.x] = 0;
  __syncthreads();
  auto add_weight = [&](int d, unsigned long long w) {
    if (limbs) {
      atomicAdd(&limb_lo[d], unsigned(w & 0x3fffu));
      atomicAdd(&limb_mid[d], unsigned((w >> 14) & 0x3fffu));
      atomicAdd(&sh.limb_hi[d], unsigned(w >> 28));
    } else {
      atomicAdd(&bin_weight[d], w);
    }
  };
  unsigned long long cut = 0;
  // Runs of one digit are added once: the leading digits of a row's keys are few, and adding each
  // candidate on its own would serialise the threads on a handful of counters.
  int run = -1;
  unsigned long long run_weight = 0;
  unsigned int run_count = 0;
  row.for_each([&](uint32_t j, uint32_t slot) {
    const uint32_t k = row.key_at(j, slot);
    const uint64_t c = row.candidate(k, j);
    // top_bit <= 63: the shift is defined, and every candidate matches at the first digit.
    if (c < lo || (c >> top_bit) != (prefix >> top_bit)) return;
    uint64_t w = 1;
    if (weighted) {
      const float wf = row.weight_of(k);  // the exp, only for candidates past the key filters
      if (min_p > 0.0f && c != best && wf < min_p) cut = max(cut, (unsigned long long)c);
      w = sp::fixed(wf);
      if (w == 0) return;
    }
    const int d = int((c >> shift) & digit_mask);
    if (d != run) {
      if (run >= 0) {
        if (weighted) add_weight(run, run_weight);  // a counted selection reads only counts
        atomicAdd(&bin_count[run], run_count);
      }
      run = d;
      run_weight = 0;
      run_count = 0;
    }
    run_weight += w;
    ++run_count;
  });
  if (run >= 0) {
    if (weighted) add_weight(run, run_weight);
    atomicAdd(&bin_count[run], run_count);
  }
  if (limbs) {  // the block's limb sums back into 64-bit bins, in place (read all, then write)
    __syncthreads();
    const unsigned t = threadIdx.x;
    using u64 = unsigned long long;
    const u64 w = (u64(sh.limb_hi[t]) << 28) + (u64(limb_mid[t]) << 14) + limb_lo[t];
    __syncthreads();
    bin_weight[t] = w;
  }
  rk.sync();  // B1: every block's bins are complete
  if (row.scatter()) {
    // By slices, in place in out: block r owns slice r (bins [r*slice, (r+1)*slice)). Thread t copies
    // bin t of block t/slice's slice r into out[t]; threads t < slice sum column t of those n copies
    // into out[r*slice + t], where the slice belongs; after B2 every block copies slice q from block q
    // (2 remote reads per thread in all; the other merge makes 2 per block per thread).
    //  - Block q's bins are read by the others only between B1 and B2; it clears them in the next
    //    histogram, after B2.
    //  - Block q's out[q*slice..] is read by the others after B2; block q writes none of out there in
    //    this step, and writes out (any histogram's) again only after the next histogram's B1, which
    //    every block reaches after its reads. The last histogram's reads end before the kernel's final
    //    barrier (sample_kernel), so no block's shared memory goes away while another reads it.
    //  - Thread t alone reads and writes column t of out: the block barrier orders the copies and sums.
    const unsigned slice = unsigned(kBins / rk.n);  // n is a power of two up to kMaxRanks
    const unsigned t = threadIdx.x, q = t / slice, i = t % slice, own = unsigned(rk.rank) * slice;
    out_weight[t] = rk.at(bin_weight, int(q))[own + i];
    out_count[t] = rk.at(bin_count, int(q))[own + i];
    __syncthreads();
    if (t < slice) {
      unsigned long long w = 0;
      unsigned int n = 0;
      for (int r = 0; r < rk.n; ++r) {
        w += out_weight[unsigned(r) * slice + t];
        n += out_count[unsigned(r) * slice + t];
      }
      out_weight[own + t] = w;
      out_count[own + t] = n;
    }
    rk.sync();  // B2: every block's slice is summed, and every block is done reading the others' bins
    if (q != unsigned(rk.rank)) {
      out_weight[t] = rk.at(out_weight, int(q))[t];
      out_count[t] = rk.at(out_count, int(q))[t];
    }
    __syncthreads();  // every merged bin written before warp 0 walks them
    return cut;
  }
  // The row's histogram: every block sums all blocks' bins (the same sums in every block). The loads
  // of the other blocks' bins are independent: unrolled by 8 to have several in flight (by 16, ptxas
  // spilled more).
  {
    const int b = threadIdx.x;
    unsigned long long w = 0;
    unsigned int n = 0;
#pragma unroll 8
    for (int r = 0; r < kMaxRanks; ++r) {
      if (r < rk.n) {
        w += rk.at(bin_weight, r)[b];
        n += rk.at(bin_count, r)[b];
      }
    }
    out_weight[b] = w;
    out_count[b] = n;
  }
  // No block clears its bins for the next digit while another still reads them (and every thread's
  // merged bin is written before warp 0 walks them).
  rk.sync();
  return cut;
}

struct Selected {
  uint64_t bound;  // the candidates >= max(lo, bound) are the selected prefix
  uint64_t mass;   // their summed weight (weighted selections)
  int shift;       // bits of bound below the resolved digits (0: the element itself; 64: target unreachable)
};

// Ends a selection whose bucket (the candidates >= lo under prefix's digits above shift; for a weighted
// selection those of nonzero weight) holds n <= kGather of them, rather than
// resolving its remaining digits one pass and two cluster barriers each (a bucket of equal scores,
// common with 16-bit logits, would go down to the ids' last digit). Every block gathers its members,
// copies all blocks' lists and finds the one at which the running count or weight within the bucket,
// from its highest, reaches rest (1 <= rest <= the bucket's count or weight): the same candidate in
// every block. `above` is what the candidates above the bucket weigh. Returns false, changing nothing,
// should the members found not be the n counted (never expected: the caller then resolves digits as
// before).
template <typename R>
__device__ bool gather(const R& row, uint64_t lo, uint64_t prefix, int shift, uint64_t rest, uint64_t above,
                       unsigned int n, bool weighted, Shared& sh, Selected& out) {
  if (threadIdx.x == 0) sh.own_n = 0;
  __syncthreads();
  row.for_each([&](uint32_t j, uint32_t slot) {
    const uint32_t k = row.key_at(j, slot);
    const uint64_t c = row.candidate(k, j);
    if (c < lo || (c >> shift) != (prefix >> shift)) return;
    uint64_t w = 1;
    if (weighted) {
      w = sp::fixed(row.weight_of(k));
      if (w == 0) return;
    }
    const unsigned int i = atomicAdd(&sh.own_n, 1u);
    if (i < unsigned(kGather)) {
      sh.own_c[i] = c;
      sh.own_w[i] = w;
    }
  });
  const Ranks& rk = row.ranks;
  rk.sync();
  // Warp 0: each block's count (clamped to its list) and where its entries go in the row's list.
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const unsigned int mine = lane < rk.n ? min(*rk.at(&sh.own_n, lane), unsigned(kGather)) : 0u;
    unsigned int incl = mine;
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane < kMaxRanks) {
      sh.gather_n[lane] = mine;
      sh.gather_off[lane] = incl - mine;
    }
    if (lane == 31) sh.gather_total = incl;
  }
  __syncthreads();
  // A thread per (block, entry); a loop of one pass (written without the loop, ptxas spilled more).
  static_assert(kMaxRanks * kGather == kThreads, "one pass copies every list");
  for (unsigned int t = threadIdx.x; t < unsigned(kMaxRanks) * kGather; t += kThreads) {
    const int r = int(t / kGather);
    const unsigned int i = t % kGather;
    if (r < rk.n && i < sh.gather_n[r] && sh.gather_total <= unsigned(kGather)) {
      const unsigned int at = sh.gather_off[r] + i;
      sh.all_c[at] = rk.at(sh.own_c, r)[i];
      sh.all_w[at] = rk.at(sh.own_w, r)[i];
    }
  }
  rk.sync();  // every block has copied every list before any list is rebuilt or its block exits
  const unsigned int total = sh.gather_total;
  if (total != n) return false;  // the same in every block
  if (threadIdx.x == 0) sh.pick_c = 0;
  __syncthreads();
  // Thread t holds entry t: what the entries above it weigh (count) decides whether it is the one.
  if (threadIdx.x < total) {
    const uint64_t c = sh.all_c[threadIdx.x], w = sh.all_w[threadIdx.x];
    uint64_t before = 0;
    for (unsigned int u = 0; u < total; ++u)
      if (sh.all_c[u] > c) before += sh.all_w[u];
    if (before < rest && rest <= before + w) {  // exactly one entry: the running sums partition (0, all]
      sh.pick_c = c;
      sh.pick_mass = before + w;
    }
  }
  __syncthreads();
  const uint64_t c = sh.pick_c, mass = sh.pick_mass;
  if (c == 0) return false;  // not reached: rest is within the bucket
  out = {c, above + mass, 0};
  return true;
}

// Among the candidates with key >= lo, in descending order, finds the first at which the running
// count (weighted = false) or running fixed-point weight (weighted = true) reaches target; the caller
// guarantees 1 <= target <= that set's count or weight. Digits are resolved from the top until the
// bucket holding it is settled: a counted selection stops when the whole bucket is needed, a weighted
// one when the bucket holds a single candidate of nonzero weight (the others in it weigh nothing, so
// taking them along changes no sum and no draw). With use_first (weighted, for this lo) the first
// digit's histogram is sh.first_*, already built.
template <typename R>
__device__ Selected select(const R& row, uint64_t lo, uint64_t target, bool weighted, bool use_first,
                           Shared& sh) {
  uint64_t prefix = 0, above = 0;
  for (int top_bit = row.bits();;) {
    const int width = min(kDigitBits, top_bit);
    const int shift = top_bit - width;
    const unsigned long long* hw = sh.first_weight;
    const unsigned int* hc = sh.first_count;
    if (!use_first || top_bit != row.bits()) {
      histogram(row, lo, prefix, top_bit, shift, weighted, 0.0f, 0, sh, sh.merged_weight, sh.merged_count);
      hw = sh.merged_weight;
      hc = sh.merged_count;
    }
    // Warp 0 walks the digits from the highest: lane L holds kBinsPerLane digits from kBins-1-L*kBinsPerLane down.
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      auto value = [&](int d) -> uint64_t { return weighted ? hw[d] : hc[d]; };
      uint64_t sum = 0;
      for (int i = 0; i < kBinsPerLane; ++i) sum += value(kBins - 1 - lane * kBinsPerLane - i);
      uint64_t incl = sum;
      for (int o = 1; o < 32; o <<= 1) {
        const uint64_t v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const unsigned reached = __ballot_sync(0xffffffffu, incl >= target);
      // Unreachable targets (excluded by the callers) take the whole set rather than reading garbage.
      if (reached == 0) {
        if (lane == 0) sh.pick_digit = -1;
      } else if (lane == __ffs(reached) - 1) {
        uint64_t rest = target - (incl - sum);
        int d = kBins - 1 - lane * kBinsPerLane;
        for (int i = 0; i < kBinsPerLane - 1 && rest > value(d); ++i, --d) rest -= value(d);
        sh.pick_digit = d;
        sh.pick_rest = rest;
      }
    }
    __syncthreads();
    const int d = sh.pick_digit;
    if (d < 0) return {lo, 0, 64};
    const uint64_t rest = sh.pick_rest;
    const uint64_t bucket_weight = hw[d];
    const unsigned int bucket_count = hc[d];
    __syncthreads();  // every thread has read the bins before the next level rebuilds them
    above += target - rest;
    target = rest;
    prefix |= uint64_t(d) << shift;
    const bool settled = weighted ? bucket_count == 1 : uint64_t(bucket_count) == rest;
    if (shift == 0 || settled) return {prefix, above + bucket_weight, shift};
    Selected small;
    if (bucket_count <= unsigned(kGather) &&
        gather(row, lo, prefix, shift, rest, above, bucket_count, weighted, sh, small))
      return small;
    top_bit = shift;
  }
}

// The token of a weighted selection: the bound itself when resolved to the last bit, otherwise the one
// candidate of nonzero weight under it.
template <typename R>
__device__ int32_t selected_token(const R& row, uint64_t lo, const Selected& sel, Shared& sh) {
  if (sel.shift == 0) return row.id_of(sel.bound);
  if (threadIdx.x == 0) sh.found = -1;
  __syncthreads();
  row.for_each([&](uint32_t j, uint32_t slot) {
    const uint32_t k = row.key_at(j, slot);
    const uint64_t c = row.candidate(k, j);
    if (c >= lo && (c >> sel.shift) == (sel.bound >> sel.shift) && sp::fixed(row.weight_of(k)) != 0)
      sh.found = int(j);
  });
  __syncthreads();
  // One block found it; the others hold -1 (stored + 1 so the max over blocks is it).
  return int32_t(across(row.ranks, MaxSum{(unsigned long long)(sh.found + 1), 0ull}, sh).mx) - 1;
}

// The sum of a row histogram's bins (the same bins, so the same sum, in every block).
__device__ unsigned long long bins_sum(const unsigned long long* bins, Shared& sh) {
  return block_sum(bins[threadIdx.x], sh);
}

// The phase profile (SampleArgs::phase_ns): slot i of the row is the time phase i ended, slot 0 the
// kernel's start (after the wait for the kernel before it).
enum Phase { kStart, kTop, kTopK, kFirstHist, kTopP, kDraw, kEnd };
static_assert(kEnd < kSamplePhases, "a row's phase slots hold every phase");
__device__ __forceinline__ void mark(unsigned long long* prof, Phase i) {
  if (prof == nullptr) return;  // the library's launches: null, one predictable branch
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  prof[i] = t;
}

// Steps 4-7 of backend/sampling.h for a row whose top candidate is `best`. prof: the row's phase slots
// in thread 0 of rank 0 when profiling, else null.
template <typename R>
__device__ int32_t draw(const R& row, const SampleParams& p, uint32_t step, uint64_t best, Shared& sh,
                        unsigned long long* prof) {
  uint64_t lo = 0;
  if (p.top_k > 0 && uint32_t(p.top_k) < row.vocab) lo = select(row, 0, uint64_t(p.top_k), false, false, sh).bound;
  mark(prof, kTopK);

  // The first digit's weighted histogram of the top-k set: its bins sum to the total, and the same
  // pass finds the min-p cut (the highest candidate after the top below min_p).
  const int top_bit = row.bits(), shift = top_bit - kDigitBits;
  unsigned long long cut =
      histogram(row, lo, 0, top_bit, shift, true, p.min_p, best, sh, sh.first_weight, sh.first_count);
  const uint64_t total = bins_sum(sh.first_weight, sh);
  uint64_t mass = total;
  if (p.min_p > 0.0f) {
    cut = row_max(row, cut, sh);
    if (cut != 0) {
      // The kept set shrank: its first digit again (the weights of what is kept are unchanged).
      lo = max(lo, uint64_t(cut) + 1);
      histogram(row, lo, 0, top_bit, shift, true, 0.0f, 0, sh, sh.first_weight, sh.first_count);
      mass = bins_sum(sh.first_weight, sh);
    }
  }
  mark(prof, kFirstHist);
  if (p.top_p < 1.0f) {
    const uint64_t target = sp::top_p_target(p.top_p, total);
    if (target >= 1 && target <= mass) {
      const Selected sel = select(row, lo, target, true, true, sh);
      if (sel.shift < 64) mass = sel.mass;  // the prefix kept: the candidates >= max(lo, sel.bound)
    }
  }
  mark(prof, kTopP);
  if (mass == 0) return row.id_of(best);
  const uint64_t r = sp::mulhi64(sp::random_bits(p.seed, step), mass);
  // Over all the candidates >= lo, not only top-p's prefix: r + 1 <= the prefix's mass, so the running
  // weight reaches it inside the prefix, where the two sets' running weights agree; the same token,
  // from the first-digit histogram already built.
  const Selected sel = select(row, lo, r + 1, true, true, sh);
  mark(prof, kDraw);
  if (sel.shift >= 64) return row.id_of(best);  // not reached: r < mass
  return selected_token(row, lo, sel, sh);
}

// kCache: the launch gave each block a key cache of a slot per logit it owns (dynamic shared memory).
// 1 block per SM is stated so that ptxas may use 64 registers (it otherwise kept to 32 and spilled).
// kScatter: see Row (launched with 2 or more blocks per row).
template <typename T, bool kCache, bool kScatter>
__global__ void __launch_bounds__(kThreads, 1) sample_kernel(SampleArgs a) {
  pdl_wait();
  pdl_trigger();
  __shared__ Shared sh;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  const Ranks rk = Ranks::here();
  const int r = int(blockIdx.x) / rk.n;
  unsigned long long* const prof =
      a.phase_ns != nullptr && rk.rank == 0 && threadIdx.x == 0 ? a.phase_ns + int64_t(r) * kSamplePhases : nullptr;
  mark(prof, kStart);
  const int sr = a.st.row ? a.st.row[r] : r;
  const SampleParams p = a.st.params[sr];
  const uint32_t step = a.st.step[sr];
  Row<T, kCache, kScatter> row{sp::RowScorer(p, sp::seen_row(a.st, sr), sp::counts_row(a.st, sr))};
  row.logits = static_cast<const T*>(a.logits) + int64_t(r) * a.ld;
  row.keys = kCache ? reinterpret_cast<uint32_t*>(dynamic_smem) : nullptr;
  row.vocab = a.vocab;
  row.id_bits = a.id_bits;
  row.id_mask = (1u << a.id_bits) - 1u;
  row.top = 0.0f;
  row.limbs = a.limbs != 0;
  row.ranks = rk;

  // The one pass over global memory: the row's validity, its top candidate, and the key cache.
  unsigned long long best = 0;
  bool poisoned = false, any_finite = false;
  row.for_each_logit([&](float l, uint32_t j, uint32_t slot) {
    poisoned |= sp::poisons_row(l);
    any_finite |= sp::is_finite(l);
    const uint32_t k = sp::order_key(row.score(l, j));
    if constexpr (kCache) row.keys[slot] = k;
    best = max(best, (unsigned long long)row.candidate(k, j));
  });
  // Validity as a sum of per-block flags: poisoned blocks in the high half, blocks with a finite logit
  // in the low half (at most 16 each), reduced together with the top.
  const bool block_poisoned = __syncthreads_or(poisoned) != 0;
  const bool block_finite = __syncthreads_or(any_finite) != 0;
  const MaxSum m = across(
      rk, MaxSum{block_max(best, sh), (block_poisoned ? 1ull << 32 : 0ull) | (block_finite ? 1ull : 0ull)}, sh);
  // A row with a NaN or +inf logit, or none finite, has no pick (backend/sampling.h); the counter
  // still advances.
  if ((m.sm >> 32) != 0 || (m.sm & 0xffffffffull) == 0) {
    if (rk.rank == 0 && threadIdx.x == 0) {
      a.out[r] = sp::kNoToken;
      sp::record_pick(a.st, sr, sp::kNoToken);
    }
    return;
  }
  best = m.mx;
  mark(prof, kTop);
  int32_t pick = row.id_of(best);
  if (p.temperature > 0.0f) {
    row.top = row.score_at(uint32_t(pick));
    pick = draw(row, p, step, best, sh, prof);
  }
  // Merged by slices, the last histogram ended without a cluster barrier after its remote reads: no
  // block leaves (its shared memory with it) while another may still be reading its slice. The other
  // passes end in one, and a greedy row made no histogram (temperature is the row's: every block of
  // the cluster takes the same branch).
  if (row.scatter() && p.temperature > 0.0f) rk.sync();
  // Every thread of every block is past its last read of seen and counts (each pass ends in a
  // row-wide barrier).
  if (rk.rank == 0 && threadIdx.x == 0) {
    a.out[r] = pick;
    sp::record_pick(a.st, sr, pick);  // the bookkeeping the CPU's ops and sample_merge share
  }
  mark(prof, kEnd);
}

// Per dtype, once per process (its GPUs assumed alike): the most blocks a row may share, and the
// dynamic shared memory a block may take for its key cache.
struct Limits {
  int max_ranks;       // 1 before Hopper; else the largest cluster of kMaxRanks, 8, 4 or 2 blocks that fits
  size_t cache_bytes;  // the opt-in maximum per block less the static Shared (0: no cache)
};

// INGOT_CUDA_SAMPLE_CACHE=0 turns the key cache off (A/B measurements; the picks are the same).
bool cache_enabled() {
  static const bool on = env_knob("INGOT_CUDA_SAMPLE_CACHE", 1) != 0;
  return on;
}

// INGOT_CUDA_SAMPLE_SCATTER: 1 merges histograms by slices at any blocks per row (2 or more), 0 never;
// unset (or anything else), from kScatterRanks blocks per row on. For the lab's A/B runs; the picks
// are the same either way.
int scatter_mode() {
  static const int v = [] {
    const int k = env_knob("INGOT_CUDA_SAMPLE_SCATTER", -1);
    return k == 0 || k == 1 ? k : -1;
  }();
  return v;
}
bool scatter_for(int ranks) {
  if (ranks < 2) return false;
  return scatter_mode() < 0 ? ranks >= kScatterRanks : scatter_mode() == 1;
}

// The kernel a launch takes: with the key cache or not, merging by slices or not.
template <typename T>
void (*kernel_for(bool cache, bool scatter))(SampleArgs) {
  if (scatter) return cache ? sample_kernel<T, true, true> : sample_kernel<T, false, true>;
  return cache ? sample_kernel<T, true, false> : sample_kernel<T, false, false>;
}

// INGOT_CUDA_SAMPLE_LIMBS=0 adds weights with 64-bit atomics (SampleArgs::limbs) for A/B runs; the
// picks are the same either way.
bool limbs_enabled() {
  static const bool on = env_knob("INGOT_CUDA_SAMPLE_LIMBS", 1) != 0;
  return on;
}

// INGOT_CUDA_SAMPLE_RANKS=N (a power of two up to the largest cluster) fixes the blocks per row before
// the key cache's fit is considered (plan_for), so that the lab can time other plans; 0: the default.
int ranks_override() {
  static const int v = env_knob("INGOT_CUDA_SAMPLE_RANKS", 0);
  return v;
}

// The logits one block of a row shared by `ranks` blocks owns, counting its last stride whole.
constexpr int64_t slots_per_block(int64_t vocab, int ranks) {
  const int64_t stride = int64_t(ranks) * kThreads;
  return (vocab + stride - 1) / stride * kThreads;
}
// Its key cache: a slot per logit it owns.
constexpr size_t cache_bytes_for(int64_t vocab, int ranks) {
  return size_t(slots_per_block(vocab, ranks)) * sizeof(uint32_t);
}

// Shared memory per block: the static Shared (43,456 bytes: 3 x 12 KiB of histograms, 4 KiB of high
// limbs, 2 KiB of gather lists, the rest small; both merges work in it, the slices in the merged
// histogram itself) plus the key cache, the only dynamic shared memory. An H200 lets a block opt in to
// 232,448 bytes (227 KiB), which leaves the cache 188,992: Qwen3's 151,936-token row takes 40,960 per
// block at 16 blocks per row (10 slots per thread), 77,824 at 8, 155,648 at 4; at 2 (307,200) it does
// not fit.
static_assert(sizeof(Shared) <= 48 * 1024, "static shared memory is capped at 48 KiB");
static_assert(sizeof(Shared) + cache_bytes_for(151936, 4) <= 232448, "a 152k row's key cache fits an H200 at 4 blocks");

// What the current device allows the sample kernels of T; found (and the attributes set) on the first
// call on each device: the opt-in limit and the cluster sizes differ between GPUs, and the driver
// keeps function attributes per device.
template <typename T>
Limits probe_limits() {
  Limits l{1, 0};
  const int major = device_attribute(cudaDevAttrComputeCapabilityMajor);
  const int optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  cudaFuncAttributes fa{};
  check(cudaFuncGetAttributes(&fa, kernel_for<T>(true, false)), "sample_kernel attributes");
  // The cached kernels (both merges: the same Shared) may take the rest of the opt-in maximum.
  if (cache_enabled() && size_t(optin) > fa.sharedSizeBytes) {
    const size_t bytes = size_t(optin) - fa.sharedSizeBytes;
    bool ok = true;
    for (const bool scatter : {false, true})
      ok = ok && cudaFuncSetAttribute(kernel_for<T>(true, scatter), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(bytes)) == cudaSuccess;
    if (ok) l.cache_bytes = bytes;
    else cudaGetLastError();  // refused: the passes recompute, as without a cache
  }
  if (major < 9) return l;
  for (const bool cache : {false, true})
    for (const bool scatter : {false, true})
      check(cudaFuncSetAttribute(kernel_for<T>(cache, scatter), cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
            "sample_kernel cluster size");
  // Asked of the kernel a row of c blocks would launch, with the largest cache a launch may take (a
  // cluster resident so is resident without it); 64 registers per thread already leave one
  // 1024-thread block per SM, so the cache costs no residency.
  for (int c = kMaxRanks; c > 1; c /= 2) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(c));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = l.cache_bytes;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = unsigned(c);
    at[0].val.clusterDim.y = at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, kernel_for<T>(l.cache_bytes > 0, scatter_for(c)), &cfg) == cudaSuccess &&
        n > 0) {
      l.max_ranks = c;
      return l;
    }
    cudaGetLastError();  // a size the device refuses: try the next
  }
  return l;
}

template <typename T>
Limits limits() {
  static std::mutex mu;
  static std::map<int, Limits> by_device;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  auto it = by_device.find(dev);
  if (it != by_device.end()) return it->second;
  return by_device[dev] = probe_limits<T>();
}

struct Plan {
  int ranks;
  size_t cache_bytes;  // 0: no cache
};

// Blocks per row: as many as fill about two waves of the GPU's SMs, a power of two up to max_ranks
// (a batch of rows already spreads over the SMs; a single row takes a whole cluster). When the slices
// of that many do not fit the key cache, more blocks per row if up to max_ranks they do: the same work
// in more, smaller blocks, each pass after the first then reading shared memory.
template <typename T>
Plan plan_for(int64_t rows, int64_t vocab) {
  const int sms = device_sm_count();
  const Limits l = limits<T>();
  int c = l.max_ranks;
  if (ranks_override() > 0)
    while (c > 1 && c > ranks_override()) c /= 2;
  else
    while (c > 1 && int64_t(c) * rows > 2 * int64_t(sms)) c /= 2;
  for (int w = c; w <= l.max_ranks; w *= 2)
    if (cache_bytes_for(vocab, w) <= l.cache_bytes) return {w, cache_bytes_for(vocab, w)};
  return {c, 0};
}

}  // namespace

void launch_sample(const Mat& logits, const SampleState& st, int32_t* out, cudaStream_t s,
                   unsigned long long* phase_ns) {
  if (logits.rows == 0) return;
  if (!st.params || !st.step) throw Error("cuda backend: sample needs the per-row settings and draw counters");
  if (logits.cols < 1 || logits.cols > INT32_MAX)
    throw Error("cuda backend: sample over a vocabulary of " + std::to_string(logits.cols) +
                " tokens (1 to 2^31 - 1 supported)");
  if (logits.rows > INT32_MAX) throw Error("cuda backend: sample over too many rows");
  uint32_t id_bits = 1;  // the bit width of the vocabulary size, so that every id is below the id mask
  while (id_bits < 31 && (uint64_t(1) << id_bits) <= uint64_t(logits.cols)) ++id_bits;
  SampleArgs a{logits.data, logits.ld, uint32_t(logits.cols), id_bits, st, out, phase_ns, 0};
  dispatch(logits.dtype, "sample", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const Plan plan = plan_for<T>(logits.rows, logits.cols);
    if (int64_t(plan.ranks) * logits.rows > INT32_MAX) throw Error("cuda backend: sample over too many rows");
    a.limbs = limbs_enabled() && slots_per_block(logits.cols, plan.ranks) < kLimbMaxLogits ? 1 : 0;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(int64_t(plan.ranks) * logits.rows));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = plan.cache_bytes;
    cfg.stream = s;
    cudaLaunchAttribute at[2];
    int n = 0;
    if (plan.ranks > 1) {  // the row's blocks form one cluster
      at[n].id = cudaLaunchAttributeClusterDimension;
      at[n].val.clusterDim.x = unsigned(plan.ranks);
      at[n].val.clusterDim.y = at[n].val.clusterDim.z = 1;
      ++n;
    }
    if (pdl_enabled()) {
      at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[n].val.programmaticStreamSerializationAllowed = 1;
      ++n;
    }
    cfg.attrs = at;
    cfg.numAttrs = unsigned(n);
    check(cudaLaunchKernelEx(&cfg, kernel_for<T>(plan.cache_bytes > 0, scatter_for(plan.ranks)), a), "sample_kernel");
  });
}

}  // namespace ingot::cuda
