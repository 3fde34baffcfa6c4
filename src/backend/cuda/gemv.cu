// y = x w^T (+bias) for one to eight tokens: weight-streaming kernels (cuBLASLt's GEMM tiles waste
// most of their work at these sizes). Two to eight tokens of 16-bit x take the tensor-core kernel of
// tc_gemv_kernel.cuh (the weights read once for all tokens); one token the CUDA-core kernel below.
// For one token: S warps share each output row, each reading its own interleaved 16-byte
// columns of it (a warp's lanes read 512 contiguous bytes per load), U loads in flight per lane, R rows
// per block; the S partial sums meet in shared memory and are added in warp order. x is re-read from
// L1/L2. With the SwiGLU epilogue a warp reads the gate row and the up row of one output, so the MLP's
// gate/up product and its activation are one kernel for decode.
// Weights depend on no earlier kernel, so the head of the weight is streamed into L2 before waiting
// for the previous kernel (programmatic dependent launch): the first wave's blocks issue bulk
// prefetches of the first INGOT_CUDA_GEMV_PREFETCH_KB (4 MiB) while the short kernels before them
// (add+RMSNorm, RoPE, attention, which let this kernel be scheduled as soon as they start) run, so the
// memory system keeps streaming weights between products instead of idling through those kernels.
// Accumulation is f32 in a fixed order, so results do not depend on launch or graph replay. On a
// backend of f32 activations with 16-bit weights x and y are f32 (the kernel's Tx): x is read as it is,
// so the product differs from the CPU backend's only in summation order.
//
// The shape of the split (S, U, R, and whether the next step's loads are issued before this step's
// math) follows K; it was chosen on the H200 by bench/gemv_lab.cu (2026-12-02, bf16, one launch per
// layer in a graph, decode shapes of Qwen3-8B, Qwen3-0.6B and Llama-3.1-8B; docs/performance.md): one
// warp per row left N = 4096..6144 products at 2.7-3.6 TB/s (a single wave of ~31 warps per SM, each
// waiting on its own loads); four warps per row reached 3.5-4.3 TB/s.
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/gemv_kernel.cuh"
#include "backend/cuda/tc_gemv_kernel.cuh"

