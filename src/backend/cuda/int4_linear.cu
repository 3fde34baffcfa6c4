// INT4 weight-only linear (W4A16): y = x w^T (+bias) with w packed as quant/int4.h lays it out, rows
// of [K/2] bytes, value = (nibble - zero) * scale of its group, re-laid by relayout_int4_cuda below
// (the backend's relayout_int4, once at load): each 32-bit word's nibbles paired (backend.h's
// Int4Scales::paired), and rows in 8-row blocks where they apply (Int4Layout::Blocks8). Every kernel
// here reads 16-byte pieces (32 values, always inside one group since groups are powers of two >= 32)
// through int4gemv::WeightMap, which places a piece in either layout, and takes the paired order only
// (check_int4_weight refuses a weight that was not re-laid).
//
// Three kernels:
//  - int4gemv::kernel (int4_gemv_kernel.cuh; f16/bf16, 1..64 tokens, decode): the weights as the MMA's
//    A operand, 16 output rows a warp tile, S warps of a tile splitting K, each lane dequantizing in
//    registers (one token block with groups of 128+: the exact integers nibble - zero, each slot's f32
//    sums scaled once; otherwise round((nibble - zero) * scale) in the activation dtype), fp32
//    accumulation; tokens are the B columns, one block of 8 (its instance per shape: int4_design
//    below), or two, four or eight (launch_blocks; from four on with x first reordered into the
//    scratch). It
//    replaced int4_mma_kernel (tokens as the A rows, weights as B), slower at every token count
//    (docs/quantization-log.md, 2026-12-03).
//  - int4_gemv_f32_kernel (f32 engines, 1..16 tokens): a warp per output row, values dequantized
//    exactly in f32 ((nibble - zero) * scale, one f32 product, as the CPU reference) and f32 FMAs.
//  - int4_dequant_kernel (wider products, act-order weights, batch-invariant mode): the weight into a
//    [N, K] scratch of the activation dtype, round((nibble - zero) * scale) as the per-weight decode
//    instances take it, for cuBLASLt. With
//    an act-order perm the columns are scattered back to input order (deq[n, perm[j]] = w[n, j]), so
//    y = x deq^T = W_stored . x[perm] with x read as it is.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/int4_gemm_kernel.cuh"
#include "backend/cuda/int4_gemv_kernel.cuh"

namespace ingot::cuda {
namespace {

constexpr int kWarps = 4;  // the f32 kernel's rows per block (a warp each)
using int4gemv::kPrefetchBytes;

// The arguments of every INT4 product kernel here (int4gemv::kernel's own, one struct for all).
using Int4Args = int4gemv::Args;

struct DequantArgs {
  const uint8_t* w;      // [N, K/2] packed nibbles, placed by wm
  int4gemv::WeightMap wm;
  const void* scales;    // [N, K/group]
  const uint8_t* zeros;  // [N, K/group] or null
  int64_t s_ld;
  const int32_t* perm;   // [K] or null
  void* out;             // [N, K] in the engine dtype, out_ld elements between rows
  int64_t out_ld;
  int N, K;
  int group_shift;
};

using int4gemv::bits_of;
using int4gemv::dequant_pair;
using int4gemv::Pair;
using int4gemv::pair_word;
using int4gemv::paired_nibble;
using int4gemv::Split;

// f32 activations: a warp per output row, each lane 32 values (16 bytes) per step; up to NT tokens.
template <int NT>
__global__ void __launch_bounds__(kWarps * 32) int4_gemv_f32_kernel(Int4Args a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int n0 = blockIdx.x * kWarps + warp;
  const uint8_t* wrow = a.w + a.wm.row_offset(min(n0, a.N - 1));
  for (int q = lane; q < min(a.K / 2, kPrefetchBytes) / 64; q += 32) prefetch_l2_line(wrow + a.wm.quad_offset(q));
  pdl_wait();
  pdl_trigger();
  if (n0 >= a.N) return;
  const float* scales = static_cast<const float*>(a.scales) + int64_t(n0) * a.s_ld;
  const uint8_t* zeros = a.zeros ? a.zeros + int64_t(n0) * a.s_ld : nullptr;
  const float* x = static_cast<const float*>(a.x);
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
  for (int base = lane * 32; base < a.K; base += 32 * 32) {
    const uint4 q = load_stream16(wrow + a.wm.piece_offset(base / 32));
    const int grp = base >> a.group_shift;
    const float s = scales[grp];
    const int z = zeros ? int(zeros[grp]) : 8;
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    float wv[32];  // value 8j + c of the piece in nibble paired_nibble(c) of word j
#pragma unroll
    for (int i = 0; i < 32; ++i) wv[i] = float(int((words[i / 8] >> (4 * paired_nibble(i % 8))) & 0xfu) - z) * s;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= a.T) break;
      const float4* xr = reinterpret_cast<const float4*>(x + int64_t(t) * a.x_ld + base);
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const float4 xv = xr[v];
        acc[t] += wv[4 * v] * xv.x + wv[4 * v + 1] * xv.y + wv[4 * v + 2] * xv.z + wv[4 * v + 3] * xv.w;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t)
    for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
  if (lane == 0) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= a.T) break;
      float v = acc[t];
      if (a.bias) v += static_cast<const float*>(a.bias)[n0];
      static_cast<float*>(a.y)[int64_t(t) * a.y_ld + n0] = v;
    }
  }
}

