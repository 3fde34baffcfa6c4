// Linear attention (Gated DeltaNet) ops: depthwise causal conv1d + SiLU, the gated delta rule and the
// gated RMSNorm (definitions in backend.h; the CPU reference is src/backend/cpu/linear_attention.cpp).
// States are fp32 [B, channels, kernel - 1] and [B, v_heads, d_k, d_v] read and written in place. The
// conv and delta-rule kernels run one row's tokens in order inside one thread block: the block of token
// t starts work only when t is the first token of its row in the call (a row's tokens are consecutive),
// the others exit at once. This is the token-sequential form, used for decode and short runs; runs of
// at least INGOT_GDN_CHUNK_MIN tokens (default kChunkMinDefault) take the chunked (WY/UT) kernel below.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/cuda_common.cuh"

namespace ingot::cuda {
namespace {

// ---- causal conv1d --------------------------------------------------------------------------------

struct ConvArgs {
  const void* x;
  int64_t x_ld;
  void* out;
  int64_t out_ld;
  const void* weight;  // [channels, kernel]
  DType weight_dtype;
  float* state;        // [B, channels, kernel - 1]
  const int32_t* row;
  const int32_t* slot;
  int64_t tokens;
  int channels, kernel;
};

constexpr int kConvThreads = 128;
constexpr int kMaxKernel = 8;

// The token and channel of a conv kernel's thread: a flattened grid of tokens x channel blocks, the
// token slowest (the first tokens' blocks, those that work in the per-run walk, are dispatched first).
struct ConvThread {
  int64_t t;
  int c;
};
__device__ inline ConvThread conv_thread(const ConvArgs& a) {
  const int cblocks = (a.channels + kConvThreads - 1) / kConvThreads;
  return {int64_t(blockIdx.x) / cblocks, int(int64_t(blockIdx.x) % cblocks) * kConvThreads + int(threadIdx.x)};
}

// One thread per (row run, channel): the window of the last kernel - 1 inputs lives in registers,
// right-aligned in a kMaxKernel - 1 array (unused leading taps have weight 0), so in-place operation is
// safe (each input is read before its output is written, by the same thread).
template <typename T>
__global__ void __launch_bounds__(kConvThreads) causal_conv1d_kernel(ConvArgs a) {
  pdl_wait();
  pdl_trigger();
  const ConvThread th = conv_thread(a);
  const int64_t t0 = th.t;
  const int32_t r = a.row[t0];
  if (t0 > 0 && a.row[t0 - 1] == r) return;  // not the first token of its row's run
  const int c = th.c;
  if (c >= a.channels) return;
  const int K = a.kernel, M = kMaxKernel - 1;
  float w[kMaxKernel], hist[kMaxKernel - 1];
#pragma unroll
  for (int j = 0; j < kMaxKernel; ++j) {
    const int tap = j - (kMaxKernel - K);  // tap index in [0, K) for the last K entries
    w[j] = tap >= 0 ? load_any(a.weight, a.weight_dtype, int64_t(c) * K + tap) : 0.f;
  }
  float* st = a.state + (int64_t(r) * a.channels + c) * (K - 1);
  const int64_t s0 = a.slot[t0];
#pragma unroll
  for (int j = 0; j < M; ++j) {
    const int i = j - (M - (K - 1));  // state index in [0, K - 1), position s0 - (K - 1) + i
    hist[j] = (i >= 0 && s0 - (K - 1) + i >= 0) ? st[i] : 0.f;
  }
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.out);
  for (int64_t t = t0; t < a.tokens && a.row[t] == r; ++t) {
    const float xv = to_f(x[t * a.x_ld + c]);
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < M; ++j) acc += w[j] * hist[j];
    acc += w[M] * xv;
    out[t * a.out_ld + c] = from_f<T>(acc / (1.0f + expf(-acc)));
#pragma unroll
    for (int j = 0; j + 1 < M; ++j) hist[j] = hist[j + 1];
    hist[M - 1] = xv;
  }
#pragma unroll
  for (int j = 0; j < M; ++j) {
    const int i = j - (M - (K - 1));
    if (i >= 0) st[i] = hist[j];
  }
}

// The same op with one thread per (token, channel), for calls whose runs are long (prefill): the
// per-channel walk above leaves most of the GPU idle and is latency-bound on a long run. A token's
// inputs before its run come from the conv state (index (K - 1) - (d - m) for the input d back, with
// m the run's tokens before it in the window), zero before slot 0. The sum is formed in the walk's
// order (state taps oldest first, then the token's own input), so both kernels give the same bits
// whichever a run takes. Not in place (a thread reads inputs other threads' outputs would overwrite);
// the state is written afterwards by causal_conv1d_state_kernel.
template <typename T>
__global__ void __launch_bounds__(kConvThreads) causal_conv1d_tokens_kernel(ConvArgs a) {
  pdl_wait();
  pdl_trigger();
  const ConvThread th = conv_thread(a);
  const int64_t t = th.t;
  const int c = th.c;
  if (c >= a.channels) return;
  const int K = a.kernel;
  const int32_t r = a.row[t];
  const int64_t s = a.slot[t];
  int m = 0;  // tokens of t's run before it, up to K - 1
  while (m < K - 1 && t - 1 - m >= 0 && a.row[t - 1 - m] == r) ++m;
  const T* x = static_cast<const T*>(a.x);
  const float* st = a.state + (int64_t(r) * a.channels + c) * (K - 1);
  float acc = 0.f;
  for (int tap = 0; tap + 1 < K; ++tap) {
    const int d = (K - 1) - tap;  // how far back this tap reads
    float v;
    if (d <= m) v = to_f(x[(t - d) * a.x_ld + c]);
    else v = s - d >= 0 ? st[(K - 1) - (d - m)] : 0.f;
    acc += load_any(a.weight, a.weight_dtype, int64_t(c) * K + tap) * v;
  }
  acc += load_any(a.weight, a.weight_dtype, int64_t(c) * K + K - 1) * to_f(x[t * a.x_ld + c]);
  static_cast<T*>(a.out)[t * a.out_ld + c] = from_f<T>(acc / (1.0f + expf(-acc)));
}

