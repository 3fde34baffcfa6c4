// The sample op on the GPU, no sort. Every step of backend/sampling.h is a pass over the row's logits
// (scores are recomputed from them each pass, so no scratch is needed): the top candidate is a max of
// the 64-bit candidate keys; top-k, top-p and the draw are radix selections over those keys
// (histograms of 10-bit digits from the top, counting candidates or summing their fixed-point
// weights); totals are sums. Sums are integers, so the order in which threads add them cannot change
// them, and the pick equals the CPU reference's bit for bit.
//
// A row is shared by the blocks of one thread block cluster (Hopper; up to 16 blocks, each a slice of
// the vocabulary): the passes are compute-bound (a score, a key and a weight per logit), and one block
// on one SM took ~1 ms over a 152k vocabulary. The blocks merge their partial sums and histograms
// through distributed shared memory and all reach the same decisions; rank 0 writes the results. On
// GPUs without clusters a row is one block, as before.
#include <cooperative_groups.h>

#include <cfloat>

#include "backend/cuda/cuda_common.cuh"
#include "backend/sampling.h"

namespace ingot::cuda {
namespace {

namespace sp = ingot::sampling;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kDigitBits = 10;  // two histograms (a block's and the merged one) fit static shared memory
constexpr int kBins = 1 << kDigitBits;
constexpr int kBinsPerLane = kBins / 32;
constexpr int kMaxRanks = 16;  // blocks per row (the largest cluster Hopper allows, non-portable)

struct SampleArgs {
  const void* logits;
  int64_t ld;
  uint32_t vocab;
  SampleState st;
  int32_t* out;
};

struct Shared {
  unsigned long long weight[kBins];  // per digit: this block's summed fixed-point weight (weighted selections)
  unsigned int count[kBins];         // per digit: its candidates (counted selections) or those of nonzero weight
  unsigned long long merged_weight[kBins];  // the same over the row's blocks
  unsigned int merged_count[kBins];
  unsigned long long red[kWarps];  // block reductions
  unsigned long long part;         // this block's share of a row reduction, read by the others
  unsigned long long pick_rest, pick_above;
  int pick_digit;
  int found;
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

// One row as every pass sees it.
template <typename T>
struct Row {
  const T* logits;
  const uint8_t* seen;     // null when no penalty applies
  const int32_t* counts;   // null when neither additive penalty applies
  float penalty, frequency, presence, inv_temp;
  float top;  // score of the top candidate
  uint32_t vocab;
  Ranks ranks;

