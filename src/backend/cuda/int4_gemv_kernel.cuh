// The INT4 weight-only decode product for 1..64 tokens of f16/bf16 activations (y = x w^T + bias, w
// packed as quant/int4.h lays it out), a template over its split of the rows (Split, below) in the
// manner of gemv_kernel.cuh, its token blocks and its epilogue. int4_linear.cu picks
// the instance by shape (int4_design there); bench/int4_lab.cu times the instances against each other
// and against the library's launcher. Also here: the pieces int4_linear.cu's other kernels share with
// it (the exact 16-bit dequantization of a nibble pair; the MMA is mma_tiles.cuh's), so every path
// that rounds weights to 16 bits rounds them to the same bits.
//
// Hand-written rather than taken from a library: the packed layouts are ours (backend.h's
// Int4Layout: quant/int4.h's rows, or the 8-row blocks the CUDA backend re-lays them into at load,
// read through WeightMap below), and the value each nibble stands for is defined bit for bit by this backend
// (round((nibble - zero) * scale) to the activation dtype), which published W4A16 kernels (their own
// interleaved layouts, scales folded into fused multiply-adds) do not reproduce.
//
// Why this shape (instruction count per 16-byte load of 32 weights is what bounds the older kernel):
//  - The weights are the MMA's A operand (m16n8k16: 16 output rows x 16 k slots) and the tokens its B
//    columns (8: tokens past the call are zero columns). A lane holds 8 weights per MMA, so 32
//    weights take 4 MMAs (weights as B would need 8), and 1..8 tokens cost the same.
//  - Lane (g, t) reads 16 bytes of row g and 16 of row g + 8 at the same columns; the B fragment
//    (x at those columns, paired as the nibble pairs are) feeds both rows. The library's weights have
//    their nibbles paired (backend.h's Int4Scales::paired, written at load), so that x's own adjacent
//    pairs are the B fragments; in quant/int4.h's order (the lab's unpaired designs) they are built
//    with byte permutes. In the 8-row-block layout (Int4Layout::Blocks8) the warp's 32 loads of one half of
//    the tile are 512 contiguous bytes; in rows they are 64 bytes of each of 8 rows.
//  - Two accumulators alternate so consecutive MMAs do not wait on each other.
//  - Dequantization is exact: a shift and one lop3 place two nibbles in the mantissas of the
//    16-bit pattern of 2^e (e = 10 for f16, 7 for bf16: unit in the last place 1), so the pair is
//    exactly 2^e + nibble; subtracting 2^e + zero is exact. Then either one packed multiply by the
//    scale rounds once, round((nibble - zero) * scale) as the f32 product rounded to 16 bits is
//    (Scaling::PerWeight), or the integers go into the MMA as they are and each slot's f32 sums are
//    multiplied by the scale (Scaling::PerSlot, below).
// Accumulation is f32; the S warps' sums meet in shared memory and are added in warp order, so
// results do not depend on scheduling or graph replay.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/mma_tiles.cuh"

