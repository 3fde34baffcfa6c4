// Small element-wise and row ops: SwiGLU, the sigmoid gate, row gather, bias add, f32 rows rounded to
// 16 bits and greedy argmax.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/vec.cuh"
#include "backend/sampling.h"

namespace ingot::cuda {
namespace {

// Calls f(t, i) for every element of a [rows, cols] grid, the launch's threads striding over them (the
// element-wise kernels below run on any grid size; their launchers cap it).
template <typename F>
__device__ __forceinline__ void for_each_element(int64_t rows, int64_t cols, F f) {
  const int64_t total = rows * cols;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = k / cols;
    f(t, k - t * cols);
  }
}

struct SwigluArgs {
  const void* gu;
  int64_t gu_ld;
  void* out;
  int64_t out_ld, inter, rows;
};

template <typename T>
__global__ void swiglu_kernel(SwigluArgs a) {
  pdl_wait();
  pdl_trigger();
  for_each_element(a.rows, a.inter, [&](int64_t t, int64_t i) {
    const T* g = static_cast<const T*>(a.gu) + t * a.gu_ld;
    const float gv = to_f(g[i]), uv = to_f(g[i + a.inter]);
    static_cast<T*>(a.out)[t * a.out_ld + i] = from_f<T>(silu_mul(gv, uv));
  });
}

// The same, V elements per thread in 16-byte loads and stores, one grid row per token (no index
// division): for aligned rows, which prefill's are.
template <typename T, int V>
__global__ void swiglu_vec_kernel(SwigluArgs a) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.y, i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (i >= a.inter) return;
  const T* g = static_cast<const T*>(a.gu) + t * a.gu_ld + i;
  float gv[V], uv[V];
  load_f<T, V, true>(g, gv);
  load_f<T, V, true>(g + a.inter, uv);
  alignas(16) T o[V];
#pragma unroll
  for (int j = 0; j < V; ++j) o[j] = from_f<T>(silu_mul(gv[j], uv[j]));
  *reinterpret_cast<uint4*>(static_cast<T*>(a.out) + t * a.out_ld + i) = *reinterpret_cast<const uint4*>(o);
}

struct SigmoidGateArgs {
  const void* x;
  int64_t x_ld;
  const void* gate;
  int64_t gate_ld;
  void* out;
  int64_t out_ld, cols, rows;
};

// out = x * sigmoid(gate) in f32, rounded once (out may alias x: each element is read then written by
// one thread).
template <typename T>
__global__ void sigmoid_gate_kernel(SigmoidGateArgs a) {
  pdl_wait();
  pdl_trigger();
  for_each_element(a.rows, a.cols, [&](int64_t t, int64_t i) {
    const float xv = to_f(static_cast<const T*>(a.x)[t * a.x_ld + i]);
    const float gv = to_f(static_cast<const T*>(a.gate)[t * a.gate_ld + i]);
    static_cast<T*>(a.out)[t * a.out_ld + i] = from_f<T>(xv * (1.0f / (1.0f + expf(-gv))));
  });
}

struct GatherArgs {
  const uint8_t* src;
  int64_t src_ld_bytes;
  const int32_t* idx;
  uint8_t* dst;
  int64_t dst_ld_bytes, row_bytes;
};

__global__ void gather_rows_kernel(GatherArgs a) {
  pdl_wait();
  pdl_trigger();
  const uint8_t* s = a.src + int64_t(a.idx[blockIdx.x]) * a.src_ld_bytes;
  uint8_t* d = a.dst + int64_t(blockIdx.x) * a.dst_ld_bytes;
  for (int64_t i = threadIdx.x; i < a.row_bytes; i += blockDim.x) d[i] = s[i];
}

struct FeedPicksArgs {
  const int32_t* picks;  // [previous step's rows] its picks
  const int32_t* from;   // [n] index into picks, or -1: keep ids[i]
  int32_t* ids;          // [n] this step's input tokens
  int64_t n;
};

