// Model-level parity of the CUDA backend: every committed fixture through Model on the GPU in f32
// against its transformers reference (allclose(1e-3, 1e-4) on every forward path, greedy ids equal),
// in both cache layouts; 16-bit engines on f32 activations against the CPU backend running the same
// engine; and CUDA-graph decode bitwise equal to the same steps run without graphs (tokens and the
// whole KV cache), greedy and sampling on the device, in f32, bf16 and bf16 weights on f32
// activations. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <cstring>
#include <filesystem>

#include "backend/backend.h"
#include "io/engine.h"
#include "io/engine_file.h"
#include "runtime/generator.h"
#include "runtime/loader.h"
#include "runtime/model.h"
#include "runtime/reference_check.h"

#ifdef INGOT_WITH_CUDA
namespace ingot {
namespace {

const std::vector<std::string> kFixtures = {"llama3", "qwen2", "qwen3", "qwen3_swa", "qwen3_5_text", "qwen3_5_wrapped", "qwen3_5_pattern"};

// INGOT_SOURCE_DIR in the environment wins, so binaries built here run from the GPU machine's copy.
std::string fixture_dir(const std::string& name) {
  const char* env = std::getenv("INGOT_SOURCE_DIR");
  return std::string(env && *env ? env : INGOT_SOURCE_DIR) + "/tests/data/models/" + name;
}

class CudaParity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: the CUDA parity tests need a GPU";
  }
};

TEST_P(CudaParity, MatchesTransformersInF32) {
  const std::string dir = fixture_dir(GetParam());
  Engine engine = build_engine(dir, BuildOptions{DType::F32});
  Reference ref = load_reference(dir + "/reference.safetensors");
  auto be = make_cuda_backend(DType::F32);
  for (CacheLayout layout : {CacheLayout::HeadsFirst, CacheLayout::Flattened}) {
    RuntimeOptions rt;
    rt.max_batch = int(ref.rows());
    rt.capacity = reference_capacity(ref);
    rt.layout = layout;
    Model m(engine, *be, rt);
    CheckOptions co;
    co.tol.atol = 1e-3;
    co.tol.rtol = 1e-4;
    for (const CaseResult& c : run_reference_check(m, ref, co)) {
      EXPECT_TRUE(c.passed()) << GetParam() << " " << layout_name(layout) << " " << c.mode << ": max |dlogit| "
                              << c.max_abs << ", allclose " << c.allclose << ", agree " << c.agree << "/" << c.total;
    }
  }
}

// Prefills each reference row, then decodes `steps` tokens for all rows at once, on a CUDA backend of
// activation dtype `dt` (the engine's weight dtype, or f32 beside 16-bit weights); returns the tokens
// of every step and the cache bytes of every row.
struct DecodeRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<uint8_t>> cache;
};

DecodeRun decode_run(const Engine& engine, const Reference& ref, DType dt, bool graphs, int steps, bool sampled = false) {
  auto be = make_cuda_backend(dt);
  RuntimeOptions rt;
  rt.max_batch = int(ref.rows());
  rt.capacity = ref.seq() + steps;
  rt.use_graphs = graphs;
  Model m(engine, *be, rt);
  const int64_t N = ref.rows(), P = ref.seq() / 2;
  std::vector<int> rows;
  std::vector<int32_t> next;
  std::vector<int64_t> at;
  for (int64_t n = 0; n < N; ++n) {
    // Rows start at different write indices: row n's prompt is P - n tokens long.
    const int64_t len = std::max<int64_t>(1, P - n);
    const int64_t* ids = ref.input_ids.as<int64_t>() + n * ref.seq();
    BatchRow r{int(n), std::vector<int32_t>(ids, ids + len), 0, {}, false};
    HostTensor lg = m.forward(Batch{{r}});
    const float* l = lg.as<float>();
    next.push_back(int32_t(std::max_element(l, l + m.spec().vocab) - l));
    rows.push_back(int(n));
    at.push_back(len);
    if (sampled) {  // each row its own settings: top-k on odd rows, all with top-p and the penalty
      SamplingParams p;
      p.temperature = 0.8f + 0.1f * float(n);
      p.top_k = n % 2 ? 40 : 0;
      p.top_p = 0.9f;
      p.repetition_penalty = 1.2f;
      p.seed = 100 + uint64_t(n);
      std::vector<int32_t> history(ids, ids + len);
      history.push_back(next.back());
      m.set_sampling(int(n), p, history);
    }
  }
  DecodeRun out;
  for (int s = 0; s < steps; ++s) {
    next = m.decode(rows, next, at);
    out.tokens.push_back(next);
    for (int64_t& a : at) ++a;
  }
  for (int64_t n = 0; n < N; ++n) out.cache.push_back(m.state().read_row(int(n)));
  return out;
}