// After causal_conv1d_tokens_kernel: each run's last token's thread leaves the row's last K - 1
// inputs in the state (from the run, or shifted from the old state for a run shorter than K - 1).
template <typename T>
__global__ void __launch_bounds__(kConvThreads) causal_conv1d_state_kernel(ConvArgs a) {
  pdl_wait();
  pdl_trigger();
  const ConvThread th = conv_thread(a);
  const int64_t t = th.t;
  const int c = th.c;
  const int32_t r = a.row[t];
  if (c >= a.channels || (t + 1 < a.tokens && a.row[t + 1] == r)) return;  // not its run's last token
  const int K = a.kernel;
  const int64_t s = a.slot[t];
  int m = 1;  // tokens of the run ending at t, up to K - 1
  while (m < K - 1 && t - m >= 0 && a.row[t - m] == r) ++m;
  const T* x = static_cast<const T*>(a.x);
  float* st = a.state + (int64_t(r) * a.channels + c) * (K - 1);
  float next[kMaxKernel - 1];
  for (int i = 0; i + 1 < K; ++i) {
    const int d = (K - 2) - i;  // state entry i holds the input d tokens before t
    if (d < m) next[i] = to_f(x[(t - d) * a.x_ld + c]);
    else next[i] = s - d >= 0 ? st[(K - 1) - (d - m + 1)] : 0.f;
  }
  for (int i = 0; i + 1 < K; ++i) st[i] = next[i];
}

// ---- gated delta rule -----------------------------------------------------------------------------

struct DeltaArgs {
  const void* q;
  int64_t q_ld;
  const void* k;
  int64_t k_ld;
  const void* v;
  int64_t v_ld;
  const void* b;
  int64_t b_ld;
  const void* a;
  int64_t a_ld;
  const void* a_log;
  DType a_log_dtype;
  const void* dt_bias;
  DType dt_bias_dtype;
  void* out;
  int64_t out_ld;
  float* state;  // [B, v_heads, d_k, d_v]
  const int32_t* row;
  const int32_t* slot;
  int64_t tokens;
  int k_heads, v_heads, d_k, d_v;
  int rows_per_warp;  // state rows each warp holds (<= kStateRows)
  int long_run;       // > 0: runs of at least this many tokens belong to the chunked kernel (the sequential one skips them)
};

constexpr int kStateRows = 32;  // state rows a thread holds in registers
constexpr int kMaxDeltaWarps = 8;
constexpr int kPrefetch = kStateRows * kMaxDeltaWarps / 32;  // q/k values per lane (d_k <= 256)