namespace ingot::cuda {
namespace {

using gemv::GemvArgs;

// Bytes of a weight streamed into L2 before the dependency wait: INGOT_CUDA_GEMV_PREFETCH_KB (0: each
// block prefetches only the head of its own rows, the kernel before the bulk prefetch).
int64_t prefetch_budget() {
  static const int64_t kb = env_knob("INGOT_CUDA_GEMV_PREFETCH_KB", 4 * 1024);
  return kb > 0 ? kb * 1024 : 0;
}

// The bulk prefetch of the head of the weight (the pf_* fields of both kernels' arguments): the budget split over its regions,
// each region's share split over the first wave's first blocks (one per SM: blocks are dispatched in
// index order, so they are the ones resident while the kernel before drains). Rows must be contiguous
// (w_ld == K) for the head to be one run of bytes.
template <typename A>
void prefetch_plan(A& a, int regions, int64_t elem_size, int64_t blocks) {
  a.pf_bytes = a.pf_share = 0;
  const int64_t budget = prefetch_budget();
  if (budget == 0 || a.w_ld != a.K) return;
  const int64_t region = int64_t(a.N) * a.K * elem_size;
  const int64_t want = std::min(region, budget / regions) / 16 * 16;
  const int64_t users = std::min<int64_t>(blocks, device_sm_count());
  if (want == 0 || users < 1) return;
  a.pf_share = (want / users + 15) / 16 * 16;
  a.pf_bytes = want;
}

// Whether the first step's weight loads go before the dependency wait (gemv_kernel.cuh, kEarly): for
// rows of at most 3k columns, where a warp's row is one or two load steps, so the step loaded early is
// most of the block's reads. Measured on the H200 in one call (2026-12-03, bf16, batch 1, prompt 128,
// 256 new, bulk prefetch 4 MiB): Qwen3-0.6B (K 1024-3072) 1,174 -> 1,225 tok/s; on K >= 4096 it cost
// ~0.5% (Qwen3-8B 235.7 -> 234.5, Llama-3.1-8B 243.4 -> 242.6), so longer rows keep the loads after
// the wait. INGOT_CUDA_GEMV_EARLY_LOAD=0/1 forces it off/on (A/B knob).
bool early_load(int K) {
  static const int knob = env_knob("INGOT_CUDA_GEMV_EARLY_LOAD", -1);
  return knob < 0 ? K <= 3072 : knob != 0;
}

template <typename T, typename Tx, int S, int U, int R, bool kPipe, bool kSwiglu>
void launch_shape(GemvArgs a, cudaStream_t s) {
  const unsigned blocks = unsigned((a.N + R - 1) / R);
  prefetch_plan(a, kSwiglu ? 2 : 1, int64_t(sizeof(T)), blocks);
  if (early_load(a.K))
    launch("gemv_kernel", gemv::kernel<T, S, U, R, kPipe, kSwiglu, true, Tx>, dim3(blocks), dim3(R * S * 32), 0, s, a);
  else
    launch("gemv_kernel", gemv::kernel<T, S, U, R, kPipe, kSwiglu, false, Tx>, dim3(blocks), dim3(R * S * 32), 0, s, a);
}

// The split for K (measured, see the header): short rows one warp each with the loads pipelined,
// 2k columns two warps, longer rows four. The SwiGLU kernel reads two rows per warp, so two loads in
// flight per row and pipelined.
// INGOT_CUDA_GEMV_ONE_WARP=1 gives every row one warp, four loads in flight, four rows a block, no
// pipelining: the kernel before the split (for A/B measurements, as INGOT_CUDA_PDL=0 is).
bool one_warp_per_row() {
  static const bool on = env_knob("INGOT_CUDA_GEMV_ONE_WARP", 0) == 1;
  return on;
}

// The split follows K and the weight's type alone: f32 x beside 16-bit w takes the 16-bit split.
template <typename T, typename Tx, bool kSwiglu>
void launch_for_k(const GemvArgs& a, cudaStream_t s) {
  if (one_warp_per_row()) return launch_shape<T, Tx, 1, 4, 4, false, kSwiglu>(a, s);
  if constexpr (kSwiglu) {
    if (a.K <= 1024) return launch_shape<T, Tx, 1, 2, 4, true, true>(a, s);
    if (a.K <= 2048) return launch_shape<T, Tx, 2, 2, 2, true, true>(a, s);
    return launch_shape<T, Tx, 4, 2, 1, true, true>(a, s);
  } else {
    if (a.K <= 1024) return launch_shape<T, Tx, 1, 4, 4, true, false>(a, s);
    if (a.K <= 2048) return launch_shape<T, Tx, 2, 4, 2, false, false>(a, s);
    return launch_shape<T, Tx, 4, 4, 2, false, false>(a, s);
  }
}

// w's dtype picks T; x in it (Tx = T) or f32 (Tx = float, 16-bit w only: gemv_suits checked).
template <bool kSwiglu>
void launch_any(DType wdt, DType xdt, const GemvArgs& a, cudaStream_t s) {
  dispatch(wdt, "linear", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (xdt == wdt) launch_for_k<T, T, kSwiglu>(a, s);
    else launch_for_k<T, float, kSwiglu>(a, s);
  });
}

// Whether the GEMV kernels take x [T, K], w [rows, K] and y: x and y in w's dtype or f32 beside a
// 16-bit w, 16-byte rows, and one token (the CUDA-core kernel), or 2..kTcTokens tokens of 16-bit x in
// w's dtype (the tensor-core kernel; on the H200, Qwen3-8B shapes, bf16, 2026-12-02, cuBLASLt had been
// faster than a CUDA-core GEMV from two tokens on: decode tok/s at batch 2/4/8 377/749/1,435 against
// 358/605/596, because that kernel multiplied every weight once per token).
constexpr int kTcTokens = 8;

// INGOT_CUDA_TC_GEMV: 0 sends 2..8 tokens to cuBLASLt (the path before the tensor-core kernel), 1 (the
// default) to the tensor-core kernel, 2 also one token (A/B against the CUDA-core kernel).
int tc_mode() {
  static const int mode = env_knob("INGOT_CUDA_TC_GEMV", 1);
  return mode;
}

// Whether the tensor-core kernel takes x [T, K] against w: 16-bit x in w's dtype, 2..kTcTokens tokens
// (or one, with INGOT_CUDA_TC_GEMV=2).
bool tc_takes(const Mat& x, const Mat& w) {
  if (x.dtype != w.dtype || x.dtype == DType::F32 || x.rows > kTcTokens) return false;
  return x.rows > 1 ? tc_mode() != 0 : tc_mode() == 2;
}

bool gemv_suits(const Mat& x, const Mat& w, const Mat& y) {
  if (x.rows < 1 || y.dtype != x.dtype || y.rows != x.rows) return false;
  if (x.rows > 1 && !tc_takes(x, w)) return false;
  if (x.dtype != w.dtype && !widened_weights(x.dtype, w.dtype)) return false;
  const int64_t V = 16 / int64_t(dtype_size(w.dtype));
  return w.cols % V == 0 && aligned16(w.data, w.ld, dtype_size(w.dtype)) &&
         aligned16(x.data, x.ld, dtype_size(x.dtype)) && w.rows <= INT32_MAX && w.cols <= INT32_MAX;
}

// The tensor-core kernel's split of K: the fewest warps per 16-row tile that still put ~32 warps on
// every SM (few tiles, e.g. 4096 rows, take 16 warps a tile; the LM head's thousands of tiles one),
// each warp keeping at least one step of its own.
template <typename T, int U>
void launch_tc_u(tcgemv::Args a, cudaStream_t s) {
  const int64_t tiles = (a.N + 15) / 16, want = 32 * int64_t(device_sm_count());
  int S = 1;
  while (S < 16 && tiles * S < want && int64_t(a.K) / (8 * 4 * U) >= 2 * S) S *= 2;
  const dim3 grid(unsigned(tiles), unsigned((a.T + 7) / 8));
  prefetch_plan(a, 1, int64_t(sizeof(T)), tiles);
  const auto go = [&](auto kernel, int warps) { launch("tc_gemv_kernel", kernel, grid, dim3(warps * 32), 0, s, a); };
  switch (S) {
    case 1: return go(tcgemv::kernel<T, 1, U>, 1);
    case 2: return go(tcgemv::kernel<T, 2, U>, 2);
    case 4: return go(tcgemv::kernel<T, 4, U>, 4);
    case 8: return go(tcgemv::kernel<T, 8, U>, 8);
    default: return go(tcgemv::kernel<T, 16, U>, 16);
  }
}

// U, the 16-byte pieces of each row a lane has in flight, as measured on the H200 (2026-12-03, bf16,
// decode at batch 2/4/8, the bulk prefetch on): rows of up to 3k columns four (Qwen3-0.6B batch 2 2,090
// tok/s against 2,030 with two), longer rows two (Qwen3-8B batch 2/4/8 411/804/1,535 against
// 380/736/1,417 with four, whose registers cost occupancy). INGOT_CUDA_TC_LOADS=2/4 forces either.
template <typename T>
void launch_tc(const tcgemv::Args& a, cudaStream_t s) {
  static const int loads = env_knob("INGOT_CUDA_TC_LOADS", 0);
  if (loads == 2 || (loads != 4 && a.K > 3072)) launch_tc_u<T, 2>(a, s);
  else launch_tc_u<T, 4>(a, s);
}

}  // namespace