TEST_P(CudaParity, GraphDecodeIsBitwiseDirectDecode) {
  const std::string dir = fixture_dir(GetParam());
  Reference ref = load_reference(dir + "/reference.safetensors");
  for (DType dt : {DType::F32, DType::BF16}) {
    Engine engine = build_engine(dir, BuildOptions{dt});
    const DecodeRun direct = decode_run(engine, ref, dt, false, 12);
    const DecodeRun graph = decode_run(engine, ref, dt, true, 12);
    EXPECT_EQ(graph.tokens, direct.tokens) << GetParam() << " " << dtype_name(dt);
    EXPECT_TRUE(graph.cache == direct.cache) << GetParam() << " " << dtype_name(dt) << ": KV cache bytes differ";
  }
  // bf16 weights on f32 activations: the GEMV's f32-x instances and the rounded x of the prefill's
  // products under capture.
  Engine engine = build_engine(dir, BuildOptions{DType::BF16});
  const DecodeRun direct = decode_run(engine, ref, DType::F32, false, 12);
  const DecodeRun graph = decode_run(engine, ref, DType::F32, true, 12);
  EXPECT_EQ(graph.tokens, direct.tokens) << GetParam() << " bf16 weights, f32 activations";
  EXPECT_TRUE(graph.cache == direct.cache) << GetParam() << " bf16 weights, f32 activations: KV cache bytes differ";
}

// launch_forward replayed as a graph (a shape's second call on: Model::run_forward_graph) computes what
// the direct call did: the same picks, KV cache bytes, and logits of the token after, bit for bit. Two
// prompts of different lengths per call, into fresh rows each time; the first call runs directly, the
// second is captured and replayed, the third replays.
TEST_P(CudaParity, GraphForwardIsBitwiseDirectForward) {
  const std::string dir = fixture_dir(GetParam());
  Reference ref = load_reference(dir + "/reference.safetensors");
  for (DType dt : {DType::F32, DType::BF16}) {
    Engine engine = build_engine(dir, BuildOptions{dt});
    auto be = make_cuda_backend(dt);
    RuntimeOptions rt;
    rt.max_batch = 6;
    rt.capacity = ref.seq() + 2;
    Model m(engine, *be, rt);
    const int64_t P = ref.seq();
    const int64_t* ids = ref.input_ids.as<int64_t>();
    const std::vector<int32_t> a(ids, ids + P), b(ids, ids + P - 1);
    struct Rep {
      std::vector<int32_t> picks;
      std::vector<std::vector<uint8_t>> cache;
      std::vector<float> next;
    };
    std::vector<Rep> reps;
    for (int rep = 0; rep < 3; ++rep) {
      const int ra = 2 * rep, rb = 2 * rep + 1;
      m.launch_forward(Batch{{BatchRow{ra, a, 0, {}, false}, BatchRow{rb, b, 0, {}, false}}});
      Rep r;
      r.picks = m.finish_launch();
      ASSERT_EQ(r.picks.size(), 2u);
      r.cache = {m.state().read_row(ra), m.state().read_row(rb)};
      HostTensor lg = m.forward(Batch{{BatchRow{ra, {r.picks[0]}, P, {}, false}}});
      r.next.assign(lg.as<float>(), lg.as<float>() + m.spec().vocab);
      reps.push_back(std::move(r));
    }
    EXPECT_EQ(m.forward_graph_count(), 1u) << GetParam() << " " << dtype_name(dt) << ": the repeated shape was not captured";
    for (int rep = 1; rep < 3; ++rep) {
      EXPECT_EQ(reps[size_t(rep)].picks, reps[0].picks) << GetParam() << " " << dtype_name(dt) << " call " << rep;
      EXPECT_TRUE(reps[size_t(rep)].cache == reps[0].cache) << GetParam() << " " << dtype_name(dt) << " call " << rep
                                                            << ": KV cache bytes differ";
      EXPECT_EQ(std::memcmp(reps[size_t(rep)].next.data(), reps[0].next.data(), reps[0].next.size() * sizeof(float)), 0)
          << GetParam() << " " << dtype_name(dt) << " call " << rep << ": the next token's logits differ";
    }
  }
}

