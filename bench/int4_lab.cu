// INT4 decode design lab (issue 12): the library's INT4 decode product (the public launcher, which
// picks an instance of src/backend/cuda/int4_gemv_kernel.cuh by shape) and several splits of that
// kernel, timed as a decode step runs them: a CUDA graph of one launch per copy over enough distinct
// copies of the weight that every call streams it from HBM (about 320 MB of packed weights, scales
// and zeros per shape), programmatic dependent launch on.
// Shapes: the decode products of Llama-3.1-8B, Qwen3-8B and Qwen3-0.6B, bf16, group 128 (and 32 for
// one shape), 1 token (and 2 for one shape, 4 and 8 for two, 16, 32 and 64 for Llama-3.1-8B's four:
// the instances of two, four and eight token blocks). Every design is checked against a
// double-precision host product of the same dequantized values; a mismatch beyond what f32
// accumulation and the output's bf16 rounding explain (or any NaN) fails the run.
//   cmake --build build-gpu/tree --target int4_lab && build-gpu/tree/int4_lab [replays]
// (for a GPU machine without our Debian packages: BINS=int4_lab scripts/gpu-build here, then
// LD_LIBRARY_PATH=build-gpu/bin/lib build-gpu/bin/int4_lab there). INGOT_LAB_SHAPE=l8b.gateup and
// INGOT_LAB_DESIGN=lib run only the shape names / designs they list, comma-separated (e.g. one under
// ncu); INGOT_LAB_MAX_TOKENS=N / INGOT_LAB_MIN_TOKENS=N only the shapes of at most / at least N
// tokens; INGOT_LAB_ROUNDS=N timing rounds (default 3, each over all of a shape's designs from a
// different start, the best kept).
// Written for this repository (its packed layout and kernels), as bench/gemv_lab.cu is.
// Columns: design, shape, T (tokens), G (group), us/call (one product), GB/s (packed weight + scale +
// zero bytes per call over its time), max err (the largest |y - ref| / (|ref| + 0.1 rms(ref)) over the
// checked outputs, ref with each weight rounded to bf16 as Scaling::PerWeight takes it), err exact (the
// same against the product of the unrounded (nibble - zero) * scale, which Scaling::PerSlot computes
// and is checked against). INGOT_LAB_SYM=1: weights without zero points (every zero 8), as RTN builds
// them; the " z0" designs run only then. Designs: "lib" the library's launcher (its choice of
// instance), "norm+lib B" the library's add + RMSNorm and then "lib B" (what the norm adds to a step's
// chain), "S4 U2 R2 P" etc. the kernel with S warps per 16-row tile, U 16-byte loads per lane and
// row in flight, R tiles per block, P pipelined, "N2" two blocks of 8 token columns (timed at 9..16
// tokens, the single-block ones at 1..8), "N4 X" / "N8 X" four / eight blocks with x reordered first
// (17..32 / 33..64; both launches timed), " W2" / " W4" two / four 16-row tiles a warp sharing its x
// loads, " ws" the scale per slot, " z0" no zero points, " B" the weights in 8-row blocks (backend.h's
// Int4Layout::Blocks8, as the CUDA backend re-lays them; "lib B" the launcher given such a weight),
// " BP" the same blocks with each word's nibbles paired (int4gemv::kernel's kPairedNibbles: x's own
// pairs are the B fragments; the library's order, backend.h's Int4Scales::paired, which "lib" and
// "lib B" are given: in rows and in blocks),
// "reg S4 U4" int4_stream_lab.cuh's register-load kernel, " T" / " B" with the weights in its 16-row
// tiles / 8-row blocks (symmetric runs only), "G WN4 W1 N8 ST4 C2 B" int4_gemm_kernel.cuh's pipelined
// GEMM for 9..64 tokens (WN warps of W tiles a block, NT token blocks, ST stages, K split over C
// blocks; x reordered first, both launches timed).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/int4_gemm_kernel.cuh"
#include "backend/cuda/int4_gemv_kernel.cuh"
#include "int4_stream_lab.cuh"
#include "lab_util.h"

