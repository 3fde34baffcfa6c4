// The one-token INT4 decode product with each block's weights brought into shared memory by bulk
// copies (cp.async.bulk, the Tensor Memory Accelerator's linear form) instead of register loads: an
// experiment (issue 12, 2026-12-07, seventh session), taken by int4_linear.cu only under
// INGOT_CUDA_INT4_BULK=1 until a device run shows it faster (docs/quantization.md, Plan), and timed
// against the register kernel by bench/int4_lab.cu ("bulk S8 C8").
//
// Why: on the H200 the register kernel (int4_gemv_kernel.cuh) streams gate/up at ~62% of the copy
// bandwidth where it reached ~85% on an H100 (docs/quantization-log.md). The H200 has the H100's SMs
// and clocks and 40% more bandwidth, so the same loads in flight per SM cover less of it: by Little's
// law an SM needs ~22 KB in flight at ~32 bytes/ns and ~0.7 µs of loaded latency, and registers bound
// what a warp can hold (gate/up's instance: 70 registers, 3 blocks of 8 warps an SM). A bulk copy is
// one instruction for kilobytes and holds no registers: thread 0 issues every copy of the block's
// 16-row tile at the start, before the dependency wait (weights depend on no earlier kernel), so a
// block has its whole tile in flight (32 KB at K = 4096) and an SM as many tiles as its shared memory
// and registers allow (4 at S = 8: 58 registers, ptxas).
//
// Layout: the 8-row blocks (backend.h's Int4Layout::Blocks8), nibbles paired. A tile's A rows g
// (Out::rows' ra) are 8 consecutive rows of one block, a contiguous run of K * 4 bytes, and its rows
// g + 8 (rb) another; within a run quad q (columns 128q ..) is 512 bytes in which lane (g, t)'s 16
// bytes (row g, piece 4q + t) lie at 16 * lane. The two runs are copied in chunks of KC quads, one
// mbarrier each, so the warps start on the first chunk while the rest arrive; a warp's read of one
// quad from shared memory is 512 contiguous bytes. Warp w of S takes quads w, w + S, ... of each chunk
// (so w, w + S, ... of the row when KC is a multiple of S) and each slot's arithmetic is
// one_token_slot's, in the register kernel's order: at S = 8 and KC a multiple of 8 the outputs are bit
// for bit those of Split<8, 1, 1> (the register kernel's gate/up instance).
// Symmetric weights (zero 8), groups of 128 or more (the scale per slot), 1..8 tokens; bulk_suits says
// which calls it takes.
//
// Hand-written: no library offers a W4A16 product in this layout. PTX forms from the PTX ISA 8.x
// (mbarrier.*, cp.async.bulk).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/int4_gemv_kernel.cuh"

namespace ingot::cuda::int4bulk {

using int4gemv::Args;

constexpr int kMaxChunks = 64;  // mbarriers a block holds
inline int64_t smem_bytes(int64_t K) { return K * 8; }  // the tile: 16 rows x K/2 bytes

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// mbarriers with transaction counts and bulk copies exist from sm_90; the other architectures a build
// compiles for (sm_80) get a kernel that traps, which launch_bulk never starts (it asks for compute
// capability 9).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define INGOT_INT4BULK_SM90 1
#else
#define INGOT_INT4BULK_SM90 0
#endif

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#if INGOT_INT4BULK_SM90
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#else
  __trap();
#endif
}
// The inits made visible to the async proxy, on whose barriers the bulk copies complete.
__device__ __forceinline__ void mbar_fence_init() {
#if INGOT_INT4BULK_SM90
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// This thread's arrival, and `bytes` more that the barrier's phase waits for.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
#if INGOT_INT4BULK_SM90
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) global -> shared, counted on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if INGOT_INT4BULK_SM90
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
#endif
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
#if INGOT_INT4BULK_SM90
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
#else
  return false;
#endif
}
// Until the barrier's phase `parity` completes. One that never would (a byte count that did not match
// its copies) traps: an error named at the next check instead of a hung device.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  for (uint32_t i = 0; !mbar_try_wait(bar, parity); ++i)
    if (i == (1u << 22)) __trap();
}