__global__ void feed_picks_kernel(FeedPicksArgs a) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n || a.from[i] < 0) return;
  a.ids[i] = max(a.picks[a.from[i]], 0);  // kNoToken (-1) feeds token 0; its request stops on the host
}

struct BiasArgs {
  void* y;
  int64_t y_ld, cols, rows;
  const void* bias;
  DType bias_dtype;  // y's, or the 16-bit weights' under f32 activations
};

template <typename T>
__global__ void add_bias_kernel(BiasArgs a) {
  pdl_wait();
  pdl_trigger();
  for_each_element(a.rows, a.cols, [&](int64_t t, int64_t n) {
    T* y = static_cast<T*>(a.y) + t * a.y_ld + n;
    *y = from_f<T>(to_f(*y) + load_any(a.bias, a.bias_dtype, n));
  });
}

struct RoundArgs {
  const float* src;
  int64_t src_ld;
  void* dst;
  int64_t dst_ld, rows, cols;
};

// dst = src rounded to nearest even in D (f16 or bf16), element by element.
template <typename D>
__global__ void round_rows_kernel(RoundArgs a) {
  pdl_wait();
  pdl_trigger();
  for_each_element(a.rows, a.cols, [&](int64_t t, int64_t n) {
    static_cast<D*>(a.dst)[t * a.dst_ld + n] = from_f<D>(a.src[t * a.src_ld + n]);
  });
}

struct ArgmaxArgs {
  const void* logits;
  int64_t ld, cols;
  int32_t* out;       // [rows] the picks; or, with parts set (argmax_part), nothing
  ArgmaxPart* parts;  // [rows] this rank's share of a split pick, its columns from offset; or null
  int64_t offset;
  int chunk, chunks;
  float* part_v;  // [rows, chunks]
  int* part_i;    // [rows, chunks]
  int* counters;  // [rows]
};

constexpr int kArgmaxThreads = 256;

// Keeps the larger value, and on equal values the lower index, so the result matches a sequential
// first-maximum scan whatever the reduction order. NaNs never win.
__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__device__ __forceinline__ void block_best(float& bv, int& bi) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    better(bv, bi, ov, oi);
  }
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
  __syncthreads();  // the shared arrays may be reused by a second call
  if ((threadIdx.x & 31) == 0) {
    sv[threadIdx.x / 32] = bv;
    si[threadIdx.x / 32] = bi;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    bv = threadIdx.x < kArgmaxThreads / 32 ? sv[threadIdx.x] : -FLT_MAX;
    bi = threadIdx.x < kArgmaxThreads / 32 ? si[threadIdx.x] : INT32_MAX;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      better(bv, bi, ov, oi);
    }
  }
}

// Grid (rows, chunks): each block finds its chunk's best, the last block of a row to finish picks the
// best chunk (chunks in order, so ties still go to the lowest index). A chunk holding a NaN or +inf
// reports index -1 (with a NaN value, which never wins); -inf never beats -FLT_MAX, so a row without a
// finite logit keeps index INT32_MAX. Either gives the row kNoToken, as sampling::argmax_row defines.
template <typename T>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(ArgmaxArgs a) {
  pdl_wait();
  pdl_trigger();
  const int row = blockIdx.x, c = blockIdx.y;
  const T* l = static_cast<const T*>(a.logits) + int64_t(row) * a.ld;
  const int64_t j0 = int64_t(c) * a.chunk, j1 = min(a.cols, j0 + a.chunk);
  float bv = -FLT_MAX;
  int bi = INT32_MAX;
  bool bad = false;
#pragma unroll 8
  for (int64_t j = j0 + threadIdx.x; j < j1; j += kArgmaxThreads) {
    const float v = to_f(l[j]);
    bad |= sampling::poisons_row(v);
    better(bv, bi, v, int(j));
  }
  bad = __syncthreads_or(bad);
  block_best(bv, bi);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    a.part_v[row * a.chunks + c] = bad ? __int_as_float(0x7fc00000) : bv;
    a.part_i[row * a.chunks + c] = bad ? -1 : bi;
    __threadfence();
    last = atomicAdd(a.counters + row, 1) == a.chunks - 1;
    if (last) a.counters[row] = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  bv = -FLT_MAX;
  bi = INT32_MAX;
  bad = false;
  for (int k = threadIdx.x; k < a.chunks; k += kArgmaxThreads) {
    const int ci = __ldcg(a.part_i + row * a.chunks + k);
    bad |= ci < 0;
    better(bv, bi, __ldcg(a.part_v + row * a.chunks + k), ci);
  }
  bad = __syncthreads_or(bad);
  block_best(bv, bi);
  if (threadIdx.x != 0) return;
  if (a.parts)
    a.parts[row] = ArgmaxPart{bv, bad ? kPartPoisoned : bi == INT32_MAX ? kPartNoFinite : int32_t(bi + a.offset)};
  else
    a.out[row] = bad || bi == INT32_MAX ? sampling::kNoToken : bi;
}

