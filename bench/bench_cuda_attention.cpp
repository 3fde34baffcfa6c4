// Decode attention on Qwen3-8B shapes (one token, 32 query heads, 8 kv heads, head_dim 128, bf16,
// heads-first cache) at kv_len 1k, 8k and 32k: the GB/s at which the CUDA backend's attention reads
// the visible K and V, to set against the device's copy bandwidth (also reported). Like the decode
// step it bounds the grid by the capacity (33k), not by kv_len. The 36 layers' caches are read in
// turn so each call streams from DRAM, as in the model, where a layer's weights evict the previous
// layer's cache from L2; 50 rounds of the 36 calls are one CUDA graph, so launch gaps do not count.
// Each size first checks two query heads against a host reference. BM_DecodeAttentionBatch is the
// served decode step's shape: 64 rows, one token each, capacity 1024, every row at the same kv_len
// (arg 0: the mean, about 304) or at lengths spread as continuous batching leaves them (arg 1), each row in its own cache row. Needs a CUDA device.
#include <benchmark/benchmark.h>

#ifdef INGOT_WITH_CUDA
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"

namespace {

using namespace ingot;

constexpr int kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kLayers = 36, kRounds = 50;
constexpr int64_t kCapacity = 32768 + 128;

// The backend, one layer's worth of random K and V (host copies kept for the reference), uploaded
// into every layer's cache, and the query; built once per process.
struct Setup {
  std::unique_ptr<Backend> be;
  std::vector<float> k_host, v_host, q_host;  // bf16-representable values
  std::vector<Buffer> k, v;
  Buffer q, out, meta;
  double copy_gbs = 0;

  static Setup& get() {
    static Setup s;
    return s;
  }

 private:
  Setup() {
    be = make_cuda_backend(DType::BF16);
    const size_t layer = size_t(kKvHeads) * kCapacity * kHeadDim;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto random_bf16 = [&](size_t n, float scale, std::vector<float>& host) {
      host.resize(n);
      for (float& x : host) x = nd(rng) * scale;
      std::vector<uint8_t> raw(n * 2);
      convert_from_f32(DType::BF16, host.data(), raw.data(), n);
      convert_to_f32(DType::BF16, raw.data(), host.data(), n);
      return raw;
    };
    const std::vector<uint8_t> kraw = random_bf16(layer, 1.0f, k_host), vraw = random_bf16(layer, 1.0f, v_host);
    const std::vector<uint8_t> qraw = random_bf16(size_t(kQHeads) * kHeadDim, 2.0f, q_host);
    for (int l = 0; l < kLayers; ++l) {
      k.emplace_back(*be, kraw.size());
      v.emplace_back(*be, vraw.size());
      be->upload(k.back().get(), kraw.data(), kraw.size());
      be->upload(v.back().get(), vraw.data(), vraw.size());
    }
    q = Buffer(*be, qraw.size());
    be->upload(q.get(), qraw.data(), qraw.size());
    out = Buffer(*be, qraw.size());
    meta = Buffer(*be, 4 * sizeof(int32_t));
    copy_gbs = be->copy_bandwidth_gbs();
  }
};

// Replays the graph (kRounds x kLayers attention calls) once to warm up, then once per benchmark
// iteration, each timed to its completion; returns the summed seconds.
double time_replays(benchmark::State& state, Setup& s, Graph& graph) {
  graph.replay();
  s.be->synchronize();
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    graph.replay();
    s.be->synchronize();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(dt);
    seconds += dt;
  }
  return seconds;
}

AttentionParams params(Setup& s, int layer) {
  AttentionParams p;
  p.q = mat(s.q.get(), DType::BF16, 1, int64_t(kQHeads) * kHeadDim);
  p.out = mat(s.out.get(), DType::BF16, 1, int64_t(kQHeads) * kHeadDim);
  p.q_heads = kQHeads;
  p.kv_heads = kKvHeads;
  p.head_dim = kHeadDim;
  p.scale = 1.0f / std::sqrt(float(kHeadDim));
  p.max_kv_len = int(kCapacity);
  p.rows = 1;
  const int32_t* m = s.meta.as<int32_t>();
  p.meta = {m, m + 1, m + 2, m + 3};
  p.cache.k = s.k[size_t(layer)].get();
  p.cache.v = s.v[size_t(layer)].get();
  p.cache.dtype = DType::BF16;
  p.cache.capacity = kCapacity;
  p.cache.batch_stride = int64_t(kKvHeads) * kCapacity * kHeadDim;
  p.cache.head_stride = kCapacity * kHeadDim;
  p.cache.slot_stride = kHeadDim;
  return p;
}