template <typename T, int S, int KC, class Out>
__global__ void __launch_bounds__(S * 32) bulk_kernel(Args a) {
  static_assert(S > 1, "the S warp sums meet in shared memory");
  extern __shared__ __align__(128) uint8_t tile[];  // [2][K/128][512]: the A rows' run, then the B rows'
  __shared__ uint64_t bars[kMaxChunks];
  __shared__ float partial[S][4][32];  // the S warp sums (mma::sum_tile)
  const int part = int(threadIdx.x) / 32, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int n0 = int(blockIdx.x) * Out::kSpan, quads = a.K / 128, chunks = (quads + KC - 1) / KC;
  uint8_t* run_a = tile;
  uint8_t* run_b = tile + quads * 512;
  int ra, rb;  // this lane's rows g and g + 8; rows ra - g and rb - g start the two runs
  Out::rows(a, n0, g, ra, rb);
  if (threadIdx.x == 0) {
    for (int c = 0; c < chunks; ++c) mbar_init(&bars[c], 1);
    mbar_fence_init();
    const uint8_t* ga = a.w + a.wm.row_offset(ra);  // g = 0 here: the runs' first rows
    const uint8_t* gb = a.w + a.wm.row_offset(rb);
    for (int c = 0; c < chunks; ++c) {
      const int q0 = c * KC;
      const uint32_t bytes = uint32_t(min(KC, quads - q0)) * 512u;
      mbar_expect_tx(&bars[c], 2 * bytes);
      bulk_copy(run_a + q0 * 512, ga + int64_t(q0) * 512, bytes, &bars[c]);
      bulk_copy(run_b + q0 * 512, gb + int64_t(q0) * 512, bytes, &bars[c]);
    }
  }
  const T* sca = static_cast<const T*>(a.scales) + int64_t(ra) * a.s_ld;
  const T* scb = static_cast<const T*>(a.scales) + int64_t(rb) * a.s_ld;
  if (t * 64 < (a.K >> a.group_shift)) {
    prefetch_l2_line(sca + t * 64);
    prefetch_l2_line(scb + t * 64);
  }
  __syncthreads();  // the barriers are initialised before any thread waits on them
  pdl_wait();
  pdl_trigger();
  const T* xr = g < a.T ? static_cast<const T*>(a.x) + int64_t(g) * a.x_ld : nullptr;
  int4gemv::Slot sl;
  sl.zma = sl.zmb = (int4gemv::Pair<T>::kMagic | 8u) * 0x00010001u;  // 2^e + 8: symmetric weights
  float acc[2][4] = {};
  for (int c = 0; c < chunks; ++c) {
    // Every warp waits on every chunk, so no copy is still landing when the block exits.
    mbar_wait(&bars[c], 0);
    const int q1 = min((c + 1) * KC, quads);
    for (int q = c * KC + part; q < q1; q += S) {
      const int p = 4 * q + t, grp = (p * 32) >> a.group_shift;
      sl.qa = reinterpret_cast<const uint4*>(run_a + q * 512)[lane];
      sl.qb = reinterpret_cast<const uint4*>(run_b + q * 512)[lane];
      sl.sa = int4gemv::bits_of(sca[grp]) * 0x00010001u;
      sl.sb = int4gemv::bits_of(scb[grp]) * 0x00010001u;
      uint32_t xv[16];  // token g, the piece's 32 columns as 16 pairs (zeros past the call's tokens)
      int4gemv::load_pairs32(xr ? xr + int64_t(p) * 32 : nullptr, xv);
      int4gemv::one_token_slot<T, int4gemv::Scaling::PerSlot, true>(sl, xv, acc);
    }
  }
  float c4[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) c4[e] = acc[0][e] + acc[1][e];
  Out::template store<T, S>(a, c4, partial, part, lane, n0, 0);
}

// Whether bulk_kernel<.., KC, Out> takes the call's shape: weights in 8-row blocks (their nibbles
// paired, as relayout_int4_cuda leaves every weight the CUDA kernels read), symmetric, groups of 128+,
// 1..8 tokens, whole runs (every tile's rows inside the weight and starting a block: N a multiple of
// 16, or for SwiGLU half of it a multiple of 8), chunks within the barriers a block holds.
template <class Out, int KC = 8>
bool bulk_suits(const Args& a) {
  const bool runs = std::is_same_v<Out, int4gemv::SwigluOut> ? (a.N / 2) % 8 == 0 : a.N % 16 == 0;
  return a.wm.quad == 512 && a.wm.row == 64 && a.K % 128 == 0 && !a.zeros && a.group_shift >= 7 && a.T >= 1 &&
         a.T <= 8 && runs && (a.K / 128 + KC - 1) / KC <= kMaxChunks;
}

// The dynamic shared memory bulk_kernel<T, S, KC, Out> may take on the current device: the opt-in limit
// less its static arrays (asked once per device).
template <typename T, int S, int KC, class Out>
int64_t dynamic_smem_limit() {
  static std::mutex mu;
  static std::map<int, int64_t> limits;  // device -> bytes
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  auto it = limits.find(dev);
  if (it != limits.end()) return it->second;
  cudaFuncAttributes fa{};
  check(cudaFuncGetAttributes(&fa, bulk_kernel<T, S, KC, Out>), "int4 bulk kernel attributes");
  return limits[dev] = int64_t(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)) - int64_t(fa.sharedSizeBytes);
}

// Launches bulk_kernel<T, S, KC, Out>, one block a tile, where it takes the call; false, launching
// nothing, where it does not (bulk_suits, a GPU before sm_90, or a tile past the device's shared
// memory). The library takes S = KC = 8, and 16 for rows past K = 8192, whose tile leaves one block an
// SM; bench/int4_lab.cu times others.
template <typename T, class Out, int S = 8, int KC = 8>
bool launch_bulk(const Args& a, cudaStream_t s) {
  if (!bulk_suits<Out, KC>(a) || device_attribute(cudaDevAttrComputeCapabilityMajor) < 9 ||
      smem_bytes(a.K) > dynamic_smem_limit<T, S, KC, Out>())
    return false;
  allow_dynamic_smem(bulk_kernel<T, S, KC, Out>, size_t(smem_bytes(a.K)), "int4 bulk kernel shared memory");
  launch("int4_bulk_kernel", bulk_kernel<T, S, KC, Out>, dim3(int4gemv::grid_blocks<int4gemv::Split<S, 1, 1>, Out>(a)),
         dim3(S * 32), size_t(smem_bytes(a.K)), s, a);
  return true;
}

}  // namespace ingot::cuda::int4bulk
