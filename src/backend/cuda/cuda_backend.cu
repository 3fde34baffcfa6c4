// The CUDA backend: device memory with peak tracking, one stream that every op runs on, cuBLASLt for
// matrix products (one workspace, plans cached per shape), a weight-streaming GEMV for few tokens,
// CUDA graph capture, and the op launchers of the other files in this directory.
#include <cublasLt.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_common.cuh"

namespace ingot {
namespace cuda {
namespace {

void check_lt(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cublasLt: ") + what + " failed with status " + std::to_string(int(st)));
}

class Stream {
 public:
  Stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  Event() { check(cudaEventCreate(&e_), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// A step's picks read back into pinned memory behind an event, so waiting for them does not wait for
// the steps queued after them.
class CudaReadback final : public Readback {
 public:
  CudaReadback(size_t max_bytes, cudaStream_t s) : max_(max_bytes), stream_(s) {
    check(cudaMallocHost(&host_, std::max<size_t>(max_bytes, 1)), "cudaMallocHost");
  }
  ~CudaReadback() override { cudaFreeHost(host_); }
  CudaReadback(const CudaReadback&) = delete;
  CudaReadback& operator=(const CudaReadback&) = delete;
  void start(const void* src, size_t bytes) override {
    if (bytes > max_) throw Error("readback: " + std::to_string(bytes) + " bytes exceed its " + std::to_string(max_));
    check(cudaMemcpyAsync(host_, src, bytes, cudaMemcpyDeviceToHost, stream_), "readback");
    check(cudaEventRecord(done_.get(), stream_), "cudaEventRecord");
  }
  const void* wait() override {
    check(cudaEventSynchronize(done_.get()), "cudaEventSynchronize");
    return host_;
  }

 private:
  void* host_ = nullptr;
  size_t max_;
  cudaStream_t stream_;
  Event done_;
};

class CudaGraph final : public Graph {
 public:
  CudaGraph(cudaGraph_t g, cudaStream_t s) : graph_(g), stream_(s) {
    check(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
  }
  ~CudaGraph() override {
    if (exec_) cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  void replay() override { check(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch"); }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  cudaStream_t stream_;
};

// Per-op device time, on when INGOT_CUDA_PROFILE=1: an event pair around every op, summed per op name
// and shape, printed to stderr as a table when the backend goes away. Graphs are not captured while
// it is on (ops then run one by one), and the events serialise the stream (no programmatic dependent
// launch overlap): each figure is the op's own duration plus its launch gap.
class OpProfile {
 public:
  OpProfile() {
    on_ = env_knob("INGOT_CUDA_PROFILE", 0) == 1;
  }
  ~OpProfile() {
    if (!on_) return;
    fold();
    for (auto& [a, b] : pool_) {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
    std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double all = 0;
    for (const auto& r : rows) all += r.second.ms;
    // The median beside the mean: an op's first call also pays for loading its kernel and, for a
    // product, choosing its algorithm, which the mean of a short run carries and the median does not.
    std::fprintf(stderr, "== INGOT_CUDA_PROFILE: device time per op (events around each op, no graphs)\n");
    std::fprintf(stderr, "%10s %8s %10s %10s %6s  %s\n", "total ms", "calls", "mean us", "median us", "%", "op");
    for (auto& [name, t] : rows) {
      std::nth_element(t.us.begin(), t.us.begin() + std::ptrdiff_t(t.us.size() / 2), t.us.end());
      std::fprintf(stderr, "%10.3f %8lld %10.2f %10.2f %6.1f  %s\n", t.ms, t.calls, 1e3 * t.ms / double(t.calls),
                   double(t.us[t.us.size() / 2]), 100.0 * t.ms / all, name.c_str());
    }
  }
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;
  bool on() const { return on_; }

  // Records the start now and the end when the returned scope closes.
  class Scope {
   public:
    Scope(OpProfile* p, size_t i, cudaStream_t s) : p_(p), i_(i), s_(s) {}
    ~Scope() {
      if (p_) cudaEventRecord(p_->pool_[i_].second, s_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpProfile* p_;
    size_t i_;
    cudaStream_t s_;
  };
  Scope scope(const std::function<std::string()>& name, cudaStream_t s) {
    if (!on_) return Scope(nullptr, 0, s);
    if (used_ == kBatch) fold();
    if (used_ == pool_.size()) {
      cudaEvent_t a, b;
      check(cudaEventCreate(&a), "cudaEventCreate");
      check(cudaEventCreate(&b), "cudaEventCreate");
      pool_.emplace_back(a, b);
      names_.emplace_back();
    }
    names_[used_] = name();
    check(cudaEventRecord(pool_[used_].first, s), "cudaEventRecord");
    return Scope(this, used_++, s);
  }

 private:
  struct Total {
    double ms = 0;
    long long calls = 0;
    std::vector<float> us;  // every call's time, for the median
  };
  static constexpr size_t kBatch = 4096;
  void fold() {
    for (size_t i = 0; i < used_; ++i) {
      float ms = 0;
      if (cudaEventSynchronize(pool_[i].second) == cudaSuccess &&
          cudaEventElapsedTime(&ms, pool_[i].first, pool_[i].second) == cudaSuccess) {
        Total& t = totals_[names_[i]];
        t.ms += ms;
        ++t.calls;
        t.us.push_back(1e3f * ms);
      }
    }
    used_ = 0;
  }
  bool on_ = false;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> pool_;
  std::vector<std::string> names_;
  size_t used_ = 0;
  std::map<std::string, Total> totals_;
};

std::string shape(const Mat& m) { return std::to_string(m.rows) + "x" + std::to_string(m.cols); }

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    default: throw Error("cuda backend: linear does not support dtype " + std::string(dtype_name(t)));
  }
}

// One matmul shape's descriptors and the algorithm chosen for it.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~LtPlan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

constexpr size_t kLtWorkspace = size_t(32) << 20;
constexpr int kTuneCandidates = 8;    // heuristic results timed for large products (at most kMaxTuneCandidates)
constexpr int kMaxTuneCandidates = 64;
constexpr int64_t kTuneRows = 64;     // products with at least this many rows are timed
constexpr int kTuneMarginPct = 20;    // an alternative must be this much faster (%) than the first choice

// A/B knobs of the product tuning: INGOT_CUDA_TUNE_CANDIDATES (1..kMaxTuneCandidates) and
// INGOT_CUDA_TUNE_MARGIN_PCT (0..100).
int tune_candidates() {
  static const int n = std::clamp(env_knob("INGOT_CUDA_TUNE_CANDIDATES", kTuneCandidates), 1, kMaxTuneCandidates);
  return n;
}
float tune_margin() {
  static const float m = 1.0f + float(std::clamp(env_knob("INGOT_CUDA_TUNE_MARGIN_PCT", kTuneMarginPct), 0, 100)) / 100.0f;
  return m;
}
constexpr size_t kAttnScratchFloats = size_t(16) << 20;  // 64 MiB of split-KV partials
constexpr size_t kAttnCounters = size_t(1) << 20;
constexpr size_t kArgmaxScratchFloats = size_t(1) << 20;
constexpr size_t kArgmaxCounters = size_t(1) << 16;
constexpr size_t kStaging = size_t(4) << 20;
constexpr size_t kStagedMax = size_t(256) << 10;

class CudaBackend final : public Backend {
 public:
  CudaBackend(DType dtype, int device, bool batch_invariant)
      : dtype_(dtype), device_(device), invariant_(batch_invariant) {
    if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16)
      throw Error("cuda backend: activation dtype must be f32, f16 or bf16, got " + std::string(dtype_name(dtype)));
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) throw Error("cuda backend: no usable CUDA device");
    if (device < 0 || device >= n)
      throw Error("cuda backend: device " + std::to_string(device) + " does not exist (" + std::to_string(n) + " found)");
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaGetDeviceProperties(&props_, device), "cudaGetDeviceProperties");
    stream_ = std::make_unique<Stream>();
    check_lt(cublasLtCreate(&lt_), "cublasLtCreate");
    lt_ws_ = alloc(kLtWorkspace);
    attn_ = make_scratch(kAttnScratchFloats, kAttnCounters);
    argmax_ = make_scratch(kArgmaxScratchFloats, kArgmaxCounters);
    check(cudaMallocHost(&staging_, kStaging), "cudaMallocHost");
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_->get());
    plans_.clear();
    if (lt_) cublasLtDestroy(lt_);
    free(lt_ws_);
    free(linear_scratch_);
    for (void* p : retired_scratch_) free(p);
    for (const Scratch* sc : {&attn_, &argmax_}) {
      free(sc->floats);
      free(sc->counters);
    }
    if (staging_) cudaFreeHost(staging_);
    for (int b = 0; b < 2; ++b) {
      if (bulk_[b]) cudaFreeHost(bulk_[b]);
      if (bulk_done_[b]) cudaEventDestroy(bulk_done_[b]);
    }
  }

  std::string name() const override { return "cuda"; }
  // For the NCCL communicator: its collectives go on this stream, in order with the kernels.
  void* native_stream() override { return stream_->get(); }
  int device_ordinal() const override { return device_; }
  DType activation_dtype() const override { return dtype_; }
  // 16-bit weights on a backend of f32 activations: widened in registers as the CPU backend does.
  bool mixed(DType weight_dtype) const { return widened_weights(dtype_, weight_dtype); }
  bool int4_weights() const override { return true; }
  // The INT4 kernels read scales, biases and activations of one dtype.
  bool int4_scales(DType scale_dtype) const override { return scale_dtype == dtype_; }
  // INT4: the decode kernels read the packed weight (past 8 tokens with x reordered into the scratch,
  // int4_decode_scratch_bytes); everything else (more tokens, act-order, or the
  // batch-invariant mode, where every row count must take the one cuBLASLt algorithm) needs the weight
  // dequantized: [rows, cols] in the activation dtype. 16-bit weights under f32 activations: the GEMV
  // reads f32 x for one token; cuBLASLt (more tokens, batch-invariant mode, or rows the GEMV cannot
  // take) needs x rounded to the weight's dtype: [tokens, cols].
  size_t linear_scratch_bytes(DType weight_dtype, int64_t rows, int64_t cols, int64_t tokens, bool perm) const override {
    if (weight_dtype == DType::U8) {
      if (!invariant_ && !perm && tokens <= int4_decode_rows(dtype_)) return int4_decode_scratch_bytes(dtype_, tokens, cols);
      return size_t(rows) * size_t(cols) * dtype_size(dtype_);
    }
    if (!mixed(weight_dtype)) return 0;
    const int64_t vec = 16 / int64_t(dtype_size(weight_dtype));
    if (!invariant_ && tokens <= 1 && cols % vec == 0) return 0;
    return size_t(tokens) * size_t(cols) * dtype_size(weight_dtype);
  }
  // INT4 weights with their nibbles paired and in 8-row blocks where those apply (int4_linear.cu;
  // backend.h's Int4Scales::paired and Int4Layout::Blocks8): each warp load of the decode kernels
  // then reads 512 contiguous bytes, and x's adjacent pairs are the MMA's B fragments.
  void relayout_int4(Mat& w) override { relayout_int4_cuda(w, stream_->get()); }
  // Grown, never moved under a Model that has one: the smaller buffer is kept until the backend goes,
  // because graphs an earlier Model captured hold its address (INT4 products past 16 rows and the
  // mixed-dtype ones write it).
  void reserve_linear_scratch(size_t bytes) override {
    if (bytes <= linear_scratch_bytes_) return;
    void* grown = alloc(bytes);
    if (linear_scratch_) retired_scratch_.push_back(linear_scratch_);
    linear_scratch_ = grown;
    linear_scratch_bytes_ = bytes;
  }

  void* alloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw Error("cuda backend: cannot allocate " + std::to_string(bytes) + " bytes on " + props_.name + " (" +
                  std::to_string(free_b) + " bytes free of " + std::to_string(total_b) + "): " + cudaGetErrorString(e));
    }
    std::lock_guard<std::mutex> g(mu_);
    sizes_[p] = bytes;
    current_ += bytes;
    peak_ = std::max(peak_, current_);
    return p;
  }
  void free(void* p) noexcept override {
    if (!p) return;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = sizes_.find(p);
      if (it != sizes_.end()) {
        current_ -= it->second;
        sizes_.erase(it);
      }
    }
    // Work queued on the stream may still read p; cudaFree waits for the device to be idle.
    cudaFree(p);
  }
  size_t peak_memory_bytes() const override { return peak_; }
  std::optional<size_t> available_memory_bytes() const override {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      cudaGetLastError();
      return std::nullopt;
    }
    return free_b;
  }