struct ArgmaxMergeArgs {
  const ArgmaxPart* parts;  // [world, rows]
  int64_t rows;
  int world;
  int32_t* out;  // [rows]
};

__global__ void argmax_merge_kernel(ArgmaxMergeArgs a) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < a.rows) a.out[i] = sampling::merge_argmax_parts(a.parts + i, a.rows, a.world);
}

unsigned grid_for(int64_t total, int threads) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((total + threads - 1) / threads, 132 * 16)));
}

}  // namespace

void launch_swiglu(const Mat& gu, const Mat& out, cudaStream_t s) {
  if (out.rows == 0) return;
  if (gu.dtype != out.dtype) throw Error("cuda backend: swiglu operands must share the activation dtype");
  SwigluArgs a{gu.data, gu.ld, out.data, out.ld, out.cols, out.rows};
  const int64_t V = 16 / int64_t(dtype_size(out.dtype));
  const size_t es = dtype_size(out.dtype);
  const bool vec = out.cols % V == 0 && out.rows <= 65535 && aligned16(gu.data, gu.ld, es) && aligned16(out.data, out.ld, es);
  dispatch(out.dtype, "swiglu", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int VT = 16 / int(sizeof(T));
    if (vec) {
      const dim3 grid(unsigned((out.cols / VT + 255) / 256), unsigned(out.rows));
      launch("swiglu_vec_kernel", swiglu_vec_kernel<T, VT>, grid, dim3(256), 0, s, a);
    } else {
      launch("swiglu_kernel", swiglu_kernel<T>, dim3(grid_for(out.rows * out.cols, 256)), dim3(256), 0, s, a);
    }
  });
}

void launch_sigmoid_gate(const Mat& x, const Mat& gate, const Mat& out, cudaStream_t s) {
  if (out.rows == 0) return;
  if (gate.dtype != x.dtype || out.dtype != x.dtype)
    throw Error("cuda backend: sigmoid_gate operands must share the activation dtype");
  if (gate.rows != x.rows || gate.cols != x.cols || out.rows != x.rows || out.cols != x.cols)
    throw Error("cuda backend: sigmoid_gate shape mismatch");
  SigmoidGateArgs a{x.data, x.ld, gate.data, gate.ld, out.data, out.ld, out.cols, out.rows};
  dispatch(out.dtype, "sigmoid_gate", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch("sigmoid_gate_kernel", sigmoid_gate_kernel<T>, dim3(grid_for(out.rows * out.cols, 256)), dim3(256), 0, s, a);
  });
}

void launch_gather_rows(const Mat& src, const int32_t* idx, const Mat& dst, cudaStream_t s) {
  if (dst.rows == 0) return;
  const int64_t es = int64_t(dtype_size(src.dtype));
  GatherArgs a{static_cast<const uint8_t*>(src.data), src.ld * es, idx, static_cast<uint8_t*>(dst.data), dst.ld * es,
               src.cols * es};
  launch("gather_rows_kernel", gather_rows_kernel, dim3(unsigned(dst.rows)), dim3(256), 0, s, a);
}

