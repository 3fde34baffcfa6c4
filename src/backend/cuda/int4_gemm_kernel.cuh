// The INT4 weight-only product for 9..64 tokens of f16/bf16 activations, shaped as a GEMM: the
// weights (in 8-row blocks, backend.h's Int4Layout::Blocks8, nibbles paired or not) and x (in the
// fragment order int4gemv::xfrag_kernel writes for the same nibble order) streamed through a
// multi-stage cp.async ring in shared memory, instead of each warp walking K with its own register
// loads (int4gemv::kernel's NT > 1 instances, which int4_linear.cu keeps for weights in rows). Hand-written for the same reasons as
// int4_gemv_kernel.cuh (our packed layout and our exact dequantization).
//
// Why: at 16-64 tokens int4gemv::kernel is bound by each warp's chain of global loads (weights, and
// x from L2), dequantization and MMAs (docs/quantization-log.md: gate/up at 64 tokens 78.6 µs on the
// H200, where its 3.7M MMAs take ~25 µs and its 59 MB of packed weights ~15 µs at copy bandwidth).
// Here the block's copies of the next ST - 1 quads (128 columns) are in flight while its warps compute
// on the current one, and one copy of x in shared memory feeds every warp of the block.
//
// Shape: a block holds WN warps of W 16-row tiles each (BT = WN * W tiles, all NT token blocks: a
// dequantized A fragment feeds NT MMAs). Stage s of the ring holds quad q of the block's tiles, each
// tile two 512-byte runs of 8-row blocks (A rows g and g + 8: Out::rows), and quad q of x in fragment
// order (NT x 2 KB). A product with too few tiles to fill the GPU splits K over a cluster of C blocks,
// whose sums meet in distributed shared memory and are added in rank order (deterministic). The
// arithmetic per weight is the batch instances' own (Scaling::PerWeight: round((nibble - zero) *
// scale) to the activation dtype, f32 accumulation), and the A and B fragments are theirs; or, with
// groups of 128+ (a stage's quad then lies in one group of each row), Scaling::PerSlot: the MMAs take
// the exact integers nibble - zero into a stage's own f32 sums, each multiplied by its row's scale once
// (an FFMA per sum instead of an HMUL2 per weight pair), as the one-token instance does.
//
// Needs (gemm_suits in int4_linear.cu): the weights in 8-row blocks (so K a multiple of 128; for
// SwigluOut half the rows a multiple of 8, so that a tile's up rows are one block), a.xf = x in
// fragment order for NT blocks (written first by the launcher), groups of 32+ (every power of two the
// kernels take: a lane's piece lies in one group).
#pragma once
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/int4_gemv_kernel.cuh"