namespace ingot::cuda::int4gemv {

// 32 consecutive 16-bit activations at p (16-byte aligned) as 16 pairs, or zeros where p is null
// (columns or tokens outside the call: they multiply real weights, and must not be NaN garbage).
template <typename T>
__device__ __forceinline__ void load_pairs32(const T* p, uint32_t (&xv)[16]) {
  if (p) {
    const uint4* px = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = px[i];
      xv[4 * i] = v.x, xv[4 * i + 1] = v.y, xv[4 * i + 2] = v.z, xv[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) xv[i] = 0;
  }
}

constexpr int kMaxTokens = 8;         // the MMA's B columns: one token block
constexpr int kPrefetchBytes = 2048;  // per row, into L2 before the dependency wait
constexpr int kFragBlocks = 4;        // from this many token blocks on, x is read in fragment order

// The MMA's B fragment (k slots 2t, 2t+1 | 2t+8, 2t+9) for pair h of a word of x, r0..r3 holding its
// columns (0,1) (2,3) (4,5) (6,7): columns (2h, 2h+4) and (2h+1, 2h+5), as the A fragment pairs the
// nibbles (a_fragment below).
__device__ __forceinline__ void b_fragments(uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3, int h, uint32_t (&B)[2]) {
  const uint32_t lo = h ? r1 : r0, hi = h ? r3 : r2;
  B[0] = __byte_perm(lo, hi, 0x5410), B[1] = __byte_perm(lo, hi, 0x7632);
}

// The token blocks (NT) of the instance that takes T = 1..64 tokens: 1, 2, 4 or 8.
inline constexpr int token_blocks(int64_t T) { return T <= 8 ? 1 : T <= 16 ? 2 : T <= 32 ? 4 : 8; }

// Where a packed weight's 16-byte pieces lie: piece p (columns 32p .. 32p + 31) of row n at byte
//   row_offset(n) + quad_offset(p >> 2) + 16 * (p & 3),
// which covers both of backend.h's Int4Layouts with three strides: Rows (block 8 ld, row ld, quad 64:
// n * ld + 16p) and Blocks8 (block 4K, row 64, quad 512). Kernels read the one layout they are given;
// no instance is compiled per layout.
struct WeightMap {
  int64_t block;  // bytes between 8-row blocks
  int32_t row;    // bytes between rows inside a block
  int32_t quad;   // bytes between a row's runs of 4 pieces (128 columns)
  __host__ __device__ int64_t row_offset(int n) const { return int64_t(n >> 3) * block + int64_t(n & 7) * row; }
  __host__ __device__ int64_t quad_offset(int q) const { return int64_t(q) * quad; }
  __host__ __device__ int64_t piece_offset(int p) const { return quad_offset(p >> 2) + 16 * (p & 3); }
  static WeightMap rows(int64_t ld) { return {8 * ld, int32_t(ld), 64}; }
  static WeightMap blocks8(int64_t K) { return {4 * K, 64, 512}; }
  static WeightMap of(Int4Layout layout, int64_t ld, int64_t K) {
    return layout == Int4Layout::Blocks8 ? blocks8(K) : rows(ld);
  }
};

struct Args {
  const void* x;         // [T, K] activations, x_ld elements between rows (16-byte aligned rows)
  int64_t x_ld;
  const uint8_t* w;      // [N, K/2] packed nibbles in the layout wm describes (16-byte aligned pieces)
  WeightMap wm;
  const void* scales;    // [N, K/group] in the activation dtype, s_ld elements between rows
  const uint8_t* zeros;  // [N, K/group] u8 in 0..15, or null (every zero 8)
  int64_t s_ld;
  const void* bias;      // [N] or null
  void* y;               // [T, N], y_ld elements between rows
  int64_t y_ld;
  int T, N, K;           // T: 1..kMaxTokens x the instance's token blocks (NT; the f32 kernel: 16); K a
                         // multiple of 32 (groups are powers of two >= 32)
  int group_shift;       // log2(group size)
  // [ceil(K/128), 4, NT, 32] x 16 bytes: x in fragment order (xfrag_kernel below), for the instances
  // that read it (kFragX); null otherwise.
  const void* xf = nullptr;
};

// x in fragment order, for the instances of kFragBlocks+ token blocks (kFragX): read straight from [T, K], a
// lane's 16-byte load of token block b takes 8 rows' bytes (two 128-byte lines each, a quarter of
// which it uses), and at 4 and 8 blocks those loads, not the math, set the time. Reordered once per
// product, 16 bytes for lane (g, t) of quad q (columns 128q .. 128q + 127), word j and block b at
// index ((q * 4 + j) * NT + b) * 32 + 4g + t: x[8b + g] at columns c = 128q + 32t + 8j .. + 7 (zeros
// past T or K), so a warp's load is 512 contiguous bytes, already paired as the MMA's B fragments
// take them (b_fragments below): (c, c+4) (c+1, c+5) (c+2, c+6) (c+3, c+7), i.e. both fragments of
// h = 0 then of h = 1. The kernel then needs no byte permutes of x (at 8 blocks they were 128 a slot,
// as many instructions as the dequantization's). kPaired (weights with paired nibbles, the library's):
// the fragments are x's own pairs (c, c+1) (c+2, c+3) (c+4, c+5) (c+6, c+7), the 16 bytes as read.
inline constexpr int64_t xfrag_bytes(int64_t K, int NT) { return (K + 127) / 128 * 4 * NT * 32 * 16; }

template <int NT, bool kPaired>
__global__ void xfrag_kernel(Args a, uint4* xf) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n = xfrag_bytes(a.K, NT) / 16;
  pdl_wait();
  pdl_trigger();
  if (i >= n) return;
  const int lane = int(i & 31), b = int((i >> 5) % NT), j = int((i / (32 * NT)) & 3);
  const int64_t q = i / (128 * NT);
  const int tok = 8 * b + (lane >> 2);
  const int64_t col = q * 128 + 32 * (lane & 3) + 8 * j;
  uint4 v = make_uint4(0, 0, 0, 0);
  if (tok < a.T && col < a.K)
    v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) + int64_t(tok) * a.x_ld + col);
  if constexpr (!kPaired) {
    uint32_t B0[2], B1[2];
    b_fragments(v.x, v.y, v.z, v.w, 0, B0);
    b_fragments(v.x, v.y, v.z, v.w, 1, B1);
    v = make_uint4(B0[0], B0[1], B1[0], B1[1]);
  }
  xf[i] = v;
}

