// The op interface that model code runs on. A backend owns its memory and executes ops in order on
// its own stream; the CPU backend is the reference that every other backend is tested against.
//
// All activations are packed "token-major": a forward over rows of different lengths concatenates
// their tokens, T in all, and per-token metadata says which cache row and slot each token belongs to.
// Nothing here knows about models; nothing in src/models knows which backend runs it.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ingot {

// The byte order of a packed INT4 weight's nibbles (the same bytes either way; scales and zeros stay
// [rows, cols / group_size] row-major).
//  - Rows: [rows, cols/2], value k of row n in byte k/2, low nibble first (quant/int4.h): engine
//    files, the CPU backend, and the CUDA backend where Blocks8 does not apply.
//  - Blocks8 (rows % 8 == 0, cols % 128 == 0): [rows/8, cols/128, 32] x 16 bytes. Cut each row into
//    16-byte pieces of 32 values (piece p: columns 32p .. 32p + 31, Rows' bytes 16p .. 16p + 15); row
//    8b + g's piece 4Q + t lies at block b, quad Q, slot 4g + t. A warp whose lane 4g + t reads piece
//    4Q + t of row 8b + g (the CUDA decode kernels' access) then reads 512 contiguous bytes instead of
//    64 bytes from each of 8 rows. The CUDA backend re-lays weights this way once, on the device, at
//    load (Backend::relayout_int4); docs/quantization.md has the measurements that chose it.
// Independently of the layout, Int4Scales::paired says in which order a 32-bit word (8 values) holds
// its nibbles.
enum class Int4Layout : uint8_t { Rows, Blocks8 };

// The per-group parameters of an INT4 weight (src/quant/int4.h): value = (nibble - zero) * scale, one
// scale (and zero) for each `group_size` consecutive columns of a row; zero is 8 when `zeros` is null
// (symmetric). With `perm`, stored column j multiplies input feature perm[j] (act-order checkpoints,
// whose groups are not contiguous in the input): y = W_stored . x[perm].
struct Int4Scales {
  const void* data = nullptr;  // [rows, cols / group_size] in `dtype`, row-major
  DType dtype = DType::F32;
  int64_t group_size = 0;
  const uint8_t* zeros = nullptr;  // [rows, cols / group_size] u8 in 0..15, or null (zero 8)
  const int32_t* perm = nullptr;   // [cols] i32, a permutation of 0..cols-1, or null (identity)
  Int4Layout layout = Int4Layout::Rows;  // of the packed bytes (Mat::data)
  // false: value 8i + c of a row in nibble c (bits 4c) of its word i, as quant/int4.h packs them (engine
  // files, the CPU backend). true: the nibbles of each word in the value order 0 2 4 6 1 3 5 7 (value
  // 2c in nibble c, 2c + 1 in nibble c + 4), as the CUDA backend re-lays every INT4 weight at load:
  // its kernels take nibbles c and c + 4 of a word with one shift and mask, which are then the value
  // pair (2c, 2c + 1) that the activations already hold side by side, so no byte permutes of x.
  bool paired = false;
};

// A row-major 2-D view of backend memory: rows x cols elements, `ld` elements between row starts.
// A packed INT4 weight (dtype U8, `int4.data` set) counts cols in logical values and ld in bytes:
// [rows, cols/2] uint8, low nibble first, with its scales beside it.
struct Mat {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0, ld = 0;
  Int4Scales int4{};  // set only for INT4 weights
  bool is_int4() const { return dtype == DType::U8; }
};
inline Mat mat(void* data, DType dt, int64_t rows, int64_t cols) { return {data, dt, rows, cols, cols}; }

// One layer's K and V cache. Element strides make heads-first [B, kv_heads, capacity, head_dim]
// (batch_stride = kv_heads*capacity*head_dim, head_stride = capacity*head_dim, slot_stride = head_dim)
// and flattened [B, capacity, kv_heads*head_dim] two settings of the same view.
struct KvLayerView {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::F32;
  int64_t batch_stride = 0, head_stride = 0, slot_stride = 0;
  int64_t capacity = 0;
};

// Per-token metadata, each an int32 array of T entries in backend memory.
struct TokenMeta {
  const int32_t* row = nullptr;       // cache row (batch slot) of the token
  const int32_t* slot = nullptr;      // cache slot its K/V are written to (= row's write_index + i)
  const int32_t* rope_pos = nullptr;  // RoPE position (the slot unless explicit positions were given)
  const int32_t* kv_len = nullptr;    // valid length of its row after this call (write_index + chunk length)
  // Optional, for attention over rows of one token each (decode): the tokens ranked by kv_len,
  // descending, ties by index (longest_first_order), which the CUDA backend uses to start the longest
  // rows first; order[0] = -1 when every token has the same kv_len. Null: none given.
  const int32_t* order = nullptr;
};