// One thread per 8 values (a 32-bit word of one row). The scratch may still be read by the previous
// product on the stream, so nothing is written before the dependency wait.
template <typename T>
__global__ void int4_dequant_kernel(DequantArgs a) {
  pdl_wait();
  pdl_trigger();
  const int64_t words_per_row = a.K / 8, total = int64_t(a.N) * words_per_row;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = idx / words_per_row;
    const int k0 = int(idx - n * words_per_row) * 8;
    const uint32_t word =
        *reinterpret_cast<const uint32_t*>(a.w + a.wm.row_offset(int(n)) + a.wm.piece_offset(k0 / 32) + (k0 & 31) / 2);
    const int64_t gi = n * a.s_ld + (k0 >> a.group_shift);
    const int z = a.zeros ? int(a.zeros[gi]) : 8;
    const T s = static_cast<const T*>(a.scales)[gi];
    T* out = static_cast<T*>(a.out) + n * a.out_ld;
    alignas(16) T v[8];
    if constexpr (std::is_same_v<T, float>) {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = float(int((word >> (4 * paired_nibble(i))) & 0xfu) - z) * s;
      if (!a.perm) {
        reinterpret_cast<float4*>(out + k0)[0] = reinterpret_cast<const float4*>(v)[0];
        reinterpret_cast<float4*>(out + k0)[1] = reinterpret_cast<const float4*>(v)[1];
        continue;
      }
    } else {
      // The decode kernel's pairs, so both paths use the same 16-bit weights bit for bit: nibbles (c,
      // c+4) of a paired word are values (2c, 2c+1), already in output order.
      const uint32_t zm = (Pair<T>::kMagic | uint32_t(z)) * 0x00010001u, s2 = bits_of(s) * 0x00010001u;
      uint32_t o[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) o[c] = dequant_pair<T>(word, 4 * c, zm, s2);
      if (!a.perm) {
        *reinterpret_cast<uint4*>(out + k0) = make_uint4(o[0], o[1], o[2], o[3]);
        continue;
      }
      *reinterpret_cast<uint4*>(v) = make_uint4(o[0], o[1], o[2], o[3]);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int32_t col = a.perm[k0 + i];
      if (col >= 0 && col < a.K) out[col] = v[i];  // a permutation (checked where it is made)
    }
  }
}

// A 16-byte piece's words in the paired order (int4gemv::pair_word).
__device__ __forceinline__ uint4 pair_piece(uint4 v) {
  return make_uint4(pair_word(v.x), pair_word(v.y), pair_word(v.z), pair_word(v.w));
}

// Rows -> Blocks8 (backend.h's Int4Layout) in place, nibbles paired, one 8-row block a thread block:
// rows 8b .. 8b + 7 are the same 4K contiguous bytes in both layouts, so the block is read whole into
// shared memory and written back in block order (16-byte piece i = 32Q + 4g + t from row g's piece
// 4Q + t).
__global__ void int4_blocks8_kernel(uint8_t* w, int K) {
  extern __shared__ uint4 block_pieces[];  // [8, K/32] the block as rows
  uint4* blk = reinterpret_cast<uint4*>(w + int64_t(blockIdx.x) * 4 * K);
  const int pieces = K / 32, n = 8 * pieces;
  pdl_wait();
  pdl_trigger();
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) block_pieces[i] = blk[i];
  __syncthreads();
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) {
    const int q = i >> 5, g = (i >> 2) & 7, t = i & 3;
    blk[i] = pair_piece(block_pieces[g * pieces + 4 * q + t]);
  }
}