// x of a call into fragment order for NT blocks at xf (xfrag_bytes(a.K, NT) bytes), on stream s, for
// weights whose nibbles are paired (kPaired: the library's) or not.
template <int NT, bool kPaired>
inline void launch_xfrag(const Args& a, void* xf, cudaStream_t s) {
  const int64_t n = xfrag_bytes(a.K, NT) / 16;
  launch("int4_xfrag_kernel", xfrag_kernel<NT, kPaired>, dim3(unsigned((n + 255) / 256)), dim3(256), 0, s, a,
         static_cast<uint4*>(xf));
}

// The 16-bit pair arithmetic of one activation dtype. kMagic: the 16-bit pattern of 2^10 (f16) or 2^7
// (bf16), whose unit in the last place is 1, so that (kMagic | nibble) is exactly 2^e + nibble.
template <typename T>
struct PairOf;  // the pair type of T and the pattern of 2^e
template <>
struct PairOf<__half> {
  using V2 = __half2;
  static constexpr uint32_t kMagic = 0x6400;
};
template <>
struct PairOf<__nv_bfloat16> {
  using V2 = __nv_bfloat162;
  static constexpr uint32_t kMagic = 0x4300;
};
template <typename T>
struct Pair {
  using V2 = typename PairOf<T>::V2;
  static constexpr uint32_t kMagic = PairOf<T>::kMagic;
  // q - zm per half, q and zm holding 2^e + integer: the integer difference, exact.
  static __device__ __forceinline__ uint32_t sub(uint32_t q, uint32_t zm) {
    V2 d = __hsub2(*reinterpret_cast<V2*>(&q), *reinterpret_cast<V2*>(&zm));
    return *reinterpret_cast<uint32_t*>(&d);
  }
  // (q - zm) * s2 per half (the difference exact), one rounding.
  static __device__ __forceinline__ uint32_t sub_mul(uint32_t q, uint32_t zm, uint32_t s2) {
    uint32_t d = sub(q, zm);
    V2 m = __hmul2(*reinterpret_cast<V2*>(&d), *reinterpret_cast<V2*>(&s2));
    return *reinterpret_cast<uint32_t*>(&m);
  }
};

// Values c and c+4 of the 8 nibbles in `word` (c = shift/4 in 0..3) as a pair of T holding 2^e +
// nibble, low half value c. The mask and the pattern go through one lop3.b32 ((a & b) | c: 0xea):
// written as C, ptxas emits an AND and an OR (a LOP3 takes one immediate; the 2026-12-03 SASS of the
// one-token instance had 68 LOP3 a load where 32 do).
template <typename T>
__device__ __forceinline__ uint32_t nibble_pair(uint32_t word, int shift) {
  uint32_t q;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;"
      : "=r"(q)
      : "r"(word >> shift), "n"(0x000f000f), "n"(Pair<T>::kMagic * 0x00010001u));
  return q;
}

// The paired nibble order (backend.h's Int4Scales::paired, the library's weights): the nibble of a
// word that holds its value c (0..7), 2c' in nibble c' and 2c' + 1 in nibble c' + 4; and a word of
// quant/int4.h's order (value c in nibble c) rewritten in it (the re-layout at load, the lab's copies).
__host__ __device__ constexpr int paired_nibble(int c) { return (c >> 1) + 4 * (c & 1); }
__host__ __device__ inline uint32_t pair_word(uint32_t v) {
  uint32_t o = 0;
  for (int c = 0; c < 8; ++c) o |= ((v >> (4 * c)) & 0xfu) << (4 * paired_nibble(c));
  return o;
}

// The same pair as round((nibble - zero) * scale): zm holds (2^e + zero) in both halves, s2 the scale
// in both; a nibble pair costs a shift, one LOP3, HADD2 and HMUL2.
template <typename T>
__device__ __forceinline__ uint32_t dequant_pair(uint32_t word, int shift, uint32_t zm, uint32_t s2) {
  return Pair<T>::sub_mul(nibble_pair<T>(word, shift), zm, s2);
}

template <typename T>
__device__ __forceinline__ uint32_t bits_of(T v) {
  return uint32_t(*reinterpret_cast<const uint16_t*>(&v));
}

// One load slot of a lane: 16 bytes of each of its two rows and their groups' (2^e + zero, scale)
// pairs, all in registers before any math.
struct Slot {
  uint4 qa, qb;            // row g, row g + 8: 32 nibbles each, the same columns
  uint32_t zma, sa, zmb, sb;
};