  __device__ __forceinline__ float score_at(uint32_t j) const {
    return sp::score(to_f(logits[j]), seen != nullptr && seen[j] != 0, penalty, counts != nullptr ? counts[j] : 0,
                     frequency, presence, inv_temp);
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

// A row-wide reduction of one value per block (op: sum or max), the same result in every block.
template <bool kMax>
__device__ unsigned long long across(const Ranks& rk, unsigned long long block_value, Shared& sh) {
  if (rk.n == 1) return block_value;
  if (threadIdx.x == 0) sh.part = block_value;
  rk.sync();
  if (threadIdx.x < 32) {
    unsigned long long v = threadIdx.x < unsigned(rk.n) ? *rk.at(&sh.part, int(threadIdx.x)) : 0ull;
    for (int o = 16; o > 0; o >>= 1) {
      const unsigned long long u = __shfl_xor_sync(0xffffffffu, v, o);
      v = kMax ? max(v, u) : v + u;
    }
    if (threadIdx.x == 0) sh.red[0] = v;
  }
  rk.sync();  // every block has read every part (and sh.red[0] is written) before any is reused
  return sh.red[0];
}

template <typename T>
__device__ unsigned long long row_sum(const Row<T>& row, unsigned long long v, Shared& sh) {
  return across<false>(row.ranks, block_sum(v, sh), sh);
}
template <typename T>
__device__ unsigned long long row_max(const Row<T>& row, unsigned long long v, Shared& sh) {
  return across<true>(row.ranks, block_max(v, sh), sh);
}

struct Selected {
  uint64_t bound;  // the candidates >= max(lo, bound) are the selected prefix
  uint64_t mass;   // their summed weight (weighted selections)
  int shift;       // bits of bound below the resolved digits (0: the element itself; 64: target unreachable)
};

// Among the candidates with key >= lo, in descending order, finds the first at which the running
// count (weighted = false) or running fixed-point weight (weighted = true) reaches target; the caller
// guarantees 1 <= target <= that set's count or weight. Digits are resolved from the top until the
// bucket holding it is settled: a counted selection stops when the whole bucket is needed, a weighted
// one when the bucket holds a single candidate of nonzero weight (the others in it weigh nothing, so
// taking them along changes no sum and no draw).
template <typename T>
__device__ Selected select(const Row<T>& row, uint64_t lo, uint64_t target, bool weighted, Shared& sh) {
  uint64_t prefix = 0, above = 0;
  for (int top_bit = 64;;) {
    const int width = min(kDigitBits, top_bit);
    const int shift = top_bit - width;
    const uint64_t digit_mask = (1ull << width) - 1;
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      sh.weight[b] = 0;
      sh.count[b] = 0;
    }
    __syncthreads();
    // Runs of one digit are added once: the leading digits of a row's keys are few, and adding each
    // candidate on its own would serialise the threads on a handful of counters.
    int run = -1;
    unsigned long long run_weight = 0;
    unsigned int run_count = 0;
    for (uint32_t j = row.ranks.first(threadIdx.x); j < row.vocab; j += row.ranks.stride()) {
      const float s = row.score_at(j);
      const uint64_t c = sp::composite(sp::order_key(s), j);
      if (c < lo || (top_bit < 64 && (c >> top_bit) != (prefix >> top_bit))) continue;
      uint64_t w = 1;
      if (weighted) {
        w = sp::fixed(sp::weight(s, row.top));
        if (w == 0) continue;
      }
      const int d = int((c >> shift) & digit_mask);
      if (d != run) {
        if (run >= 0) {
          atomicAdd(&sh.weight[run], run_weight);
          atomicAdd(&sh.count[run], run_count);
        }
        run = d;
        run_weight = 0;
        run_count = 0;
      }
      run_weight += w;
      ++run_count;
    }
    if (run >= 0) {
      atomicAdd(&sh.weight[run], run_weight);
      atomicAdd(&sh.count[run], run_count);
    }
    // The row's histogram: every block sums all blocks' bins (the same sums in every block).
    const Ranks& rk = row.ranks;
    rk.sync();
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      unsigned long long w = 0;
      unsigned int n = 0;
      for (int r = 0; r < rk.n; ++r) {
        w += rk.at(sh.weight, r)[b];
        n += rk.at(sh.count, r)[b];
      }
      sh.merged_weight[b] = w;
      sh.merged_count[b] = n;
    }
    rk.sync();  // no block clears its bins for the next digit while another still reads them
    // Warp 0 walks the digits from the highest: lane L holds kBinsPerLane digits from kBins-1-L*kBinsPerLane down.
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      auto value = [&](int d) -> uint64_t { return weighted ? sh.merged_weight[d] : sh.merged_count[d]; };
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
    const uint64_t bucket_weight = sh.merged_weight[d];
    const unsigned int bucket_count = sh.merged_count[d];
    __syncthreads();  // every thread has read the bins before the next level clears them
    above += target - rest;
    target = rest;
    prefix |= uint64_t(d) << shift;
    const bool settled = weighted ? bucket_count == 1 : uint64_t(bucket_count) == rest;
    if (shift == 0 || settled) return {prefix, above + bucket_weight, shift};
    top_bit = shift;
  }
}

// The token of a weighted selection: the bound itself when resolved to the last bit, otherwise the one
// candidate of nonzero weight under it.
template <typename T>
__device__ int32_t selected_token(const Row<T>& row, uint64_t lo, const Selected& sel, Shared& sh) {
  if (sel.shift == 0) return sp::composite_id(sel.bound);
  if (threadIdx.x == 0) sh.found = -1;
  __syncthreads();
  for (uint32_t j = row.ranks.first(threadIdx.x); j < row.vocab; j += row.ranks.stride()) {
    const float s = row.score_at(j);
    const uint64_t c = sp::composite(sp::order_key(s), j);
    if (c >= lo && (c >> sel.shift) == (sel.bound >> sel.shift) && sp::fixed(sp::weight(s, row.top)) != 0)
      sh.found = int(j);
  }
  __syncthreads();
  // One block found it; the others hold -1 (stored + 1 so the max over blocks is it).
  return int32_t(across<true>(row.ranks, (unsigned long long)(sh.found + 1), sh)) - 1;
}

// Steps 4-7 of backend/sampling.h for a row whose top candidate is `best`.
template <typename T>
__device__ int32_t draw(const Row<T>& row, const SampleParams& p, uint32_t step, uint64_t best, Shared& sh) {
  uint64_t lo = 0;
  if (p.top_k > 0 && uint32_t(p.top_k) < row.vocab) lo = select(row, 0, uint64_t(p.top_k), false, sh).bound;

  // The top-k set's total weight, and the min-p cut: the highest candidate after the top below min_p.
  unsigned long long total = 0, cut = 0;
  for (uint32_t j = row.ranks.first(threadIdx.x); j < row.vocab; j += row.ranks.stride()) {
    const float s = row.score_at(j);
    const uint64_t c = sp::composite(sp::order_key(s), j);
    if (c < lo) continue;
    const float w = sp::weight(s, row.top);
    total += sp::fixed(w);
    if (p.min_p > 0.0f && c != best && w < p.min_p) cut = max(cut, (unsigned long long)c);
  }
  total = row_sum(row, total, sh);
  uint64_t mass = total;
  if (p.min_p > 0.0f) {
    cut = row_max(row, cut, sh);
    if (cut != 0) {
      lo = max(lo, uint64_t(cut) + 1);
      unsigned long long kept = 0;
      for (uint32_t j = row.ranks.first(threadIdx.x); j < row.vocab; j += row.ranks.stride()) {
        const float s = row.score_at(j);
        if (sp::composite(sp::order_key(s), j) >= lo) kept += sp::fixed(sp::weight(s, row.top));
      }
      mass = row_sum(row, kept, sh);
    }
  }
  if (p.top_p < 1.0f) {
    const uint64_t target = sp::top_p_target(p.top_p, total);
    if (target >= 1 && target <= mass) {
      const Selected sel = select(row, lo, target, true, sh);
      if (sel.shift < 64) {
        lo = max(lo, sel.bound);
        mass = sel.mass;
      }
    }
  }
  if (mass == 0) return sp::composite_id(best);
  const uint64_t r = sp::mulhi64(sp::random_bits(p.seed, step), mass);
  const Selected sel = select(row, lo, r + 1, true, sh);
  if (sel.shift >= 64) return sp::composite_id(best);  // not reached: r < mass
  return selected_token(row, lo, sel, sh);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a) {
  pdl_wait();
  pdl_trigger();
  __shared__ Shared sh;
  const Ranks rk = Ranks::here();
  const int r = int(blockIdx.x) / rk.n;
  const int sr = a.st.row ? a.st.row[r] : r;
  const SampleParams p = a.st.params[sr];
  const uint32_t step = a.st.step[sr];
  uint8_t* seen = a.st.seen ? a.st.seen + int64_t(sr) * a.st.seen_ld : nullptr;
  Row<T> row;
  row.logits = static_cast<const T*>(a.logits) + int64_t(r) * a.ld;
  row.seen = p.repetition_penalty != 1.0f ? seen : nullptr;
  int32_t* counts = a.st.counts ? a.st.counts + int64_t(sr) * a.st.counts_ld : nullptr;
  row.counts = sp::counts_penalise(p) ? counts : nullptr;
  row.penalty = p.repetition_penalty;
  row.frequency = p.frequency_penalty;
  row.presence = p.presence_penalty;
  row.inv_temp = sp::inverse_temperature(p.temperature);
  row.vocab = a.vocab;
  row.top = 0.0f;
  row.ranks = rk;

  unsigned long long best = 0;
  bool poisoned = false, any_finite = false;
  for (uint32_t j = rk.first(threadIdx.x); j < row.vocab; j += rk.stride()) {
    const float l = to_f(row.logits[j]);
    poisoned |= sp::poisons_row(l);
    any_finite |= sp::is_finite(l);
    best = max(best, (unsigned long long)sp::composite(sp::order_key(row.score_at(j)), j));
  }
  // A row with a NaN or +inf logit, or none finite, has no pick (backend/sampling.h); the counter
  // still advances.
  const bool row_poisoned = across<true>(rk, __syncthreads_or(poisoned) ? 1ull : 0ull, sh) != 0;
  const bool row_finite = across<true>(rk, __syncthreads_or(any_finite) ? 1ull : 0ull, sh) != 0;
  if (row_poisoned || !row_finite) {
    if (rk.rank == 0 && threadIdx.x == 0) {
      a.out[r] = sp::kNoToken;
      a.st.step[sr] = step + 1;
    }
    return;
  }
  best = row_max(row, best, sh);
  int32_t pick = sp::composite_id(best);
  if (p.temperature > 0.0f) {
    row.top = row.score_at(uint32_t(pick));
    pick = draw(row, p, step, best, sh);
  }
  // Every thread of every block is past its last read of seen and counts (each pass ends in a
  // row-wide barrier).
  if (rk.rank == 0 && threadIdx.x == 0) {
    a.out[r] = pick;
    if (seen) seen[pick] = 1;
    if (counts) ++counts[pick];
    a.st.step[sr] = step + 1;
  }
}

// The most blocks a row may share on this process's GPUs (assumed alike): 1 before Hopper; else the
// largest cluster of kMaxRanks, 8, 4 or 2 blocks the kernel can be resident with.
template <typename T>
int max_ranks() {
  static const int v = [] {
    int dev = 0, major = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
    if (major < 9) return 1;
    check(cudaFuncSetAttribute(sample_kernel<T>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
          "sample_kernel cluster size");
    for (int c = kMaxRanks; c > 1; c /= 2) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(unsigned(c));
      cfg.blockDim = dim3(kThreads);
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeClusterDimension;
      at[0].val.clusterDim.x = unsigned(c);
      at[0].val.clusterDim.y = at[0].val.clusterDim.z = 1;
      cfg.attrs = at;
      cfg.numAttrs = 1;
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, sample_kernel<T>, &cfg) == cudaSuccess && n > 0) return c;
      cudaGetLastError();  // a size the device refuses: try the next
    }
    return 1;
  }();
  return v;
}

// Blocks per row: as many as fill about two waves of the GPU's SMs, a power of two up to max_ranks
// (a batch of rows already spreads over the SMs; a single row takes a whole cluster).
template <typename T>
int ranks_for(int64_t rows) {
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  int c = max_ranks<T>();
  while (c > 1 && int64_t(c) * rows > 2 * int64_t(sms)) c /= 2;
  return c;
}

}  // namespace

