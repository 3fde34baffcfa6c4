// The weight-streaming product for a few tokens (y = x w^T, 16-bit x and w, f32 accumulation) on the
// tensor cores: the weights are the A operand of mma.sync m16n8k16 (16 output rows a warp tile), the
// tokens its B columns (8 a block; columns past the call are zeros). A lane loads 16
// bytes of each of its two rows at the same columns, and those bytes are its A fragments as they are:
// the MMA's k slots need not be consecutive columns, only the same columns for A and B, so lane t's
// four k slots of an MMA are four consecutive columns of its own 16-byte piece, and the x fragment is a
// 16-byte load of each token's row at that piece. No conversion or permute: per 32 bytes of weights a
// lane issues two weight loads, one x load and two MMAs, where the CUDA-core GEMV
// (gemv_kernel.cuh) widens and multiplies every weight once per token. S warps of a tile split K,
// interleaved by step as int4_gemv_kernel.cuh's do; U pieces per row and lane in flight.
//
// Each output's sum is formed in a fixed order that does not depend on T or on the block's other
// tokens: the MMAs of one token column in the same sequence of pieces, two accumulators (columns 0-3
// and 4-7 of the pieces) added at the end, then the S warps' sums in warp order. Hand-written: the
// library GEMMs' tiles are sized for many tokens and read a decode step's weights at well under the
// copy bandwidth.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/mma_tiles.cuh"

namespace ingot::cuda::tcgemv {

struct Args {
  const void* x;   // [T, K] activations, x_ld elements between rows (16-byte aligned rows)
  int64_t x_ld;
  const void* w;   // [N, K] weights, w_ld elements between rows (16-byte aligned rows)
  int64_t w_ld;
  const void* bias;  // [N] or null
  void* y;           // [T, N], y_ld elements between rows
  int64_t y_ld;
  int T, N, K;  // K a multiple of 8
  // Bulk prefetch before the wait, as gemv_kernel.cuh's (gemv.cu, prefetch_plan): block b streams bytes
  // [b * pf_share, min((b + 1) * pf_share, pf_bytes)) of the weight into L2; pf_bytes 0: each block
  // prefetches the head of its own rows instead.
  int64_t pf_bytes, pf_share;
};

constexpr int kPrefetchBytes = 2048;  // per row, into L2 before the dependency wait (no bulk prefetch)

// Lane (g, t) = (lane / 4, lane % 4) of a warp owns A rows g and g + 8 of its tile (outputs n0 + g,
// n0 + g + 8) and B column g (token tok0 + g; blockIdx.y picks the group of 8 tokens). A row is cut
// into 16-byte pieces of 8 columns; in step i, slot u, lane t reads piece p = (i * S + part) * 4U +
// 4u + t of both rows. Its words (columns 8p + 2w, 8p + 2w + 1), w = 0..3, are A fragments a0/a1 (k
// slots 2t, 2t + 1) and a2/a3 (slots 2t + 8, 2t + 9) of two MMAs: words 0, 1 the first, words 2, 3 the
// second; the same words of x are the B fragments.
template <typename T, int S, int U>
__global__ void __launch_bounds__(S * 32) kernel(Args a) {
  const int part = int(threadIdx.x) / 32, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int n0 = int(blockIdx.x) * 16, tok0 = int(blockIdx.y) * 8;
  // Rows past N read the last row (always in bounds); their outputs are not written.
  const int na = min(n0 + g, a.N - 1), nb = min(n0 + g + 8, a.N - 1);
  const T* wa = static_cast<const T*>(a.w) + int64_t(na) * a.w_ld;
  const T* wb = static_cast<const T*>(a.w) + int64_t(nb) * a.w_ld;
  // The head of the weight into L2 before waiting: weights depend on no earlier kernel.
  if (a.pf_bytes > 0) {
    if (blockIdx.y == 0) prefetch_l2_share(a.w, blockIdx.x, a.pf_share, a.pf_bytes);
  } else {
    const int head = min(a.K * int(sizeof(T)), kPrefetchBytes);
    for (int b = (part * 4 + t) * 128; b < head; b += S * 4 * 128) {
      prefetch_l2_line(reinterpret_cast<const char*>(wa) + b);
      prefetch_l2_line(reinterpret_cast<const char*>(wb) + b);
    }
  }
  pdl_wait();
  pdl_trigger();
  // Token row of this lane's B column, null past the call.
  const T* xr = tok0 + g < a.T ? static_cast<const T*>(a.x) + int64_t(tok0 + g) * a.x_ld : nullptr;
  const int pieces = a.K / 8;
  constexpr int kStepPieces = S * 4 * U;
  const int steps = (pieces + kStepPieces - 1) / kStepPieces;
  float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};

  for (int i = 0; i < steps; ++i) {
    const int q0 = (i * S + part) * 4 * U;  // the warp's first piece this step (lane t = 0)
    uint4 qa[U], qb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int p = q0 + 4 * u + t;
      const bool ok = p < pieces;
      qa[u] = ok ? load_stream16(wa + int64_t(p) * 8) : make_uint4(0, 0, 0, 0);
      qb[u] = ok ? load_stream16(wb + int64_t(p) * 8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (q0 + 4 * u >= pieces) break;  // warp-uniform: the MMAs below run on every lane or none
      const int p = q0 + 4 * u + t;
      const uint32_t A0[4] = {qa[u].x, qb[u].x, qa[u].y, qb[u].y};
      const uint32_t A1[4] = {qa[u].z, qb[u].z, qa[u].w, qb[u].w};
      // x of token column g at the piece's columns (zeros outside the call: they meet real weights).
      const uint4 xv = xr && p < pieces ? *reinterpret_cast<const uint4*>(xr + int64_t(p) * 8) : make_uint4(0, 0, 0, 0);
      mma::Mma<T>::run(acc[0], A0, xv.x, xv.y);
      mma::Mma<T>::run(acc[1], A1, xv.z, xv.w);
    }
  }

  float c[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) c[e] = acc[0][e] + acc[1][e];
  if constexpr (S > 1) {
    __shared__ float partial[S][4][32];  // the tile's S warp sums
    mma::store_tile<T, S>(a, c, partial, part, lane, n0, tok0);
  } else {
    mma::store_tile<T, S>(a, c, nullptr, part, lane, n0, tok0);
  }
}

}  // namespace ingot::cuda::tcgemv