// A 16-bit engine (bf16, f16) on the CUDA backend of f32 activations and f32 KV cache against the CPU
// backend running the same engine, which computes exactly so (f32 activations, the weights widened).
// Each reference row is fed one token per forward, then continued greedily for 8 tokens: every product
// has one row, so the GPU reads x unrounded and differs from the CPU in summation order only. The
// logits of every step within fp32's GPU tolerance (atol 1e-3, rtol 1e-4), NaN never passing, and
// the greedy tokens equal.
TEST_P(CudaParity, SixteenBitWeightsOnF32ActivationsMatchTheCpu) {
  const std::string dir = fixture_dir(GetParam());
  Reference ref = load_reference(dir + "/reference.safetensors");
  constexpr int64_t kNew = 8;
  for (DType wt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(GetParam() + " " + std::string(dtype_name(wt)) + " weights");
    const Engine engine = build_engine(dir, BuildOptions{wt});
    auto cpu = make_cpu_backend(2);
    auto gpu = make_cuda_backend(DType::F32);
    RuntimeOptions rt;
    rt.max_batch = 1;
    rt.capacity = ref.seq() + kNew;
    Model mc(engine, *cpu, rt), mg(engine, *gpu, rt);
    EXPECT_EQ(mg.state().bytes(), mc.state().bytes());  // the KV cache in f32, as the CPU's
    const int64_t vocab = mg.spec().vocab;
    for (int64_t n = 0; n < ref.rows(); ++n) {
      const int64_t* ids = ref.input_ids.as<int64_t>() + n * ref.seq();
      std::vector<int32_t> picked_cpu, picked_gpu;
      int32_t tok = 0;
      for (int64_t p = 0; p < ref.seq() + kNew; ++p) {
        // The row restarts at slot 0 (allowed for every layer kind) and continues one token a call.
        if (p < ref.seq()) tok = int32_t(ids[p]);
        const Batch b{{BatchRow{0, {tok}, p, {}, false, true}}};
        const HostTensor lc = mc.forward(b), lg = mg.forward(b);
        ASSERT_EQ(lc.numel(), vocab);
        ASSERT_EQ(lg.numel(), vocab);
        const float *want = lc.as<float>(), *got = lg.as<float>();
        int64_t bad = 0;
        float worst = 0;
        for (int64_t i = 0; i < vocab; ++i) {
          const float d = std::fabs(got[i] - want[i]);
          if (!(d <= 1e-3f + 1e-4f * std::fabs(want[i]))) ++bad;
          if (!(d <= worst)) worst = d;
        }
        EXPECT_EQ(bad, 0) << "row " << n << " step " << p << ": " << bad << " logits differ, max |diff| " << worst;
        if (p + 1 >= ref.seq()) {
          picked_cpu.push_back(int32_t(std::max_element(want, want + vocab) - want));
          picked_gpu.push_back(int32_t(std::max_element(got, got + vocab) - got));
          tok = picked_cpu.back();
        }
      }
      EXPECT_EQ(picked_gpu, picked_cpu) << "row " << n;
    }
  }
}