// Block (32 lanes, W warps) per (row run, value head, 32 state columns): lane = column j, warp w holds
// rows [w R, w R + R) of the state's columns in registers for the whole run, so the state is read once
// and written once per call (decode: a pure stream of the state). Per token, warps 0 and 1 L2-normalise
// q and k into shared memory (double-buffered by token parity) and warp 2 computes the gates; then each
// thread forms partial S^T k, S^T q and k.q over its rows, the W partials are summed in warp order, and
//   u = beta (v - decay S^T k),  o = decay S^T q + u (k.q),  S = decay S + k u
// (o from the updated state by the identity (decay S + k u)^T q, so a token needs one reduction).
template <typename T, bool kNext>
__global__ void __launch_bounds__(kMaxDeltaWarps * 32, kNext ? 1 : 3) gated_delta_rule_kernel(DeltaArgs a) {
  pdl_wait();
  pdl_trigger();
  // Flattened grid, the token slowest: the blocks of the first tokens (those that work) are dispatched
  // first, the exiting ones of a long run after them.
  const int tiles = (a.d_v + 31) / 32;
  const int64_t t0 = int64_t(blockIdx.x) / (int64_t(a.v_heads) * tiles);
  const int rem = int(int64_t(blockIdx.x) % (int64_t(a.v_heads) * tiles));
  const int32_t r = a.row[t0];
  if (t0 > 0 && a.row[t0 - 1] == r) return;  // not the first token of its row's run
  // A long run (the same test as the chunked kernel's, so each run has exactly one owner).
  if (a.long_run > 0 && t0 + a.long_run - 1 < a.tokens && a.row[t0 + a.long_run - 1] == r) return;
  const int h = rem / tiles, kh = h / (a.v_heads / a.k_heads);
  const int lane = threadIdx.x, w = threadIdx.y, W = blockDim.y;
  const int DK = a.d_k, DV = a.d_v, R = a.rows_per_warp;
  const int j = (rem % tiles) * 32 + lane;
  const bool col = j < DV;
  extern __shared__ float sm[];
  float* qn = sm;               // [2][DK]
  float* kn = sm + 2 * DK;      // [2][DK]
  float* red = sm + 4 * DK;     // [W][3][32]
  float* gates = red + W * 96;  // [2][beta, decay]

  float* S = a.state + (int64_t(r) * a.v_heads + h) * int64_t(DK) * DV;
  const bool fresh = a.slot[t0] == 0;  // slot 0 starts from a zero state
  float s[kStateRows];
#pragma unroll
  for (int i = 0; i < kStateRows; ++i) {
    const int ii = w * R + i;
    s[i] = (i < R && ii < DK && col && !fresh) ? S[int64_t(ii) * DV + j] : 0.f;
  }
  const float A = expf(load_any(a.a_log, a.a_log_dtype, h));
  const float dtb = load_any(a.dt_bias, a.dt_bias_dtype, h);
  const float q_scale = 1.0f / sqrtf(float(DK));
  const T* v = static_cast<const T*>(a.v);
  T* out = static_cast<T*>(a.out);
  // With kNext, the next token's q/k, v and gate inputs are loaded into registers while the current
  // one is processed (for long runs; it costs registers, so decode goes without).
  const int per_lane = (DK + 31) / 32;  // <= kPrefetch
  float nx[kNext ? kPrefetch : 1];      // warp 0: raw q, warp 1: raw k of the next token
  float nv = 0.f, nb = 0.f, na = 0.f;
  auto fetch = [&](int64_t t) {
    if constexpr (kNext) {
      if (w < 2) {
        const T* src = w == 0 ? static_cast<const T*>(a.q) + t * a.q_ld + int64_t(kh) * DK
                              : static_cast<const T*>(a.k) + t * a.k_ld + int64_t(kh) * DK;
#pragma unroll
        for (int m = 0; m < kPrefetch; ++m) {
          const int i = lane + 32 * m;
          nx[m] = (m < per_lane && i < DK) ? to_f(src[i]) : 0.f;
        }
      } else if (w == 2 && lane == 0) {
        nb = to_f(static_cast<const T*>(a.b)[t * a.b_ld + h]);
        na = to_f(static_cast<const T*>(a.a)[t * a.a_ld + h]);
      }
      nv = col ? to_f(v[t * a.v_ld + int64_t(h) * DV + j]) : 0.f;
    }
  };
  fetch(t0);
  int buf = 0;
  bool more = true;
  for (int64_t t = t0; more; ++t, buf ^= 1) {
    more = t + 1 < a.tokens && a.row[t + 1] == r;  // uniform over the block
    float vj;
    if constexpr (kNext) {
      float cx[kPrefetch];
#pragma unroll
      for (int m = 0; m < kPrefetch; ++m) cx[m] = nx[m];
      vj = nv;
      const float cb = nb, ca = na;
      if (more) fetch(t + 1);
      if (w < 2) {
        float* dst = (w == 0 ? qn : kn) + buf * DK;
        float ss = 0.f;
#pragma unroll
        for (int m = 0; m < kPrefetch; ++m) ss += cx[m] * cx[m];
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float inv = 1.0f / sqrtf(ss + 1e-6f);
#pragma unroll
        for (int m = 0; m < kPrefetch; ++m) {
          const int i = lane + 32 * m;
          if (m < per_lane && i < DK) dst[i] = w == 0 ? cx[m] * inv * q_scale : cx[m] * inv;
        }
      } else if (w == 2 && lane == 0) {
        const float x = ca + dtb;
        const float sp = x > 20.f ? x : log1pf(expf(x));
        gates[buf * 2] = 1.0f / (1.0f + expf(-cb));
        gates[buf * 2 + 1] = expf(-A * sp);
      }
    } else {
      if (w < 2) {
        const T* src = w == 0 ? static_cast<const T*>(a.q) + t * a.q_ld + int64_t(kh) * DK
                              : static_cast<const T*>(a.k) + t * a.k_ld + int64_t(kh) * DK;
        float* dst = (w == 0 ? qn : kn) + buf * DK;
        float ss = 0.f;
        for (int i = lane; i < DK; i += 32) {
          const float x = to_f(src[i]);
          dst[i] = x;
          ss += x * x;
        }
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float inv = 1.0f / sqrtf(ss + 1e-6f);
        for (int i = lane; i < DK; i += 32) dst[i] = w == 0 ? dst[i] * inv * q_scale : dst[i] * inv;
      } else if (w == 2 && lane == 0) {
        const float bb = to_f(static_cast<const T*>(a.b)[t * a.b_ld + h]);
        const float x = to_f(static_cast<const T*>(a.a)[t * a.a_ld + h]) + dtb;
        const float sp = x > 20.f ? x : log1pf(expf(x));
        gates[buf * 2] = 1.0f / (1.0f + expf(-bb));
        gates[buf * 2 + 1] = expf(-A * sp);
      }
      vj = col ? to_f(v[t * a.v_ld + int64_t(h) * DV + j]) : 0.f;
    }
    __syncthreads();
    const float* kq = kn + buf * DK;
    const float* qq = qn + buf * DK;
    float pk = 0.f, pq = 0.f, pkq = 0.f;
#pragma unroll
    for (int i = 0; i < kStateRows; ++i) {
      const int ii = w * R + i;
      if (i < R && ii < DK) {
        const float kv = kq[ii], qv = qq[ii];
        pk += s[i] * kv;
        pq += s[i] * qv;
        pkq += kv * qv;
      }
    }
    red[(w * 3 + 0) * 32 + lane] = pk;
    red[(w * 3 + 1) * 32 + lane] = pq;
    red[(w * 3 + 2) * 32 + lane] = pkq;
    __syncthreads();
    float sk = 0.f, sq = 0.f, dkq = 0.f;
    for (int ww = 0; ww < W; ++ww) {
      sk += red[(ww * 3 + 0) * 32 + lane];
      sq += red[(ww * 3 + 1) * 32 + lane];
      dkq += red[(ww * 3 + 2) * 32 + lane];
    }
    const float beta = gates[buf * 2], decay = gates[buf * 2 + 1];
    const float u = beta * (vj - decay * sk);
    if (col && w == 0) out[t * a.out_ld + int64_t(h) * DV + j] = from_f<T>(decay * sq + u * dkq);
#pragma unroll
    for (int i = 0; i < kStateRows; ++i) {
      const int ii = w * R + i;
      if (i < R && ii < DK) s[i] = decay * s[i] + kq[ii] * u;
    }
  }
#pragma unroll
  for (int i = 0; i < kStateRows; ++i) {
    const int ii = w * R + i;
    if (i < R && ii < DK && col) S[int64_t(ii) * DV + j] = s[i];
  }
}