// TokenMeta::order for tokens of one row each with these kv_lens (a permutation of [0, n), or -1 first
// when all are equal).
inline std::vector<int32_t> longest_first_order(const std::vector<int32_t>& kv_len) {
  std::vector<int32_t> order(kv_len.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  if (std::adjacent_find(kv_len.begin(), kv_len.end(), std::not_equal_to<>()) == kv_len.end()) {
    if (!order.empty()) order[0] = -1;
    return order;
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return kv_len[size_t(a)] > kv_len[size_t(b)]; });
  return order;
}

struct RopeWriteParams {
  Mat qkv;                       // [T, (q_heads + 2*kv_heads) * head_dim]; q is rotated in place
  const void* q_norm = nullptr;  // [head_dim] weight or null (Qwen3 q/k RMSNorm before RoPE)
  const void* k_norm = nullptr;  // [head_dim]
  DType norm_dtype = DType::F32;
  float norm_eps = 1e-6f;
  const float* inv_freq = nullptr;  // [rot_dim/2] in backend memory
  int rot_dim = 0;                  // rotated leading dims of each head (partial rotary when < head_dim)
  float attn_scale = 1.0f;          // multiplies cos and sin (YaRN)
  int q_heads = 0, kv_heads = 0, head_dim = 0;
  TokenMeta meta;
  KvLayerView cache;
};

struct AttentionParams {
  Mat q;    // [T, q_heads*head_dim] (a strided view into the qkv buffer)
  Mat out;  // [T, q_heads*head_dim]
  int q_heads = 0, kv_heads = 0, head_dim = 0;
  int window = 0;       // sliding window (keys with slot > p - window), 0 = full
  float scale = 1.0f;   // softmax scale, 1/sqrt(head_dim)
  int max_kv_len = 0;   // an upper bound of kv_len over the call's tokens (grid sizing)
  int rows = 0;         // distinct cache rows among the tokens (kernel choice: tokens per row); 0 = unknown
  TokenMeta meta;
  KvLayerView cache;
};

// Linear attention (Gated DeltaNet, Qwen3.5 / Qwen3-Next). Per layer and cache row the state is static
// fp32 whatever the activation dtype: the convolution state [B, channels, kernel - 1] (a row's last
// kernel - 1 inputs, oldest first) and the recurrent state [B, v_heads, d_k, d_v], both contiguous. The
// ops read token-major inputs with TokenMeta's row and slot: a row's tokens are consecutive and in slot
// order within one call, its state is read and written in place, rows not in the call are untouched,
// and a token at slot 0 starts from a zero state whatever the buffer holds (so resetting a row needs no
// clearing). Any split of a row's tokens over calls gives the result of one call.

// Depthwise causal conv1d (no bias) then SiLU, per channel c:
//   out[t, c] = silu(sum_{j < kernel} w[c, j] * x[slot(t) - (kernel - 1) + j, c])
// where inputs before the call come from the conv state and inputs before slot 0 are zero.
struct CausalConv1dParams {
  Mat x;                         // [T, channels]
  Mat out;                       // [T, channels]; may be x itself (in place)
  const void* weight = nullptr;  // [channels, kernel] (the checkpoint's conv1d.weight [channels, 1, kernel])
  DType weight_dtype = DType::F32;
  int kernel = 0;                // 2..8
  float* state = nullptr;        // [B, channels, kernel - 1]
  TokenMeta meta;                // row and slot
  int rows = 0;                  // distinct rows among the tokens (kernel choice); 0 = unknown
};

// The gated delta rule, per token and value head h (key head h / (v_heads / k_heads)), in fp32:
//   q' = l2norm(q) / sqrt(d_k), k' = l2norm(k) (l2norm(x) = x * rsqrt(sum x^2 + 1e-6)),
//   beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias),
//   S = exp(g) * S;  S = S + k' (x) beta * (v - S^T k');  out = S^T q'
// with S [d_k, d_v] the row's recurrent state of head h.
struct GatedDeltaRuleParams {
  Mat q, k;                        // [T, k_heads * d_k] (strided views into the conv output)
  Mat v;                           // [T, v_heads * d_v]
  Mat b, a;                        // [T, v_heads]
  const void* a_log = nullptr;     // [v_heads]
  DType a_log_dtype = DType::F32;
  const void* dt_bias = nullptr;   // [v_heads]
  DType dt_bias_dtype = DType::F32;
  Mat out;                         // [T, v_heads * d_v]
  int k_heads = 0, v_heads = 0, d_k = 0, d_v = 0;
  float* state = nullptr;          // [B, v_heads, d_k, d_v]
  TokenMeta meta;                  // row and slot
  int rows = 0;                    // distinct rows among the tokens (kernel choice); 0 = unknown
};