// The rows' nibbles paired in place (weights the blocks do not take): one thread a 16-byte piece.
__global__ void int4_pair_rows_kernel(uint8_t* w, int64_t ld, int64_t rows, int64_t pieces_per_row) {
  pdl_wait();
  pdl_trigger();
  const int64_t total = rows * pieces_per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    uint4* p = reinterpret_cast<uint4*>(w + (i / pieces_per_row) * ld) + i % pieces_per_row;
    *p = pair_piece(*p);
  }
}

int log2_exact(int64_t v) {
  int s = 0;
  while ((int64_t(1) << s) < v) ++s;
  return s;
}

}  // namespace

void check_int4_weight(const Mat& w, DType scale_dtype, const char* op) {
  const Int4Scales& q = w.int4;
  const int64_t g = q.group_size;
  if (!w.data || !q.data)
    throw Error(std::string("cuda backend: ") + op + ": an INT4 weight needs its packed data and its scales");
  if (g < 32 || g > 256 || (g & (g - 1)) != 0 || w.cols % g != 0)
    throw Error(std::string("cuda backend: ") + op + ": INT4 group size " + std::to_string(g) +
                " must be a power of two in [32, 256] dividing the " + std::to_string(w.cols) + " columns");
  if (w.ld * 2 != w.cols)
    throw Error(std::string("cuda backend: ") + op + ": an INT4 weight of " + std::to_string(w.cols) +
                " columns has rows of " + std::to_string(w.cols / 2) + " bytes, not " + std::to_string(w.ld));
  // A 16-bit engine on a backend of f32 activations: its INT4 kernels read scales and x of one dtype.
  if (q.dtype != scale_dtype)
    throw Error(std::string("cuda backend: ") + op + ": INT4 scales are " + std::string(dtype_name(q.dtype)) +
                " on a " + std::string(dtype_name(scale_dtype)) + " backend; " +
                (scale_dtype == DType::F32 && q.dtype != DType::F32
                     ? "INT4 weights need 16-bit activations, drop --activations f32"
                     : "build the engine in the backend's dtype"));
  if (!aligned16(w.data, w.ld, 1))
    throw Error(std::string("cuda backend: ") + op + ": INT4 weight rows must start on 16-byte boundaries");
  if (!q.paired)
    throw Error(std::string("cuda backend: ") + op + ": an INT4 weight [" + std::to_string(w.rows) + ", " +
                std::to_string(w.cols) + "] in quant/int4.h's nibble order: the CUDA kernels read weights "
                "re-laid out at load (Backend::relayout_int4)");
  if (q.layout == Int4Layout::Blocks8 && (w.rows % 8 != 0 || w.cols % 128 != 0))
    throw Error(std::string("cuda backend: ") + op + ": an INT4 weight [" + std::to_string(w.rows) + ", " +
                std::to_string(w.cols) + "] in 8-row blocks needs rows % 8 == 0 and columns % 128 == 0");
  if (w.rows > INT32_MAX || w.cols > INT32_MAX)
    throw Error(std::string("cuda backend: ") + op + ": INT4 weight of more than 2^31 rows or columns");
}

