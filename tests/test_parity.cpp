// End-to-end parity with transformers on every committed fixture (CPU backend, f32): full prefill,
// token-by-token decode, random chunk splits, batched rows at different write indices and the greedy
// continuation, in both cache layouts, all within allclose(1e-4, 1e-4).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <tuple>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "runtime/reference_check.h"
#include "parity_helpers.h"
#include "test_helpers.h"

namespace ingot {
namespace {

class Parity : public ::testing::TestWithParam<std::tuple<std::string, CacheLayout>> {};

TEST_P(Parity, MatchesTransformers) {
  const auto& [name, layout] = GetParam();
  const std::string dir = test::fixture(name);
  Reference ref = load_reference(dir + "/reference.safetensors");
  Engine eng = build_engine(dir);
  test::expect_reference_parity(eng, ref, layout, name, {1u, 2u, 3u});
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity,
                         ::testing::Combine(::testing::Values("llama3", "qwen2", "qwen3", "qwen3_swa", "qwen3_5_text", "qwen3_5_wrapped", "qwen3_5_pattern"),
                                            ::testing::Values(CacheLayout::HeadsFirst, CacheLayout::Flattened)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + layout_name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace ingot

// `ingot eval-logits` (used for the 16-bit studies) returns each context's last-position logits: on
// contexts cut from a fixture's rows they equal transformers' logits at those positions, whether the
// contexts run as prefill or token by token through the decode path (--decode; rows of different
// lengths share the calls, so rows finish at different steps), on a sliding-window model and on a
// hybrid one (Qwen3.5: its linear layers' state carried from step to step).
namespace ingot {
namespace {

class EvalLogits : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(EvalLogits, LastPositionsMatchTransformers) {
  const std::string dir = test::fixture(std::get<0>(GetParam()));
  Reference ref = load_reference(dir + "/reference.safetensors");
  const int64_t N = ref.rows(), S = ref.seq(), V = ref.vocab();
  HostTensor lengths(DType::I64, {N});
  const int64_t cut[] = {S, 5, 17, 1};
  for (int64_t n = 0; n < N; ++n) lengths.as<int64_t>()[n] = cut[n % 4];
  test::TempDir tmp;
  write_safetensors(tmp.file("ctx.safetensors"), {{"input_ids", ref.input_ids.view()}, {"lengths", lengths.view()}});
  const std::string cmd = std::string(INGOT_BINARY) + " eval-logits --device cpu --model " + dir + " --contexts " +
                          tmp.file("ctx.safetensors") + " --out " + tmp.file("out.safetensors") + " --max-batch 3 " + std::get<1>(GetParam()) + " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  SafetensorsFile out(tmp.file("out.safetensors"));
  const TensorEntry* lg = out.find("logits");
  ASSERT_NE(lg, nullptr);
  ASSERT_EQ(lg->shape, (Shape{N, V}));
  const float* got = reinterpret_cast<const float*>(lg->data);
  for (int64_t n = 0; n < N; ++n) {
    const float* want = ref.logits.as<float>() + (n * S + cut[n % 4] - 1) * V;
    for (int64_t v = 0; v < V; ++v)
      ASSERT_NEAR(got[n * V + v], want[v], 1e-4 + 1e-4 * std::fabs(want[v])) << "context " << n << " token " << v;
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, EvalLogits,
                         ::testing::Combine(::testing::Values("qwen3_swa", "qwen3_5_text"),
                                            ::testing::Values("", "--decode", "--decode --activations f32")),
                         [](const auto& info) {
                           const std::string& flags = std::get<1>(info.param);
                           return std::get<0>(info.param) + "_" +
                                  (flags.empty() ? "prefill" : flags.size() > 8 ? "decode_f32" : "decode");
                         });

}  // namespace
}  // namespace ingot
