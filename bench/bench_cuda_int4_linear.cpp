// The INT4 decode products alone on Llama-3.1-8B shapes (bf16 activations, group 128): per layer the
// fused q/k/v [6144, 4096], o [4096, 4096], fused gate/up [28672, 4096] and down [4096, 14336]
// products, 32 layers of distinct weights so each call streams from DRAM as in the model, for 1, 4 and
// 16 tokens; beside them the same products on bf16 weights (the 16-bit GEMV for up to 8 tokens,
// cuBLASLt beyond). 10 rounds of the 32 layers are one CUDA graph, so launch gaps do not count.
// Reports the GB/s of weight bytes read (INT4: packed bytes + scales), the microseconds per layer and
// the device's copy bandwidth. Each INT4 run first checks 8 outputs of one product against a host
// reference. Needs a CUDA device.
#include <benchmark/benchmark.h>

#ifdef INGOT_WITH_CUDA
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"

namespace {

using namespace ingot;

constexpr int kLayers = 32, kRounds = 10, kGroup = 128, kMaxTokens = 16;
constexpr std::array<std::array<int64_t, 2>, 4> kShapes = {{{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}}};

// Random bytes, cheaply (gigabytes of them): a 64-bit LCG.
void fill(std::vector<uint8_t>& v, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i + 8 <= v.size(); i += 8) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    std::memcpy(v.data() + i, &s, 8);
  }
}

// A packed INT4 weight [N, K] with its bf16 scales, in `layout`.
Mat weight_mat(void* packed, void* scales, int64_t N, int64_t K, Int4Layout layout) {
  Mat m{packed, DType::U8, N, K, K / 2};
  m.int4.data = scales;
  m.int4.dtype = DType::BF16;
  m.int4.group_size = kGroup;
  m.int4.layout = layout;
  return m;
}

// Every layer's weights in both forms, the activations and the outputs; built once per process.
struct Setup {
  std::unique_ptr<Backend> be;
  std::vector<Buffer> packed, scales, dense;          // [layer * 4 + shape]
  Int4Layout layouts[4] = {};                         // [shape] as the backend re-laid the packed weights
  std::vector<uint8_t> host_packed0, host_scales0;    // layer 0's o product, for the reference
  std::vector<float> x_host;                          // [kMaxTokens, 14336] bf16-representable
  Buffer x, y;
  double copy_gbs = 0;

  static Setup& get() {
    static Setup s;
    return s;
  }

 private:
  Setup() {
    be = make_cuda_backend(DType::BF16);
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> sc(0.001f, 0.02f);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    packed.resize(size_t(kLayers) * 4);
    scales.resize(size_t(kLayers) * 4);
    dense.resize(size_t(kLayers) * 4);
    for (int i = 0; i < 4; ++i) {
      const int64_t N = kShapes[size_t(i)][0], K = kShapes[size_t(i)][1];
      std::vector<uint8_t> p(size_t(N * K / 2)), d(size_t(N * K * 2));
      std::vector<float> s(size_t(N * K / kGroup));
      for (float& v : s) v = sc(rng);
      std::vector<uint8_t> sraw(s.size() * 2);
      convert_from_f32(DType::BF16, s.data(), sraw.data(), s.size());
      fill(p, uint64_t(i) + 1);
      // Dense bf16 weights: random 16-bit patterns with the exponent forced small (|w| < 2^-3).
      fill(d, uint64_t(i) + 100);
      for (size_t j = 1; j < d.size(); j += 2) d[j] = uint8_t((d[j] & 0x80) | 0x3d);
      if (i == 1) host_packed0 = p, host_scales0 = sraw;
      for (int l = 0; l < kLayers; ++l) {
        const size_t at = size_t(l) * 4 + size_t(i);
        packed[at] = Buffer(*be, p.size());
        scales[at] = Buffer(*be, sraw.size());
        dense[at] = Buffer(*be, d.size());
        be->upload(packed[at].get(), p.data(), p.size());
        be->upload(scales[at].get(), sraw.data(), sraw.size());
        be->upload(dense[at].get(), d.data(), d.size());
        Mat m = weight_mat(packed[at].get(), scales[at].get(), N, K, Int4Layout::Rows);
        be->relayout_int4(m);  // as a Model's load does
        layouts[i] = m.int4.layout;
      }
    }
    x_host.resize(size_t(kMaxTokens) * 14336);
    for (float& v : x_host) v = nd(rng);
    std::vector<uint8_t> xraw(x_host.size() * 2);
    convert_from_f32(DType::BF16, x_host.data(), xraw.data(), x_host.size());
    convert_to_f32(DType::BF16, xraw.data(), x_host.data(), x_host.size());
    x = Buffer(*be, xraw.size());
    be->upload(x.get(), xraw.data(), xraw.size());
    y = Buffer(*be, size_t(kMaxTokens) * 28672 * 2);
    copy_gbs = be->copy_bandwidth_gbs();
  }
};