// Largest |difference| between the GPU output of query heads 0 and 31 and a double-precision host
// softmax over keys [0, kv_len), relative to the reference's largest magnitude.
double reference_error(Setup& s, int kv_len) {
  std::vector<uint8_t> raw(size_t(kQHeads) * kHeadDim * 2);
  s.be->download(raw.data(), s.out.get(), raw.size());
  std::vector<float> got(size_t(kQHeads) * kHeadDim);
  convert_to_f32(DType::BF16, raw.data(), got.data(), got.size());
  double worst = 0, scale = 0;
  for (int h : {0, kQHeads - 1}) {
    const int kvh = h / (kQHeads / kKvHeads);
    const float* q = s.q_host.data() + size_t(h) * kHeadDim;
    std::vector<double> sc(static_cast<size_t>(kv_len));
    double mx = -1e300;
    for (int j = 0; j < kv_len; ++j) {
      const float* kr = s.k_host.data() + (size_t(kvh) * kCapacity + size_t(j)) * kHeadDim;
      double d = 0;
      for (int i = 0; i < kHeadDim; ++i) d += double(q[i]) * kr[i];
      sc[size_t(j)] = d / std::sqrt(double(kHeadDim));
      mx = std::max(mx, sc[size_t(j)]);
    }
    std::vector<double> acc(kHeadDim, 0.0);
    double sum = 0;
    for (int j = 0; j < kv_len; ++j) {
      const double w = std::exp(sc[size_t(j)] - mx);
      sum += w;
      const float* vr = s.v_host.data() + (size_t(kvh) * kCapacity + size_t(j)) * kHeadDim;
      for (int i = 0; i < kHeadDim; ++i) acc[size_t(i)] += w * vr[i];
    }
    for (int i = 0; i < kHeadDim; ++i) {
      const double want = acc[size_t(i)] / sum;
      scale = std::max(scale, std::fabs(want));
      worst = std::max(worst, std::fabs(double(got[size_t(h) * kHeadDim + size_t(i)]) - want));
    }
  }
  return worst / std::max(scale, 1e-30);
}