namespace ingot::cuda::int4gemm {

using int4gemv::Args;

// Thread-block clusters exist from sm_90; the other architectures a build compiles for (sm_80) get
// instances that the launcher never starts with C > 1 (int4_linear.cu asks for compute capability 9).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define INGOT_INT4GEMM_CLUSTERS 1
#else
#define INGOT_INT4GEMM_CLUSTERS 0
#endif

__device__ __forceinline__ int cluster_rank() {
#if INGOT_INT4GEMM_CLUSTERS
  return int(cooperative_groups::this_cluster().block_rank());
#else
  __trap();
  return 0;
#endif
}

// Bytes of shared memory per stage: BT tiles x 2 runs x 512, and NT blocks x 4 words x 32 lanes x 16.
template <int BT, int NT>
constexpr int stage_bytes() {
  return BT * 1024 + NT * 2048;
}

template <typename T, class Out, int WN, int W, int NT, int ST, int C, bool kZeros,
          int4gemv::Scaling kScaling = int4gemv::Scaling::PerWeight>
__global__ void __launch_bounds__(WN * 32) gemm_kernel(Args a) {
  namespace ig = int4gemv;
  constexpr int BT = WN * W, kStage = stage_bytes<BT, NT>() / 16;  // uint4 per stage
  constexpr int kThreads = WN * 32;
  static_assert(ST >= 2, "a ring of at least two stages");
  extern __shared__ uint4 smem[];  // [ST][BT * 64 + NT * 128] uint4: weights then x
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int tiles = (Out::outputs(a) + Out::kSpan - 1) / Out::kSpan;
  const int tile0 = int(blockIdx.x) * BT;
  int rank = 0;
  if constexpr (C > 1) rank = cluster_rank();
  const int quads = a.K / 128, per = (quads + C - 1) / C;
  const int q_begin = min(quads, rank * per), nq = min(quads, q_begin + per) - q_begin;

  // This thread's weight copies: run c = threadIdx.x / 32 + k * WN (k < 2W) of the block's 2 BT runs,
  // 16 bytes at lane; a run is tile c / 2's first (A rows) or second (A rows + 8) 8-row block.
  const uint8_t* wsrc[2 * W];
  bool wok[2 * W];
#pragma unroll
  for (int k = 0; k < 2 * W; ++k) {
    const int c = warp + k * WN, tile = tile0 + c / 2;
    int ra, rb;
    Out::rows(a, min(tile, tiles - 1) * Out::kSpan, 0, ra, rb);
    wok[k] = tile < tiles;
    wsrc[k] = a.w + int64_t((c & 1) ? rb : ra) / 8 * a.wm.block + 16 * lane;
  }
  // The lane's scale rows (rows g and g + 8 of each of its warp's tiles) and zero rows.
  const T *sca[W], *scb[W];
  const uint8_t *zra[W], *zrb[W];
#pragma unroll
  for (int w = 0; w < W; ++w) {
    const int tile = min(tile0 + warp * W + w, tiles - 1);
    int ra, rb;
    Out::rows(a, tile * Out::kSpan, g, ra, rb);
    sca[w] = static_cast<const T*>(a.scales) + int64_t(ra) * a.s_ld;
    scb[w] = static_cast<const T*>(a.scales) + int64_t(rb) * a.s_ld;
    zra[w] = kZeros && a.zeros ? a.zeros + int64_t(ra) * a.s_ld : nullptr;
    zrb[w] = kZeros && a.zeros ? a.zeros + int64_t(rb) * a.s_ld : nullptr;
  }
  const uint4* xsrc = static_cast<const uint4*>(a.xf);

  auto load_w = [&](int slot, int q) {
    uint4* dst = smem + slot * kStage;
#pragma unroll
    for (int k = 0; k < 2 * W; ++k)
      mma::cp_async16(dst + (warp + k * WN) * 32 + lane, wsrc[k] + int64_t(q) * a.wm.quad, wok[k]);
  };
  auto load_x = [&](int slot, int q) {
    uint4* dst = smem + slot * kStage + BT * 64;
    const uint4* src = xsrc + int64_t(q) * (4 * NT * 32);
#pragma unroll
    for (int i = int(threadIdx.x); i < 4 * NT * 32; i += kThreads) mma::cp_async16(dst + i, src + i, true);
  };
  // Scales (and zero patterns) of quad q for the lane's rows, ST - 1 quads ahead in registers.
  ig::Slot sreg[ST][W];
  auto load_s = [&](ig::Slot (&sl)[W], int q) {
    const int grp = (q * 128 + 32 * t) >> a.group_shift;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      sl[w].sa = ig::bits_of(sca[w][grp]) * 0x00010001u;
      sl[w].sb = ig::bits_of(scb[w][grp]) * 0x00010001u;
      const uint32_t za = kZeros && zra[w] ? uint32_t(zra[w][grp]) : 8u;
      const uint32_t zb = kZeros && zrb[w] ? uint32_t(zrb[w][grp]) : 8u;
      sl[w].zma = (ig::Pair<T>::kMagic | za) * 0x00010001u;
      sl[w].zmb = (ig::Pair<T>::kMagic | zb) * 0x00010001u;
    }
  };

  // The first ST - 1 quads' weights and scales depend on no earlier kernel: issued before the wait.
#pragma unroll
  for (int s = 0; s < ST - 1; ++s)
    if (s < nq) {
      load_w(s, q_begin + s);
      load_s(sreg[s], q_begin + s);
    }
  pdl_wait();
  pdl_trigger();
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    if (s < nq) load_x(s, q_begin + s);
    mma::cp_async_commit();  // one group per stage, empty or not, so the waits count stages
  }

  float acc[W][NT][4];
#pragma unroll
  for (int w = 0; w < W; ++w)
