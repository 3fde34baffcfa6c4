// A lab-only design for bench/int4_lab.cu (issue 12; written 2026-12-06, not yet run on a GPU): the
// one-token INT4 decode product with the weights streamed through a ring of D shared-memory stages per
// warp by cp.async, instead of each warp's own register loads.
//
// Why: ncu on the library's one-token kernel (an H100, 2026-12-06, docs/quantization.md) showed it
// latency-bound with few warps in flight: 130 registers a thread, 3 blocks of 4 warps an SM, 0.76
// eligible warps a scheduler, the largest stall the wait on global loads. Here a warp keeps D - 1
// steps of its weights in flight in shared memory while it computes on the oldest, so the bytes in
// flight no longer cost registers (Marlin's structure, in the form of this repository's kernel: the
// same tile, the same slots, the same per-slot scaling).
//
// Each lane copies and later reads back only its own 16-byte pieces, so cp.async's wait is the only
// synchronisation the ring needs (mma_tiles.cuh, cp_async16). Symmetric weights only (every zero 8;
// a.zeros must be null), groups of 128 or more (the scale per slot, Scaling::PerSlot), 1..8 tokens,
// PlainOut. If it wins in the lab it moves into int4_gemv_kernel.cuh as a split of the library's kernel.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/int4_gemv_kernel.cuh"

namespace ingot::lab::int4stream {

using cuda::int4gemv::Args;

// S warps per 16-row tile splitting K as the library's kernel does (step i, slot u, lane t: piece
// (i * S + part) * 4U + 4u + t), U slots a step, D stages in the ring.
template <typename T, int S, int U, int D>
__global__ void __launch_bounds__(S * 32) kernel(Args a) {
  namespace ig = cuda::int4gemv;
  static_assert(D >= 2, "a ring of one stage would wait on every copy");
  const int part = int(threadIdx.x) / 32, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int n0 = int(blockIdx.x) * 16;
  const int ra = min(n0 + g, a.N - 1), rb = min(n0 + g + 8, a.N - 1);  // rows past N read the last row
  const uint8_t* wa = a.w + int64_t(ra) * a.w_ld;
  const uint8_t* wb = a.w + int64_t(rb) * a.w_ld;
  const T* sca = static_cast<const T*>(a.scales) + int64_t(ra) * a.s_ld;
  const T* scb = static_cast<const T*>(a.scales) + int64_t(rb) * a.s_ld;
  // The tile's scale rows into L2 (read a slot at a time below; the weights come through the ring).
  if (t * 64 < (a.K >> a.group_shift)) {
    cuda::prefetch_l2_line(sca + t * 64);
    cuda::prefetch_l2_line(scb + t * 64);
  }
  cuda::pdl_wait();
  cuda::pdl_trigger();

  const int pieces = a.K / 32;
  constexpr int kStepPieces = S * 4 * U;
  const int steps = (pieces + kStepPieces - 1) / kStepPieces;
  __shared__ uint4 ring[S][D][U][2][32];  // [warp, stage, slot, row g | g + 8, lane] 16 bytes each

  // Step `step`'s weights into stage step % D (zero-filled past K), one commit group a step, empty
  // past the last step so that the wait below counts the same groups every iteration.
  auto issue = [&](int step) {
    if (step < steps) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int p = (step * S + part) * 4 * U + 4 * u + t;
        const bool ok = p < pieces;
        cuda::mma::cp_async16(&ring[part][step % D][u][0][lane], ok ? wa + int64_t(p) * 16 : wa, ok);
        cuda::mma::cp_async16(&ring[part][step % D][u][1][lane], ok ? wb + int64_t(p) * 16 : wb, ok);
      }
    }
    cuda::mma::cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < D - 1; ++i) issue(i);

  const T* xr = g < a.T ? static_cast<const T*>(a.x) + int64_t(g) * a.x_ld : nullptr;
  const uint32_t zm = (ig::Pair<T>::kMagic | 8u) * 0x00010001u;  // 2^e + 8, both halves
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < steps; ++i) {
    issue(i + D - 1);
    cuda::mma::cp_async_wait<D - 1>();  // step i's group (and every earlier one) has landed
    const int stage = i % D;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int q = (i * S + part) * 4 * U + 4 * u;
      if (q >= pieces) break;  // warp-uniform
      const int p = q + t;
      const bool ok = p < pieces;
      const uint4 qa = ring[part][stage][u][0][lane], qb = ring[part][stage][u][1][lane];
      const int grp = (p * 32) >> a.group_shift;
      const float fa = ok ? cuda::to_f(sca[grp]) : 0.f, fb = ok ? cuda::to_f(scb[grp]) : 0.f;
      uint32_t xv[16];  // token g, the piece's 32 columns as 16 pairs (zeros outside the call)
      ig::load_pairs32(xr && ok ? xr + int64_t(p) * 32 : nullptr, xv);
      const uint32_t wa4[4] = {qa.x, qa.y, qa.z, qa.w}, wb4[4] = {qb.x, qb.y, qb.z, qb.w};
      float sm[2][4] = {};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t A[4], B[2];
          ig::int_fragment<T>(wa4[j], wb4[j], zm, zm, h, A);
          ig::b_fragments(xv[4 * j], xv[4 * j + 1], xv[4 * j + 2], xv[4 * j + 3], h, B);
          cuda::mma::Mma<T>::run(sm[h], A, B[0], B[1]);
        }
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] = fmaf(sm[0][e] + sm[1][e], e < 2 ? fa : fb, acc[e]);
    }
  }
  cuda::mma::cp_async_wait<0>();  // the trailing empty groups
  __shared__ float partial[S][4][32];  // the tile's S warp sums
  cuda::mma::store_tile<T, S>(a, acc, S > 1 ? partial : nullptr, part, lane, n0, 0);
}

// The grid of kernel<T, S, U, D>: one block a 16-row tile.
inline unsigned grid_blocks(const Args& a) { return unsigned((a.N + 15) / 16); }

}  // namespace ingot::lab::int4stream
