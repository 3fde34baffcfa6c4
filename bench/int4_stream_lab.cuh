// Lab-only designs for bench/int4_lab.cu (issue 12; 2026-12-06): the one-token INT4 decode product
// with the weights re-laid out in tiles, so that every warp load is 512 contiguous bytes (Marlin
// stores its weights that way) instead of 64 bytes of each of 8 rows.
//
// Why: ncu on the library's one-token kernel (an H100, 2026-12-06, docs/quantization-log.md) showed it
// latency-bound with few warps in flight and DRAM at ~40% of its peak, while the 16-bit GEMV, whose
// warp loads are whole 512-byte runs of one row, reaches 84%. A cp.async ring of shared-memory stages
// per warp, tried here the same day, lost to register loads on every shape and was removed. The
// 8-row blocks (BlockLayout) moved into the library (backend.h's Int4Layout::Blocks8, read through
// int4gemv::WeightMap); the 16-row tiles (TileLayout) stay here to be compared with them.
//
// The tiled layout (TileLayout, tile_layout() writes it from the row layout): [N/16, K/128, 2, 32] x 16
// bytes: 16-row tile r, quad Q (columns 128Q .. 128Q + 127), half h, lane 4g + t holds the 16 bytes of
// row 16r + 8h + g at piece 4Q + t, i.e. exactly what lane (g, t) of the kernel loads as qa (h = 0)
// and qb (h = 1) in one slot. N a multiple of 16, K of 128 (the lab's shapes).
//
// Symmetric weights only (every zero 8; a.zeros must be null), groups of 128 or more (the scale per
// slot, Scaling::PerSlot), 1..8 tokens, PlainOut.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/int4_gemv_kernel.cuh"