// ---- chunked gated delta rule (prefill of long runs) ----------------------------------------------
// Written for ingot: no library we link offers a gated delta rule, so this is our own kernel of the
// chunked WY / UT-transform form (Gated DeltaNet paper; flash-linear-attention computes the same math).
// Within a chunk of C = 64 tokens with cumulative log decay gamma_i = sum_{j <= i} g_j (g = log decay):
//   A  = strictly-lower(diag(beta) (K K^T o exp(gamma_i - gamma_j)))
//   V' = (I + A)^-1 diag(beta) (V - diag(exp(gamma)) K S)     (= U - W S of the WY form, W and U never
//                                                             formed: one triangular solve on 32 columns)
//   O  = diag(exp(gamma)) Q S + (Q K^T o exp(gamma_i - gamma_j) o causal) V'
//   S  = exp(gamma_C) S + (K o exp(gamma_C - gamma))^T V'
// with S the fp32 state [d_k, d_v] entering the chunk; only exponentials of non-positive numbers are
// taken, so nothing overflows. Everything is fp32 (inputs widened on load), so the f32 results match the
// sequential kernel to the order of the sums. Value columns are independent in the recurrence, so a
// block owns (long run, value head, 32 state columns) and walks the run's chunks in order with the
// state tile in registers (its rows w*16..w*16+15 of column lane) and a copy in shared memory for the
// K S and Q S products. The chunk's K K^T and Q K^T are recomputed by each column tile of a head: it
// keeps the kernel one pass with no scratch, and 4 tiles x 32 heads fill the H200's SMs for one row.
// A run's tail chunk is zero-padded (k, q, v, beta and g zero), which leaves the algebra exact.
constexpr int kChunk = 64;
constexpr int kChunkDk = 128;        // largest d_k of the chunked kernel (K/Q rows zero-padded to it)
constexpr int kChunkCols = 32;       // state columns per block
constexpr int kChunkThreads = 256;
constexpr int kChunkWarps = kChunkThreads / 32;
constexpr int kKs = kChunkDk + 4;    // K/Q row stride: float4 rows, conflict-free for 8 rows at a time
constexpr int kMs = kChunk + 4;      // A/P row stride
constexpr int kXs = kChunkCols + 4;  // X row stride: the solve's 8 rows x 4 columns per warp hit 32 banks
constexpr int kChunkMinDefault = 32; // runs shorter than this stay on the sequential kernel
constexpr size_t kChunkSmemFloats = size_t(2) * kChunk * kKs + size_t(2) * kChunk * kMs + size_t(kChunk) * kXs +
                                    size_t(kChunkDk) * kChunkCols + 5 * kChunk + 16;
constexpr size_t kChunkSmem = kChunkSmemFloats * sizeof(float);

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