// Gated RMSNorm of the linear layers' output, per token and head (dim elements each), in fp32 and
// rounded once: out = w * (x * rsqrt(mean(x^2) + eps)) * silu(z); w [dim] is used as is (around 1).
struct GatedRmsNormParams {
  Mat x, z, out;                   // [T, heads * dim]; out may be x
  const void* weight = nullptr;    // [dim]
  DType weight_dtype = DType::F32;
  int heads = 0, dim = 0;
  float eps = 1e-6f;
};

// One row's sampling settings as the sample op reads them from backend memory.
struct SampleParams {
  float temperature = 0.0f;         // <= 0: the argmax after the penalty
  int32_t top_k = 0;                // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off; relative to the top token's probability
  float repetition_penalty = 1.0f;  // 1 = off
  uint64_t seed = 0;
  // OpenAI's additive penalties over the row's generated tokens (counts), 0 = off. Last, so that the
  // positional initialisers written before they existed keep their meaning.
  float frequency_penalty = 0.0f;  // minus this x the token's count
  float presence_penalty = 0.0f;   // minus this once the token was generated at all
};

// What the sample op reads and advances, in backend memory, per state row (a cache row for the
// Model). Logits row i uses state row row[i] (i when row is null); state rows must be distinct within
// one call. Living in buffers, it can change between replays of a captured graph.
struct SampleState {
  const int32_t* row = nullptr;
  const SampleParams* params = nullptr;  // [state rows]
  uint32_t* step = nullptr;              // [state rows] draws so far: the position in the seed's stream
  uint8_t* seen = nullptr;               // [state rows, seen_ld] 1 = token in the row's history; may be null
  int64_t seen_ld = 0;
  // [state rows, counts_ld] times each token was generated (the prompt not counted, as OpenAI and
  // vLLM count for the frequency and presence penalties); may be null.
  int32_t* counts = nullptr;
  int64_t counts_ld = 0;
};

// One rank's share of a greedy pick over a vocabulary split across ranks (tensor parallelism): the
// argmax rule over this rank's columns. index is the global column (offset + j) of the row's first
// maximum, or kPartNoFinite (no finite logit in these columns: the other ranks decide) or
// kPartPoisoned (a NaN or +inf here: the whole row has no pick). backend/sampling.h merges them.
struct ArgmaxPart {
  float value = 0.0f;
  int32_t index = -1;
};
constexpr int32_t kPartNoFinite = -1, kPartPoisoned = -2;

// One rank's share of a drawn pick over a vocabulary split across ranks: its kSampleCandidates best
// columns by the sampler's order (backend/sampling.h: composite(order_key(score), id), descending),
// key 0 past its last column. A row whose setting keeps at most kSampleCandidates candidates (greedy,
// or top_k in 1..kSampleCandidates: sampling::split_draw_suits) is decided by the first top_k of the
// whole row's order, which lie inside the union of the ranks' lists, so merging the lists decides it
// exactly as the sample op over the whole row.
constexpr int kSampleCandidates = 64;
struct SampleCandidate {
  uint64_t key = 0;    // composite(order_key(score), global id); 0: none
  float score = 0.0f;  // the penalised, tempered score (step 1)
  int32_t flag = 0;    // on a row's first candidate: kPartPoisoned (a NaN or +inf logit here),
                       // kPartNoFinite (no finite logit here), else 0
};

// A recorded sequence of ops replayed as one unit (a CUDA graph). Everything that changes between
// replays must live in backend buffers the ops read, never in the recorded arguments.
class Graph {
 public:
  virtual ~Graph() = default;
  virtual void replay() = 0;
};

