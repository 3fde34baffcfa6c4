// Shared pieces of the CUDA backend's kernels: error checks that turn CUDA failures into ingot::Error,
// element conversions for the three activation dtypes, and the launchers every op family defines (one
// .cu per family, each taking the backend's stream). Launchers dispatch on the runtime DType to
// explicit template instantiations.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "backend/backend.h"
#include "core/error.h"

namespace ingot::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

// An A/B knob from the environment (INGOT_CUDA_*, INGOT_GDN_*) as a plain integer, or `fallback` when unset or not
// one. The callers read each knob once (a function-local static), so a run keeps one setting.
inline int env_knob(const char* name, int fallback) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  return *end == '\0' && v >= -1000000 && v <= 1000000 ? int(v) : fallback;
}

// Weights of `weights` on activations of `activations` that the kernels widen in registers: 16-bit
// weights under f32 activations (the CUDA backend of f32 activations, as the CPU backend runs).
inline bool widened_weights(DType activations, DType weights) {
  return activations == DType::F32 && (weights == DType::F16 || weights == DType::BF16);
}

// Programmatic dependent launch (sm_90+): every kernel here is launched so that it may start while
// the kernel before it on the stream drains. It must call pdl_wait() before touching anything an
// earlier kernel writes or reads (every block, before any early return, so completion stays
// transitive); work that depends on nothing (prefetching weights) can go before it. pdl_trigger()
// lets the next kernel be scheduled early. Both are no-ops on older GPUs.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The same pair in the other order, for the short kernels that sit between two weight-streaming
// products (add+RMSNorm, RoPE, decode attention): once every block of this kernel has started, the
// next kernel may be scheduled, so a product's blocks become resident while this kernel still waits
// and runs, and stream their weight into L2 before their own wait (gemv.cu). Only scheduling moves:
// the next kernel's pdl_wait still waits for this kernel to complete, and this one for its own
// predecessor, so completion stays transitive. Early starts chain through consecutive kernels of
// this kind (RoPE then attention: the O product's blocks may start while the QKV product still runs)
// and stop at the first kernel that triggers after its wait (every product), so the work any kernel
// does before its wait must read only what no kernel of the step writes: weights and the metadata
// the host uploads before the step.
__device__ __forceinline__ void pdl_trigger_then_wait() {
  pdl_trigger();
  pdl_wait();
}

// Streams bytes [p, p + n) into L2 without waiting for them (the copy engine of the SM does it:
// one instruction per piece); p 16-byte aligned, n a multiple of 16. A hint: no result depends on it.
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
#endif
}

// Block b's share of a bulk prefetch of the first `total` bytes at base: bytes [b * share,
// min((b + 1) * share, total)), in pieces of up to 16 KB spread over the block's threads (the weight
// products' prefetch before their dependency wait; the host sizes the share, gemv.cu prefetch_plan).
__device__ __forceinline__ void prefetch_l2_share(const void* base, int64_t b, int64_t share, int64_t total) {
  constexpr int64_t kPiece = 16384;
  const int64_t lo = b * share, hi = lo + share < total ? lo + share : total;
  for (int64_t off = lo + int64_t(threadIdx.x) * kPiece; off < hi; off += int64_t(blockDim.x) * kPiece)
    prefetch_l2_bulk(static_cast<const char*>(base) + off, uint32_t(hi - off < kPiece ? hi - off : kPiece));
}

// The 128-byte line at p into L2 (a hint).
__device__ __forceinline__ void prefetch_l2_line(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// 16 bytes of a weight, read once: through the non-coherent path and not kept in L1 (which holds the
// activations the products re-read).
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// An attribute of the current device, asked of the driver once per device and attribute (launchers
// read them on every call, graph capture included).
inline int device_attribute(cudaDeviceAttr attr) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> cache;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({dev, int(attr)});
  if (it != cache.end()) return it->second;
  int v = 0;
  check(cudaDeviceGetAttribute(&v, attr, dev), "cudaDeviceGetAttribute");
  return cache[{dev, int(attr)}] = v;
}