namespace {

// The one-token-block instances of int4_gemv_kernel.cuh the library compiles: S warps per 16-row
// tile, U loads per lane and row in flight, R tiles per block.
enum class Int4Design { S8U1R1, S8U2R1, S8U4R1, S16U1R1, S16U2R1 };

// The instance for a product of N rows of K columns. bench/int4_lab.cu on an H100 (2026-12-07, bf16,
// group 128, one token, symmetric weights in 8-row blocks with paired nibbles and the scale per slot,
// best of 6 rounds; µs per call, the pick against the earlier pick in the same run; the figures of every
// split in docs/quantization.md):
//  - K <= 1024 (Qwen3-0.6B's QKV and gate/up): 8 warps a tile, one load each (2.56 / 2.75; 4 warps
//    with four loads 3.04 / 3.52).
//  - K 2048-3072 with N = 1024 (its O and down): 16 warps a tile, 64 tiles being too few to fill the
//    GPU otherwise (O 2.04; down 2.74 with two loads, kept as the H200 measured it, 2.72 with one).
//  - K = 4096: N = 4096 (O) 8 warps with four loads (4.69 against 6.28 for 16 warps with one);
//    N = 6144 (QKV) 8 warps with two loads (6.60 against 6.93 for 4 warps with four); N = 24576-28672
//    (gate/up) 8 warps with one load (27.32 / 24.28 against 29.01 / 25.56 for 4 warps with four).
//  - Longer rows (down, K = 12288-14336): 8 warps, four loads each (12.78 / 10.86).
Int4Design int4_design(int N, int K) {
  if (K <= 1024) return Int4Design::S8U1R1;
  if (K <= 2048) return Int4Design::S16U1R1;
  if (K <= 3072) return Int4Design::S16U2R1;
  if (K <= 8192) return N <= 4096 ? Int4Design::S8U4R1 : N <= 8192 ? Int4Design::S8U2R1 : Int4Design::S8U1R1;
  return Int4Design::S8U4R1;
}

// One token block: no zero-point loads without zero points (kZeros false: the H200, 2026-12-04,
// Llama-3.1-8B shapes, batch 1 419.2 tok/s against 414.7), and the scale per slot where groups span
// the 128 columns of an MMA (Scaling::PerSlot, group 128+). The batch instances keep the instance that
// tests for zeros (batch 16 lost 7.5% without it, 2026-12-04) and the scale per weight (per slot:
// 3,963 against 4,134 tok/s at batch 16 and 8,236 against 8,601 at 64 on an H100, 2026-12-06).
template <typename T, class Out, class Sp, bool kZeros>
void launch_one_block(const int4gemv::Args& a, const dim3& grid, const dim3& block, cudaStream_t s) {
  using int4gemv::Scaling;
  if (a.group_shift >= 7)
    return launch("int4_gemv_kernel", int4gemv::kernel<T, Sp, 1, false, Out, kZeros, Scaling::PerSlot, true>, grid, block,
                  0, s, a);
  launch("int4_gemv_kernel", int4gemv::kernel<T, Sp, 1, false, Out, kZeros, Scaling::PerWeight, true>, grid, block, 0, s, a);
}

template <typename T, class Out, class Sp, int NT = 1, bool X = false>
void launch_design(const int4gemv::Args& a, cudaStream_t s) {
  const dim3 grid(int4gemv::grid_blocks<Sp, Out>(a)), block(Sp::R * Sp::S * 32);
  if constexpr (NT == 1) {
    if (a.zeros) return launch_one_block<T, Out, Sp, true>(a, grid, block, s);
    return launch_one_block<T, Out, Sp, false>(a, grid, block, s);
  }
  launch("int4_gemv_kernel", int4gemv::kernel<T, Sp, NT, X, Out, true, int4gemv::Scaling::PerWeight, true>, grid, block, 0, s, a);
}

// Whether int4gemm::gemm_kernel takes the call: weights in 8-row blocks (K a multiple of 128), for
// SwiGLU half the rows a multiple of 8 (a tile's up rows one block), and wide products (N >= 4 K: an
// 8B model's gate/up). bench/int4_lab.cu on an H100 (2026-12-07, bf16, group 128, Llama-3.1-8B's
// products, µs per call against the per-warp kernel's split below): gate/up 34.8 against 37.8 at 16
// tokens, 42.5 against 43.5 at 32, 58.2 against 73.9 at 64; but O and down (N < K, few tiles) 15.7
// against 14.3 and 60.9 against 36.4 at 64 even split over a cluster, and QKV mixed (21.3 against 17.6
// at 64): with the GEMM on every shape `ingot bench` lost 4% at batch 16 and 12% at 64.
template <class Out>
bool gemm_suits(const int4gemv::Args& a) {
  // Thread-block clusters (the GEMM's split of K) need compute capability 9+.
  if (device_attribute(cudaDevAttrComputeCapabilityMajor) < 9 || a.N < 4 * a.K) return false;
  const bool blocks = a.wm.quad == int4gemv::WeightMap::blocks8(a.K).quad && a.wm.row == 64 && a.K % 128 == 0;
  return blocks && (!std::is_same_v<Out, int4gemv::SwigluOut> || (a.N / 2) % 8 == 0);
}

// The GEMM's split of K over a cluster: enough blocks for two a multiprocessor where the tiles alone
// are too few. At 33..64 tokens two tiles a warp and three stages (gate/up 58.2 µs against 70.0 for
// one tile and four stages, the lab run above). At 9..32 tokens with groups of 128+, the scale per
// stage (Scaling::PerSlot: no HMUL2 per weight pair; its sums, W x NT x 4 floats a lane, are too many
// registers at eight token blocks): Llama-3.1-8B shapes at batch 16 4,430.1 tok/s against 4,365.2
// with the scale per weight (an H100, 2026-12-07, one run each in one call: within the spread of
// repeated runs, so kept for its fewer instructions and its exact sums, not for a measured gain).
template <typename T, class Out, int NT, int4gemv::Scaling Sc>
void launch_gemm_split(const int4gemv::Args& a, cudaStream_t s) {
  constexpr int WN = 4, W = 1, ST = 4;
  const int tiles = (Out::outputs(a) + Out::kSpan - 1) / Out::kSpan, blocks = (tiles + WN * W - 1) / (WN * W);
  const int want = 2 * device_sm_count();
  if (blocks >= want) return int4gemm::launch_gemm<T, Out, WN, W, NT, ST, 1, true, Sc>(a, s);
  if (2 * blocks >= want) return int4gemm::launch_gemm<T, Out, WN, W, NT, ST, 2, true, Sc>(a, s);
  int4gemm::launch_gemm<T, Out, WN, W, NT, ST, 4, true, Sc>(a, s);
}

template <typename T, class Out, int NT>
void launch_gemm(const int4gemv::Args& a, cudaStream_t s) {
  if constexpr (NT == 8) {
    int4gemm::launch_gemm<T, Out, 4, 2, NT, 3, 1, true>(a, s);
  } else {
    if (a.group_shift >= 7) return launch_gemm_split<T, Out, NT, int4gemv::Scaling::PerSlot>(a, s);
    launch_gemm_split<T, Out, NT, int4gemv::Scaling::PerWeight>(a, s);
  }
}

// 9..64 tokens: NT = 2, 4 or 8 token blocks (int4gemv::token_blocks), from 4 blocks on with x first
// reordered into the scratch (int4gemv::xfrag_kernel). The split bench/int4_lab.cu measured fastest
// on the H200 (2026-12-03, bf16, group 128, Llama-3.1-8B's products; µs per call, both launches,
// against the next best split of the same run; docs/quantization-log.md):
//  - 16 tokens: two tiles a warp with two loads per lane and row for N <= 4096 or long rows (O 8.75
//    against 9.27, down 24.13 against 25.42), one tile and one load for QKV (12.13; two tiles 11.99), and four warps a
//    pair of tiles with one load for gate/up (41.02 against 42.69): at 16 tokens a tile reads 128 KB
//    of x for its 32 KB of weights, which the pair shares.
//  - 32 tokens: two loads for long rows (down 29.72 against 31.36), one tile and one load up to
//    N = 8192 (QKV 14.56 against 15.54; O 11.32 against 11.38), four warps with two loads wider
//    (gate/up 49.94 against 52.55).
//  - 64 tokens: one load for N <= 4096 (O 15.48 against 16.83, down 42.96 against 45.65), four warps
//    with two loads wider (QKV 20.32 against 23.91), and for gate/up two tiles a warp (79.45 against
//    89.02).
// Where the GEMM takes the call (gemm_suits above), x is reordered for it and it runs instead.
template <typename T, class Out, int NT>
void launch_blocks(int4gemv::Args a, void* xf, cudaStream_t s) {
  if (gemm_suits<Out>(a)) {
    int4gemv::launch_xfrag<NT, true>(a, xf, s);
    a.xf = xf;
    return launch_gemm<T, Out, NT>(a, s);
  }
  constexpr bool X = NT >= int4gemv::kFragBlocks;
  if constexpr (X) {
    int4gemv::launch_xfrag<NT, true>(a, xf, s);
    a.xf = xf;
  }
  if constexpr (NT == 2) {
    if (a.N <= 4096 || a.K > 8192) return launch_design<T, Out, Split<8, 2, 1, false, 2>, NT, X>(a, s);
    if (a.N <= 8192) return launch_design<T, Out, Split<8, 1, 1, false>, NT, X>(a, s);
    return launch_design<T, Out, Split<4, 1, 1, false, 2>, NT, X>(a, s);
  } else if constexpr (NT == 4) {
    if (a.K > 8192) return launch_design<T, Out, Split<8, 2, 1, false>, NT, X>(a, s);
    if (a.N <= 8192) return launch_design<T, Out, Split<8, 1, 1, false>, NT, X>(a, s);
    return launch_design<T, Out, Split<4, 2, 1, false>, NT, X>(a, s);
  } else {
    if (a.N <= 4096) return launch_design<T, Out, Split<8, 1, 1, false>, NT, X>(a, s);
    if (a.N <= 8192) return launch_design<T, Out, Split<4, 2, 1, false>, NT, X>(a, s);
    return launch_design<T, Out, Split<4, 2, 1, false, 2>, NT, X>(a, s);
  }
}

// Out: int4gemv::PlainOut or SwigluOut; the split is the weight's ([2I, K] for SwiGLU).
template <typename T, class Out>
void launch_new(const int4gemv::Args& a, void* xf, cudaStream_t s) {
  switch (int4gemv::token_blocks(a.T)) {
    case 2: return launch_blocks<T, Out, 2>(a, xf, s);
    case 4: return launch_blocks<T, Out, 4>(a, xf, s);
    case 8: return launch_blocks<T, Out, 8>(a, xf, s);
    default: break;  // one block: the split by shape below
  }
  switch (int4_design(a.N, a.K)) {
    case Int4Design::S8U1R1: return launch_design<T, Out, Split<8, 1, 1, false>>(a, s);
    case Int4Design::S8U2R1: return launch_design<T, Out, Split<8, 2, 1, false>>(a, s);
    case Int4Design::S8U4R1: return launch_design<T, Out, Split<8, 4, 1, false>>(a, s);
    case Int4Design::S16U1R1: return launch_design<T, Out, Split<16, 1, 1, false>>(a, s);
    case Int4Design::S16U2R1: return launch_design<T, Out, Split<16, 2, 1, false>>(a, s);
  }
}

// Whether the decode kernels take the call: 1..int4_decode_rows tokens, no act-order perm, 16-byte
// aligned x rows.
bool decode_suits(const Mat& x, const Mat& w) {
  return x.rows >= 1 && x.rows <= int4_decode_rows(x.dtype) && !w.int4.perm &&
         aligned16(x.data, x.ld, dtype_size(x.dtype));
}

int4gemv::WeightMap weight_map(const Mat& w) { return int4gemv::WeightMap::of(w.int4.layout, w.ld, w.cols); }

Int4Args int4_args(const Mat& x, const Mat& w, const void* bias, const Mat& y) {
  return Int4Args{x.data,       x.ld, static_cast<const uint8_t*>(w.data), weight_map(w), w.int4.data, w.int4.zeros,
                  w.cols / w.int4.group_size, bias, y.data, y.ld, int(x.rows), int(w.rows), int(w.cols),
                  log2_exact(w.int4.group_size)};
}

}  // namespace