  void upload(void* dst, const void* src, size_t n) override {
    if (n == 0) return;
    if (n <= kStagedMax) {
      // Small metadata goes through pinned staging so the copy is truly asynchronous; when the ring
      // wraps, earlier copies out of it must have finished before their bytes are overwritten.
      if (staging_off_ + n > kStaging) {
        synchronize();
        staging_off_ = 0;
      }
      uint8_t* st = static_cast<uint8_t*>(staging_) + staging_off_;
      std::memcpy(st, src, n);
      staging_off_ += (n + 255) / 256 * 256;
      check(cudaMemcpyAsync(dst, st, n, cudaMemcpyHostToDevice, stream_->get()), "upload");
    } else {
      upload_bulk(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
    }
  }

  // Weights (often straight from a file mapping): copied in chunks through two pinned buffers, so the
  // host copy of chunk i+1 (which also pages the mapping in, on several threads) overlaps the DMA of
  // chunk i. The driver's own pageable path copies on one thread and waits for each transfer.
  void upload_bulk(uint8_t* dst, const uint8_t* src, size_t n) {
    if (!bulk_[0]) {
      for (int b = 0; b < 2; ++b) {
        check(cudaMallocHost(&bulk_[b], kBulkChunk), "cudaMallocHost");
        check(cudaEventCreateWithFlags(&bulk_done_[b], cudaEventDisableTiming), "cudaEventCreate");
      }
    }
    const unsigned threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
    for (size_t off = 0, i = 0; off < n; off += kBulkChunk, ++i) {
      const int b = int(i % 2);
      const size_t len = std::min(kBulkChunk, n - off);
      check(cudaEventSynchronize(bulk_done_[b]), "cudaEventSynchronize");  // its previous DMA is done
      uint8_t* st = static_cast<uint8_t*>(bulk_[b]);
      const size_t part = (len + threads - 1) / threads;
      std::vector<std::thread> pool;
      for (unsigned t = 1; t < threads && t * part < len; ++t)
        pool.emplace_back([=] { std::memcpy(st + t * part, src + off + t * part, std::min(part, len - t * part)); });
      std::memcpy(st, src + off, std::min(part, len));
      for (auto& th : pool) th.join();
      check(cudaMemcpyAsync(dst + off, st, len, cudaMemcpyHostToDevice, stream_->get()), "upload");
      check(cudaEventRecord(bulk_done_[b], stream_->get()), "cudaEventRecord");
    }
  }
  void download(void* dst, const void* src, size_t n) override {
    if (n == 0) return;
    if (n <= kStagedMax) {
      if (staging_off_ + n > kStaging) staging_off_ = 0;  // the sync below also retires the ring
      check(cudaMemcpyAsync(staging_, src, n, cudaMemcpyDeviceToHost, stream_->get()), "download");
      synchronize();
      std::memcpy(dst, staging_, n);
      staging_off_ = 0;
    } else {
      check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_->get()), "download");
      synchronize();
    }
  }
  void fill_zero(void* dst, size_t n) override { check(cudaMemsetAsync(dst, 0, n, stream_->get()), "fill_zero"); }
  void synchronize() override { check(cudaStreamSynchronize(stream_->get()), "cudaStreamSynchronize"); }