namespace {

using bf16 = __nv_bfloat16;
using ingot::cuda::int4gemv::Args;
using ingot::cuda::int4gemv::PlainOut;
using ingot::cuda::int4gemv::Scaling;
using ingot::cuda::int4gemv::Split;

using ingot::lab::ck;
using Design = ingot::lab::Design<Args>;

// " W2" etc.: W 16-row tiles a warp (the batch instances).
std::string tiles_name(int W) { return W > 1 ? " W" + std::to_string(W) : ""; }

// " ws": the one-block instance with the scale applied per slot (Scaling::PerSlot, checked against the
// exact product); " z0": the instance that reads no zero points (run with INGOT_LAB_SYM=1, whose
// weights have none).
// Layout 2: the weights in 8-row blocks (backend.h's Int4Layout::Blocks8, " B"), as the CUDA backend
// re-lays them at load; 0 in rows.
// " mN": registers bounded so that N blocks fit an SM (Split's M, __launch_bounds__'s second argument).
template <int S, int U, int R, bool P, int NT = 1, int W = 1, Scaling Sc = Scaling::PerWeight, bool Z = true,
          int Layout = 0, int M = 0>
Design design() {
  Design d;
  d.name = ingot::lab::design_name(S, U, R, P) + (NT > 1 ? " N" + std::to_string(NT) : "") + tiles_name(W) +
           (Sc == Scaling::PerSlot ? " ws" : "") + (Z ? "" : " z0") + (Layout == 2 ? " B" : Layout == 3 ? " BP" : "") +
           (M > 0 ? " m" + std::to_string(M) : "");
  d.layout = Layout;
  d.min_tokens = NT > 1 ? 4 * NT + 1 : 1;  // the token counts the library gives this NT
  d.max_tokens = 8 * NT;
  d.min_group = Sc == Scaling::PerWeight ? 0 : 128;
  d.needs_sym = !Z;
  d.exact = Sc == Scaling::PerSlot;
  d.launch = [](const Args& a, cudaStream_t s) {
    using Sp = Split<S, U, R, P, W, M>;
    ingot::cuda::launch("int4_lab", ingot::cuda::int4gemv::kernel<bf16, Sp, NT, false, PlainOut, Z, Sc, Layout == 3>,
                        dim3(ingot::cuda::int4gemv::grid_blocks<Sp, PlainOut>(a)), dim3(R * S * 32), 0, s, a);
  };
  return d;
}

// A one-block split in both scalings without zero points, and with the scale per slot with them; the
// library's one-token instance for symmetric weights (per slot, no zeros) also in 8-row blocks.
template <int S, int U, int R, bool P>
void add_scalings(std::vector<Design>& v) {
  v.push_back(design<S, U, R, P, 1, 1, Scaling::PerSlot>());
  v.push_back(design<S, U, R, P, 1, 1, Scaling::PerWeight, false>());
  v.push_back(design<S, U, R, P, 1, 1, Scaling::PerSlot, false>());
  v.push_back(design<S, U, R, P, 1, 1, Scaling::PerSlot, false, 2>());
  v.push_back(design<S, U, R, P, 1, 1, Scaling::PerSlot, false, 3>());
}

// int4_stream_lab.cuh's designs (symmetric weights, one token block, the scale per slot): "reg S4 U4
// (P)" register loads as the library takes them; " T" the weights in its tiled layout (each warp load
// 512 contiguous bytes; the lab uploads a re-laid-out copy for these), " B" in 8-row blocks (likewise).
// Its cp.async ring of shared-memory stages lost to register loads on every shape (an H100,
// 2026-12-06, docs/quantization-log.md) and is gone.
namespace lab4 = ingot::lab::int4stream;
template <int Layout>
using LabLayout = std::conditional_t<Layout == 1, lab4::TileLayout, lab4::MapLayout>;
Design stream_base(std::string name, int layout) {
  Design d;
  d.name = std::move(name) + (layout == 1 ? " T" : layout == 2 ? " B" : "");
  d.max_tokens = 8;
  d.min_group = 128;
  d.needs_sym = true;
  d.exact = true;
  d.layout = layout;
  return d;
}
template <int Layout, int S, int U, bool P>
Design design_reg() {
  Design d = stream_base("reg S" + std::to_string(S) + " U" + std::to_string(U) + (P ? " P" : ""), Layout);
  d.launch = [](const Args& a, cudaStream_t s) {
    ingot::cuda::launch("int4_lab_reg", lab4::reg_kernel<bf16, LabLayout<Layout>, S, U, P>,
                        dim3(lab4::grid_blocks(a)), dim3(S * 32), 0, s, a);
  };
  return d;
}

// NT = 4, 8 with x reordered first (the lab's buffer at a.xf), both launches timed.
template <int S, int U, int R, int NT, int W = 1>
Design design_frag() {
  Design d;
  d.name = ingot::lab::design_name(S, U, R, false) + " N" + std::to_string(NT) + " X" + tiles_name(W);
  d.min_tokens = 4 * NT + 1;
  d.max_tokens = 8 * NT;
  d.launch = [](const Args& a, cudaStream_t s) {
    ingot::cuda::int4gemv::launch_xfrag<NT, false>(a, const_cast<void*>(a.xf), s);
    using Sp = Split<S, U, R, false, W>;
    ingot::cuda::launch("int4_lab", ingot::cuda::int4gemv::kernel<bf16, Sp, NT, true>,
                        dim3(ingot::cuda::int4gemv::grid_blocks<Sp, PlainOut>(a)), dim3(R * S * 32), 0, s, a);
  };
  return d;
}

// The kernel's splits with NT blocks of 8 token columns (the library's 9..16 tokens: NT = 2).
template <int NT>
void add_wide(std::vector<Design>& v) {
  v.push_back(design<4, 2, 1, false, NT>());
  v.push_back(design<4, 4, 1, false, NT>());
  v.push_back(design<8, 1, 1, false, NT>());
  v.push_back(design<8, 2, 1, false, NT>());
  v.push_back(design<16, 1, 1, false, NT>());
  v.push_back(design<8, 1, 2, false, NT>());
  v.push_back(design<4, 1, 1, false, NT, 2>());
  v.push_back(design<8, 1, 1, false, NT, 2>());
  v.push_back(design<8, 2, 1, false, NT, 2>());
  v.push_back(design<4, 1, 1, false, NT, 4>());
  v.push_back(design<8, 1, 1, false, NT, 4>());
}

// int4_gemm_kernel.cuh's pipelined GEMM for 9..64 tokens (NT blocks of 8): WN warps of W tiles a block,
// ST stages, K split over clusters of C blocks; x reordered first (both launches timed), the weights in
// 8-row blocks; " ws" the scale per stage (Scaling::PerSlot, groups of 128+, checked against the exact
// product).
template <int WN, int W, int NT, int ST, int C, Scaling Sc = Scaling::PerWeight>
Design design_gemm() {
  Design d;
  d.name = "G WN" + std::to_string(WN) + " W" + std::to_string(W) + " N" + std::to_string(NT) + " ST" +
           std::to_string(ST) + " C" + std::to_string(C) + " B" + (Sc == Scaling::PerSlot ? " ws" : "");
  d.min_tokens = 8 * (NT / 2) + 1;
  d.max_tokens = 8 * NT;
  d.layout = 2;
  d.min_group = Sc == Scaling::PerWeight ? 0 : 128;
  d.exact = Sc == Scaling::PerSlot;
  d.launch = [](const Args& a, cudaStream_t s) {
    ingot::cuda::int4gemv::launch_xfrag<NT, false>(a, const_cast<void*>(a.xf), s);
    ingot::cuda::int4gemm::launch_gemm<bf16, PlainOut, WN, W, NT, ST, C, true, Sc>(a, s);
  };
  return d;
}

// The buffers of the add + RMSNorm launched before the product in "norm+lib B" (allocated per shape by
// main): the residual [T, K] it adds x into, its output [T, K] and its weight [K], bf16. The product
// still reads the shape's x, so its result is checked as the other designs' are; in the graph it
// waits for the norm as a model's product waits for the norm whose output it reads.
struct NormChain {
  void* resid = nullptr;
  void* out = nullptr;
  void* weight = nullptr;
};

// The library's product through its public launcher: Args as the Mats it takes, the weight as the
// CUDA backend re-lays it at load, nibbles paired, in 8-row blocks or rows.
void launch_library(const Args& a, bool blocks, cudaStream_t s) {
  using ingot::DType;
  using ingot::Mat;
  Mat x{const_cast<void*>(a.x), DType::BF16, a.T, a.K, a.x_ld};
  Mat w{const_cast<uint8_t*>(a.w), DType::U8, a.N, a.K, a.K / 2};
  w.int4.layout = blocks ? ingot::Int4Layout::Blocks8 : ingot::Int4Layout::Rows;
  w.int4.paired = true;
  w.int4.data = const_cast<void*>(a.scales);
  w.int4.dtype = DType::BF16;
  w.int4.group_size = int64_t(1) << a.group_shift;
  w.int4.zeros = const_cast<uint8_t*>(a.zeros);
  Mat y{a.y, DType::BF16, a.T, a.N, a.y_ld};
  if (!ingot::cuda::launch_int4_gemv(x, w, a.bias, y, const_cast<void*>(a.xf),
                                     ingot::cuda::int4_decode_scratch_bytes(DType::BF16, a.T, a.K), s)) {
    std::fprintf(stderr, "the library's INT4 launcher refused the call\n");
    std::exit(1);
  }
}

// "lib" (rows, layout 4) and "lib B" (8-row blocks, layout 3).
Design library(bool blocks = false) {
  Design d;
  d.name = blocks ? "lib B" : "lib";
  d.max_tokens = 64;
  d.layout = blocks ? 3 : 4;
  d.launch = [blocks](const Args& a, cudaStream_t s) { launch_library(a, blocks, s); };
  return d;
}

// "norm+lib B": the library's add + RMSNorm of the call's T rows (x added into the residual), then
// "lib B" waiting for it (programmatic dependent launch, as in a model's step). Its time less lib B's
// is what the norm kernel adds to the chain of a decode step: the most that fusing the norm into the
// product's prologue could save (docs/quantization.md, Plan).
Design library_after_norm(const NormChain* nc) {
  Design d;
  d.name = "norm+lib B";
  d.max_tokens = 64;
  d.layout = 3;
  d.launch = [nc](const Args& a, cudaStream_t s) {
    using ingot::DType;
    const ingot::Mat resid{nc->resid, DType::BF16, a.T, a.K, a.K}, out{nc->out, DType::BF16, a.T, a.K, a.K};
    const ingot::Mat delta{const_cast<void*>(a.x), DType::BF16, a.T, a.K, a.x_ld};
    ingot::cuda::launch_add_rmsnorm(resid, &delta, nc->weight, DType::BF16, 1e-6f, out, s);
    launch_library(a, true, s);
  };
  return d;
}

// The library's path (and behind its norm), then the kernel's splits around int4_design's picks.
std::vector<Design> designs(const NormChain* nc) {
  std::vector<Design> v = {
      library_after_norm(nc),   library(),                library(true),
      design<1, 4, 4, false>(), design<2, 4, 2, false>(),
      design<2, 2, 4, true>(),  design<4, 2, 2, false>(),  design<4, 4, 1, false>(),  design<4, 4, 1, true>(),
      design<8, 1, 1, false>(), design<8, 2, 1, false>(),  design<8, 2, 2, false>(),  design<8, 4, 1, false>(),
      design<8, 4, 1, true>(),  design<16, 1, 1, false>(), design<16, 2, 1, false>(), design<16, 4, 1, false>()};
  add_scalings<4, 2, 1, false>(v);
  add_scalings<4, 4, 1, false>(v);
  add_scalings<4, 4, 1, true>(v);
  add_scalings<8, 1, 1, false>(v);
  add_scalings<8, 2, 1, false>(v);
  add_scalings<8, 4, 1, false>(v);
  add_scalings<16, 1, 1, false>(v);
  add_scalings<16, 2, 1, false>(v);
  // The library's symmetric one-token instances (8-row blocks, paired nibbles, the scale per slot, no
  // zero points) with registers bounded for 3 or 4 blocks an SM: the gate/up instance (S8 U1) takes
  // 70 registers, so 3 blocks (24 warps) an SM, and the one-token kernel was measured short of bytes
  // in flight, not of issue slots (docs/quantization-log.md).
  {
    constexpr Scaling kSlotM = Scaling::PerSlot;
    for (Design d : {design<8, 1, 1, false, 1, 1, kSlotM, false, 3, 3>(), design<8, 1, 1, false, 1, 1, kSlotM, false, 3, 4>(),
                     design<8, 2, 1, false, 1, 1, kSlotM, false, 3, 3>(), design<8, 2, 1, false, 1, 1, kSlotM, false, 3, 4>(),
                     design<8, 4, 1, false, 1, 1, kSlotM, false, 3, 3>(), design<8, 4, 1, false, 1, 1, kSlotM, false, 3, 4>()})
      v.push_back(d);
  }
  // The library's launcher a second time: how far apart two timings of one kernel land (the noise).
  Design again = library();
  again.name = "lib again";
  v.push_back(again);
  for (Design d : {design_reg<0, 4, 4, false>(), design_reg<0, 8, 2, false>(),
                   design_reg<1, 4, 4, false>(), design_reg<1, 4, 2, true>(), design_reg<1, 4, 4, true>(),
                   design_reg<1, 8, 2, false>(), design_reg<1, 8, 1, true>(), design_reg<1, 8, 4, false>(),
                   design_reg<1, 16, 1, false>(), design_reg<1, 2, 4, true>(), design_reg<2, 4, 4, false>(),
                   design_reg<2, 8, 2, false>(), design_reg<2, 4, 2, true>(), design_reg<0, 16, 1, false>(),
                   design_reg<0, 8, 1, true>()})
    v.push_back(d);
  add_wide<2>(v);
  for (Design d : {design_frag<8, 1, 1, 4>(), design_frag<8, 2, 1, 4>(), design_frag<4, 2, 1, 4>(),
                   design_frag<8, 1, 1, 8>(), design_frag<8, 2, 1, 8>(), design_frag<4, 2, 1, 8>(),
                   design_frag<4, 1, 1, 4, 2>(), design_frag<8, 1, 1, 4, 2>(), design_frag<4, 2, 1, 4, 2>(),
                   design_frag<4, 1, 1, 4, 4>(), design_frag<8, 1, 1, 4, 4>(),
                   design_frag<4, 1, 1, 8, 2>(), design_frag<8, 1, 1, 8, 2>(), design_frag<4, 2, 1, 8, 2>(),
                   design_frag<2, 1, 1, 8, 4>(), design_frag<4, 1, 1, 8, 4>(), design_frag<8, 1, 1, 8, 4>()})
    v.push_back(d);
  for (Design d : {design_gemm<4, 1, 2, 4, 1>(), design_gemm<8, 1, 2, 4, 1>(), design_gemm<4, 2, 2, 4, 1>(),
                   design_gemm<4, 1, 2, 4, 2>(), design_gemm<4, 1, 2, 4, 4>(), design_gemm<4, 1, 4, 4, 1>(),
                   design_gemm<8, 1, 4, 4, 1>(), design_gemm<4, 1, 4, 4, 2>(), design_gemm<4, 1, 8, 3, 1>(),
                   design_gemm<8, 1, 8, 3, 1>(), design_gemm<4, 1, 8, 4, 2>(), design_gemm<8, 1, 8, 4, 2>(),
                   design_gemm<8, 1, 8, 4, 4>(), design_gemm<4, 2, 8, 3, 1>()})
    v.push_back(d);
  constexpr Scaling kSlot = Scaling::PerSlot;
  for (Design d : {design_gemm<4, 1, 2, 4, 1, kSlot>(), design_gemm<8, 1, 2, 4, 1, kSlot>(),
                   design_gemm<4, 2, 2, 4, 1, kSlot>(), design_gemm<4, 1, 2, 4, 2, kSlot>(),
                   design_gemm<4, 1, 4, 4, 1, kSlot>(), design_gemm<8, 1, 4, 4, 1, kSlot>(),
                   design_gemm<4, 1, 4, 4, 2, kSlot>(),
                   design_gemm<4, 1, 8, 3, 1, kSlot>(), design_gemm<4, 2, 8, 3, 1, kSlot>()})
    v.push_back(d);
  return v;
}

struct Shape {
  const char* name;
  int N, K;
  int G;  // group size
  int T;  // tokens
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  // INGOT_LAB_SYM=1: symmetric weights (every zero 8, none passed), the model's RTN case.
  const bool sym = std::getenv("INGOT_LAB_SYM") && std::string(std::getenv("INGOT_LAB_SYM")) == "1";
  // INGOT_LAB_ROUNDS=N: timing rounds over a shape's designs (default 3; the best kept).
  const int rounds = std::max(1, std::getenv("INGOT_LAB_ROUNDS") ? std::atoi(std::getenv("INGOT_LAB_ROUNDS")) : 3);
  // INGOT_LAB_MAX_TOKENS=N: only the shapes of at most N tokens.
  const int max_tokens = std::getenv("INGOT_LAB_MAX_TOKENS") ? std::atoi(std::getenv("INGOT_LAB_MAX_TOKENS")) : 64;
  // INGOT_LAB_MIN_TOKENS=N: only the shapes of at least N tokens.
  const int min_tokens = std::getenv("INGOT_LAB_MIN_TOKENS") ? std::atoi(std::getenv("INGOT_LAB_MIN_TOKENS")) : 1;
  // gate/up fused ([2I, H]) as the engine stores it.
  const std::vector<Shape> shapes = {
      // Llama-3.1-8B: q 4096 + kv 2 x 1024, o, gate/up 2 x 14336, down
      {"l8b.qkv", 6144, 4096, 128, 1}, {"l8b.o", 4096, 4096, 128, 1},
      {"l8b.gateup", 28672, 4096, 128, 1}, {"l8b.down", 4096, 14336, 128, 1},
      // Qwen3-8B: q 4096 + kv 2 x 1024, o, gate/up 2 x 12288, down
      {"q8b.qkv", 6144, 4096, 128, 1}, {"q8b.o", 4096, 4096, 128, 1},
      {"q8b.gateup", 24576, 4096, 128, 1}, {"q8b.down", 4096, 12288, 128, 1},
      // Qwen3-0.6B: q 2048 + kv 2 x 1024 over hidden 1024, o, gate/up 2 x 3072, down
      {"q0.6b.qkv", 4096, 1024, 128, 1}, {"q0.6b.o", 1024, 2048, 128, 1},
      {"q0.6b.gateup", 6144, 1024, 128, 1}, {"q0.6b.down", 1024, 3072, 128, 1},
      // group 32; 2, 4 and 8 tokens
      {"l8b.qkv", 6144, 4096, 32, 1}, {"l8b.qkv", 6144, 4096, 128, 2},
      {"l8b.qkv", 6144, 4096, 128, 4}, {"l8b.down", 4096, 14336, 128, 4},
      {"l8b.qkv", 6144, 4096, 128, 8}, {"l8b.down", 4096, 14336, 128, 8},
      // batch decode: 16 tokens (two token blocks), 32 and 64 (four and eight, x reordered first)
      {"l8b.qkv", 6144, 4096, 128, 16}, {"l8b.o", 4096, 4096, 128, 16},
      {"l8b.gateup", 28672, 4096, 128, 16}, {"l8b.down", 4096, 14336, 128, 16},
      {"l8b.qkv", 6144, 4096, 128, 32}, {"l8b.o", 4096, 4096, 128, 32},
      {"l8b.gateup", 28672, 4096, 128, 32}, {"l8b.down", 4096, 14336, 128, 32},
      {"l8b.qkv", 6144, 4096, 128, 64}, {"l8b.o", 4096, 4096, 128, 64},
      {"l8b.gateup", 28672, 4096, 128, 64}, {"l8b.down", 4096, 14336, 128, 64},
  };
  cudaStream_t s;
  ck(cudaStreamCreate(&s), "stream");
  double copy_gbs = 0;
  // The device's copy bandwidth (1 GiB, read + write counted), the ceiling the GB/s column is read against.
  copy_gbs = ingot::lab::copy_bandwidth_gbs(s, size_t(1) << 30);
  std::printf("device copy bandwidth (cudaMemcpy D2D, 1 GiB, read + write): %.0f GB/s\n", copy_gbs);

  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> byte(0, 255), nib(0, 15);
  std::uniform_real_distribution<float> sc(0.004f, 0.016f);
  const size_t kPoolBytes = size_t(320) << 20;  // packed weights + scales + zeros of all copies of a shape
  std::vector<std::string> table;
  bool failed = false;
  char line[256];
  for (const Shape& sh : shapes) {
    if (!ingot::lab::selected("INGOT_LAB_SHAPE", sh.name) || sh.T > max_tokens || sh.T < min_tokens) continue;
    const int groups = sh.K / sh.G;
    const size_t wbytes = size_t(sh.N) * size_t(sh.K / 2), sbytes = size_t(sh.N) * size_t(groups) * 2,
                 zbytes = size_t(sh.N) * size_t(groups), copy = wbytes + sbytes + zbytes;
    const int copies = int(std::max<size_t>(2, kPoolBytes / copy));
    std::vector<uint8_t> hw(wbytes), hz(zbytes);  // [N, K/2] packed, [N, K/G] zeros
    std::vector<bf16> hs(size_t(sh.N) * size_t(groups)), hx(size_t(sh.T) * size_t(sh.K));  // [N, K/G], [T, K]
    for (auto& v : hw) v = uint8_t(byte(rng));
    for (auto& v : hz) v = sym ? uint8_t(8) : uint8_t(nib(rng));
    for (auto& v : hs) v = __float2bfloat16_rn(sc(rng));
    for (auto& v : hx) v = __float2bfloat16_rn(nd(rng));
    // Every copy in one allocation: copy c's weights (packed as `w` holds them), scales and zeros at
    // c * copy (16-byte aligned: every size above is a multiple of 16).
    auto upload_pool = [&](const std::vector<uint8_t>& w) {
      uint8_t* p;
      ck(cudaMalloc(&p, copy * size_t(copies)), "malloc");
      for (int c = 0; c < copies; ++c) {
        uint8_t* base = p + size_t(c) * copy;
        ck(cudaMemcpy(base, w.data(), wbytes, cudaMemcpyHostToDevice), "upload");
        ck(cudaMemcpy(base + wbytes, hs.data(), sbytes, cudaMemcpyHostToDevice), "upload");
        ck(cudaMemcpy(base + wbytes + sbytes, hz.data(), zbytes, cudaMemcpyHostToDevice), "upload");
      }
      return p;
    };
    // pools[l]: the weights in layout l (Design::layout: 0 rows; 1 int4_stream_lab.cuh's tiles, 2 8-row
    // blocks, for the designs that read them; N and K multiples of 16 and 128 here); 3 8-row blocks and
    // 4 rows with each word's nibbles paired (int4_stream_lab.cuh's pair_nibbles: the library's order).
    uint8_t* pools[5] = {upload_pool(hw), nullptr, nullptr, nullptr, upload_pool(lab4::pair_nibbles(hw))};
    for (int l = 1; l <= 2 && sh.N % 16 == 0 && sh.K % 128 == 0; ++l)
      pools[l] = upload_pool(lab4::tile_layout(hw, sh.N, sh.K, l == 2));
    if (pools[2]) pools[3] = upload_pool(lab4::pair_nibbles(lab4::tile_layout(hw, sh.N, sh.K, true)));
    bf16 *x, *y;  // [T, K], [T, N]
    void* xf;     // x in fragment order (the 4- and 8-block instances), as the library's scratch
    ck(cudaMalloc(&xf, size_t(ingot::cuda::int4gemv::xfrag_bytes(sh.K, 8))), "malloc");
    ck(cudaMalloc(&x, hx.size() * 2), "malloc");
    ck(cudaMalloc(&y, size_t(sh.T) * size_t(sh.N) * 2), "malloc");
    ck(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice), "upload");
    // The reference: every 37th row (and the last), each weight round_bf16((nibble - zero) * scale)
    // as the kernels define it, products and sums in double.
    std::vector<int> rows;  // the checked output rows
    for (int n = 0; n < sh.N; n += 37) rows.push_back(n);
    rows.push_back(sh.N - 1);
    std::vector<double> ref(rows.size() * size_t(sh.T));  // [rows, T]
    std::vector<double> exact(ref.size());  // [rows, T] the same with (nibble - zero) * scale unrounded
    double rms = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const int n = rows[i];
      std::vector<double> wrow(size_t(sh.K)), wexact(size_t(sh.K));  // [K] row n dequantized, rounded or not
      for (int k = 0; k < sh.K; ++k) {
        const int q = (hw[size_t(n) * (sh.K / 2) + k / 2] >> (4 * (k & 1))) & 0xf;
        const size_t gi = size_t(n) * groups + k / sh.G;
        wexact[size_t(k)] = double(q - int(hz[gi])) * double(__bfloat162float(hs[gi]));
        wrow[size_t(k)] = __bfloat162float(__float2bfloat16_rn(float(wexact[size_t(k)])));
      }
      for (int t = 0; t < sh.T; ++t) {
        double acc = 0, acc_x = 0;
        for (int k = 0; k < sh.K; ++k) {
          const double xv = __bfloat162float(hx[size_t(t) * sh.K + k]);
          acc += wrow[size_t(k)] * xv;
          acc_x += wexact[size_t(k)] * xv;
        }
        ref[i * sh.T + t] = acc;
        exact[i * sh.T + t] = acc_x;
        rms += acc * acc;
      }
    }
    rms = std::sqrt(rms / double(ref.size()));
    int lg = 0;
    while ((1 << lg) < sh.G) ++lg;
    // Every design's graph is built and checked first, then timed in `rounds` rounds over all of them,
    // each round starting one step further along the list, the best round kept: timed once each in
    // list order, the first designs after the host's reference work ran on a GPU still raising its
    // clocks, and two H100 runs of 2026-12-06 ranked the same kernels in opposite orders.
    struct Run {
      const Design* d;
      cudaGraph_t g;
      cudaGraphExec_t ge;
      double worst, worst_x, us;
    };
    NormChain nc;  // "norm+lib B"'s buffers: the residual and output [T, K], the weight [K] (ones)
    ck(cudaMalloc(&nc.resid, size_t(sh.T) * size_t(sh.K) * 2), "malloc");
    ck(cudaMalloc(&nc.out, size_t(sh.T) * size_t(sh.K) * 2), "malloc");
    ck(cudaMalloc(&nc.weight, size_t(sh.K) * 2), "malloc");
    ck(cudaMemset(nc.resid, 0, size_t(sh.T) * size_t(sh.K) * 2), "memset");
    {
      const std::vector<bf16> ones(size_t(sh.K), __float2bfloat16_rn(1.0f));
      ck(cudaMemcpy(nc.weight, ones.data(), ones.size() * 2, cudaMemcpyHostToDevice), "upload");
    }
    std::vector<Design> all = designs(&nc);
    std::vector<Run> runs;
    for (const Design& d : all) {
      if (!ingot::lab::selected("INGOT_LAB_DESIGN", d.name)) continue;
      if (sh.T < d.min_tokens || sh.T > d.max_tokens || sh.G < d.min_group || (d.needs_sym && !sym) ||
          !pools[d.layout])
        continue;
      ck(cudaMemset(y, 0xff, size_t(sh.T) * size_t(sh.N) * 2), "memset");  // NaN until written
      Run r{&d, nullptr, nullptr, 0, 0, 1e30};
      ck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
      for (int c = 0; c < copies; ++c) {
        const uint8_t* base = pools[d.layout] + size_t(c) * copy;
        // The library's map of the layout (the lab's own tiles, layout 1, ignore it).
        const auto wm = ingot::cuda::int4gemv::WeightMap::of(
            d.layout == 2 || d.layout == 3 ? ingot::Int4Layout::Blocks8 : ingot::Int4Layout::Rows, sh.K / 2, sh.K);
        d.launch(Args{x, sh.K, base, wm, base + wbytes, sym ? nullptr : base + wbytes + sbytes, groups, nullptr,
                      y, sh.N, sh.T, sh.N, sh.K, lg, xf},
                 s);
      }
      ck(cudaStreamEndCapture(s, &r.g), "capture");
      ck(cudaGraphInstantiate(&r.ge, r.g, 0), "instantiate");
      ck(cudaGraphLaunch(r.ge, s), "replay");
      ck(cudaStreamSynchronize(s), "sync");
      std::vector<bf16> hy(size_t(sh.T) * size_t(sh.N));  // [T, N]
      ck(cudaMemcpy(hy.data(), y, hy.size() * 2, cudaMemcpyDeviceToHost), "download");
      for (size_t i = 0; i < rows.size(); ++i)  // against the rounded weights' product, and the exact one's
        for (int t = 0; t < sh.T; ++t) {
          const double rf = ref[i * sh.T + t], v = __bfloat162float(hy[size_t(t) * sh.N + rows[i]]);
          const double err = std::fabs(v - rf) / (std::fabs(rf) + 0.1 * rms);
          if (!(err <= r.worst)) r.worst = err == err ? err : 1e9;  // NaN never passes
          const double ex = exact[i * sh.T + t], err_x = std::fabs(v - ex) / (std::fabs(ex) + 0.1 * rms);
          if (!(err_x <= r.worst_x)) r.worst_x = err_x == err_x ? err_x : 1e9;
        }
      runs.push_back(r);
    }
    const size_t n = runs.size();
    for (int round = 0; round < rounds; ++round)
      for (size_t k = 0; k < n; ++k) {
        Run& r = runs[(k + size_t(round) * std::max<size_t>(1, n / size_t(rounds))) % n];
        const float ms = ingot::lab::replay_ms(r.ge, reps, s);
        r.us = std::min(r.us, ms * 1e3 / (double(reps) * copies));
      }
    for (Run& r : runs) {
      const Design& d = *r.d;
      // bf16 output rounding is 2^-9 relative; f32 sums of K products add far less. Each design against
      // the product it computes: of the rounded weights (per weight) or of the stored values (per slot).
      // "lib" takes the scale per slot with groups of 128+ at one token block, and where the GEMM takes
      // 9..32 tokens (weights in 8-row blocks, N >= 4K: int4_linear.cu's gemm_suits and launch_gemm).
      const bool lib = d.name.rfind("lib", 0) == 0 || d.name.rfind("norm+lib", 0) == 0;
      const bool lib_gemm_slot = d.layout == 3 && sh.T > 8 && sh.T <= 32 && sh.N >= 4 * sh.K;
      const bool exact_ref = d.exact || (lib && sh.G >= 128 && (sh.T <= 8 || lib_gemm_slot));
      const bool wrong = !((exact_ref ? r.worst_x : r.worst) <= 0.01);
      failed = failed || wrong;
      std::snprintf(line, sizeof line, "%-18s %-14s %2d %4d %9.2f %9.0f %9.5f %9.5f%s", d.name.c_str(), sh.name, sh.T,
                    sh.G, r.us, double(copy) / (r.us * 1e-6) / 1e9, r.worst, r.worst_x, wrong ? "  WRONG" : "");
      std::printf("%s\n", line);
      std::fflush(stdout);
      table.push_back(line);
      ck(cudaGraphExecDestroy(r.ge), "destroy");
      ck(cudaGraphDestroy(r.g), "destroy");
    }
    for (uint8_t* p : pools)
      if (p) ck(cudaFree(p), "free");
    ck(cudaFree(x), "free");
    ck(cudaFree(xf), "free");
    ck(cudaFree(y), "free");
    for (void* p : {nc.resid, nc.out, nc.weight}) ck(cudaFree(p), "free");
  }
  std::printf("\nfinal table (device copy %.0f GB/s%s)\n%-18s %-14s %2s %4s %9s %9s %9s %9s\n", copy_gbs,
              sym ? ", symmetric weights" : "", "design", "shape", "T", "G", "us/call", "GB/s", "max err", "err exact");
  for (const auto& l : table) std::printf("%s\n", l.c_str());
  if (failed) {
    std::printf("FAILED: a design's result is wrong (marked WRONG above)\n");
    return 1;
  }
  return 0;
}