// A copy from backend memory to the host, queued in order after the ops issued before it and waited
// for on its own: the host reads a step's picks while the steps queued after it still run
// (Model::launch_decode). Reusable; one copy in flight at a time.
class Readback {
 public:
  virtual ~Readback() = default;
  virtual void start(const void* src, size_t bytes) = 0;  // bytes <= the size it was made for
  virtual const void* wait() = 0;  // the bytes of the last start(), once that copy is done
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The dtype activations and the KV cache use on this backend.
  virtual DType activation_dtype() const = 0;
  // True when backend memory is host memory (weights can then be used in place, never copied).
  virtual bool host_memory() const { return false; }
  // True when linear() takes packed INT4 weights (Mat::is_int4). A Model refuses an INT4 engine on a
  // backend without them before allocating anything.
  virtual bool int4_weights() const { return false; }
  // Whether linear() takes INT4 weights whose scales (and biases) are in `scale_dtype`, the engine's
  // weight dtype: every dtype on the CPU; on CUDA only the activation dtype (its INT4 kernels read
  // scales and activations of one type, so a CUDA backend of f32 activations refuses a 16-bit INT4
  // engine). A Model checks it with int4_weights() before allocating anything.
  virtual bool int4_scales(DType scale_dtype) const {
    (void)scale_dtype;
    return true;
  }
  // Bytes of scratch linear() needs for a weight of `weight_dtype` (U8: packed INT4), rows x cols,
  // called with `tokens` rows (`perm`: an INT4 weight with an act-order permutation): 0 where the
  // weight and x are read as they are (the CPU always; CUDA's one-token GEMV and its INT4 decode kernel
  // for up to 16 tokens without a perm; 17..64 of 16-bit x take x reordered, [tokens, cols] rounded up
  // to the kernel's tiles). CUDA's other products use it for the INT4 weight
  // dequantized into the activation dtype ([rows, cols]) or, on f32 activations with 16-bit weights,
  // for x rounded to the weight's dtype ([tokens, cols]) because cuBLASLt takes A and B of one type.
  // The Model plans the largest over its linear weights (MemoryPlan::ws.linear_scratch) and hands it
  // over with reserve_linear_scratch before any forward.
  virtual size_t linear_scratch_bytes(DType weight_dtype, int64_t rows, int64_t cols, int64_t tokens, bool perm) const {
    (void)weight_dtype, (void)rows, (void)cols, (void)tokens, (void)perm;
    return 0;
  }
  // Called once for each INT4 weight after its upload (a Model's load): the backend may reorder the
  // packed bytes in place, for its kernels, into another Int4Layout or nibble order of the same size,
  // and records them in w.int4.layout and w.int4.paired. The default keeps Rows, unpaired. A host-memory backend never does (its weights are the engine
  // file's own bytes).
  virtual void relayout_int4(Mat& w) { (void)w; }
  // Makes sure linear() has at least `bytes` of scratch (grows, never shrinks; allocated here, so not
  // inside a graph capture). linear() refuses a call whose scratch was not reserved.
  virtual void reserve_linear_scratch(size_t bytes) { (void)bytes; }

  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) noexcept = 0;
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;    // host -> backend
  virtual void download(void* dst, const void* src, size_t bytes) = 0;  // backend -> host, synchronising
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  virtual void synchronize() = 0;
  // A Readback of up to max_bytes. This one copies at start() through download(), which waits for
  // everything queued; backends with queues override it with a copy that waits for nothing later.
  virtual std::unique_ptr<Readback> make_readback(size_t max_bytes);

  // Records the ops `body` issues into a Graph, or returns null when the backend has no graphs (the
  // caller then runs body() directly). The body must not allocate or synchronise.
  virtual std::unique_ptr<Graph> capture(const std::function<void()>& body) { (void)body; return nullptr; }
  // Measured device copy bandwidth in GB/s, counting bytes read plus bytes written; 0 when not meaningful.
  virtual double copy_bandwidth_gbs() { return 0.0; }
  // Peak backend memory allocated so far, in bytes (0 when not tracked).
  virtual size_t peak_memory_bytes() const { return 0; }
  // Bytes alloc() could still hand out now (free device memory; for host memory what the kernel could
  // give without swapping), or nullopt when unknown. Checked against a MemoryPlan before allocating.
  virtual std::optional<size_t> available_memory_bytes() const { return std::nullopt; }
  // The queue this backend's ops run on (a cudaStream_t on CUDA), or null where ops run on the host as
  // they are called (the CPU). A device communicator (dist/nccl_communicator.h) enqueues its collectives
  // on it, so they are ordered with the kernels around them and recorded by capture() like any kernel.
  virtual void* native_stream() { return nullptr; }
  // The GPU this backend runs on (its CUDA device ordinal), or -1 on the CPU.
  virtual int device_ordinal() const { return -1; }

  // out[t, :] = table[ids[t], :]
  virtual void embedding(const Mat& table, const int32_t* ids, const Mat& out) = 0;
  // if delta: x += delta (the residual add); then out = rmsnorm(x) * weight. weight is [cols].
  virtual void add_rmsnorm(const Mat& x, const Mat* delta, const void* weight, DType weight_dtype, float eps,
                           const Mat& out) = 0;
  // y = x w^T (+ bias): x [T, K], w [N, K], bias [N] or null, y [T, N]. f32 accumulation. w may be
  // packed INT4 where int4_weights() (then bias, when given, is in the scales' dtype); otherwise the
  // bias is in w's dtype, which may be 16-bit under f32 activations (the CPU always; CUDA of dtype f32).
  virtual void linear(const Mat& x, const Mat& w, const void* bias, const Mat& y) = 0;
  // Optional per-head q/k RMSNorm, RoPE on q (in place) and k, and K/V written to their cache slots.
  virtual void rope_cache_write(const RopeWriteParams& p) = 0;
  // Masked attention of each token's query over its row's cache: key j visible iff j <= slot (causal),
  // j < kv_len (valid length) and, with a window, j > slot - window. No visible key gives zeros.
  virtual void attention(const AttentionParams& p) = 0;
  // out = x * sigmoid(gate), elementwise in f32 and rounded once; x, gate, out [T, n] (out may be x).
  // Qwen3.5's gated attention output.
  virtual void sigmoid_gate(const Mat& x, const Mat& gate, const Mat& out) = 0;
  // out = silu(gate) * up where gate_up = [gate | up] along columns; gate_up [T, 2I], out [T, I].
  virtual void swiglu(const Mat& gate_up, const Mat& out) = 0;
  // linear(x, w_gate_up) then swiglu in one op, w_gate_up [2I, K] (gate rows, then up rows), out [T, I],
  // rounded as the two ops round. Returns false, doing nothing, where the backend has no fused kernel
  // for these shapes; the caller then runs the two ops.
  virtual bool linear_swiglu(const Mat& x, const Mat& w_gate_up, const Mat& out) {
    (void)x, (void)w_gate_up, (void)out;
    return false;
  }
  // ids[i] = picks[from[i]] for from[i] >= 0, else ids[i] is left as it is; a pick that is not a token
  // (sampling::kNoToken) is fed as token 0, so a step never reads outside the embedding table (the
  // request that drew it stops with an error when its pick is read). Feeds a decode step the previous
  // step's picks without a trip through the host. All pointers in backend memory, [n].
  virtual void feed_picks(const int32_t* picks, const int32_t* from, int64_t n, int32_t* ids) = 0;
  // dst[i, :] = src[idx[i], :]
  virtual void gather_rows(const Mat& src, const int32_t* idx, const Mat& dst) = 0;
  // out[i] = argmax_j logits[i, j] (lowest index on ties), or -1 (sampling::kNoToken) for a row with
  // a NaN or +inf logit or no finite one: its softmax is NaN, it has no meaningful pick.
  virtual void argmax(const Mat& logits, int32_t* out) = 0;
  // argmax split over ranks: out[i] = this rank's ArgmaxPart of logits row i, whose column j is
  // vocabulary entry offset + j (logits.cols >= 1); then, once every rank's parts are gathered
  // ([world, rows], rank-major), argmax_merge gives out[i] = the row's pick, exactly what argmax gives
  // over the whole row (sampling::merge_argmax_parts). Backend memory throughout.
  virtual void argmax_part(const Mat& logits, int64_t offset, ArgmaxPart* out) = 0;
  virtual void argmax_merge(const ArgmaxPart* parts, int64_t rows, int world, int32_t* out) = 0;
  // out[i] = a token drawn from logits row i by its state row's settings (repetition, frequency and
  // presence penalties, temperature, top-k, min-p, top-p), defined exactly in backend/sampling.h so
  // every backend picks the same token; then marks it in seen and counts it in counts (each when
  // given) and advances step. A row without a pick (as for argmax) gives -1 (sampling::kNoToken),
  // marks and counts nothing and still advances step.
  virtual void sample(const Mat& logits, const SampleState& st, int32_t* out) = 0;
  // The sample op split over ranks, where sample_split() is true: sample_part writes out [rows,
  // kSampleCandidates] = this rank's SampleCandidates of each logits row, whose column j is vocabulary
  // entry offset + j (the penalties read seen and counts at offset + j); once every rank's are gathered
  // ([world, rows, kSampleCandidates], rank-major), sample_merge gives out[i], marks, counts and
  // advances exactly as sample over the whole row would. Only for rows whose setting
  // sampling::split_draw_suits (any other is an error: it needs the whole row; the CPU's sample_merge
  // throws Error, CUDA's, whose settings are in device memory, gives such a row kNoToken and leaves its
  // marks, counts and step as they were). Backend memory.
  virtual bool sample_split() const { return false; }
  virtual void sample_part(const Mat& logits, int64_t offset, const SampleState& st, SampleCandidate* out) {
    (void)logits, (void)offset, (void)st, (void)out;
    throw Error("this backend has no split sampling (sample_part)");
  }
  virtual void sample_merge(const SampleCandidate* parts, int64_t rows, int world, const SampleState& st,
                            int32_t* out) {
    (void)parts, (void)rows, (void)world, (void)st, (void)out;
    throw Error("this backend has no split sampling (sample_merge)");
  }
  // Log-probabilities of the raw logits (log_softmax, no temperature or penalty), defined in
  // backend/logprobs.h: per row i, chosen_lp[i] = logits[i, chosen[i]] - logsumexp(logits[i, :]) (NaN
  // when chosen[i] is not a token, e.g. kNoToken), and the top_n (0..kMaxTopLogprobs) most likely
  // tokens in descending order, ties to the lower id, into top_ids/top_lp [rows, top_n]. All outputs
  // in backend memory. Only called when a request asks for log-probabilities.
  virtual void logprobs(const Mat& logits, const int32_t* chosen, int top_n, float* chosen_lp, int32_t* top_ids,
                        float* top_lp) = 0;
  // Widens a matrix into contiguous f32 rows at dst (host memory backends only; others download).
  virtual void to_f32(const Mat& src, float* dst) = 0;
  // Linear attention (Gated DeltaNet) ops: see CausalConv1dParams, GatedDeltaRuleParams, GatedRmsNormParams.
  virtual void causal_conv1d(const CausalConv1dParams& p) = 0;
  virtual void gated_delta_rule(const GatedDeltaRuleParams& p) = 0;
  virtual void gated_rmsnorm(const GatedRmsNormParams& p) = 0;
};