bool launch_gemv(const Mat& x, const Mat& w, const void* bias, const Mat& y, cudaStream_t s) {
  if (!gemv_suits(x, w, y)) return false;
  if (tc_takes(x, w)) {
    const tcgemv::Args a{x.data, x.ld, w.data, w.ld, bias, y.data, y.ld, int(x.rows), int(w.rows), int(w.cols), 0, 0};
    dispatch(w.dtype, "linear", [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      if constexpr (!std::is_same_v<T, float>) launch_tc<T>(a, s);
    });
    return true;
  }
  const GemvArgs a{x.data, w.data, w.ld, bias, y.data, int(w.rows), int(w.cols), 0, 0};
  launch_any<false>(w.dtype, x.dtype, a, s);
  return true;
}

bool launch_gemv_swiglu(const Mat& x, const Mat& w_gate_up, const Mat& out, cudaStream_t s) {
  if (x.rows != 1 || !gemv_suits(x, w_gate_up, out) || w_gate_up.rows % 2 != 0) return false;
  const GemvArgs a{x.data, w_gate_up.data, w_gate_up.ld, nullptr, out.data, int(w_gate_up.rows / 2),
                   int(w_gate_up.cols), 0, 0};
  launch_any<true>(w_gate_up.dtype, x.dtype, a, s);
  return true;
}

}  // namespace ingot::cuda