// Multiprocessors of the current device (launchers size grids by it).
inline int device_sm_count() { return device_attribute(cudaDevAttrMultiProcessorCount); }

// Lets `kernel` launch with up to `bytes` of dynamic shared memory on the current device (above 48 KiB
// less its static arrays a kernel must opt in). The driver keeps the allowance per device and function
// and refuses a launch above it, so it is raised here, never lowered, the first time each device sees
// a kernel at a larger size: a process that drives several GPUs, or launches one kernel at several
// sizes, stays within it on every launch. Cheap after the first call (a lookup under a lock).
inline void allow_dynamic_smem(const void* kernel, size_t bytes, const char* what) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> granted;  // (device, kernel) -> bytes
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  size_t& g = granted[{dev, kernel}];
  if (bytes <= g) return;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), what);
  g = bytes;
}
template <typename... KArgs>
void allow_dynamic_smem(void (*kernel)(KArgs...), size_t bytes, const char* what) {
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes, what);
}

// Blocks of `kernel` (at `threads` a block and `smem` bytes of dynamic shared memory, allowed first)
// that one multiprocessor of the current device holds at once, asked once per device and shape. A
// cached shape was allowed on this device when it was first asked, and allowances are never lowered,
// so only a new shape asks allow_dynamic_smem.
inline int resident_blocks_per_sm(const void* kernel, int threads, size_t smem, const char* what) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, size_t>, int> cache;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(dev, kernel, threads, smem);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  allow_dynamic_smem(kernel, smem, what);
  int n = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem), what);
  return cache[key] = n;
}
template <typename... KArgs>
int resident_blocks_per_sm(void (*kernel)(KArgs...), int threads, size_t smem, const char* what) {
  return resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, smem, what);
}

// Whether launches allow programmatic dependent launch; INGOT_CUDA_PDL=0 turns it off (for A/B
// measurements and as a fallback), the kernels' waits then being no-ops.
inline bool pdl_enabled() {
  static const bool on = env_knob("INGOT_CUDA_PDL", 1) != 0;
  return on;
}

// Launches `kernel` on stream s with programmatic stream serialisation allowed (see pdl_wait), and
// checks the launch; `name` names the kernel in errors.
template <typename... KArgs, typename... Args>
void launch(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
            Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), name);
}

// f32 <-> element conversions (round to nearest even for the 16-bit types, as torch does).
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// silu(g) * u: the one SwiGLU expression, so the fused GEMV epilogue and the swiglu kernels round alike.
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// Whether rows starting at p, `stride` elements of `elem_size` bytes apart, can be read in 16-byte
// vectors (the condition of every vectorised kernel's fast path).
inline bool aligned16(const void* p, int64_t stride, size_t elem_size) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (uint64_t(stride) * elem_size) % 16 == 0;
}

// One element of a small vector (norm weights, biases) whose dtype is only known at run time.
__device__ __forceinline__ float load_any(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Calls f with a null pointer of the element type of dt (f32, f16 or bf16).
template <typename F>
void dispatch(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::F32: f(static_cast<float*>(nullptr)); return;
    case DType::F16: f(static_cast<__half*>(nullptr)); return;
    case DType::BF16: f(static_cast<__nv_bfloat16*>(nullptr)); return;
    default: throw Error(std::string("cuda backend: ") + op + " does not support dtype " + std::string(dtype_name(dt)));
  }
}

// Launchers (defined in the .cu of each family).
void launch_embedding(const Mat& table, const int32_t* ids, const Mat& out, cudaStream_t s);
void launch_add_rmsnorm(const Mat& x, const Mat* delta, const void* weight, DType wt, float eps, const Mat& out,
                        cudaStream_t s);