template <typename T>
__global__ void __launch_bounds__(kChunkThreads, 1) gated_delta_chunked_kernel(DeltaArgs a) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ float4 smem4[];
  float* Ks = reinterpret_cast<float*>(smem4);  // [C][kKs] l2-normalised k
  float* Qs = Ks + kChunk * kKs;                // [C][kKs] l2-normalised q / sqrt(d_k)
  float* Am = Qs + kChunk * kKs;                // [C][kMs] A (strictly lower)
  float* Pm = Am + kChunk * kMs;                // [C][kMs] masked, decayed Q K^T
  float* Xm = Pm + kChunk * kMs;                // [C][kXs] V, then the solve's rhs, then V'
  float* Sm = Xm + kChunk * kXs;                // [kChunkDk][32] state tile at the chunk's start
  float* beta = Sm + kChunkDk * kChunkCols;     // [C]
  float* gam = beta + kChunk;                   // [C] cumulative log decay
  float* eg = gam + kChunk;                     // [C] exp(gamma_i)
  float* dc = eg + kChunk;                      // [C] exp(gamma_C - gamma_i)
  float* graw = dc + kChunk;                    // [C] per-token log decay
  int* ints = reinterpret_cast<int*>(graw + kChunk);  // [0] the run's first token, [1..8] warp counts
  const int tid = int(threadIdx.x), lane = tid & 31, w = tid >> 5;
  const int tiles = (a.d_v + kChunkCols - 1) / kChunkCols;
  const int per_run = a.v_heads * tiles;
  const int kth = int(blockIdx.x) / per_run;
  const int h = (int(blockIdx.x) % per_run) / tiles, tile = int(blockIdx.x) % tiles;
  const int64_t NT = a.tokens;
  const int L = a.long_run;

  // Find the kth long run (first token t of its row in the call, its row still at t + L - 1): the host
  // only knows a bound on their number, so each block scans the call's row ids (L2-resident).
  if (tid == 0) ints[0] = -1;
  int before = 0;
  for (int64_t base = 0; base < NT; base += kChunkThreads) {
    const int64_t t = base + tid;
    bool f = false;
    if (t < NT) {
      const int32_t rt = a.row[t];
      f = (t == 0 || a.row[t - 1] != rt) && t + L - 1 < NT && a.row[t + L - 1] == rt;
    }
    const unsigned bal = __ballot_sync(0xffffffffu, f);
    if (lane == 0) ints[1 + w] = __popc(bal);
    __syncthreads();
    int wpre = 0, total = 0;
    for (int i = 0; i < kChunkWarps; ++i) {
      const int cnt = ints[1 + i];
      total += cnt;
      if (i < w) wpre += cnt;
    }
    if (f && before + wpre + __popc(bal & ((1u << lane) - 1u)) == kth) ints[0] = int(t);
    __syncthreads();  // the counts are read before the next round writes them
    before += total;
    if (before > kth) break;  // uniform
  }
  if (ints[0] < 0) return;  // fewer long runs than the bound
  const int64_t t0 = ints[0];
  const int32_t r = a.row[t0];
  const int kh = h / (a.v_heads / a.k_heads);
  const int DK = a.d_k, DV = a.d_v;
  const int col0 = tile * kChunkCols;
  const bool colok = col0 + lane < DV;
  float* S = a.state + (int64_t(r) * a.v_heads + h) * int64_t(DK) * DV;
  const bool fresh = a.slot[t0] == 0;  // slot 0 starts from a zero state
  float s[16];                         // state rows w*16 + i, column lane
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int d = w * 16 + i;
    s[i] = (!fresh && d < DK && colok) ? S[int64_t(d) * DV + col0 + lane] : 0.f;
    Sm[d * kChunkCols + lane] = s[i];
  }
  const float Adec = expf(load_any(a.a_log, a.a_log_dtype, h));
  const float dtb = load_any(a.dt_bias, a.dt_bias_dtype, h);
  const float q_scale = 1.0f / sqrtf(float(DK));
  const T* qp = static_cast<const T*>(a.q);
  const T* kp = static_cast<const T*>(a.k);
  const T* vp = static_cast<const T*>(a.v);
  T* out = static_cast<T*>(a.out);

  for (int64_t c0 = t0;; c0 += kChunk) {
    // Tokens of the run in this chunk (a row's tokens are consecutive); also the barrier that ends the
    // previous chunk's reads of K and X before they are overwritten.
    const int n = __syncthreads_count(tid < kChunk && c0 + tid < NT && a.row[c0 + tid] == r);
    if (n == 0) break;
    // Load k, q, v (zero-padded) and the gates: every global load of the chunk is issued before the
    // first shared store (one memory latency per chunk, not one per element).
    {
      constexpr int kPer = kChunk * kChunkDk / kChunkThreads;  // k (and q) elements per thread
      constexpr int vPer = kChunk * kChunkCols / kChunkThreads;
      float kv[kPer], qv[kPer], vv[vPer];
      const int d = tid % kChunkDk, j = tid % kChunkCols;
#pragma unroll
      for (int m = 0; m < kPer; ++m) {
        const int i = tid / kChunkDk + m * (kChunkThreads / kChunkDk);
        const int64_t t = c0 + i;
        const bool ok = i < n && d < DK;
        kv[m] = ok ? to_f(kp[t * a.k_ld + int64_t(kh) * DK + d]) : 0.f;
        qv[m] = ok ? to_f(qp[t * a.q_ld + int64_t(kh) * DK + d]) : 0.f;
      }
#pragma unroll
      for (int m = 0; m < vPer; ++m) {
        const int i = tid / kChunkCols + m * (kChunkThreads / kChunkCols);
        vv[m] = (i < n && col0 + j < DV) ? to_f(vp[(c0 + i) * a.v_ld + int64_t(h) * DV + col0 + j]) : 0.f;
      }
#pragma unroll
      for (int m = 0; m < kPer; ++m) {
        const int i = tid / kChunkDk + m * (kChunkThreads / kChunkDk);
        Ks[i * kKs + d] = kv[m];
        Qs[i * kKs + d] = qv[m];
      }
#pragma unroll
      for (int m = 0; m < vPer; ++m) Xm[(tid / kChunkCols + m * (kChunkThreads / kChunkCols)) * kXs + j] = vv[m];
    }
    if (tid < kChunk) {
      float bb = 0.f, g = 0.f;
      if (tid < n) {
        const int64_t t = c0 + tid;
        bb = 1.0f / (1.0f + expf(-to_f(static_cast<const T*>(a.b)[t * a.b_ld + h])));
        const float x = to_f(static_cast<const T*>(a.a)[t * a.a_ld + h]) + dtb;
        const float sp = x > 20.f ? x : log1pf(expf(x));
        g = -Adec * sp;
      }
      beta[tid] = bb;
      graw[tid] = g;
    }
    __syncthreads();
    // L2-normalise k and q (warp w: rows 8w..8w+7); cumulative decays.
    for (int rr = 0; rr < kChunk / kChunkWarps; ++rr) {
      float* kr = Ks + (w * (kChunk / kChunkWarps) + rr) * kKs;
      float* qr = Qs + (w * (kChunk / kChunkWarps) + rr) * kKs;
      float kx[4], qx[4], sk = 0.f, sq = 0.f;
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        kx[m] = kr[lane + 32 * m];
        qx[m] = qr[lane + 32 * m];
        sk += kx[m] * kx[m];
        sq += qx[m] * qx[m];
      }
      for (int o = 16; o > 0; o >>= 1) {
        sk += __shfl_xor_sync(0xffffffffu, sk, o);
        sq += __shfl_xor_sync(0xffffffffu, sq, o);
      }
      const float ik = 1.0f / sqrtf(sk + 1e-6f), iq = 1.0f / sqrtf(sq + 1e-6f);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        kr[lane + 32 * m] = kx[m] * ik;
        qr[lane + 32 * m] = qx[m] * iq * q_scale;
      }
    }
    if (tid < kChunk) {
      float pre = 0.f, tot = 0.f;  // same summation order, so gam[C - 1] == tot exactly
      for (int j = 0; j < kChunk; ++j) {
        const float gj = graw[j];
        tot += gj;
        if (j <= tid) pre += gj;
      }
      gam[tid] = pre;
      eg[tid] = expf(pre);
      dc[tid] = expf(tot - pre);
    }
    __syncthreads();
    // A and P: thread (ti, tj) owns rows ti + 16 r and columns tj + 16 s.
    {
      const int ti = tid >> 4, tj = tid & 15;
      float ak[4][4], aq[4][4];
#pragma unroll
      for (int r4 = 0; r4 < 4; ++r4)
#pragma unroll
        for (int s4 = 0; s4 < 4; ++s4) ak[r4][s4] = aq[r4][s4] = 0.f;
#pragma unroll 2
      for (int d = 0; d < kChunkDk; d += 4) {
        float4 ki[4], qi[4], kj[4];
#pragma unroll
        for (int r4 = 0; r4 < 4; ++r4) {
          ki[r4] = *reinterpret_cast<const float4*>(Ks + (ti + 16 * r4) * kKs + d);
          qi[r4] = *reinterpret_cast<const float4*>(Qs + (ti + 16 * r4) * kKs + d);
          kj[r4] = *reinterpret_cast<const float4*>(Ks + (tj + 16 * r4) * kKs + d);
        }
#pragma unroll
        for (int r4 = 0; r4 < 4; ++r4)
#pragma unroll
          for (int s4 = 0; s4 < 4; ++s4) {
            ak[r4][s4] += dot4(ki[r4], kj[s4]);
            aq[r4][s4] += dot4(qi[r4], kj[s4]);
          }
      }
#pragma unroll
      for (int r4 = 0; r4 < 4; ++r4)
#pragma unroll
        for (int s4 = 0; s4 < 4; ++s4) {
          const int i = ti + 16 * r4, j = tj + 16 * s4;
          float av = 0.f, pv = 0.f;
          if (i >= j) {  // exp of a non-positive number only
            const float e = expf(gam[i] - gam[j]);
            pv = aq[r4][s4] * e;
            if (i > j) av = beta[i] * ak[r4][s4] * e;
          }
          Am[i * kMs + j] = av;
          Pm[i * kMs + j] = pv;
        }
    }
    // K S and Q S for column lane, rows w + 8 r; the solve's rhs X = beta (V - exp(gamma) K S).
    float qsv[8];
    {
      float ksv[8];
#pragma unroll
      for (int r8 = 0; r8 < 8; ++r8) ksv[r8] = qsv[r8] = 0.f;
#pragma unroll 2
      for (int d = 0; d < kChunkDk; d += 4) {
        const float4 sv = make_float4(Sm[d * kChunkCols + lane], Sm[(d + 1) * kChunkCols + lane],
                                      Sm[(d + 2) * kChunkCols + lane], Sm[(d + 3) * kChunkCols + lane]);
#pragma unroll
        for (int r8 = 0; r8 < 8; ++r8) {
          const int i = w + kChunkWarps * r8;
          ksv[r8] += dot4(*reinterpret_cast<const float4*>(Ks + i * kKs + d), sv);
          qsv[r8] += dot4(*reinterpret_cast<const float4*>(Qs + i * kKs + d), sv);
        }
      }
#pragma unroll
      for (int r8 = 0; r8 < 8; ++r8) {
        const int i = w + kChunkWarps * r8;
        Xm[i * kXs + lane] = beta[i] * (Xm[i * kXs + lane] - eg[i] * ksv[r8]);
      }
    }
    __syncthreads();
    // V' = (I + A)^-1 X by forward substitution: warp w solves columns 4w..4w+3, 8 lanes per column
    // splitting each row's sum (the lanes of a column share a warp, so no block barrier per row).
    {
      const int cc = w * 4 + (lane >> 3), p = lane & 7;
      for (int i = 1; i < n; ++i) {
        float acc = 0.f;
        for (int j = p; j < i; j += 8) acc += Am[i * kMs + j] * Xm[j * kXs + cc];
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        acc += __shfl_xor_sync(0xffffffffu, acc, 4);
        if (p == 0) Xm[i * kXs + cc] -= acc;
        __syncwarp();
      }
    }
    __syncthreads();
    // Output rows w + 8 r of column lane, then the state update.
    {
      float o[8];
#pragma unroll
      for (int r8 = 0; r8 < 8; ++r8) o[r8] = eg[w + kChunkWarps * r8] * qsv[r8];
#pragma unroll 2
      for (int j = 0; j < kChunk; j += 4) {
        const float4 xv = make_float4(Xm[j * kXs + lane], Xm[(j + 1) * kXs + lane], Xm[(j + 2) * kXs + lane],
                                      Xm[(j + 3) * kXs + lane]);
#pragma unroll
        for (int r8 = 0; r8 < 8; ++r8)
          o[r8] += dot4(*reinterpret_cast<const float4*>(Pm + (w + kChunkWarps * r8) * kMs + j), xv);
      }
      if (colok) {
#pragma unroll
        for (int r8 = 0; r8 < 8; ++r8) {
          const int i = w + kChunkWarps * r8;
          if (i < n) out[(c0 + i) * a.out_ld + int64_t(h) * DV + col0 + lane] = from_f<T>(o[r8]);
        }
      }
      const float dl = expf(gam[kChunk - 1]);
#pragma unroll
      for (int i = 0; i < 16; ++i) s[i] *= dl;
      for (int i = 0; i < n; ++i) {
        const float xi = Xm[i * kXs + lane] * dc[i];
#pragma unroll
        for (int q4 = 0; q4 < 4; ++q4) {
          const float4 kv = *reinterpret_cast<const float4*>(Ks + i * kKs + w * 16 + 4 * q4);
          s[4 * q4] += kv.x * xi;
          s[4 * q4 + 1] += kv.y * xi;
          s[4 * q4 + 2] += kv.z * xi;
          s[4 * q4 + 3] += kv.w * xi;
        }
      }
#pragma unroll
      for (int i = 0; i < 16; ++i) Sm[(w * 16 + i) * kChunkCols + lane] = s[i];
    }
    if (n < kChunk) break;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int d = w * 16 + i;
    if (d < DK && colok) S[int64_t(d) * DV + col0 + lane] = s[i];
  }
}