void launch_feed_picks(const int32_t* picks, const int32_t* from, int64_t n, int32_t* ids, cudaStream_t s) {
  if (n == 0) return;
  FeedPicksArgs a{picks, from, ids, n};
  launch("feed_picks_kernel", feed_picks_kernel, dim3(grid_for(n, 256)), dim3(256), 0, s, a);
}

void launch_add_bias(const Mat& y, const void* bias, DType bias_dtype, cudaStream_t s) {
  if (y.rows == 0) return;
  BiasArgs a{y.data, y.ld, y.cols, y.rows, bias, bias_dtype};
  dispatch(y.dtype, "add_bias", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch("add_bias_kernel", add_bias_kernel<T>, dim3(grid_for(y.rows * y.cols, 256)), dim3(256), 0, s, a);
  });
}

void launch_round_rows(const Mat& src, const Mat& dst, cudaStream_t s) {
  if (src.dtype != DType::F32 || (dst.dtype != DType::F16 && dst.dtype != DType::BF16))
    throw Error("cuda backend: rounding rows takes f32 to f16 or bf16, not " + std::string(dtype_name(src.dtype)) +
                " to " + std::string(dtype_name(dst.dtype)));
  if (src.rows != dst.rows || src.cols != dst.cols) throw Error("cuda backend: rounding rows: shape mismatch");
  if (src.rows == 0) return;
  RoundArgs a{static_cast<const float*>(src.data), src.ld, dst.data, dst.ld, src.rows, src.cols};
  const dim3 grid(grid_for(src.rows * src.cols, 256));
  if (dst.dtype == DType::F16) launch("round_rows_kernel", round_rows_kernel<__half>, grid, dim3(256), 0, s, a);
  else launch("round_rows_kernel", round_rows_kernel<__nv_bfloat16>, grid, dim3(256), 0, s, a);
}

namespace {
// The argmax kernel over logits: picks into out, or (parts set) this rank's ArgmaxParts of a split pick.
void launch_argmax_kernel(const Mat& logits, int32_t* out, ArgmaxPart* parts, int64_t offset, const Scratch& ws,
                          cudaStream_t s) {
  if (logits.rows == 0) return;
  if (size_t(logits.rows) > ws.n_counters)
    throw Error("cuda backend: argmax over " + std::to_string(logits.rows) + " rows exceeds its scratch of " +
                std::to_string(ws.n_counters) + " rows");
  // Chunks of at least 2048 logits, as many as the scratch holds (half floats, half indices).
  const int64_t cap = int64_t(ws.n_floats / 2) / logits.rows;
  int64_t chunk = std::max<int64_t>(2048, (logits.cols + cap - 1) / std::max<int64_t>(cap, 1));
  const int64_t chunks = (logits.cols + chunk - 1) / chunk;
  ArgmaxArgs a{logits.data, logits.ld, logits.cols, out, parts, offset, int(chunk), int(chunks), ws.floats,
               reinterpret_cast<int*>(ws.floats + ws.n_floats / 2), ws.counters};
  dispatch(logits.dtype, "argmax", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch("argmax_kernel", argmax_kernel<T>, dim3(unsigned(logits.rows), unsigned(chunks)), dim3(kArgmaxThreads), 0,
           s, a);
  });
}
}  // namespace

void launch_argmax(const Mat& logits, int32_t* out, const Scratch& ws, cudaStream_t s) {
  launch_argmax_kernel(logits, out, nullptr, 0, ws, s);
}

void launch_argmax_part(const Mat& logits, int64_t offset, ArgmaxPart* out, const Scratch& ws, cudaStream_t s) {
  if (logits.cols < 1) throw Error("cuda backend: argmax_part over no columns");
  launch_argmax_kernel(logits, nullptr, out, offset, ws, s);
}

void launch_argmax_merge(const ArgmaxPart* parts, int64_t rows, int world, int32_t* out, cudaStream_t s) {
  if (rows == 0) return;
  ArgmaxMergeArgs a{parts, rows, world, out};
  launch("argmax_merge_kernel", argmax_merge_kernel, dim3(grid_for(rows, 256)), dim3(256), 0, s, a);
}

}  // namespace ingot::cuda