// The MMA's A fragment from word j of a slot's two rows (wa, wb): nibble pairs c = 2h (k slots 2t,
// 2t+1) and c = 2h + 1 (slots 2t+8, 2t+9), i.e. nibbles (2h, 2h+4) and (2h+1, 2h+5) (columns
// (8j+2h, 8j+2h+4) and (8j+2h+1, 8j+2h+5) in quant/int4.h's order, (8j+4h, 8j+4h+1) and (8j+4h+2,
// 8j+4h+3) paired); A rows g (a0, a2) and g + 8 (a1, a3).
template <typename T>
__device__ __forceinline__ void a_fragment(const Slot& sl, uint32_t wa, uint32_t wb, int h, uint32_t (&A)[4]) {
  A[0] = dequant_pair<T>(wa, 8 * h, sl.zma, sl.sa);
  A[1] = dequant_pair<T>(wb, 8 * h, sl.zmb, sl.sb);
  A[2] = dequant_pair<T>(wa, 8 * h + 4, sl.zma, sl.sa);
  A[3] = dequant_pair<T>(wb, 8 * h + 4, sl.zmb, sl.sb);
}

// Where the one-token-block instance applies a group's scale:
//  - PerWeight: each weight is round((nibble - zero) * scale) in the activation dtype before its MMA
//    (a shift, one LOP3, HADD2 and HMUL2 a nibble pair). Every group size; the batch instances.
//  - PerSlot (NT = 1, groups of at least 128 columns, so that the 128 columns the four t-lanes of one
//    MMA cover lie in one group): the MMAs take the exact integers nibble - zero (HSUB2 of the two
//    2^e patterns, no HMUL2), a slot's sums are kept apart in f32 and multiplied by the scale once
//    (an FFMA per accumulator value). So the product is that of the stored values up to f32
//    summation, without PerWeight's rounding of each weight to 16 bits (2^-9 relative for bf16): the
//    lab's error against the exact product fell from 0.018 to 0.003 (docs/quantization-log.md), at the
//    same end-to-end speed at one token (an H100, 2026-12-06: 335.7 against 338.5 tok/s in one call,
//    within the noise); 4% slower with several token blocks, which keep PerWeight.
enum class Scaling { PerWeight, PerSlot };

// The A fragment of a_fragment's columns as the exact integers nibble - zero (zma, zmb: 2^e + zero of
// rows g and g + 8), for Scaling::PerSlot.
template <typename T>
__device__ __forceinline__ void int_fragment(uint32_t wa, uint32_t wb, uint32_t zma, uint32_t zmb, int h,
                                             uint32_t (&A)[4]) {
  A[0] = Pair<T>::sub(nibble_pair<T>(wa, 8 * h), zma);
  A[1] = Pair<T>::sub(nibble_pair<T>(wb, 8 * h), zmb);
  A[2] = Pair<T>::sub(nibble_pair<T>(wa, 8 * h + 4), zma);
  A[3] = Pair<T>::sub(nibble_pair<T>(wb, 8 * h + 4), zmb);
}

// A scale pair's value (both halves hold it) in f32.
template <typename T>
__device__ __forceinline__ float scale_f32(uint32_t s2) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __uint_as_float(s2 << 16);
  else return __half2float(__ushort_as_half(static_cast<unsigned short>(s2 & 0xffffu)));
}

// One slot of the one-token product: lane (g, t)'s 16 bytes of rows g and g + 8 (sl.qa, sl.qb) against
// token g's 32 columns there (xv, as load_pairs32 gives them), into the two accumulators: alternating
// by h (Scaling::PerWeight, the weights rounded to 16 bits first: acc[0] and acc[1]), or summed per slot
// as integers and scaled once into acc[0] (PerSlot; rows g: elements 0, 1; g + 8: 2, 3). kPairedNibbles: x's own pairs
// are the B fragments (the library's order, below), else byte permutes build them.
template <typename T, Scaling kScaling, bool kPairedNibbles>
__device__ __forceinline__ void one_token_slot(const Slot& sl, const uint32_t (&xv)[16], float (*acc)[4]) {
  const uint32_t wa4[4] = {sl.qa.x, sl.qa.y, sl.qa.z, sl.qa.w};
  const uint32_t wb4[4] = {sl.qb.x, sl.qb.y, sl.qb.z, sl.qb.w};
  float sm[2][4] = {};
  float(*dst)[4] = kScaling == Scaling::PerWeight ? acc : sm;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t r0 = xv[4 * j], r1 = xv[4 * j + 1], r2 = xv[4 * j + 2], r3 = xv[4 * j + 3];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t A[4];
      if constexpr (kScaling == Scaling::PerWeight) a_fragment<T>(sl, wa4[j], wb4[j], h, A);
      else int_fragment<T>(wa4[j], wb4[j], sl.zma, sl.zmb, h, A);
      uint32_t B[2];
      if constexpr (kPairedNibbles) B[0] = h ? r2 : r0, B[1] = h ? r3 : r1;
      else b_fragments(r0, r1, r2, r3, h, B);
      mma::Mma<T>::run(dst[h], A, B[0], B[1]);
    }
  }
  if constexpr (kScaling == Scaling::PerSlot) {
    const float fa = scale_f32<T>(sl.sa), fb = scale_f32<T>(sl.sb);
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][e] = fmaf(sm[0][e] + sm[1][e], e < 2 ? fa : fb, acc[0][e]);
  }
}

