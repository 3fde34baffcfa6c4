// The sample op split over ranks on the GPU (Backend::sample_part / sample_merge): a drawn pick over a
// vocabulary cut across tensor-parallel ranks without gathering the logits. What the two ops compute
// is defined in backend/sampling.h (sample_part_row, merge_sample_parts: the CPU reference); the
// candidates, picks, marks, counts and draw counters here are the CPU backend's bit for bit.
//
// Hand-written because no library selects with our ordering: the candidates are ranked by a 64-bit
// key (sampling::composite: the score's order key high, the inverted global id low, so ties go to the
// lower id and NaN ranks lowest), the scores come from the sampler's explicitly rounded step 1, and
// the draw runs the shared fixed-point steps 4-7 (sampling::draw_merged). A CUB top-k would need the
// keys materialised in global memory and a second pass for the scores, and does not give this order
// for NaN or -0 without the same key anyway.
//
// sample_part: one block a row. Each warp keeps its best kSampleCandidates keys in registers (two a
// lane, sorted), offered 32 columns at a time: a ballot against the list's last key lets a batch that
// cannot enter pass with no further work (after the first few batches of an ordinary row, nearly all),
// and a key that enters is inserted by a ballot for its place and two shuffles. One pass over the
// columns (the logits, and the seen marks and counts where a penalty reads them), no atomics, no
// histogram; a row whose keys rise with the column (never seen in practice) costs an insertion per
// column. Then the warps' 32 sorted lists meet in shared memory and each key finds its place in their
// union by binary searches (merged_rank); the first kSampleCandidates places are the row's list, whose
// scores are computed again from their logits (the same rounded steps, so the same bits as the key's
// score, and the CPU's, NaN payloads aside: see the test).
//
// sample_merge: one block a row. The ranks' lists (parts [world, rows, kSampleCandidates]) meet the
// same way; thread 0 then runs the CPU's merge on the first kSampleCandidates of the union (which hold
// every candidate a split-suited setting can keep) and the sample op's bookkeeping.
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/sampling.h"

namespace ingot::cuda {
namespace {

namespace sp = ingot::sampling;

constexpr int K = kSampleCandidates;
static_assert(K == 64, "a warp holds its list two keys a lane");
constexpr unsigned kAll = 0xffffffffu;

constexpr int kPartThreads = 1024;  // one block a row: a row's columns spread over 32 warps
constexpr int kPartWarps = kPartThreads / 32;
constexpr int kPartLoads = 4;  // columns a lane loads before scoring any (their latencies overlap)

constexpr int kMergeThreads = 256;
// The most ranks a merge takes: kMaxTensorParallel (dist/communicator.h), whose keys ([world, K] of 8
// bytes, 32 KiB) fit the 48 KiB of shared memory a block gets without opting in.
constexpr int kMaxMergeWorld = 64;

// Where key x, entry k of sorted list l of n, falls in their union's order (lists of K keys each,
// descending, 0-padded, one after another): k, plus the keys above it in every other list, counting
// in lists before l the equal keys too. Only padding zeros can be equal (a key holds its global id),
// so every entry gets its own place and each of the first K places is taken exactly once. Stops
// counting once the place is K or more (such an entry is not kept).
__device__ int merged_rank(const unsigned long long* lists, int n, int l, int k, unsigned long long x) {
  int rank = k;
  for (int o = 0; o < n && rank < K; ++o) {
    if (o == l) continue;
    const unsigned long long* list = lists + o * K;
    int lo = 0, hi = K;  // the first entry not ranked above x
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      const bool above = o < l ? list[mid] >= x : list[mid] > x;
      if (above) lo = mid + 1;
      else hi = mid;
    }
    rank += lo;
  }
  return rank;
}

// A warp's best K keys so far, descending, 0 where there is none yet: entry i sits in lane i % 32, in
// `a` for i < 32, in `b` for the others. Every lane of the warp calls every member together.
struct WarpTop {
  unsigned long long a = 0, b = 0;

  __device__ __forceinline__ unsigned long long last() const { return __shfl_sync(kAll, b, 31); }

  // y (the same in every lane) into its place; the last entry falls out.
  __device__ __forceinline__ void insert(unsigned long long y) {
    const int lane = int(threadIdx.x & 31);
    const int pos = __popc(__ballot_sync(kAll, a > y)) + __popc(__ballot_sync(kAll, b > y));
    const unsigned long long a_prev = __shfl_up_sync(kAll, a, 1), b_prev = __shfl_up_sync(kAll, b, 1);
    const unsigned long long a_last = __shfl_sync(kAll, a, 31);
    // Entries before pos stay; entry pos is y; each after it takes its predecessor (entry 32's is 31).
    const int ia = lane, ib = 32 + lane;
    const unsigned long long na = ia < pos ? a : ia == pos ? y : a_prev;  // ia > pos: lane >= 1
    const unsigned long long nb = ib < pos ? b : ib == pos ? y : lane == 0 ? a_last : b_prev;
    a = na;
    b = nb;
  }