size_t int4_decode_scratch_bytes(DType activations, int64_t tokens, int64_t cols) {
  if (activations == DType::F32) return 0;
  // x in fragment order: the GEMM's at 2+ token blocks (weights in 8-row blocks), the kernel's at 4+.
  const int blocks = int4gemv::token_blocks(tokens);
  return blocks < 2 ? 0 : size_t(int4gemv::xfrag_bytes(cols, blocks));
}

bool launch_int4_gemv(const Mat& x, const Mat& w, const void* bias, const Mat& y, void* scratch, size_t scratch_bytes,
                      cudaStream_t s) {
  if (!decode_suits(x, w)) return false;
  if (int4_decode_scratch_bytes(x.dtype, x.rows, x.cols) > scratch_bytes) return false;
  const Int4Args a = int4_args(x, w, bias, y);
  switch (x.dtype) {
    case DType::F16:
    case DType::BF16:
      dispatch(x.dtype, "int4 linear", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        if constexpr (!std::is_same_v<T, float>) launch_new<T, int4gemv::PlainOut>(a, scratch, s);
      });
      return true;
    case DType::F32: {
      const dim3 grid(unsigned((a.N + kWarps - 1) / kWarps)), block(kWarps * 32);
      if (a.T == 1) launch("int4_gemv_f32_kernel", int4_gemv_f32_kernel<1>, grid, block, 0, s, a);
      else if (a.T == 2) launch("int4_gemv_f32_kernel", int4_gemv_f32_kernel<2>, grid, block, 0, s, a);
      else if (a.T <= 4) launch("int4_gemv_f32_kernel", int4_gemv_f32_kernel<4>, grid, block, 0, s, a);
      else if (a.T <= 8) launch("int4_gemv_f32_kernel", int4_gemv_f32_kernel<8>, grid, block, 0, s, a);
      else launch("int4_gemv_f32_kernel", int4_gemv_f32_kernel<16>, grid, block, 0, s, a);
      return true;
    }
    default: return false;
  }
}