// What a tile's 16 A rows (the MMA's M) are and where its sums go.
//  - PlainOut: y = x w^T (+ bias), A rows g and g + 8 are weight rows n0 + g and n0 + g + 8, the
//    outputs of those numbers (16 a tile).
//  - SwigluOut: y = silu(x Wg^T) * (x Wu^T) for w = [Wg; Wu] ([2I, K]; no bias): A row g is gate row
//    m = n0 + g and A row g + 8 up row I + m, so lane (g, t) holds both halves of output m for its
//    tokens and a tile covers 8 outputs. Each half is rounded to T before the SwiGLU, as the product
//    followed by the swiglu kernel rounds it, so fusing changes no bit; it saves that kernel's
//    launch and the [T, 2I] round trip.
// Rows past the weight read its last row (always in bounds); their outputs are not written.
struct PlainOut {
  static constexpr int kSpan = 16;  // outputs a tile
  static __host__ __device__ __forceinline__ int outputs(const Args& a) { return a.N; }
  static __device__ __forceinline__ void rows(const Args& a, int n0, int g, int& ra, int& rb) {
    ra = min(n0 + g, a.N - 1), rb = min(n0 + g + 8, a.N - 1);
  }
  template <typename T, int S>
  static __device__ __forceinline__ void store(const Args& a, float (&c)[4], float (*partial)[4][32], int part,
                                               int lane, int n0, int tok0) {
    mma::store_tile<T, S>(a, c, partial, part, lane, n0, tok0);
  }
};
struct SwigluOut {
  static constexpr int kSpan = 8;
  static __host__ __device__ __forceinline__ int outputs(const Args& a) { return a.N / 2; }
  static __device__ __forceinline__ void rows(const Args& a, int n0, int g, int& ra, int& rb) {
    const int inter = a.N / 2, m = min(n0 + g, inter - 1);
    ra = m, rb = inter + m;
  }
  template <typename T, int S>
  static __device__ __forceinline__ void store(const Args& a, float (&c)[4], float (*partial)[4][32], int part,
                                               int lane, int n0, int tok0) {
    if (!mma::sum_tile<S>(c, partial, part, lane)) return;
    const int g = lane >> 2, t = lane & 3, out = n0 + g;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int tok = tok0 + 2 * t + e;
      if (tok < a.T && out < a.N / 2) {
        const float gate = to_f(from_f<T>(c[e])), up = to_f(from_f<T>(c[e + 2]));
        static_cast<T*>(a.y)[int64_t(tok) * a.y_ld + out] = from_f<T>(silu_mul(gate, up));
      }
    }
  }
};

// How an instance spreads the rows over a block's warps and its loads over time: S warps per 16-row
// tile splitting K, U 16-byte loads per lane and row in flight, R tiles per block, P the next step's
// loads issued before this step's math, W 16-row tiles per warp (batch instances, below).
// M: blocks an SM the compiler must leave registers for (__launch_bounds__'s second argument; 0, the
// library's, leaves ptxas its own choice: every instance's registers, barriers and shared memory are
// those of the one-argument form, checked with -Xptxas -v on 2026-12-07, where an explicit 1 moved
// them). For the lab's " mN" designs: the gate/up instance takes 70 registers, i.e. 3 blocks of 8
// warps an SM, and the one-token kernel was measured short of bytes in flight (quantization-log.md).
template <int S_, int U_, int R_, bool P_ = false, int W_ = 1, int M_ = 0>
struct Split {
  static constexpr int S = S_, U = U_, R = R_, W = W_, M = M_;
  static constexpr bool P = P_;
};

// The grid of kernel<T, Sp, NT, X, Out> for a call: one block per R x W tiles of Out::kSpan outputs.
template <class Sp, class Out>
inline unsigned grid_blocks(const Args& a) {
  const unsigned tiles = unsigned((Out::outputs(a) + Out::kSpan - 1) / Out::kSpan);
  return (tiles + Sp::R * Sp::W - 1) / (Sp::R * Sp::W);
}