  // Each lane's key x (0: none) for the list. Keys are distinct, so the list is the K largest offered.
  __device__ __forceinline__ void offer(unsigned long long x) {
    unsigned long long bar = last();
    unsigned m = __ballot_sync(kAll, x > bar);
    while (m != 0) {  // warp-uniform: m, y and bar are the same in every lane
      const int src = __ffs(m) - 1;
      m &= m - 1;
      const unsigned long long y = __shfl_sync(kAll, x, src);
      if (y > bar) {
        insert(y);
        bar = last();
      }
    }
  }
};

struct SamplePartArgs {
  const void* logits;  // [rows, ld]: this rank's columns of each row
  int64_t ld, cols;
  uint32_t offset;       // the vocabulary entry of column 0
  SampleState st;        // params, seen and counts read (indexed by vocabulary entry); nothing written
  SampleCandidate* out;  // [rows, kSampleCandidates]
};

template <typename T>
__global__ void __launch_bounds__(kPartThreads) sample_part_kernel(SamplePartArgs a) {
  pdl_wait();
  pdl_trigger();
  __shared__ unsigned long long lists[kPartWarps * K];  // [warps, K] each warp's best keys, descending
  __shared__ unsigned long long best[K];                // [K] the row's, descending
  const int64_t r = blockIdx.x;
  const int64_t sr = a.st.row ? a.st.row[r] : r;
  const sp::RowScorer scorer(a.st.params[sr], sp::seen_row(a.st, sr), sp::counts_row(a.st, sr));
  const T* logits = static_cast<const T*>(a.logits) + r * a.ld;
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);

  bool poisoned = false, finite = false;
  WarpTop top;
  // Warp w reads 32 consecutive columns, kPartThreads apart kPartLoads times, then the next stretch.
  constexpr int64_t kStride = kPartThreads;
  for (int64_t base = int64_t(warp) * 32 + lane; base - lane < a.cols; base += kPartLoads * kStride) {
    float l[kPartLoads];
#pragma unroll
    for (int u = 0; u < kPartLoads; ++u) {
      const int64_t j = base + u * kStride;
      l[u] = j < a.cols ? to_f(logits[j]) : 0.0f;
    }
    unsigned long long x[kPartLoads];
#pragma unroll
    for (int u = 0; u < kPartLoads; ++u) {
      const int64_t j = base + u * kStride;
      x[u] = 0;
      if (j < a.cols) {
        poisoned |= sp::poisons_row(l[u]);
        finite |= sp::is_finite(l[u]);
        const uint32_t id = a.offset + uint32_t(j);
        x[u] = sp::composite(sp::order_key(scorer(l[u], id)), id);
      }
    }
#pragma unroll
    for (int u = 0; u < kPartLoads; ++u) top.offer(x[u]);
  }
  poisoned = __syncthreads_or(poisoned) != 0;
  finite = __syncthreads_or(finite) != 0;
  lists[warp * K + lane] = top.a;
  lists[warp * K + 32 + lane] = top.b;
  __syncthreads();
  for (int e = int(threadIdx.x); e < kPartWarps * K; e += kPartThreads) {
    const int rank = merged_rank(lists, kPartWarps, e / K, e % K, lists[e]);
    if (rank < K) best[rank] = lists[e];
  }
  __syncthreads();
  if (threadIdx.x < unsigned(K)) {
    const int k = int(threadIdx.x);
    SampleCandidate c{};  // key 0 past the row's last column, as the CPU leaves it
    if (best[k] != 0) {
      const int32_t id = sp::composite_id(best[k]);
      c.key = best[k];
      c.score = scorer(to_f(logits[int64_t(uint32_t(id) - a.offset)]), id);
    }
    if (k == 0) c.flag = poisoned ? kPartPoisoned : finite ? 0 : kPartNoFinite;
    a.out[r * K + k] = c;
  }
}

struct SampleMergeArgs {
  const SampleCandidate* parts;  // [world, rows, kSampleCandidates] rank-major
  int64_t rows;
  int world;
  SampleState st;  // params and step read; seen, counts and step written (the pick's state row)
  int32_t* out;    // [rows]
};