namespace ingot::lab::int4stream {

using cuda::int4gemv::Args;

// Where lane (g, t)'s 16 bytes of half h (row g or g + 8 of the tile) at piece p lie, in the
// library's layouts (rows or 8-row blocks): through the WeightMap the lab passes in a.wm.
struct MapLayout {
  const uint8_t* wa;
  const uint8_t* wb;
  cuda::int4gemv::WeightMap wm;
  __device__ MapLayout(const Args& a, int n0, int g) : wm(a.wm) {
    const int ra = min(n0 + g, a.N - 1), rb = min(n0 + g + 8, a.N - 1);  // rows past N read the last row
    wa = a.w + wm.row_offset(ra);
    wb = a.w + wm.row_offset(rb);
  }
  __device__ const uint8_t* at(int p, int h, int) const { return (h ? wb : wa) + wm.piece_offset(p); }
};
struct TileLayout {
  const uint8_t* base;  // the tile's first byte plus the lane's 16 bytes
  __device__ TileLayout(const Args& a, int n0, int g) {
    (void)g;
    base = a.w + int64_t(n0 / 16) * (a.K / 128) * 1024;
  }
  // p = 4Q + t, lane = 4g + t
  __device__ const uint8_t* at(int p, int h, int lane) const {
    return base + (int64_t(p >> 2) * 2 + h) * 512 + lane * 16;
  }
};

// Every 32-bit word of a packed weight (8 columns, column i in nibble i) with its nibbles in the order
// 0 2 4 6 1 3 5 7 (int4gemv::pair_word, as the library re-lays weights at load; int4gemv::kernel's
// kPairedNibbles): nibble c holds column 2c and nibble c + 4 column 2c + 1, for c < 4. Any layout of
// whole 16-byte pieces keeps its words whole, so this composes with the others.
inline std::vector<uint8_t> pair_nibbles(std::vector<uint8_t> w) {
  for (size_t i = 0; i + 4 <= w.size(); i += 4) {
    const uint32_t v = uint32_t(w[i]) | uint32_t(w[i + 1]) << 8 | uint32_t(w[i + 2]) << 16 | uint32_t(w[i + 3]) << 24;
    const uint32_t o = ingot::cuda::int4gemv::pair_word(v);
    for (int b = 0; b < 4; ++b) w[i + size_t(b)] = uint8_t(o >> (8 * b));
  }
  return w;
}

// The row layout [N, K/2] rewritten as TileLayout's (block8 false) or in 8-row blocks (true: backend.h's
// Int4Layout::Blocks8, which the library re-lays on the device), host side, for the lab's copies.
inline std::vector<uint8_t> tile_layout(const std::vector<uint8_t>& rows, int N, int K, bool block8) {
  std::vector<uint8_t> out(rows.size());
  const int pieces = K / 32, quads = K / 128;
  for (int n = 0; n < N; ++n)
    for (int p = 0; p < pieces; ++p) {
      const size_t lane16 = size_t(4 * (n % 8) + p % 4) * 16;
      const size_t dst = block8 ? (size_t(n / 8) * quads + p / 4) * 512 + lane16
                                : ((size_t(n / 16) * quads + p / 4) * 2 + (n % 16) / 8) * 512 + lane16;
      for (int b = 0; b < 16; ++b) out[dst + b] = rows[size_t(n) * (K / 2) + size_t(p) * 16 + b];
    }
  return out;
}

// One slot's math: lane (g, t)'s 16 bytes of rows g and g + 8 at piece p (qa, qb) against token g's
// x there, the integer products summed in f32 and scaled once into acc (Scaling::PerSlot).
template <typename T>
__device__ __forceinline__ void consume(const Args& a, const T* xr, const T* sca, const T* scb, int p, bool ok,
                                        uint4 qa, uint4 qb, float (&acc)[4]) {
  namespace ig = cuda::int4gemv;
  const uint32_t zm = (ig::Pair<T>::kMagic | 8u) * 0x00010001u;  // 2^e + 8, both halves
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

// What the kernel's warps start from: the lane's place in the tile, the weights' layout, the scale
// rows (their lines into L2 before the dependency wait) and token g's x; then the wait. S warps per
// 16-row tile split K as the library's kernel does: step i, slot u, lane t read piece
// (i * S + part) * 4U + 4u + t of both rows.
template <typename T, class L, int S, int U>
struct Tile {
  int part, lane, g, t, n0, pieces, steps;
  L lay;
  const T *sca, *scb;  // the scale rows of rows g and g + 8
  const T* xr;         // token g's x, or null past the call's tokens
  __device__ explicit Tile(const Args& a)
      : part(int(threadIdx.x) / 32),
        lane(int(threadIdx.x) & 31),
        g(lane >> 2),
        t(lane & 3),
        n0(int(blockIdx.x) * 16),
        pieces(a.K / 32),
        steps((pieces + S * 4 * U - 1) / (S * 4 * U)),
        lay(a, n0, g) {
    const int ra = min(n0 + g, a.N - 1), rb = min(n0 + g + 8, a.N - 1);
    sca = static_cast<const T*>(a.scales) + int64_t(ra) * a.s_ld;
    scb = static_cast<const T*>(a.scales) + int64_t(rb) * a.s_ld;
    if (t * 64 < (a.K >> a.group_shift)) {
      cuda::prefetch_l2_line(sca + t * 64);
      cuda::prefetch_l2_line(scb + t * 64);
    }
    xr = g < a.T ? static_cast<const T*>(a.x) + int64_t(g) * a.x_ld : nullptr;
    cuda::pdl_wait();
    cuda::pdl_trigger();
  }
  // The first piece of slot u in step `step` (lane t reads this + t).
  __device__ int slot_piece(int step, int u) const { return (step * S + part) * 4 * U + 4 * u; }
  // Slot u of step `step` against acc, unless the slot starts past K (warp-uniform).
  __device__ bool consume_slot(const Args& a, int step, int u, uint4 qa, uint4 qb, float (&acc)[4]) const {
    const int q = slot_piece(step, u);
    if (q >= pieces) return false;
    consume<T>(a, xr, sca, scb, q + t, q + t < pieces, qa, qb, acc);
    return true;
  }
  __device__ void store(const Args& a, float (&acc)[4]) const {
    __shared__ float partial[S][4][32];  // the tile's S warp sums
    cuda::mma::store_tile<T, S>(a, acc, S > 1 ? partial : nullptr, part, lane, n0, 0);
  }
};

// Register loads, as the library's kernel takes them, from layout L: U slots a step, all loaded
// before the step's math; P: the next step's loads issued before this step's math (two register sets).
template <typename T, class L, int S, int U, bool P>
__global__ void __launch_bounds__(S * 32) reg_kernel(Args a) {
  const Tile<T, L, S, U> w(a);
  auto load = [&](uint4 (&q)[U][2], int step) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int p = w.slot_piece(step, u) + w.t;
      const bool ok = step < w.steps && p < w.pieces;
#pragma unroll
      for (int h = 0; h < 2; ++h) q[u][h] = ok ? cuda::load_stream16(w.lay.at(p, h, w.lane)) : make_uint4(0, 0, 0, 0);
    }
  };
  auto math = [&](const uint4 (&q)[U][2], int step, float (&acc)[4]) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (!w.consume_slot(a, step, u, q[u][0], q[u][1], acc)) break;
  };
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  uint4 q0[U][2];
  load(q0, 0);
  if constexpr (P) {
    uint4 q1[U][2];
    for (int i = 0; i < w.steps; i += 2) {
      load(q1, i + 1);
      math(q0, i, acc);
      load(q0, i + 2);
      math(q1, i + 1, acc);
    }
  } else {
    for (int i = 0; i < w.steps; ++i) {
      math(q0, i, acc);
      if (i + 1 < w.steps) load(q0, i + 1);
    }
  }
  w.store(a, acc);
}

// The grid of the kernel: one block a 16-row tile.
inline unsigned grid_blocks(const Args& a) { return unsigned((a.N + 15) / 16); }

}  // namespace ingot::lab::int4stream