// The same with every row sampling on the device: the sampling state lives in buffers the graph
// reads, so replays draw the same tokens as direct steps.
TEST_P(CudaParity, GraphSampledDecodeIsBitwiseDirectDecode) {
  const std::string dir = fixture_dir(GetParam());
  Reference ref = load_reference(dir + "/reference.safetensors");
  for (DType dt : {DType::F32, DType::BF16}) {
    Engine engine = build_engine(dir, BuildOptions{dt});
    const DecodeRun direct = decode_run(engine, ref, dt, false, 12, true);
    const DecodeRun graph = decode_run(engine, ref, dt, true, 12, true);
    EXPECT_EQ(graph.tokens, direct.tokens) << GetParam() << " " << dtype_name(dt);
    EXPECT_TRUE(graph.cache == direct.cache) << GetParam() << " " << dtype_name(dt) << ": KV cache bytes differ";
  }
}

// An engine file reloaded (here in the same process; test_engine_file does a separate process on the
// CPU) gives bitwise the same logits on the GPU as the in-memory build, in f32 and bf16.
TEST_P(CudaParity, EngineFileReloadIsBitwise) {
  const std::string dir = fixture_dir(GetParam());
  Reference ref = load_reference(dir + "/reference.safetensors");
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Engine built = build_engine(dir, BuildOptions{dt});
    EngineBuildInfo info;
    info.bounds.max_batch = int(ref.rows());
    info.bounds.capacity = reference_capacity(ref);
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("ingot-cuda-reload-" + GetParam() + "-" + std::string(dtype_name(dt)) + ".ingot")).string();
    save_engine(built, info, path);
    LoadedEngine loaded = load_engine(path);
    auto be = make_cuda_backend(dt);
    RuntimeOptions rt{info.bounds};
    Model a(built, *be, rt), b(loaded.engine, *be, rt);
    Batch batch;
    for (int64_t n = 0; n < ref.rows(); ++n) {
      const int64_t* ids = ref.input_ids.as<int64_t>() + n * ref.seq();
      batch.rows.push_back(BatchRow{int(n), std::vector<int32_t>(ids, ids + ref.seq()), 0, {}, true});
    }
    HostTensor la = a.forward(batch), lb = b.forward(batch);
    ASSERT_EQ(la.nbytes(), lb.nbytes());
    EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.nbytes()), 0);
    std::filesystem::remove(path);
  }
}

// INT4 (quantized at build, group 32) in f32 on the GPU against the CPU backend running the same packed
// weights (itself bitwise the f32 model of the dequantized weights, test_int4): a prefill of two rows,
// 21 tokens (the dequantize + cuBLASLt path), then a decode step of both rows (the decode kernel), at
// the fp32 parity tolerances.
TEST_P(CudaParity, Int4MatchesCpuInF32) {
  const std::string dir = fixture_dir(GetParam());
  auto ids = [](int n, int start) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(int32_t((start + 37 * i) % 500));
    return v;
  };
  auto run = [&](const Engine& e, Backend& be) {
    RuntimeOptions rt;
    rt.max_batch = 2;
    rt.capacity = 32;
    Model m(e, be, rt);
    HostTensor a = m.forward(Batch{{BatchRow{0, ids(12, 3), 0, {}, true}, BatchRow{1, ids(9, 11), 0, {}, true}}});
    HostTensor b = m.forward(Batch{{BatchRow{0, {17}, 12, {}, false}, BatchRow{1, {29}, 9, {}, false}}});
    std::vector<float> out(a.as<float>(), a.as<float>() + a.numel());
    out.insert(out.end(), b.as<float>(), b.as<float>() + b.numel());
    return out;
  };
  BuildOptions bo{DType::F32};
  bo.int4_group_size = 32;
  const Engine q = build_engine(dir, bo);
  auto cpu = make_cpu_backend(2);
  auto gpu = make_cuda_backend(DType::F32);
  const std::vector<float> want = run(q, *cpu), got = run(q, *gpu);
  ASSERT_EQ(got.size(), want.size());
  size_t bad = 0;
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float d = std::fabs(got[i] - want[i]);
    if (!(d <= 1e-3f + 1e-4f * std::fabs(want[i]))) ++bad;
    if (!(d <= worst)) worst = d;
  }
  EXPECT_EQ(bad, 0u) << GetParam() << ": " << bad << " of " << got.size() << " logits differ, max |diff| " << worst;
}