// Lane (g, t) = (lane / 4, lane % 4) of a warp owns output rows n0 + g and n0 + g + 8 of its 16-row
// tile (A rows g, g + 8) and token g (B column g). The row is cut into 16-byte pieces of 32 columns;
// in step i, slot u, lane t reads piece p = (i * S + part) * 4U + 4u + t of both rows (quad
// (i * S + part) * U + u), so a warp's slots of one step cover U quads (128U columns) of each of its 16
// rows and the S warps of a tile interleave by step. Word j of a piece (columns 8j .. 8j + 7 of the
// piece) feeds two MMAs with the nibble pairs a shift and a mask give: k slots (2t, 2t+1 | 2t+8,
// 2t+9) hold nibbles (0, 4 | 1, 5), then (2, 6 | 3, 7), which are columns (8j, 8j+1 | 8j+2, 8j+3) then
// (8j+4, 8j+5 | 8j+6, 8j+7) with paired nibbles (x's own pairs), else columns (8j, 8j+4 | 8j+1, 8j+5)
// then (8j+2, 8j+6 | 8j+3, 8j+7) (x paired the same way with byte permutes), so every product pairs a
// weight with its own input column in either order and either layout.
//
// NT > 1 (up to 8 NT tokens; the library takes NT = 2 for 9..16, 4 and 8 with kFragX for 17..64): the
// same tile and loads, NT MMA column blocks of 8 tokens. Each word's two A fragments are dequantized
// once and feed NT MMAs each (token block b's B fragment from token 8b + g's x, read per word: 16
// bytes), so the dequantization is shared by all the tokens and consecutive MMAs write different
// accumulators. kFragX: x read from a.xf, in fragment order (xfrag_kernel above): read from [T, K]
// at 4 and 8 blocks, the x loads set the time and ran slower than dequantize + cuBLASLt on the H200
// (docs/quantization-log.md).
// W (NT > 1 only): 16-row tiles per warp, the tile rows n0 + 16w + g and + 8 for w < W. Each lane's
// x loads of a word (NT x 16 bytes) and the B fragments built from them feed the W tiles' MMAs: a
// tile reads all of x once, so at 16-64 tokens x is most of what the tiles read (from L2: 64 tokens
// of K = 4096 are 512 KB a tile against the tile's 32 KB of weights), and W tiles a warp divide it
// by W. Out: PlainOut or SwigluOut (above; the row numbers here are PlainOut's). kZeros false: for
// weights without zero points (symmetric, zero 8; a.zeros null) the instance loads none and its
// 2^e + 8 pattern is a constant, which takes a byte load, a broadcast and a test per slot and row off
// the loop; true reads a.zeros where it is set.
// kPairedNibbles (the library's weights, backend.h's Int4Scales::paired; false for the lab's unpaired
// designs): each 32-bit word holds its 8 columns in the nibble order 0 2 4 6 1 3 5 7, so the pair a
// shift and a mask give (nibbles c, c + 4) is the column pair (2c, 2c + 1) and the B fragment is x's
// own pairs, no byte permutes (16 a slot of the one-token loop's ~140 instructions; an H100,
// 2026-12-07: 2-8% less time a product at one token, docs/quantization.md). With kFragX, x in
// fragment order must have been written for the same order (launch_xfrag's kPaired).
template <typename T, class Sp, int NT = 1, bool kFragX = false, class Out = PlainOut, bool kZeros = true,
          Scaling kScaling = Scaling::PerWeight, bool kPairedNibbles = false>
__global__ void __launch_bounds__(Sp::R * Sp::S * 32, Sp::M) kernel(Args a) {
  constexpr int S = Sp::S, U = Sp::U, R = Sp::R, W = Sp::W;
  constexpr bool kPipe = Sp::P;
  static_assert(NT > 1 || !kFragX, "the fragment order is for the batch instances");
  static_assert(NT > 1 || W == 1, "several tiles a warp share x across token blocks");
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "16-bit activations only");
  static_assert(NT == 1 || kScaling == Scaling::PerWeight, "scales per slot: one token block only");
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int r = warp / S, part = warp % S;
  // The warp's first output (tile w's at n0 + w * kSpan).
  const int n0 = (int(blockIdx.x) * R + r) * W * Out::kSpan;
  int na[W], nb[W];
  // The lane's piece t of quad 0 of both rows: its piece of quad q (columns 128q + 32t ..) lies
  // quad_offset(q) further (WeightMap).
  const uint8_t *wa[W], *wb[W];