__global__ void __launch_bounds__(kMergeThreads) sample_merge_kernel(SampleMergeArgs a) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ __align__(16) unsigned char merge_smem[];
  unsigned long long* const keys = reinterpret_cast<unsigned long long*>(merge_smem);  // [world, K]
  // [K] the union's first K, descending (raw storage: SampleCandidate's initialisers are not allowed
  // on a __shared__ variable).
  __shared__ __align__(16) unsigned char merged_raw[K * sizeof(SampleCandidate)];
  __shared__ sp::Cand cand[K];  // draw_merged's room
  SampleCandidate* const merged = reinterpret_cast<SampleCandidate*>(merged_raw);
  const int64_t r = blockIdx.x, stride = a.rows * K;
  const SampleCandidate* const row = a.parts + r * K;  // rank w's list at row + w * stride
  const int n = a.world * K;
  for (int e = int(threadIdx.x); e < n; e += kMergeThreads) keys[e] = row[(e / K) * stride + e % K].key;
  __syncthreads();
  for (int e = int(threadIdx.x); e < n; e += kMergeThreads) {
    const int rank = merged_rank(keys, a.world, e / K, e % K, keys[e]);
    if (rank < K) merged[rank] = SampleCandidate{keys[e], row[(e / K) * stride + e % K].score, 0};
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const int64_t sr = a.st.row ? a.st.row[r] : r;
  const SampleParams p = a.st.params[sr];
  if (!sp::split_draw_suits(p)) {
    // A setting that needs the whole row: the CPU's merge throws (Error) before touching the row's
    // state. The settings live in device memory, so no host check can see them before the launch, and
    // a kernel cannot throw: the row gets no pick (kNoToken, which stops its request with an error
    // where the pick is read) and its marks, counts and draw counter stay as they are. Unlike the
    // CPU's throw, the call's other rows still get their picks. (Model::pick_for never sends such a
    // row here: it checks split_draw_suits on the host copy of every row's settings.)
    a.out[r] = sp::kNoToken;
    return;
  }
  bool poisoned = false, finite = false;
  for (int w = 0; w < a.world; ++w) {
    const int32_t flag = row[w * stride].flag;
    poisoned |= flag == kPartPoisoned;
    finite |= flag != kPartNoFinite;
  }
  int kept = 0;  // real candidates among the union's first K
  while (kept < K && merged[kept].key != 0) ++kept;
  const int32_t pick =
      poisoned || !finite || kept == 0 ? sp::kNoToken : sp::draw_merged(merged, kept, p, a.st.step[sr], cand);
  a.out[r] = pick;
  sp::record_pick(a.st, sr, pick);  // as the sample op: marked and counted (not kNoToken), step advanced
}

}  // namespace

void launch_sample_part(const Mat& logits, int64_t offset, const SampleState& st, SampleCandidate* out,
                        cudaStream_t s) {
  if (logits.rows == 0) return;
  if (!st.params) throw Error("cuda backend: sample_part needs the per-row settings");
  if (logits.rows > INT32_MAX) throw Error("cuda backend: sample_part over too many rows");
  // Candidate ids are global vocabulary entries: offset + j must be a token id (below 2^31).
  if (offset < 0 || logits.cols < 0 || offset + logits.cols > INT32_MAX)
    throw Error("cuda backend: sample_part over columns [" + std::to_string(offset) + ", " +
                std::to_string(offset + logits.cols) + ") of the vocabulary (0 to 2^31 - 1 supported)");
  const SamplePartArgs a{logits.data, logits.ld, logits.cols, uint32_t(offset), st, out};
  dispatch(logits.dtype, "sample_part", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch("sample_part_kernel", sample_part_kernel<T>, dim3(unsigned(logits.rows)), dim3(kPartThreads), 0, s, a);
  });
}

void launch_sample_merge(const SampleCandidate* parts, int64_t rows, int world, const SampleState& st, int32_t* out,
                         cudaStream_t s) {
  if (rows == 0) return;
  if (!st.params || !st.step) throw Error("cuda backend: sample_merge needs the per-row settings and draw counters");
  if (rows > INT32_MAX) throw Error("cuda backend: sample_merge over too many rows");
  if (world < 1 || world > kMaxMergeWorld)
    throw Error("cuda backend: sample_merge over " + std::to_string(world) + " ranks (1 to " +
                std::to_string(kMaxMergeWorld) + " supported)");
  const SampleMergeArgs a{parts, rows, world, st, out};
  const size_t smem = size_t(world) * K * sizeof(unsigned long long);
  launch("sample_merge_kernel", sample_merge_kernel, dim3(unsigned(rows)), dim3(kMergeThreads), smem, s, a);
}

}  // namespace ingot::cuda