// INT4 decode through CUDA graphs is bitwise the same steps run directly (tokens and KV cache), in f32
// and bf16: the INT4 kernels are deterministic under capture and programmatic dependent launch.
TEST_P(CudaParity, Int4GraphDecodeIsBitwiseDirectDecode) {
  const std::string dir = fixture_dir(GetParam());
  Reference ref = load_reference(dir + "/reference.safetensors");
  for (DType dt : {DType::F32, DType::BF16}) {
    BuildOptions bo{dt};
    bo.int4_group_size = 32;
    Engine engine = build_engine(dir, bo);
    const DecodeRun direct = decode_run(engine, ref, dt, false, 12);
    const DecodeRun graph = decode_run(engine, ref, dt, true, 12);
    EXPECT_EQ(graph.tokens, direct.tokens) << GetParam() << " " << dtype_name(dt);
    EXPECT_TRUE(graph.cache == direct.cache) << GetParam() << " " << dtype_name(dt) << ": KV cache bytes differ";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaParity, ::testing::ValuesIn(kFixtures));

// INT4 weights with 16-bit scales on f32 activations: the CUDA kernels read scales and x of one dtype,
// so a Model refuses the engine by name before allocating anything (the backend's peak is unchanged).
TEST(CudaF32Activations, Int4SixteenBitEngineIsRefusedBeforeAllocating) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: the CUDA parity tests need a GPU";
  BuildOptions bo{DType::BF16};
  bo.int4_group_size = 32;
  const Engine q = build_engine(fixture_dir("qwen3"), bo);
  auto be = make_cuda_backend(DType::F32);
  const size_t before = be->peak_memory_bytes();
  RuntimeOptions rt;
  rt.max_batch = 1;
  rt.capacity = 16;
  try {
    Model m(q, *be, rt);
    ADD_FAILURE() << "a bf16 INT4 engine ran on f32 activations";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("INT4 weights need 16-bit activations, drop --activations f32"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bf16 scales"), std::string::npos) << msg;
  }
  EXPECT_EQ(be->peak_memory_bytes(), before);
}

// Batch invariance of the hybrid models (issue 10; the failure TensorRT-LLM has with Qwen3.5 at
// concurrency >= 5): in bf16 with CUDA graphs, each of 8 greedy requests running together gives the
// tokens it gives alone on a one-row model. Prompts of different lengths, so rows sit at different
// write indices and some prefill while others decode. On the batch-invariant backend (the promise is
// --batch-invariant's: by default a one-token product takes the GEMV kernel and a batch's cuBLASLt,
// whose sums are ordered differently, so only that mode promises the same bits).
class CudaBatchInvariance : public CudaParity {};

// Greedy, 24 new tokens.
Request greedy_request(const std::vector<int32_t>& prompt) {
  Request r;
  r.prompt = prompt;
  r.max_new_tokens = 24;
  return r;
}

// Every prompt alone, one after another, on a one-row model (a new Generator each: no prefix reuse).
std::vector<std::vector<int32_t>> each_alone(Model& one_row, const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : prompts) out.push_back(Generator(one_row).generate(greedy_request(p)).ids);
  return out;
}