#pragma unroll
    for (int b = 0; b < NT; ++b)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[w][b][e] = 0.f;

  for (int i0 = 0; i0 < nq; i0 += ST) {
#pragma unroll
    for (int s = 0; s < ST; ++s) {
      const int i = i0 + s;
      if (i >= nq) break;
      mma::cp_async_wait<ST - 2>();
      __syncthreads();  // stage s landed for every thread; stage s - 1 consumed by every warp
      const int kNext = (s + ST - 1) % ST;  // a constant once the loop is unrolled
      if (i + ST - 1 < nq) {
        load_w(kNext, q_begin + i + ST - 1);
        load_x(kNext, q_begin + i + ST - 1);
        load_s(sreg[kNext], q_begin + i + ST - 1);
      }
      mma::cp_async_commit();
      const uint4* ws = smem + s * kStage;
      const uint4* xs = ws + BT * 64;
      uint4 qa[W], qb[W];
#pragma unroll
      for (int w = 0; w < W; ++w) {
        qa[w] = ws[(2 * (warp * W + w)) * 32 + lane];
        qb[w] = ws[(2 * (warp * W + w) + 1) * 32 + lane];
      }
      // PerWeight: the MMAs add into acc; PerSlot: into this stage's own sums (rows g: e 0, 1; g + 8:
      // e 2, 3), scaled into acc after them (sm is unused, and compiled away, per weight).
      constexpr bool kPerSlot = kScaling == ig::Scaling::PerSlot;
      float sm[W][NT][4];
      if constexpr (kPerSlot) {
#pragma unroll
        for (int w = 0; w < W; ++w)
#pragma unroll
          for (int b = 0; b < NT; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) sm[w][b][e] = 0.f;
      }
      float(*dst)[NT][4] = kPerSlot ? sm : acc;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint4 xw[NT];
#pragma unroll
        for (int b = 0; b < NT; ++b) xw[b] = xs[(j * NT + b) * 32 + lane];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int w = 0; w < W; ++w) {
            const uint32_t wa4[4] = {qa[w].x, qa[w].y, qa[w].z, qa[w].w};
            const uint32_t wb4[4] = {qb[w].x, qb[w].y, qb[w].z, qb[w].w};
            uint32_t A[4];
            if constexpr (kPerSlot) ig::int_fragment<T>(wa4[j], wb4[j], sreg[s][w].zma, sreg[s][w].zmb, h, A);
            else ig::a_fragment<T>(sreg[s][w], wa4[j], wb4[j], h, A);
#pragma unroll
            for (int b = 0; b < NT; ++b)
              mma::Mma<T>::run(dst[w][b], A, h ? xw[b].z : xw[b].x, h ? xw[b].w : xw[b].y);
          }
        }
      }
      if constexpr (kPerSlot) {
#pragma unroll
        for (int w = 0; w < W; ++w) {
          const float fa = ig::scale_f32<T>(sreg[s][w].sa), fb = ig::scale_f32<T>(sreg[s][w].sb);
#pragma unroll
          for (int b = 0; b < NT; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[w][b][e] = fmaf(sm[w][b][e], e < 2 ? fa : fb, acc[w][b][e]);
        }
      }
    }
  }
  mma::cp_async_wait<0>();

  if constexpr (C == 1) {
#pragma unroll
    for (int w = 0; w < W; ++w)
#pragma unroll
      for (int b = 0; b < NT; ++b)
        if (8 * b < a.T)
          Out::template store<T, 1>(a, acc[w][b], nullptr, 0, lane, (tile0 + warp * W + w) * Out::kSpan, 8 * b);
  } else {
#if INGOT_INT4GEMM_CLUSTERS
    // Split K: each rank's sums into its own shared memory, then rank r adds token blocks r, r + C, ..
    // of every rank in rank order and writes them.
    static_assert(BT * NT * 512 <= ST * stage_bytes<BT, NT>(), "the sums fit in the ring");
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    __syncthreads();  // every warp is done with the ring
    float* red = reinterpret_cast<float*>(smem);  // [BT][NT][4][32]
#pragma unroll
    for (int w = 0; w < W; ++w)
#pragma unroll
      for (int b = 0; b < NT; ++b)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[(((warp * W + w) * NT + b) * 4 + e) * 32 + lane] = acc[w][b][e];
    cl.sync();
    for (int b = rank; b < NT; b += C) {
      if (8 * b >= a.T) break;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        for (int r = 0; r < C; ++r) {
          const float* rr = cl.map_shared_rank(red, r);
#pragma unroll
          for (int e = 0; e < 4; ++e) c[e] += rr[(((warp * W + w) * NT + b) * 4 + e) * 32 + lane];
        }
        Out::template store<T, 1>(a, c, nullptr, 0, lane, (tile0 + warp * W + w) * Out::kSpan, 8 * b);
      }
    }
    cl.sync();  // no rank leaves while another still reads its shared memory
#else
    __trap();
#endif
  }
}

// Launches the kernel for a (x already in fragment order at a.xf): a block per BT tiles, C blocks a
// cluster along K, with programmatic dependent launch.
// kScaling PerSlot needs groups of 128+ (a.group_shift >= 7; the caller checks).
template <typename T, class Out, int WN, int W, int NT, int ST, int C, bool kZeros,
          int4gemv::Scaling kScaling = int4gemv::Scaling::PerWeight>
void launch_gemm(const Args& a, cudaStream_t s) {
  constexpr int BT = WN * W;
  constexpr int smem = ST * stage_bytes<BT, NT>();
  auto kern = gemm_kernel<T, Out, WN, W, NT, ST, C, kZeros, kScaling>;
  allow_dynamic_smem(kern, smem, "int4 gemm shared memory");
  const int tiles = (Out::outputs(a) + Out::kSpan - 1) / Out::kSpan;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned((tiles + BT - 1) / BT), unsigned(C));
  cfg.blockDim = dim3(WN * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (C > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = 1;
    attr[n].val.clusterDim.y = unsigned(C);
    attr[n++].val.clusterDim.z = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = unsigned(n);
  check(cudaLaunchKernelEx(&cfg, kern, a), "int4 gemm");
}

}  // namespace ingot::cuda::int4gemm