void BM_DecodeAttention(benchmark::State& state) {
  if (!cuda_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Setup& s = Setup::get();
  const int kv_len = int(state.range(0));
  const int32_t meta[4] = {0, kv_len - 1, kv_len - 1, kv_len};  // row, slot, RoPE position, kv_len
  s.be->upload(s.meta.get(), meta, sizeof(meta));
  s.be->attention(params(s, 0));
  const double err = reference_error(s, kv_len);
  if (!(err < 2e-2)) {
    state.SkipWithError(("output differs from the host reference by " + std::to_string(err)).c_str());
    return;
  }
  std::unique_ptr<Graph> graph = s.be->capture([&] {
    for (int r = 0; r < kRounds; ++r)
      for (int l = 0; l < kLayers; ++l) s.be->attention(params(s, l));
  });
  if (!graph) {
    state.SkipWithError("the backend did not capture a graph");
    return;
  }
  const double seconds = time_replays(state, s, *graph);
  const int64_t calls = int64_t(state.iterations()) * kRounds * kLayers;
  const double bytes = 2.0 * kKvHeads * double(kv_len) * kHeadDim * 2;  // K and V read per call
  state.counters["us_per_call"] = seconds / double(calls) * 1e6;
  state.counters["GB/s"] = bytes * double(calls) / seconds / 1e9;
  state.counters["copy_GB/s"] = s.copy_gbs;
  state.counters["rel_err"] = err;
}
BENCHMARK(BM_DecodeAttention)->Arg(128)->Arg(384)->Arg(1024)->Arg(8192)->Arg(32768)->UseManualTime()->Unit(benchmark::kMicrosecond);

// 64 rows of one decode token each over a [64, kv_heads, 1024, head_dim] cache per layer (the random
// K and V of the first 1024 slots of the batch-1 setup, copied into every row): the served step.
constexpr int kRows = 64;
constexpr int64_t kBatchCapacity = 1024;

struct BatchSetup {
  std::vector<Buffer> k, v;
  Buffer q, out, meta;
  static BatchSetup& get(Setup& s) {
    static BatchSetup b(s);
    return b;
  }

 private:
  explicit BatchSetup(Setup& s) {
    const size_t row = size_t(kKvHeads) * kBatchCapacity * kHeadDim;  // elements of one cache row
    std::vector<uint8_t> kraw(row * kRows * 2), vraw(row * kRows * 2);
    std::vector<float> kf(row), vf(row);
    for (int h = 0; h < kKvHeads; ++h) {
      const size_t src = size_t(h) * kCapacity * kHeadDim, dst = size_t(h) * kBatchCapacity * kHeadDim;
      std::copy_n(s.k_host.data() + src, kBatchCapacity * kHeadDim, kf.data() + dst);
      std::copy_n(s.v_host.data() + src, kBatchCapacity * kHeadDim, vf.data() + dst);
    }
    for (int r = 0; r < kRows; ++r) {
      convert_from_f32(DType::BF16, kf.data(), kraw.data() + size_t(r) * row * 2, row);
      convert_from_f32(DType::BF16, vf.data(), vraw.data() + size_t(r) * row * 2, row);
    }
    for (int l = 0; l < kLayers; ++l) {
      k.emplace_back(*s.be, kraw.size());
      v.emplace_back(*s.be, vraw.size());
      s.be->upload(k.back().get(), kraw.data(), kraw.size());
      s.be->upload(v.back().get(), vraw.data(), vraw.size());
    }
    std::vector<uint8_t> qraw(size_t(kRows) * kQHeads * kHeadDim * 2);
    std::vector<uint8_t> one(size_t(kQHeads) * kHeadDim * 2);
    convert_from_f32(DType::BF16, s.q_host.data(), one.data(), s.q_host.size());
    for (int r = 0; r < kRows; ++r) std::copy(one.begin(), one.end(), qraw.begin() + ptrdiff_t(r * one.size()));
    q = Buffer(*s.be, qraw.size());
    s.be->upload(q.get(), qraw.data(), qraw.size());
    out = Buffer(*s.be, qraw.size());
    meta = Buffer(*s.be, 5 * kRows * sizeof(int32_t));
  }
};

AttentionParams batch_params(BatchSetup& b, int layer) {
  AttentionParams p;
  p.q = mat(b.q.get(), DType::BF16, kRows, int64_t(kQHeads) * kHeadDim);
  p.out = mat(b.out.get(), DType::BF16, kRows, int64_t(kQHeads) * kHeadDim);
  p.q_heads = kQHeads;
  p.kv_heads = kKvHeads;
  p.head_dim = kHeadDim;
  p.scale = 1.0f / std::sqrt(float(kHeadDim));
  p.max_kv_len = int(kBatchCapacity);  // the graph-captured decode step sizes the grid by the capacity
  p.rows = kRows;
  const int32_t* m = b.meta.as<int32_t>();
  p.meta = {m, m + kRows, m + 2 * kRows, m + 3 * kRows, m + 4 * kRows};  // + the Model's longest-first order
  p.cache.k = b.k[size_t(layer)].get();
  p.cache.v = b.v[size_t(layer)].get();
  p.cache.dtype = DType::BF16;
  p.cache.capacity = kBatchCapacity;
  p.cache.batch_stride = int64_t(kKvHeads) * kBatchCapacity * kHeadDim;
  p.cache.head_stride = kBatchCapacity * kHeadDim;
  p.cache.slot_stride = kHeadDim;
  return p;
}

void BM_DecodeAttentionBatch(benchmark::State& state) {
  if (!cuda_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Setup& s = Setup::get();
  BatchSetup& b = BatchSetup::get(s);
  const bool spread = state.range(0) != 0;
  // Lengths as continuous batching leaves them: a prompt of 32..256 tokens plus a uniform share of a
  // 128..512-token reply (fixed seed; mean about 304), or every row at that mean.
  std::vector<int32_t> len(kRows);
  std::mt19937 rng(11);
  int64_t sum = 0;
  for (int32_t& l : len) {
    const int prompt = 32 + int(rng() % 225), reply = 128 + int(rng() % 385);
    l = int32_t(prompt + int(rng() % uint32_t(reply + 1)));
    sum += l;
  }
  if (!spread) std::fill(len.begin(), len.end(), int32_t(sum / kRows));
  int64_t total = 0;
  std::vector<int32_t> meta(5 * kRows);
  for (int r = 0; r < kRows; ++r) {
    meta[size_t(r)] = r;                                // row
    meta[size_t(kRows + r)] = len[size_t(r)] - 1;       // slot
    meta[size_t(2 * kRows + r)] = len[size_t(r)] - 1;   // position
    meta[size_t(3 * kRows + r)] = len[size_t(r)];       // kv_len
    total += len[size_t(r)];
  }
  const std::vector<int32_t> order = longest_first_order(len);  // as the Model uploads it
  std::copy(order.begin(), order.end(), meta.begin() + 4 * kRows);
  s.be->upload(b.meta.get(), meta.data(), meta.size() * sizeof(int32_t));
  std::unique_ptr<Graph> graph = s.be->capture([&] {
    for (int r = 0; r < kRounds; ++r)
      for (int l = 0; l < kLayers; ++l) s.be->attention(batch_params(b, l));
  });
  if (!graph) {
    state.SkipWithError("the backend did not capture a graph");
    return;
  }
  const double seconds = time_replays(state, s, *graph);
  const int64_t calls = int64_t(state.iterations()) * kRounds * kLayers;
  const double bytes = 2.0 * kKvHeads * double(total) * kHeadDim * 2;  // K and V of every row per call
  state.counters["us_per_call"] = seconds / double(calls) * 1e6;
  state.counters["GB/s"] = bytes * double(calls) / seconds / 1e9;
  state.counters["copy_GB/s"] = s.copy_gbs;
  state.counters["mean_kv"] = double(total) / kRows;
  state.counters["max_kv"] = *std::max_element(len.begin(), len.end());
}
BENCHMARK(BM_DecodeAttentionBatch)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
#else
namespace {
void BM_DecodeAttention(benchmark::State& state) {
  state.SkipWithError("this build has no CUDA backend (nvcc was not found at configure time)");
}
BENCHMARK(BM_DecodeAttention);
}  // namespace
#endif

BENCHMARK_MAIN();