void launch_rope_cache_write(const RopeWriteParams& p, cudaStream_t s);
// Device scratch the backend owns for cross-block reductions: partial results, and counters that are
// zero between uses (the last block of a group to finish resets its counter after merging).
struct Scratch {
  float* floats = nullptr;
  size_t n_floats = 0;
  int* counters = nullptr;
  size_t n_counters = 0;
};
// `ws.n_floats` bounds how many key slices the split-KV kernels may use.
// batch_invariant: no tensor-core prefill kernel and one slice per token (the split would follow the call's size).
void launch_attention(const AttentionParams& p, const Scratch& ws, cudaStream_t s, bool batch_invariant = false);
// The tensor-core prefill kernel (attention_prefill.cu); false, launching nothing, when the call does
// not suit it (f32, few query tokens, head_dim other than 64/128, unaligned rows).
bool launch_attention_prefill(const AttentionParams& p, cudaStream_t s);
// The tensor-core decode kernel (attention_decode_mma.cu) for calls of one token per row with more
// (token, kv head) items than the device holds at once; false, launching nothing, otherwise (f32,
// head_dim other than 64/128, more than 16 query heads per kv head, unaligned rows, few rows).
bool launch_attention_decode_mma(const AttentionParams& p, cudaStream_t s);
void launch_swiglu(const Mat& gate_up, const Mat& out, cudaStream_t s);
void launch_sigmoid_gate(const Mat& x, const Mat& gate, const Mat& out, cudaStream_t s);
void launch_gather_rows(const Mat& src, const int32_t* idx, const Mat& dst, cudaStream_t s);
void launch_feed_picks(const int32_t* picks, const int32_t* from, int64_t n, int32_t* ids, cudaStream_t s);
void launch_argmax(const Mat& logits, int32_t* out, const Scratch& ws, cudaStream_t s);
// The argmax op's two halves for a vocabulary split across ranks (Backend::argmax_part / argmax_merge);
// the part is the argmax kernel writing an ArgmaxPart instead of a pick.
void launch_argmax_part(const Mat& logits, int64_t offset, ArgmaxPart* out, const Scratch& ws, cudaStream_t s);
void launch_argmax_merge(const ArgmaxPart* parts, int64_t rows, int world, int32_t* out, cudaStream_t s);
// The sample op (sample.cu): a cluster of blocks per row, state in st's buffers, no scratch. phase_ns:
// null but in bench/sample_lab.cu, [rows, kSamplePhases] device timestamps of each row's phases
// (sample.cu, Phase).
constexpr int kSamplePhases = 8;
void launch_sample(const Mat& logits, const SampleState& st, int32_t* out, cudaStream_t s,
                   unsigned long long* phase_ns = nullptr);
// The sample op split over ranks (sample_split.cu; Backend::sample_part / sample_merge), one block a
// row each, no scratch: this rank's kSampleCandidates best candidates of each logits row (columns from
// vocabulary entry `offset`) into out [rows, kSampleCandidates]; then the pick of each row from every
// rank's lists, parts [world, rows, kSampleCandidates], with the sample op's marks, counts and draw
// counter.
void launch_sample_part(const Mat& logits, int64_t offset, const SampleState& st, SampleCandidate* out,
                        cudaStream_t s);
void launch_sample_merge(const SampleCandidate* parts, int64_t rows, int world, const SampleState& st, int32_t* out,
                         cudaStream_t s);
// The logprobs op (logprobs.cu): one block per row, no scratch.
void launch_logprobs(const Mat& logits, const int32_t* chosen, int top_n, float* chosen_lp, int32_t* top_ids,
                     float* top_lp, cudaStream_t s);
