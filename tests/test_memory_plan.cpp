// The memory plan: what plan_memory predicts is what a Model allocates, defaults resolve the same way
// everywhere, absurd options and plans that do not fit are refused with their figures, and a run on
// an engine file sizes its cache for the request, never for the stored bounds.
#include <gtest/gtest.h>

#include <algorithm>

#include "backend/backend.h"
#include "backend/forwarding_backend.h"
#include "core/host_memory.h"
#include "io/engine_file.h"
#include "runtime/memory_plan.h"
#include "runtime/model.h"
#include "test_helpers.h"

namespace ingot {
namespace {

const char* const kFixtures[] = {"llama3", "qwen2", "qwen3", "qwen3_swa", "qwen3_5_text", "qwen3_5_wrapped", "qwen3_5_pattern"};

TEST(MemoryPlan, MatchesWhatTheModelAllocates) {
  auto be = make_cpu_backend();
  for (const char* fx : kFixtures) {
    const Engine eng = build_engine(test::fixture(fx));
    for (const auto& [batch, capacity] : {std::pair<int, int64_t>{1, 0}, {3, 20}, {2, 7}}) {
      RuntimeOptions rt;
      rt.max_batch = batch;
      rt.capacity = capacity;
      rt.layout = batch == 3 ? CacheLayout::Flattened : CacheLayout::HeadsFirst;
      const MemoryPlan p = plan_memory(eng.spec, eng.weight_dtype, be->activation_dtype(), rt, be->host_memory());
      Model m(eng, *be, rt);
      SCOPED_TRACE(std::string(fx) + " batch " + std::to_string(batch));
      EXPECT_EQ(p.weights, m.weight_bytes());
      EXPECT_EQ(p.weights, eng.weight_bytes());
      EXPECT_EQ(p.weights, engine_weight_bytes(eng.spec, eng.weight_dtype));
      EXPECT_EQ(p.cache, m.state().bytes());
      EXPECT_EQ(p.workspace, m.workspace_bytes());
      EXPECT_EQ(p.workspace, p.ws.total());
      EXPECT_EQ(p.options.capacity, m.state().capacity());
      EXPECT_EQ(p.options.max_tokens, m.max_tokens());
      // The CPU backend reads the engine's weights in place: only the cache and workspace are new.
      EXPECT_EQ(p.allocated(), p.cache + p.workspace);
    }
  }
}

// The CPU backend answering for its linear scratch as the CUDA backend of f32 activations does for
// 16-bit weights: products of more than one token round x to the weight's dtype first, [tokens, cols].
// It records what the Model reserves.
class RoundingCpu final : public ForwardingBackend {
 public:
  RoundingCpu() : ForwardingBackend(make_cpu_backend(1)) {}
  size_t linear_scratch_bytes(DType wdt, int64_t rows, int64_t cols, int64_t tokens, bool perm) const override {
    (void)rows, (void)perm;
    return (wdt == DType::BF16 || wdt == DType::F16) && tokens > 1 ? size_t(tokens * cols) * dtype_size(wdt) : 0;
  }
  void reserve_linear_scratch(size_t bytes) override { reserved = std::max(reserved, bytes); }
  size_t reserved = 0;
};

// The plan counts that scratch over every linear weight (the widest input of any product: the hidden
// size, the attention or linear-attention output, the intermediate size), the Model reserves exactly
// it on the backend, and the CPU backend itself needs none.
TEST(MemoryPlan, CountsTheScratchOfSixteenBitProductsUnderF32Activations) {
  for (const char* fx : kFixtures) {
    SCOPED_TRACE(fx);
    const Engine eng = build_engine(test::fixture(fx), BuildOptions{DType::BF16});
    const ModelSpec& s = eng.spec;
    RoundingCpu be;
    RuntimeOptions rt;
    rt.max_batch = 2;
    rt.capacity = 16;  // up to 32 tokens per forward
    const MemoryPlan p = plan_memory(s, eng.weight_dtype, be.activation_dtype(), rt, be.host_memory(), nullptr, &be);
    int64_t widest = std::max({s.hidden, s.q_dim(), s.intermediate});
    if (s.has_linear_layers()) widest = std::max(widest, s.linear.value_width());
    EXPECT_EQ(p.options.max_tokens, 32);
    EXPECT_EQ(p.ws.linear_scratch, size_t(32 * widest) * 2);
    EXPECT_EQ(p.workspace, p.ws.total());
    {
      Model m(eng, be, rt);
      EXPECT_EQ(be.reserved, p.ws.linear_scratch);
      EXPECT_EQ(m.workspace_bytes(), p.workspace);
    }
    rt.max_tokens = 1;  // one-token products read x as it is
    EXPECT_EQ(plan_memory(s, eng.weight_dtype, be.activation_dtype(), rt, be.host_memory(), nullptr, &be).ws.linear_scratch, 0u);
    auto cpu = make_cpu_backend(1);
    rt.max_tokens = 0;
    EXPECT_EQ(plan_memory(s, eng.weight_dtype, cpu->activation_dtype(), rt, true, nullptr, cpu.get()).ws.linear_scratch, 0u);
  }
}

TEST(MemoryPlan, DefaultsResolveOnce) {
  ModelSpec s = build_engine(test::fixture("qwen3")).spec;
  EXPECT_EQ(default_capacity(s), s.max_position);  // 64: below the default
  s.max_position = 40960;
  EXPECT_EQ(default_capacity(s), kDefaultCapacity);
  const MemoryPlan p = plan_memory(s, DType::BF16, DType::BF16, RuntimeOptions{});
  EXPECT_EQ(p.options.capacity, kDefaultCapacity);
  EXPECT_EQ(p.options.max_tokens, 4096);
  EXPECT_EQ(p.options.max_logit_rows, 64);
  EXPECT_EQ(p.cache, size_t(2) * size_t(s.layers) * size_t(s.kv_dim()) * size_t(kDefaultCapacity) * 2);
}

TEST(MemoryPlan, AbsurdOptionsAreRefusedWithTheLimit) {
  const ModelSpec s = build_engine(test::fixture("qwen3")).spec;
  auto plan = [&](int batch, int64_t capacity, int64_t max_tokens = 0) {
    RuntimeOptions rt;
    rt.max_batch = batch;
    rt.capacity = capacity;
    rt.max_tokens = max_tokens;
    return plan_memory(s, DType::F32, DType::F32, rt);
  };
  test::expect_error([&] { plan(0, 8); }, {"max batch must be at least 1, got 0"});
  test::expect_error([&] { plan(kMaxBatch + 1, 8); }, {"max batch 1048577", "limit of 1048576"});
  test::expect_error([&] { plan(1, -5); }, {"capacity must be at least 1, got -5"});
  test::expect_error([&] { plan(1, kMaxCapacity + 1); }, {"capacity 1073741825", "2^30"});
  test::expect_error([&] { plan(1, 8, -1); }, {"max tokens per forward", "got -1"});
  // The Model refuses them before allocating anything.
  const Engine eng = build_engine(test::fixture("qwen3"));
  auto be = make_cpu_backend();
  RuntimeOptions rt;
  rt.max_batch = -3;
  test::expect_error([&] { Model(eng, *be, rt); }, {"max batch must be at least 1, got -3"});
}

TEST(MemoryPlan, APlanThatDoesNotFitIsRefusedWithBothFigures) {
  const ModelSpec s = build_engine(test::fixture("qwen3")).spec;
  RuntimeOptions rt;
  rt.max_batch = 2;
  rt.capacity = 64;
  const MemoryPlan p = plan_memory(s, DType::F32, DType::F32, rt);
  check_fits(p, std::nullopt, "host memory");       // unknown: nothing to compare
  check_fits(p, p.allocated(), "host memory");      // exactly enough
  test::expect_error([&] { check_fits(p, p.allocated() - 1, "host memory"); },
                     {"not enough memory", "this run needs", "weights", "KV cache", "max batch 2 x capacity 64",
                      "workspace", "host memory has", "available"});
  test::expect_error([&] { check_fits(size_t(3e9), "building the engine's bf16 weights", size_t(2e9), "host memory"); },
                     {"building the engine's bf16 weights needs 3.00 GB", "host memory has 2.00 GB available"});
  EXPECT_EQ(format_bytes(1.5e9), "1.50 GB");
  EXPECT_EQ(format_bytes(2.5e6), "2.5 MB");
}

TEST(MemoryPlan, AModelThatCannotFitIsRefusedBeforeAllocating) {
  // A Llama-70B-shaped cache (80 layers, 8 KV heads of 128) for 100000 rows of 4096 slots: 134 TB,
  // refused by the plan in microseconds on any machine.
  ModelSpec s = build_engine(test::fixture("llama3")).spec;
  s.layers = 80;
  s.kv_heads = 8;
  s.head_dim = 128;
  s.heads = 64;
  s.hidden = 8192;
  s.window.assign(80, 0);
  RuntimeOptions rt;
  rt.max_batch = 100000;
  rt.capacity = 4096;
  const MemoryPlan p = plan_memory(s, DType::BF16, DType::BF16, rt);
  EXPECT_GT(double(p.cache), 1e14);
  test::expect_error([&] { check_fits(p, host_available_bytes().value_or(size_t(1) << 40), "host memory"); },
                     {"not enough memory", "max batch 100000 x capacity 4096"});
}

TEST(MemoryPlan, EngineRunsTakeTheRequestNotTheBounds) {
  EngineFileInfo f;
  f.path = "m.ingot";
  f.spec = build_engine(test::fixture("qwen3_swa")).spec;  // max_position 256
  f.bounds.max_batch = 4;
  f.bounds.capacity = 128;
  f.bounds.layout = CacheLayout::Flattened;
  RuntimeOptions rt;
  RuntimeOptions got = fit_engine_bounds(f, rt, false);
  EXPECT_EQ(got.capacity, 128);  // min(default 256, the bound)
  EXPECT_EQ(got.max_batch, 1);   // the request's, not the bound's 4
  EXPECT_EQ(got.layout, CacheLayout::Flattened);
  rt.capacity = 10;
  rt.max_batch = 2;
  got = fit_engine_bounds(f, rt, false);
  EXPECT_EQ(got.capacity, 10);
  EXPECT_EQ(got.max_batch, 2);
  rt.capacity = 129;
  test::expect_error([&] { fit_engine_bounds(f, rt, false); }, {"m.ingot", "needs capacity 129", "at most 128"});
  rt.capacity = 10;
  rt.max_batch = 5;
  test::expect_error([&] { fit_engine_bounds(f, rt, false); }, {"needs max batch 5", "at most 4"});
  rt.max_batch = 1;
  rt.layout = CacheLayout::HeadsFirst;
  test::expect_error([&] { fit_engine_bounds(f, rt, true); }, {"flattened cache layout"});
}

}  // namespace
}  // namespace ingot