bool launch_int4_gemv_swiglu(const Mat& x, const Mat& w_gate_up, const Mat& out, void* scratch, size_t scratch_bytes,
                             cudaStream_t s) {
  if (x.dtype == DType::F32 || !decode_suits(x, w_gate_up) || w_gate_up.rows % 2 != 0) return false;
  if (out.rows != x.rows || out.cols * 2 != w_gate_up.rows || out.dtype != x.dtype)
    throw Error("cuda backend: int4 linear_swiglu of x [" + std::to_string(x.rows) + ", " + std::to_string(x.cols) +
                "] and w [" + std::to_string(w_gate_up.rows) + ", " + std::to_string(w_gate_up.cols) + "] into [" +
                std::to_string(out.rows) + ", " + std::to_string(out.cols) + "]");
  if (int4_decode_scratch_bytes(x.dtype, x.rows, x.cols) > scratch_bytes) return false;
  const Int4Args a = int4_args(x, w_gate_up, nullptr, out);
  // Where the plain product of these weights takes the GEMM but the fused one cannot (an intermediate
  // size that is not a multiple of 8: a tile's up rows would straddle two blocks), the call goes the
  // unfused way, so that fusing never changes a bit.
  if (int4gemv::token_blocks(a.T) >= 2 && gemm_suits<int4gemv::PlainOut>(a) && !gemm_suits<int4gemv::SwigluOut>(a))
    return false;
  dispatch(x.dtype, "int4 linear_swiglu", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if constexpr (!std::is_same_v<T, float>) launch_new<T, int4gemv::SwigluOut>(a, scratch, s);
  });
  return true;
}