void launch_sample(const Mat& logits, const SampleState& st, int32_t* out, cudaStream_t s) {
  if (logits.rows == 0) return;
  if (!st.params || !st.step) throw Error("cuda backend: sample needs the per-row settings and draw counters");
  if (logits.cols < 1 || logits.cols > INT32_MAX)
    throw Error("cuda backend: sample over a vocabulary of " + std::to_string(logits.cols) +
                " tokens (1 to 2^31 - 1 supported)");
  if (logits.rows > INT32_MAX) throw Error("cuda backend: sample over too many rows");
  SampleArgs a{logits.data, logits.ld, uint32_t(logits.cols), st, out};
  dispatch(logits.dtype, "sample", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const int ranks = ranks_for<T>(logits.rows);
    if (int64_t(ranks) * logits.rows > INT32_MAX) throw Error("cuda backend: sample over too many rows");
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(int64_t(ranks) * logits.rows));
    cfg.blockDim = dim3(kThreads);
    cfg.stream = s;
    cudaLaunchAttribute at[2];
    int n = 0;
    if (ranks > 1) {  // the row's blocks form one cluster
      at[n].id = cudaLaunchAttributeClusterDimension;
      at[n].val.clusterDim.x = unsigned(ranks);
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
    check(cudaLaunchKernelEx(&cfg, sample_kernel<T>, a), "sample_kernel");
  });
}

}  // namespace ingot::cuda