  std::unique_ptr<Graph> capture(const std::function<void()>& body) override {
    if (prof_.on()) return nullptr;  // profiling times ops one by one
    cudaStream_t s = stream_->get();
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      body();
    } catch (...) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(s, &g);
      if (g) cudaGraphDestroy(g);
      cudaGetLastError();
      throw;
    }
    cudaGraph_t g = nullptr;
    check(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture");
    return std::make_unique<CudaGraph>(g, s);
  }

  double copy_bandwidth_gbs() override {
    if (bandwidth_ > 0) return bandwidth_;
    // A copy far larger than the L2 cache, timed over several repetitions after a warm-up. Its buffers
    // bypass alloc(): they are a measurement, not engine memory, and must not show in the peak.
    const size_t bytes = size_t(2) << 30;
    void* a = nullptr;
    void* b = nullptr;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
      cudaGetLastError();
      if (a) cudaFree(a);
      return 0.0;  // not enough free memory to measure: report "not measured"
    }
    struct DevFree {
      void operator()(void* p) const { cudaFree(p); }
    };
    const std::unique_ptr<void, DevFree> own_a(a), own_b(b);
    Event e0, e1;
    cudaStream_t s = stream_->get();
    check(cudaMemsetAsync(a, 1, bytes, s), "bandwidth fill");
    check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s), "bandwidth warm-up");
    const int reps = 10;
    check(cudaEventRecord(e0.get(), s), "cudaEventRecord");
    for (int i = 0; i < reps; ++i)
      check(cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice, s), "bandwidth copy");
    check(cudaEventRecord(e1.get(), s), "cudaEventRecord");
    check(cudaEventSynchronize(e1.get()), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0.get(), e1.get()), "cudaEventElapsedTime");
    bandwidth_ = 2.0 * double(bytes) * reps / (double(ms) * 1e-3) / 1e9;
    return bandwidth_;
  }

  void embedding(const Mat& table, const int32_t* ids, const Mat& out) override {
    auto _ = prof_.scope([&] { return "embedding " + shape(out); }, stream_->get());
    launch_embedding(table, ids, out, stream_->get());
  }
  void add_rmsnorm(const Mat& x, const Mat* delta, const void* weight, DType wt, float eps, const Mat& out) override {
    auto _ = prof_.scope([&] { return std::string(delta ? "add_rmsnorm " : "rmsnorm ") + shape(x); }, stream_->get());
    launch_add_rmsnorm(x, delta, weight, wt, eps, out, stream_->get());
  }
  void linear(const Mat& x, const Mat& w, const void* bias, const Mat& y) override {
    if (w.is_int4()) return linear_int4(x, w, bias, y);
    if ((w.dtype != dtype_ && !mixed(w.dtype)) || x.dtype != dtype_ || y.dtype != dtype_)
      throw Error("cuda backend: linear got " + std::string(dtype_name(w.dtype)) + " weights and " +
                  std::string(dtype_name(x.dtype)) + " activations on a " + std::string(dtype_name(dtype_)) +
                  " backend; build the engine in the backend's dtype (--dtype)");
    if (x.cols != w.cols || y.cols != w.rows || y.rows != x.rows)
      throw Error("cuda backend: linear shape mismatch: x [" + std::to_string(x.rows) + ", " + std::to_string(x.cols) +
                  "], w [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "], y [" +
                  std::to_string(y.rows) + ", " + std::to_string(y.cols) + "]");
    if (x.rows == 0) return;
    auto _ = prof_.scope([&] { return "linear x " + shape(x) + " w " + shape(w); }, stream_->get());
    // Batch-invariant: every row count takes the same cuBLASLt algorithm (the GEMV's reduction order
    // differs from the GEMM's, so a token decoded alone would not match one decoded in a batch).
    if (!invariant_ && launch_gemv(x, w, bias, y, stream_->get())) return;
    if (w.dtype == x.dtype) {
      matmul(x, w, y);
    } else {
      // cuBLASLt takes A and B of one type: x is rounded to the weight's dtype (the one rounding of
      // this mode's multi-token products), the product accumulates and is written in f32.
      const Mat xw = scratch(w.dtype, x.rows, x.cols,  // [T, K] weight dtype
                             std::to_string(x.rows) + " rows of " + std::to_string(x.cols) + " f32 activations against " +
                                 std::string(dtype_name(w.dtype)) + " weights need",
                             "scratch to round them");
      launch_round_rows(x, xw, stream_->get());
      matmul(xw, w, y);
    }
    if (bias) launch_add_bias(y, bias, w.dtype, stream_->get());
  }
  void rope_cache_write(const RopeWriteParams& p) override {
    auto _ = prof_.scope([&] { return "rope_cache_write T=" + std::to_string(p.qkv.rows); }, stream_->get());
    launch_rope_cache_write(p, stream_->get());
  }
  void attention(const AttentionParams& p) override {
    auto _ = prof_.scope([&] { return "attention T=" + std::to_string(p.q.rows) + " rows=" + std::to_string(p.rows) +
                                      " max_kv=" + std::to_string(p.max_kv_len); }, stream_->get());
    launch_attention(p, attn_, stream_->get(), invariant_);
  }
  bool linear_swiglu(const Mat& x, const Mat& w, const Mat& out) override {
    if (w.is_int4()) {  // the INT4 decode kernel with the SwiGLU epilogue, for the tokens it takes
      check_int4_weight(w, dtype_, "linear_swiglu");
      if (invariant_ || dtype_ == DType::F32 || x.dtype != dtype_ || out.dtype != dtype_ || x.cols != w.cols ||
          x.rows > int4_decode_rows(dtype_) || w.int4.perm)
        return false;
      auto _ = prof_.scope([&] { return "linear_swiglu int4 x " + shape(x) + " w " + shape(w); }, stream_->get());
      return launch_int4_gemv_swiglu(x, w, out, linear_scratch_, linear_scratch_bytes_, stream_->get());
    }
    if (invariant_ || x.rows > 8 || (w.dtype != dtype_ && !mixed(w.dtype)) || x.cols != w.cols ||
        out.cols * 2 != w.rows || out.rows != x.rows)
      return false;
    auto _ = prof_.scope([&] { return "linear_swiglu x " + shape(x) + " w " + shape(w); }, stream_->get());
    return launch_gemv_swiglu(x, w, out, stream_->get());
  }
  void sigmoid_gate(const Mat& x, const Mat& gate, const Mat& out) override {
    auto _ = prof_.scope([&] { return "sigmoid_gate " + shape(out); }, stream_->get());
    launch_sigmoid_gate(x, gate, out, stream_->get());
  }
  void swiglu(const Mat& gu, const Mat& out) override {
    auto _ = prof_.scope([&] { return "swiglu " + shape(out); }, stream_->get());
    launch_swiglu(gu, out, stream_->get());
  }
  void gather_rows(const Mat& src, const int32_t* idx, const Mat& dst) override {
    launch_gather_rows(src, idx, dst, stream_->get());
  }
  void feed_picks(const int32_t* picks, const int32_t* from, int64_t n, int32_t* ids) override {
    launch_feed_picks(picks, from, n, ids, stream_->get());
  }
  std::unique_ptr<Readback> make_readback(size_t max_bytes) override {
    return std::make_unique<CudaReadback>(max_bytes, stream_->get());
  }
  void argmax(const Mat& logits, int32_t* out) override {
    auto _ = prof_.scope([&] { return "argmax " + shape(logits); }, stream_->get());
    launch_argmax(logits, out, argmax_, stream_->get());
  }
  void argmax_part(const Mat& logits, int64_t offset, ArgmaxPart* out) override {
    auto _ = prof_.scope([&] { return "argmax_part " + shape(logits); }, stream_->get());
    launch_argmax_part(logits, offset, out, argmax_, stream_->get());
  }
  void argmax_merge(const ArgmaxPart* parts, int64_t rows, int world, int32_t* out) override {
    auto _ = prof_.scope([&] { return "argmax_merge"; }, stream_->get());
    launch_argmax_merge(parts, rows, world, out, stream_->get());
  }
  void sample(const Mat& logits, const SampleState& st, int32_t* out) override {
    auto _ = prof_.scope([&] { return "sample " + shape(logits); }, stream_->get());
    launch_sample(logits, st, out, stream_->get());
  }
  bool sample_split() const override { return true; }
  void sample_part(const Mat& logits, int64_t offset, const SampleState& st, SampleCandidate* out) override {
    auto _ = prof_.scope([&] { return "sample_part " + shape(logits); }, stream_->get());
    launch_sample_part(logits, offset, st, out, stream_->get());
  }
  void sample_merge(const SampleCandidate* parts, int64_t rows, int world, const SampleState& st,
                    int32_t* out) override {
    auto _ = prof_.scope([&] { return "sample_merge"; }, stream_->get());
    launch_sample_merge(parts, rows, world, st, out, stream_->get());
  }
  void logprobs(const Mat& logits, const int32_t* chosen, int top_n, float* chosen_lp, int32_t* top_ids,
                float* top_lp) override {
    auto _ = prof_.scope([&] { return "logprobs " + shape(logits); }, stream_->get());
    launch_logprobs(logits, chosen, top_n, chosen_lp, top_ids, top_lp, stream_->get());
  }
  void causal_conv1d(const CausalConv1dParams& p) override {
    auto _ = prof_.scope([&] { return "causal_conv1d " + shape(p.x); }, stream_->get());
    launch_causal_conv1d(p, stream_->get());
  }
  void gated_delta_rule(const GatedDeltaRuleParams& p) override {
    auto _ = prof_.scope([&] { return "gated_delta_rule T=" + std::to_string(p.q.rows); }, stream_->get());
    launch_gated_delta_rule(p, stream_->get(), invariant_);
  }
  void gated_rmsnorm(const GatedRmsNormParams& p) override {
    auto _ = prof_.scope([&] { return "gated_rmsnorm " + shape(p.x); }, stream_->get());
    launch_gated_rmsnorm(p, stream_->get());
  }
  void to_f32(const Mat& src, float* dst) override {
    const size_t es = dtype_size(src.dtype);
    std::vector<uint8_t> raw(size_t(src.cols) * es);
    for (int64_t r = 0; r < src.rows; ++r) {
      download(raw.data(), static_cast<const uint8_t*>(src.data) + size_t(r * src.ld) * es, raw.size());
      convert_to_f32(src.dtype, raw.data(), dst + r * src.cols, size_t(src.cols));
    }
  }

 private:
  // y = x w^T (+ bias) for a packed INT4 w (int4_linear.cu): the decode kernel for few tokens, else the
  // weight dequantized into the reserved scratch and the cuBLASLt product of the 16-bit (or f32) path.
  void linear_int4(const Mat& x, const Mat& w, const void* bias, const Mat& y) {
    check_int4_weight(w, dtype_, "linear");
    if (x.dtype != dtype_ || y.dtype != dtype_)
      throw Error("cuda backend: linear got " + std::string(dtype_name(x.dtype)) + " activations on a " +
                  std::string(dtype_name(dtype_)) + " backend");
    if (x.cols != w.cols || y.cols != w.rows || y.rows != x.rows)
      throw Error("cuda backend: linear shape mismatch: x [" + std::to_string(x.rows) + ", " + std::to_string(x.cols) +
                  "], INT4 w [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "], y [" +
                  std::to_string(y.rows) + ", " + std::to_string(y.cols) + "]");
    if (x.rows == 0) return;
    auto _ = prof_.scope([&] { return "linear int4 x " + shape(x) + " w " + shape(w); }, stream_->get());
    if (!invariant_ && launch_int4_gemv(x, w, bias, y, linear_scratch_, linear_scratch_bytes_, stream_->get())) return;
    const Mat deq = scratch(dtype_, w.rows, w.cols,  // [N, K] activation dtype
                            "the INT4 weight [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "] over " +
                                std::to_string(x.rows) + " rows needs",
                            "dequantization scratch");
    launch_int4_dequant(w, deq, stream_->get());
    matmul(x, deq, y);
    if (bias) launch_add_bias(y, bias, dtype_, stream_->get());
  }

  // The reserved linear scratch as a [rows, cols] matrix of `dtype`; a call needing more than the
  // Model's plan reserved is refused, `who` and `what` naming the need ("... needs N bytes of what").
  Mat scratch(DType dtype, int64_t rows, int64_t cols, const std::string& who, const char* what) const {
    const size_t need = size_t(rows) * size_t(cols) * dtype_size(dtype);
    if (need > linear_scratch_bytes_)
      throw Error("cuda backend: linear: " + who + " " + std::to_string(need) + " bytes of " + what + " but " +
                  std::to_string(linear_scratch_bytes_) +
                  " are reserved (Backend::reserve_linear_scratch; a Model reserves what its memory plan counts)");
    return mat(linear_scratch_, dtype, rows, cols);
  }

  // y [T, N] = x [T, K] w[N, K]^T. In cuBLASLt's column-major terms: C (N x T) = op(A) B with
  // A = w read as a K x N matrix (transposed), B = x read as K x T. x and w share a dtype; y is in
  // theirs or, for 16-bit inputs under f32 activations, f32.
  void matmul(const Mat& x, const Mat& w, const Mat& y) {
    const PlanKey key{y.rows, w.rows, w.cols, w.ld, x.ld, y.ld, int(w.dtype), int(y.dtype)};
    auto it = plans_.find(key);
    if (it == plans_.end()) it = plans_.emplace(key, make_plan(x, w, y)).first;
    const LtPlan& p = *it->second;
    const float alpha = 1.0f, beta = 0.0f;
    check_lt(cublasLtMatmul(lt_, p.op, &alpha, w.data, p.a, x.data, p.b, &beta, y.data, p.c, y.data, p.c, &p.algo,
                            lt_ws_, kLtWorkspace, stream_->get()),
             "cublasLtMatmul");
  }

  // Counters start at zero; the kernels leave them at zero after every use.
  Scratch make_scratch(size_t floats, size_t counters) {
    Scratch sc;
    sc.floats = static_cast<float*>(alloc(floats * sizeof(float)));
    sc.n_floats = floats;
    sc.counters = static_cast<int*>(alloc(counters * sizeof(int)));
    sc.n_counters = counters;
    fill_zero(sc.counters, counters * sizeof(int));
    synchronize();
    return sc;
  }

  std::unique_ptr<LtPlan> make_plan(const Mat& x, const Mat& w, const Mat& y) {
    auto p = std::make_unique<LtPlan>();
    const cudaDataType_t t = lt_type(w.dtype), tc = lt_type(y.dtype);
    // f32 stays exact f32 (no TF32); 16-bit types accumulate in f32 (and may write f32: C and D in
    // f32 with A and B 16-bit is one of CUBLAS_COMPUTE_32F's combinations).
    check_lt(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
    check_lt(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
    check_lt(cublasLtMatrixLayoutCreate(&p->a, t, uint64_t(w.cols), uint64_t(w.rows), w.ld), "layout A");
    check_lt(cublasLtMatrixLayoutCreate(&p->b, t, uint64_t(x.cols), uint64_t(x.rows), x.ld), "layout B");
    check_lt(cublasLtMatrixLayoutCreate(&p->c, tc, uint64_t(y.cols), uint64_t(y.rows), y.ld), "layout C");
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    const uint64_t ws = kLtWorkspace;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    // In-place split-K reductions accumulate with atomics in an unspecified order; excluding them keeps
    // every product deterministic (graph replay must equal direct execution bit for bit).
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                          CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask);
    if (invariant_) {
      cublasLtMatmulPreferenceDestroy(pref);
      p->algo = invariant_algo(p->op, w, y.dtype);
      cublasLtMatmulHeuristicResult_t chk{};
      if (cublasLtMatmulAlgoCheck(lt_, p->op, p->a, p->b, p->c, p->c, &p->algo, &chk) != CUBLAS_STATUS_SUCCESS ||
          chk.workspaceSize > kLtWorkspace)
        throw Error("cublasLt: the batch-invariant algorithm of the " + std::to_string(w.rows) + " x " +
                    std::to_string(w.cols) + " product does not take a call of " + std::to_string(y.rows) +
                    " rows; run without --batch-invariant");
      return p;
    }
    cublasLtMatmulHeuristicResult_t res[kMaxTuneCandidates]{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt_, p->op, p->a, p->b, p->c, p->c, pref, tune_candidates(), res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check_lt(st, "AlgoGetHeuristic");
    if (found == 0)
      throw Error("cublasLt: no algorithm for a " + std::to_string(y.rows) + " x " + std::to_string(w.rows) + " x " +
                  std::to_string(w.cols) + " " + std::string(dtype_name(w.dtype)) + " product into " +
                  std::string(dtype_name(y.dtype)));
    p->algo = res[0].algo;
    if (y.rows >= kTuneRows) choose_algo(*p, res, found, x, w, y);
    return p;
  }

  // Batch-invariant products: one algorithm per weight shape for every row count, cuBLASLt's first
  // heuristic choice for a fixed 128-row product (never timed: the same choice in every process), with
  // split-K off, so each output element is one tile's K loop in one order whatever the call's rows.
  cublasLtMatmulAlgo_t invariant_algo(cublasLtMatmulDesc_t op, const Mat& w, DType y_dtype) {
    const auto key = std::make_tuple(w.rows, w.cols, w.ld, int(w.dtype), int(y_dtype));
    if (auto it = invariant_algos_.find(key); it != invariant_algos_.end()) return it->second;
    constexpr int64_t kRows = 128;
    const cudaDataType_t t = lt_type(w.dtype), tc = lt_type(y_dtype);
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatrixLayoutCreate(&a, t, uint64_t(w.cols), uint64_t(w.rows), w.ld), "layout A");
    check_lt(cublasLtMatrixLayoutCreate(&b, t, uint64_t(w.cols), uint64_t(kRows), w.cols), "layout B");
    check_lt(cublasLtMatrixLayoutCreate(&c, tc, uint64_t(w.rows), uint64_t(kRows), w.rows), "layout C");
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    const uint64_t ws = kLtWorkspace;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask);
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, op, a, b, c, c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    check_lt(st, "AlgoGetHeuristic");
    if (found == 0)
      throw Error("cublasLt: no batch-invariant algorithm for a " + std::to_string(w.rows) + " x " +
                  std::to_string(w.cols) + " " + std::string(dtype_name(w.dtype)) + " product into " +
                  std::string(dtype_name(y_dtype)));
    const int32_t one = 1;
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    check_lt(cublasLtMatmulAlgoConfigSetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof one),
             "ALGO_CONFIG_SPLITK_NUM");
    check_lt(cublasLtMatmulAlgoConfigSetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof none),
             "ALGO_CONFIG_REDUCTION_SCHEME");
    invariant_algos_.emplace(key, res.algo);
    return res.algo;
  }

  // cuBLASLt's first heuristic choice is sometimes far from its best (measured on the H200: 4096 x 6144 x
  // 4096 bf16 at 65 TFLOP/s, its neighbours at 700-800). Products of at least kTuneRows rows therefore time
  // the heuristic's top candidates once, on their real operands (y is recomputed by the caller), each run
  // after evicting L2: a product in a forward reads its weights from memory, and timed with them in L2 the
  // choice favoured candidates that were slower in the forward (H200, Qwen3-8B shapes: TTFT(128) 6.1 -> 6.35
  // ms when its 128-row products were timed with L2 warm). The candidates include split-K ones of the
  // heuristic's own (reduced in a workspace, in a fixed order); split-K variants of the first choice added
  // beside them never won (INGOT_CUDA_TUNE_LOG=1 prints each shape's candidates). The fastest is kept if it
  // beats the first choice by more than kTuneMarginPct, so near ties cannot flip between runs. The choice is
  // kept per process by (device, shape with rows rounded up to a power of two): every backend in a process
  // computes the same bits, and a new prompt length in a known bucket reuses the choice (checked for its
  // exact shape) instead of timing again.
  void choose_algo(LtPlan& p, const cublasLtMatmulHeuristicResult_t* res, int found, const Mat& x, const Mat& w,
                   const Mat& y) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(stream_->get(), &cs), "cudaStreamIsCapturing");
    if (cs != cudaStreamCaptureStatusNone) return;  // no timing inside a graph capture
    int64_t bucket = 1;
    while (bucket < y.rows) bucket *= 2;
    static std::mutex mu;
    static std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int>,
                    cublasLtMatmulAlgo_t>
        chosen;
    const auto key = std::make_tuple(device_, bucket, w.rows, w.cols, w.ld, x.ld, y.ld, int(w.dtype), int(y.dtype));
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = chosen.find(key); it != chosen.end()) {
      cublasLtMatmulHeuristicResult_t chk{};
      if (cublasLtMatmulAlgoCheck(lt_, p.op, p.a, p.b, p.c, p.c, &it->second, &chk) == CUBLAS_STATUS_SUCCESS &&
          chk.workspaceSize <= kLtWorkspace)
        p.algo = it->second;
      return;
    }
    std::vector<cublasLtMatmulAlgo_t> cands;
    for (int i = 0; i < found; ++i)
      if (res[i].workspaceSize <= kLtWorkspace) cands.push_back(res[i].algo);
    if (cands.empty()) return;
    const float alpha = 1.0f, beta = 0.0f;
    Event e0, e1;
    cudaStream_t s = stream_->get();
    // Evicting L2: the attention scratch (64 MiB of partials no op keeps between calls) overwritten.
    const size_t flush = std::min(attn_.n_floats * sizeof(float), size_t(props_.l2CacheSize) * 2);
    auto time_ms = [&](const cublasLtMatmulAlgo_t& algo) {
      auto run = [&] {
        return cublasLtMatmul(lt_, p.op, &alpha, w.data, p.a, x.data, p.b, &beta, y.data, p.c, y.data, p.c, &algo,
                              lt_ws_, kLtWorkspace, s);
      };
      if (run() != CUBLAS_STATUS_SUCCESS) return 1e30f;  // warm-up; a candidate that fails is never chosen
      float total = 0;
      for (int i = 0; i < 3; ++i) {
        check(cudaMemsetAsync(attn_.floats, 0, flush, s), "cudaMemsetAsync");
        check(cudaEventRecord(e0.get(), s), "cudaEventRecord");
        run();
        check(cudaEventRecord(e1.get(), s), "cudaEventRecord");
        check(cudaEventSynchronize(e1.get()), "cudaEventSynchronize");
        float ms = 0;
        check(cudaEventElapsedTime(&ms, e0.get(), e1.get()), "cudaEventElapsedTime");
        total += ms;
      }
      return total;
    };
    std::vector<float> ms(cands.size());
    for (size_t i = 0; i < cands.size(); ++i) ms[i] = time_ms(cands[i]);
    const float first = ms[0];
    float best = first;
    size_t pick = 0;
    for (size_t i = 1; i < cands.size(); ++i)
      if (ms[i] < best) best = ms[i], pick = i;
    if (best * tune_margin() > first) pick = 0;
    // INGOT_CUDA_TUNE_LOG=1: each timed shape's candidates (split-K, us per call with L2 evicted).
    static const bool log = env_knob("INGOT_CUDA_TUNE_LOG", 0) == 1;
    if (log) {
      std::fprintf(stderr, "tune %lldx%lldx%lld:", static_cast<long long>(y.rows), static_cast<long long>(w.rows),
                   static_cast<long long>(w.cols));
      for (size_t i = 0; i < cands.size(); ++i) {
        int32_t split = 0;
        size_t got = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&cands[i], CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split, &got);
        std::fprintf(stderr, " %s%zu:k%d:%.1f", i == pick ? "*" : "", i, split, 1e3 * ms[i] / 3);
      }
      std::fprintf(stderr, "\n");
    }
    p.algo = cands[pick];
    chosen.emplace(key, p.algo);
  }

  DType dtype_;
  int device_;
  bool invariant_;  // batch-invariant kernels (make_cuda_backend)
  // by w rows, cols, ld, dtype and y dtype
  std::map<std::tuple<int64_t, int64_t, int64_t, int, int>, cublasLtMatmulAlgo_t> invariant_algos_;
  // reserve_linear_scratch: the largest INT4 weight dequantized, [rows, cols] activation dtype, or the
  // widest x rounded for 16-bit weights under f32 activations, [tokens, cols] weight dtype
  void* linear_scratch_ = nullptr;
  size_t linear_scratch_bytes_ = 0;
  std::vector<void*> retired_scratch_;  // smaller scratches earlier graphs may still write (freed last)
  cudaDeviceProp props_{};
  std::unique_ptr<Stream> stream_;
  cublasLtHandle_t lt_ = nullptr;
  void* lt_ws_ = nullptr;
  Scratch attn_, argmax_;
  void* staging_ = nullptr;
  size_t staging_off_ = 0;
  static constexpr size_t kBulkChunk = size_t(64) << 20;
  void* bulk_[2] = {nullptr, nullptr};           // pinned chunk buffers of upload_bulk
  cudaEvent_t bulk_done_[2] = {nullptr, nullptr};  // DMA out of each buffer finished
  // by y rows, w rows, cols, ld, x ld, y ld, w dtype (= x dtype), y dtype
  using PlanKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int>;
  std::map<PlanKey, std::unique_ptr<LtPlan>> plans_;
  std::mutex mu_;
  std::map<void*, size_t> sizes_;
  size_t current_ = 0, peak_ = 0;
  double bandwidth_ = 0;
  OpProfile prof_;  // destroyed first: its table prints while the stream still exists
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(DType dtype, int device, bool batch_invariant) {
  return std::make_unique<cuda::CudaBackend>(dtype, device, batch_invariant);
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  cudaGetLastError();  // no driver / no device leaves a sticky error to clear, not a failure of ours
  return n;
}

bool cuda_available() { return cuda_device_count() > 0; }

}  // namespace ingot