#pragma unroll
  for (int w = 0; w < W; ++w) {
    Out::rows(a, n0 + w * Out::kSpan, g, na[w], nb[w]);
    wa[w] = a.w + a.wm.row_offset(na[w]) + 16 * t;
    wb[w] = a.w + a.wm.row_offset(nb[w]) + 16 * t;
  }
  // The head of both rows (their first kPrefetchBytes) into L2 before waiting: weights depend on no
  // earlier kernel. One prefetch per 128-byte line: every other quad in rows (64 bytes a quad of a row),
  // every quad in blocks (a row's 64 bytes of a quad shared with one neighbour row).
  {
    const int head_quads = min(a.K / 2, kPrefetchBytes) / 64, qs = a.wm.quad >= 128 ? 1 : 128 / a.wm.quad;
    for (int q = (part * 4 + t) * qs; q < head_quads; q += S * 4 * qs)
#pragma unroll
      for (int w = 0; w < W; ++w) {
        prefetch_l2_line(wa[w] - 16 * t + a.wm.quad_offset(q));
        prefetch_l2_line(wb[w] - 16 * t + a.wm.quad_offset(q));
      }
  }
  pdl_wait();
  pdl_trigger();
  const T *sca[W], *scb[W];
  const uint8_t *zra[W], *zrb[W];
#pragma unroll
  for (int w = 0; w < W; ++w) {
    sca[w] = static_cast<const T*>(a.scales) + int64_t(na[w]) * a.s_ld;
    scb[w] = static_cast<const T*>(a.scales) + int64_t(nb[w]) * a.s_ld;
    zra[w] = kZeros && a.zeros ? a.zeros + int64_t(na[w]) * a.s_ld : nullptr;
    zrb[w] = kZeros && a.zeros ? a.zeros + int64_t(nb[w]) * a.s_ld : nullptr;
  }
  // Token g's row of x: lanes past the call's tokens read nothing and multiply zeros.
  const T* xr = g < a.T ? static_cast<const T*>(a.x) + int64_t(g) * a.x_ld : nullptr;
  const int pieces = a.K / 32;
  constexpr int kStepPieces = S * 4 * U;  // pieces of a row one step of the tile's S warps covers

  // Loads of one step: every weight load first, then the scales and zeros of their groups. With
  // `check` (the last step when K ends inside it), a lane past K loads nothing: zero weights and a
  // zero scale (and its x is zero too). Callers pass constants, so each call site compiles its own
  // branch-free copy.
  // Slot u * W + w: load slot u of tile w.
  auto load = [&](Slot (&sl)[U * W], int step, bool check) {
    const int q0 = (step * S + part) * U, p0 = q0 * 4 + t;  // slot u: quad q0 + u, piece p0 + 4u
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int p = p0 + 4 * u;
      const bool ok = !check || p < pieces;
      const int64_t off = a.wm.quad_offset(q0 + u);
#pragma unroll
      for (int w = 0; w < W; ++w) {
        sl[u * W + w].qa = ok ? load_stream16(wa[w] + off) : make_uint4(0, 0, 0, 0);
        sl[u * W + w].qb = ok ? load_stream16(wb[w] + off) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int p = p0 + 4 * u;
      const bool ok = !check || p < pieces;
      const int grp = (p * 32) >> a.group_shift;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        Slot& sw = sl[u * W + w];
        if constexpr (kZeros) {
          const uint32_t za = ok && zra[w] ? uint32_t(zra[w][grp]) : 8u, zb = ok && zrb[w] ? uint32_t(zrb[w][grp]) : 8u;
          sw.zma = (Pair<T>::kMagic | za) * 0x00010001u;
          sw.zmb = (Pair<T>::kMagic | zb) * 0x00010001u;
        } else {
          sw.zma = sw.zmb = (Pair<T>::kMagic | 8u) * 0x00010001u;
        }
        sw.sa = ok ? bits_of(sca[w][grp]) * 0x00010001u : 0u;
        sw.sb = ok ? bits_of(scb[w][grp]) * 0x00010001u : 0u;
      }
    }
  };

  // NT = 1: two accumulators alternating by h; NT > 1: one per tile and token block (w * NT + b).
  constexpr int kAcc = NT == 1 ? 2 : W * NT;
  float acc[kAcc][4];