// Runs of at least this many tokens take the chunked kernel; INGOT_GDN_CHUNK_MIN overrides it (0 turns
// the chunked kernel off: A/B measurements and a fallback).
int chunk_min_tokens() {
  static const int v = std::max(0, env_knob("INGOT_GDN_CHUNK_MIN", kChunkMinDefault));
  return v;
}

// ---- gated RMSNorm --------------------------------------------------------------------------------

struct NormArgs {
  const void* x;
  int64_t x_ld;
  const void* z;
  int64_t z_ld;
  void* out;
  int64_t out_ld;
  const void* weight;
  DType weight_dtype;
  int heads, dim;
  float eps;
};

constexpr int kNormWarps = 4;

// One warp per (token, head): the sum of squares first (every lane has read its elements before any
// write, so out may be x), then w * x * inv * silu(z) in f32, rounded once.
template <typename T>
__global__ void __launch_bounds__(kNormWarps * 32) gated_rmsnorm_kernel(NormArgs a) {
  pdl_wait();
  pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int h = int(blockIdx.y) * kNormWarps + warp;
  if (h >= a.heads) return;
  const int64_t t = blockIdx.x;
  const T* x = static_cast<const T*>(a.x) + t * a.x_ld + int64_t(h) * a.dim;
  const T* z = static_cast<const T*>(a.z) + t * a.z_ld + int64_t(h) * a.dim;
  T* o = static_cast<T*>(a.out) + t * a.out_ld + int64_t(h) * a.dim;
  float ss = 0.f;
  for (int i = lane; i < a.dim; i += 32) {
    const float v = to_f(x[i]);
    ss += v * v;
  }
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float inv = 1.0f / sqrtf(ss / float(a.dim) + a.eps);
  for (int i = lane; i < a.dim; i += 32) {
    const float zv = to_f(z[i]);
    o[i] = from_f<T>(load_any(a.weight, a.weight_dtype, i) * (to_f(x[i]) * inv) * (zv / (1.0f + expf(-zv))));
  }
}