// All prompts submitted at once to one Generator.
std::vector<Completion> all_together(Model& m, const std::vector<std::vector<int32_t>>& prompts,
                                     GeneratorOptions o = {}) {
  Generator g(m, o);
  std::vector<Completion> done(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r = greedy_request(prompts[i]);
    r.on_done = [&done, i](const Completion& c) { done[i] = c; };
    g.submit(std::move(r));
  }
  g.run();
  return done;
}

TEST_P(CudaBatchInvariance, GreedyTokensAloneEqualInsideABatchOf8) {
  const std::string dir = fixture_dir(GetParam());
  Reference ref = load_reference(dir + "/reference.safetensors");
  Engine engine = build_engine(dir, BuildOptions{DType::BF16});
  auto be = make_cuda_backend(DType::BF16, 0, /*batch_invariant=*/true);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    const int64_t n = i % ref.rows(), len = std::max<int64_t>(1, ref.seq() - 3 * i);
    const int64_t* ids = ref.input_ids.as<int64_t>() + n * ref.seq();
    prompts.emplace_back(ids, ids + len);
  }
  RuntimeOptions one;
  one.max_batch = 1;
  one.capacity = ref.seq() + 32;
  Model alone_model(engine, *be, one);
  const std::vector<std::vector<int32_t>> alone = each_alone(alone_model, prompts);
  RuntimeOptions eight = one;
  eight.max_batch = 8;
  Model batch_model(engine, *be, eight);
  const std::vector<Completion> done = all_together(batch_model, prompts);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(done[i].ids, alone[i]) << GetParam() << " request " << i;
}

INSTANTIATE_TEST_SUITE_P(Hybrid, CudaBatchInvariance,
                         ::testing::Values("qwen3_5_text", "qwen3_5_wrapped", "qwen3_5_pattern"));

// --batch-invariant (issue 11, part 3), on random weights of real shapes (Qwen3-0.6B and Qwen3.5-0.8B:
// real widths, so products, attention and the delta rule take a real model's paths) in bf16: eight
// greedy requests of different prompt lengths give each exactly the tokens it gives alone, inside a
// batch of 8 whose prompts are cut into 7-token prefill chunks mixed with decode steps (CUDA graphs).
// Random weights make near-uniform logits, so a difference in the last bit soon changes a token.
TEST(CudaBatchInvariantMode, GreedyTokensAloneEqualInABatchWithChunkedPrefill) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: the CUDA parity tests need a GPU";
  for (const std::string shape : {"qwen3-0.6b", "qwen3.5-0.8b"}) {
    LoadSpec ls;
    ls.config_path = std::string(INGOT_SOURCE_DIR) + "/bench/shapes/" + shape + ".json";
    ls.device = "cuda";
    ls.dtype = "bf16";
    ls.batch_invariant = true;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 8; ++i) {
      std::vector<int32_t> p;
      for (int j = 0; j < 5 + 23 * i; ++j) p.push_back(int32_t(100 + (i * 7919 + j * 31) % 50000));
      prompts.push_back(std::move(p));
    }
    RuntimeOptions one;
    one.max_batch = 1;
    one.capacity = 256;
    std::vector<std::vector<int32_t>> alone;
    {
      Loaded a = load(ls, one);
      alone = each_alone(*a.model, prompts);
    }
    RuntimeOptions eight = one;
    eight.max_batch = 8;
    Loaded b = load(ls, eight);
    const std::vector<Completion> done = all_together(*b.model, prompts, GeneratorOptions{7});
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(done[i].ids.size(), 24u) << shape << " request " << i << ": " << done[i].error;
      EXPECT_EQ(done[i].ids, alone[i]) << shape << " request " << i;
    }
  }
}

}  // namespace
}  // namespace ingot
#else
TEST(CudaParity, NotBuilt) { GTEST_SKIP() << "this build has no CUDA backend (nvcc was not found at configure time)"; }
#endif