#pragma unroll
  for (int b = 0; b < kAcc; ++b)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[b][e] = 0.f;
  // Token block b's x row for this lane: token 8b + g, or the call's last token past it (its B column
  // feeds only output column 8b + g, which is not written).
  auto x_row = [&](int b) {
    return static_cast<const T*>(a.x) + int64_t(min(8 * b + g, a.T - 1)) * a.x_ld;
  };
  auto math_wide = [&](const Slot (&sl)[U * W], int step, bool check) {
    const int q0 = (step * S + part) * 4 * U;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (check && q0 + 4 * u >= pieces) break;  // warp-uniform
      // A lane past K has zero weights and scale (exact zeros); its x is read at the last piece.
      const int p = check ? min(q0 + 4 * u + t, pieces - 1) : q0 + 4 * u + t;
      const uint4* xq =  // this slot's quad of x in fragment order
          kFragX ? static_cast<const uint4*>(a.xf) + int64_t((step * S + part) * U + u) * (4 * NT * 32) + lane : nullptr;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // Token block b's x at columns 8j .. 8j + 7 of piece p: kFragX already as the B fragments of
        // h = 0 (x, y) and h = 1 (z, w), else as read from [T, K] (pairs of columns).
        uint4 xw[NT];
#pragma unroll
        for (int b = 0; b < NT; ++b) {
          if constexpr (kFragX) xw[b] = xq[(j * NT + b) * 32];
          else xw[b] = *reinterpret_cast<const uint4*>(x_row(b) + int64_t(p) * 32 + 8 * j);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t B[NT][2];  // token block b's B fragment, shared by the W tiles
#pragma unroll
          for (int b = 0; b < NT; ++b) {
            if constexpr (kFragX || kPairedNibbles) {  // fragment order, or x's own pairs
              B[b][0] = h ? xw[b].z : xw[b].x, B[b][1] = h ? xw[b].w : xw[b].y;
            } else {
              b_fragments(xw[b].x, xw[b].y, xw[b].z, xw[b].w, h, B[b]);
            }
          }
#pragma unroll
          for (int w = 0; w < W; ++w) {
            const Slot& sw = sl[u * W + w];
            const uint32_t wa4[4] = {sw.qa.x, sw.qa.y, sw.qa.z, sw.qa.w};
            const uint32_t wb4[4] = {sw.qb.x, sw.qb.y, sw.qb.z, sw.qb.w};
            uint32_t A[4];
            a_fragment<T>(sw, wa4[j], wb4[j], h, A);
#pragma unroll
            for (int b = 0; b < NT; ++b) mma::Mma<T>::run(acc[w * NT + b], A, B[b][0], B[b][1]);
          }
        }
      }
    }
  };
  auto math_one = [&](const Slot (&sl)[U], int step, bool check) {
    const int q0 = (step * S + part) * 4 * U;  // the warp's first piece this step (lane t = 0)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (check && q0 + 4 * u >= pieces) break;  // warp-uniform: the MMAs below run on every lane or none
      const int p = q0 + 4 * u + t;
      uint32_t xv[16];  // token g, the piece's 32 columns as 16 pairs (zeros outside the call)
      load_pairs32(xr && (!check || p < pieces) ? xr + int64_t(p) * 32 : nullptr, xv);
      one_token_slot<T, kScaling, kPairedNibbles>(sl[u], xv, acc);
    }
  };

  auto math = [&](const Slot (&sl)[U * W], int step, bool check) {
    if constexpr (NT > 1) math_wide(sl, step, check);
    else math_one(sl, step, check);
  };

  const int steps = (pieces + kStepPieces - 1) / kStepPieces;
  // Steps before `full` lie wholly inside K and run without the per-slot checks against it (the
  // H200, 2026-12-03: 7-15% less time a product at 1-64 tokens, docs/quantization-log.md); the rest (at
  // most one) keep them.
  const int full = pieces / kStepPieces;
  int i = 0;
  if constexpr (!kPipe) {
    for (; i < full; ++i) {
      Slot sl[U * W];
      load(sl, i, false);
      math(sl, i, false);
    }
  } else {
    // Two register buffers: step i + 1's loads are in flight while step i's math runs.
    Slot A[U * W], B[U * W];
    if (i < full) load(A, i, false);
    while (i < full) {
      if (i + 1 < full) load(B, i + 1, false);
      math(A, i, false);
      if (++i >= full) break;
      if (i + 1 < full) load(A, i + 1, false);
      math(B, i, false);
      ++i;
    }
  }
  for (; i < steps; ++i) {
    Slot sl[U * W];
    load(sl, i, true);
    math(sl, i, true);
  }

  if constexpr (NT == 1) {
    float c[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) c[e] = acc[0][e] + acc[1][e];
    if constexpr (S > 1) {
      __shared__ float partial[R][S][4][32];  // each tile's S warp sums
      Out::template store<T, S>(a, c, partial[r], part, lane, n0, 0);
    } else {
      Out::template store<T, S>(a, c, nullptr, part, lane, n0, 0);
    }
  } else {
    // Tile by tile, token block by token block through one [R][S][4][32] exchange (store_tile syncs
    // after the writes; the sync here keeps the next writes behind warp 0's reads of the last ones).
    __shared__ float partial[R][S > 1 ? S : 1][4][32];
#pragma unroll
    for (int w = 0; w < W; ++w)
#pragma unroll
      for (int b = 0; b < NT; ++b) {
        if (8 * b >= a.T) break;  // block-uniform
        if ((w > 0 || b > 0) && S > 1) __syncthreads();
        Out::template store<T, S>(a, acc[w * NT + b], S > 1 ? partial[r] : nullptr, part, lane, n0 + w * Out::kSpan,
                                  8 * b);
      }
  }
}

}  // namespace ingot::cuda::int4gemv