void require_dtype(const Mat& m, DType dt, const char* op) {
  if (m.dtype != dt) throw Error(std::string("cuda backend: ") + op + " operands must share the activation dtype");
}

}  // namespace

void launch_causal_conv1d(const CausalConv1dParams& p, cudaStream_t s) {
  const int64_t T = p.x.rows;
  if (p.kernel < 2 || p.kernel > kMaxKernel)
    throw Error("cuda backend: causal_conv1d kernel size " + std::to_string(p.kernel) + " (2.." +
                std::to_string(kMaxKernel) + " supported)");
  if (p.out.rows != T || p.out.cols != p.x.cols) throw Error("cuda backend: causal_conv1d shape mismatch");
  require_dtype(p.out, p.x.dtype, "causal_conv1d");
  if (T == 0) return;
  ConvArgs a{p.x.data, p.x.ld, p.out.data, p.out.ld, p.weight, p.weight_dtype, p.state, p.meta.row, p.meta.slot,
             T, int(p.x.cols), p.kernel};
  const int64_t blocks = T * ((p.x.cols + kConvThreads - 1) / kConvThreads);
  if (blocks > 0x7fffffff) throw Error("cuda backend: causal_conv1d: too many tokens in one call");
  const dim3 grid{unsigned(blocks)};
  // Token-parallel when some run is longer than one token (prefill chunks) and the output has its own
  // buffer; decode steps (one token per row) and in-place calls walk per channel.
  const bool by_token = p.out.data != p.x.data && p.rows > 0 && T > p.rows;
  dispatch(p.x.dtype, "causal_conv1d", [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    if (by_token) {
      launch("causal_conv1d_tokens_kernel", causal_conv1d_tokens_kernel<E>, grid, dim3(kConvThreads), 0, s, a);
      launch("causal_conv1d_state_kernel", causal_conv1d_state_kernel<E>, grid, dim3(kConvThreads), 0, s, a);
    } else {
      launch("causal_conv1d_kernel", causal_conv1d_kernel<E>, grid, dim3(kConvThreads), 0, s, a);
    }
  });
}