Mat weight(Setup& s, int layer, int i, bool int4) {
  const int64_t N = kShapes[size_t(i)][0], K = kShapes[size_t(i)][1];
  const size_t at = size_t(layer) * 4 + size_t(i);
  if (!int4) return mat(s.dense[at].get(), DType::BF16, N, K);
  return weight_mat(s.packed[at].get(), s.scales[at].get(), N, K, s.layouts[i]);
}

void product(Setup& s, int layer, int i, int64_t T, bool int4) {
  const int64_t N = kShapes[size_t(i)][0], K = kShapes[size_t(i)][1];
  s.be->linear(mat(s.x.get(), DType::BF16, T, K), weight(s, layer, i, int4), nullptr, mat(s.y.get(), DType::BF16, T, N));
}

// Largest |difference| of outputs 0..7 of token 0 of layer 0's o product against a host dot product
// over the dequantized weights, relative to the largest reference magnitude.
double reference_error(Setup& s) {
  product(s, 0, 1, 1, true);
  std::vector<uint8_t> raw(16);
  s.be->download(raw.data(), s.y.get(), raw.size());
  std::vector<float> got(8), sc(s.host_scales0.size() / 2);
  convert_to_f32(DType::BF16, raw.data(), got.data(), 8);
  convert_to_f32(DType::BF16, s.host_scales0.data(), sc.data(), sc.size());
  const int64_t K = 4096;
  double worst = 0, scale = 0;
  for (int n = 0; n < 8; ++n) {
    double want = 0;
    for (int64_t k = 0; k < K; ++k) {
      const int nib = (s.host_packed0[size_t(n * K / 2 + k / 2)] >> (4 * (k % 2))) & 0xf;
      want += double(nib - 8) * sc[size_t(n * (K / kGroup) + k / kGroup)] * s.x_host[size_t(k)];
    }
    scale = std::max(scale, std::fabs(want));
    worst = std::max(worst, std::fabs(double(got[size_t(n)]) - want));
  }
  return worst / std::max(scale, 1e-30);
}

void BM_Llama8bLinears(benchmark::State& state) {
  if (!cuda_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Setup& s = Setup::get();
  const int64_t T = state.range(0);
  const bool int4 = state.range(1) != 0;
  double err = 0;
  if (int4) {
    err = reference_error(s);
    if (!(err < 2e-2)) {
      state.SkipWithError(("output differs from the host reference by " + std::to_string(err)).c_str());
      return;
    }
  }
  for (int i = 0; i < 4; ++i) product(s, 0, i, T, int4);  // plans made outside the capture
  std::unique_ptr<Graph> graph = s.be->capture([&] {
    for (int r = 0; r < kRounds; ++r)
      for (int l = 0; l < kLayers; ++l)
        for (int i = 0; i < 4; ++i) product(s, l, i, T, int4);
  });
  if (!graph) {
    state.SkipWithError("the backend did not capture a graph");
    return;
  }
  graph->replay();  // warm-up
  s.be->synchronize();
  double seconds = 0;
  int64_t layers = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    graph->replay();
    s.be->synchronize();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(dt);
    seconds += dt;
    layers += int64_t(kRounds) * kLayers;
  }
  double bytes = 0;  // weight bytes of one layer
  for (const auto& sh : kShapes)
    bytes += int4 ? double(sh[0]) * double(sh[1]) / 2 + double(sh[0]) * double(sh[1] / kGroup) * 2
                  : double(sh[0]) * double(sh[1]) * 2;
  state.counters["us_per_layer"] = seconds / double(layers) * 1e6;
  state.counters["GB/s"] = bytes * double(layers) / seconds / 1e9;
  state.counters["copy_GB/s"] = s.copy_gbs;
  if (int4) state.counters["rel_err"] = err;
}
// Args: tokens, INT4 (1) or bf16 (0).
BENCHMARK(BM_Llama8bLinears)
    ->ArgsProduct({{1, 4, 16}, {1, 0}})
    ->ArgNames({"tokens", "int4"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
#else
namespace {
void BM_Llama8bLinears(benchmark::State& state) {
  state.SkipWithError("this build has no CUDA backend (nvcc was not found at configure time)");
}
BENCHMARK(BM_Llama8bLinears);
}  // namespace
#endif

BENCHMARK_MAIN();