void relayout_int4_cuda(Mat& w, cudaStream_t s) {
  // A weight the kernels cannot take anyway stays as it is: check_int4_weight names its fault.
  if (!w.is_int4() || w.int4.paired || w.int4.layout != Int4Layout::Rows || w.ld * 2 != w.cols || w.cols % 32 != 0 ||
      w.rows > INT32_MAX || !aligned16(w.data, w.ld, 1))
    return;
  // 8-row blocks where the rows come in eights of whole 128-column quads and a block of 4K bytes fits
  // one block's shared memory (K up to ~58k on sm_90).
  const int optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  const size_t smem = size_t(w.cols) * 4;
  if (w.rows % 8 == 0 && w.cols % 128 == 0 && smem <= size_t(optin)) {
    allow_dynamic_smem(int4_blocks8_kernel, smem, "int4 re-layout shared memory");
    launch("int4_blocks8_kernel", int4_blocks8_kernel, dim3(unsigned(w.rows / 8)), dim3(256), smem, s,
           static_cast<uint8_t*>(w.data), int(w.cols));
    w.int4.layout = Int4Layout::Blocks8;
  } else {
    const int64_t pieces = w.rows * (w.cols / 32);
    const unsigned blocks = unsigned(std::min<int64_t>((pieces + 255) / 256, int64_t(1) << 16));
    launch("int4_pair_rows_kernel", int4_pair_rows_kernel, dim3(blocks), dim3(256), 0, s,
           static_cast<uint8_t*>(w.data), w.ld, w.rows, w.cols / 32);
  }
  w.int4.paired = true;
}

void launch_int4_dequant(const Mat& w, const Mat& out, cudaStream_t s) {
  if (out.rows != w.rows || out.cols != w.cols)
    throw Error("cuda backend: int4 dequantize into [" + std::to_string(out.rows) + ", " + std::to_string(out.cols) +
                "] for a weight [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "]");
  const DequantArgs a{static_cast<const uint8_t*>(w.data), weight_map(w), w.int4.data, w.int4.zeros,
                      w.cols / w.int4.group_size, w.int4.perm, out.data, out.ld, int(w.rows), int(w.cols),
                      log2_exact(w.int4.group_size)};
  const int64_t words = w.rows * (w.cols / 8);
  const unsigned blocks = unsigned(std::min<int64_t>((words + 255) / 256, int64_t(1) << 20));
  dispatch(out.dtype, "int4 dequantize", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch("int4_dequant_kernel", int4_dequant_kernel<T>, dim3(blocks), dim3(256), 0, s, a);
  });
}

}  // namespace ingot::cuda