void launch_gated_delta_rule(const GatedDeltaRuleParams& p, cudaStream_t s, bool batch_invariant) {
  const int HK = p.k_heads, HV = p.v_heads, DK = p.d_k, DV = p.d_v;
  if (HK <= 0 || HV <= 0 || HV % HK != 0 || DK <= 0 || DV <= 0)
    throw Error("cuda backend: gated_delta_rule: v_heads " + std::to_string(HV) +
                " must be a positive multiple of k_heads " + std::to_string(HK) + " (and head dims positive)");
  if (DK > kStateRows * kMaxDeltaWarps)
    throw Error("cuda backend: gated_delta_rule supports d_k up to " + std::to_string(kStateRows * kMaxDeltaWarps));
  for (const Mat* m : {&p.k, &p.v, &p.b, &p.a, &p.out}) require_dtype(*m, p.q.dtype, "gated_delta_rule");
  const int64_t T = p.q.rows;
  if (T == 0) return;
  const int W = std::max(4, (DK + kStateRows - 1) / kStateRows);
  const int R = (DK + W - 1) / W;
  // Long runs (prefill) take the chunked kernel. A run of L tokens beside rows - 1 others needs
  // T >= L + rows - 1, so decode calls (one token per row) never launch it.
  const int L = batch_invariant ? 0 : chunk_min_tokens();
  const bool chunked = L > 0 && DK <= kChunkDk && T >= int64_t(L) + std::max(p.rows, 1) - 1;
  DeltaArgs a{p.q.data, p.q.ld, p.k.data, p.k.ld, p.v.data, p.v.ld, p.b.data, p.b.ld, p.a.data, p.a.ld,
              p.a_log, p.a_log_dtype, p.dt_bias, p.dt_bias_dtype, p.out.data, p.out.ld, p.state,
              p.meta.row, p.meta.slot, T, HK, HV, DK, DV, R, chunked ? L : 0};
  // With one row whose run is long, nothing is left for the sequential kernel.
  if (!(chunked && p.rows == 1)) {
    const int64_t blocks = T * HV * ((DV + 31) / 32);
    if (blocks > 0x7fffffff) throw Error("cuda backend: gated_delta_rule: too many tokens in one call");
    const size_t smem = sizeof(float) * (size_t(4 * DK) + size_t(W) * 96 + 4);  // < 48 KiB for d_k <= 256
    // Prefetching the next token pays on long runs only (it costs registers and so blocks per SM).
    const bool next = p.rows > 0 ? T >= 4 * int64_t(p.rows) : T > 64;
    dispatch(p.q.dtype, "gated_delta_rule", [&](auto* tag) {
      using E = std::remove_pointer_t<decltype(tag)>;
      if (next)
        launch("gated_delta_rule_kernel", gated_delta_rule_kernel<E, true>, dim3(unsigned(blocks)),
               dim3(32, unsigned(W)), smem, s, a);
      else
        launch("gated_delta_rule_kernel", gated_delta_rule_kernel<E, false>, dim3(unsigned(blocks)),
               dim3(32, unsigned(W)), smem, s, a);
    });
  }
  if (chunked) {
    // At most T / L long runs (and no more than the rows); blocks past the actual count exit.
    int64_t runs = T / L;
    if (p.rows > 0) runs = std::min<int64_t>(runs, p.rows);
    const int64_t blocks = runs * HV * ((DV + kChunkCols - 1) / kChunkCols);
    if (blocks > 0x7fffffff) throw Error("cuda backend: gated_delta_rule: too many tokens in one call");
    dispatch(p.q.dtype, "gated_delta_rule", [&](auto* tag) {
      using E = std::remove_pointer_t<decltype(tag)>;
      allow_dynamic_smem(gated_delta_chunked_kernel<E>, kChunkSmem, "gated_delta_chunked_kernel shared memory");
      launch("gated_delta_chunked_kernel", gated_delta_chunked_kernel<E>, dim3(unsigned(blocks)),
             dim3(kChunkThreads), kChunkSmem, s, a);
    });
  }
}

void launch_gated_rmsnorm(const GatedRmsNormParams& p, cudaStream_t s) {
  require_dtype(p.z, p.x.dtype, "gated_rmsnorm");
  require_dtype(p.out, p.x.dtype, "gated_rmsnorm");
  if (p.x.rows == 0 || p.heads == 0) return;
  NormArgs a{p.x.data, p.x.ld, p.z.data, p.z.ld, p.out.data, p.out.ld, p.weight, p.weight_dtype, p.heads, p.dim, p.eps};
  const dim3 grid(unsigned(p.x.rows), unsigned((p.heads + kNormWarps - 1) / kNormWarps));
  dispatch(p.x.dtype, "gated_rmsnorm", [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    launch("gated_rmsnorm_kernel", gated_rmsnorm_kernel<E>, grid, dim3(kNormWarps * 32), 0, s, a);
  });
}

}  // namespace ingot::cuda