// y = x w^T (+bias) for one token, bandwidth bound, x and y in w's dtype, or f32 with 16-bit w (x read
// unrounded, bias in w's dtype); or for 2..8 tokens of 16-bit x in w's dtype on the tensor cores (each
// token's outputs the same whichever tokens share the call). Returns false when the shapes or
// alignment do not suit it (the caller then uses cuBLASLt).
bool launch_gemv(const Mat& x, const Mat& w, const void* bias, const Mat& y, cudaStream_t s);
// out = silu(x Wg^T) * (x Wu^T), w_gate_up = [Wg; Wu], for one token (dtypes as launch_gemv); false
// when it does not suit.
bool launch_gemv_swiglu(const Mat& x, const Mat& w_gate_up, const Mat& out, cudaStream_t s);
// INT4 weights (int4_linear.cu). Products of up to int4_decode_rows tokens read the packed weight in
// place (64 of f16/bf16 activations, 16 of f32); wider ones (and act-order weights) dequantize it
// into a scratch for cuBLASLt.
inline constexpr int64_t int4_decode_rows(DType activations) { return activations == DType::F32 ? 16 : 64; }
// The scratch the decode kernels need for `tokens` rows of `cols` inputs (x in fragment order past 16
// tokens; 0 up to 16).
size_t int4_decode_scratch_bytes(DType activations, int64_t tokens, int64_t cols);
// Throws Error naming `op` when w is not an INT4 weight the kernels take (scales in scale_dtype, a
// power-of-two group in [32, 256] dividing the columns, K/2-byte rows on 16-byte boundaries).
void check_int4_weight(const Mat& w, DType scale_dtype, const char* op);
// y = x w^T (+bias, in the scales' dtype) for 1..int4_decode_rows tokens, with `scratch` of at least
// int4_decode_scratch_bytes; false, launching nothing, when the call does not suit it (more tokens,
// an act-order perm, unaligned x, a smaller scratch).
bool launch_int4_gemv(const Mat& x, const Mat& w, const void* bias, const Mat& y, void* scratch, size_t scratch_bytes,
                      cudaStream_t s);
// out = silu(x Wg^T) * (x Wu^T) for an INT4 w_gate_up = [Wg; Wu] ([2I, K]) and 16-bit activations,
// the same bits as launch_int4_gemv followed by launch_swiglu; false, launching nothing, where
// launch_int4_gemv would refuse the call (and for f32 activations).
bool launch_int4_gemv_swiglu(const Mat& x, const Mat& w_gate_up, const Mat& out, void* scratch, size_t scratch_bytes,
                             cudaStream_t s);
// out [N, K] (out.dtype, 16-byte aligned rows) = the dequantized weight, columns in input order.
void launch_int4_dequant(const Mat& w, const Mat& out, cudaStream_t s);
// Re-lays a packed INT4 weight of quant/int4.h's Rows layout in place (the same bytes' size, on stream
// s) as the kernels read it: each word's nibbles paired (backend.h's Int4Scales::paired), and rows in
// Int4Layout::Blocks8 where they apply (rows % 8 == 0, columns % 128 == 0, a block within the device's
// shared memory); records both in w.int4. A weight the kernels would refuse is left as it is.
void relayout_int4_cuda(Mat& w, cudaStream_t s);
// Adds bias [N] (in bias_dtype) to every row of y.
void launch_add_bias(const Mat& y, const void* bias, DType bias_dtype, cudaStream_t s);
// dst = src rounded to nearest even: f32 rows into f16 or bf16 ones of the same shape (x of a
// multi-token product of 16-bit weights under f32 activations, for cuBLASLt).
void launch_round_rows(const Mat& src, const Mat& dst, cudaStream_t s);
// Linear attention (linear_attention.cu): causal conv1d + SiLU, the gated delta rule, the gated RMSNorm.
void launch_causal_conv1d(const CausalConv1dParams& p, cudaStream_t s);
// batch_invariant: the token-sequential kernel only (the chunked one rounds otherwise and takes long runs only).
void launch_gated_delta_rule(const GatedDeltaRuleParams& p, cudaStream_t s, bool batch_invariant = false);
void launch_gated_rmsnorm(const GatedRmsNormParams& p, cudaStream_t s);

}  // namespace ingot::cuda