// Backend::make_readback's default: download() at start (which waits for everything queued).
class DownloadReadback final : public Readback {
 public:
  DownloadReadback(Backend& be, size_t max_bytes) : be_(be), bytes_(max_bytes) {}
  void start(const void* src, size_t bytes) override {
    if (bytes > bytes_.size()) throw Error("readback: " + std::to_string(bytes) + " bytes exceed its " + std::to_string(bytes_.size()));
    be_.download(bytes_.data(), src, bytes);
  }
  const void* wait() override { return bytes_.data(); }

 private:
  Backend& be_;
  std::vector<uint8_t> bytes_;
};

inline std::unique_ptr<Readback> Backend::make_readback(size_t max_bytes) {
  return std::make_unique<DownloadReadback>(*this, max_bytes);
}

// RAII for one backend allocation.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& be, size_t bytes) : be_(&be), p_(bytes ? be.alloc(bytes) : nullptr), n_(bytes) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept : be_(o.be_), p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_; p_ = o.p_; n_ = o.n_;
      o.p_ = nullptr; o.n_ = 0;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* get() const { return p_; }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  size_t size() const { return n_; }

 private:
  void reset() {
    if (p_) be_->free(p_);
    p_ = nullptr;
  }
  Backend* be_ = nullptr;
  void* p_ = nullptr;
  size_t n_ = 0;
};

std::unique_ptr<Backend> make_cpu_backend(int threads = 0);
#ifdef INGOT_WITH_CUDA
// dtype: activation/cache dtype (F32, F16 or BF16). Throws Error when no GPU is usable.
// batch_invariant: every op gives a token's row the same bits whatever else is in the call and however
// a prompt is chunked (decode included): products through one cuBLASLt algorithm per weight shape without
// split-K (no GEMV), attention in one slice per token on the decode kernel (no tensor-core prefill
// kernel), the token-sequential delta rule (no chunked kernel). Slower; measured in docs/performance.md.
std::unique_ptr<Backend> make_cuda_backend(DType dtype, int device = 0, bool batch_invariant = false);
bool cuda_available();
// GPUs the CUDA runtime sees (0 when there is no driver or no device; never throws): what `--tp N
// --device cuda` checks before anything is read or allocated, one GPU per rank.
int cuda_device_count();
#endif

}  // namespace ingot
