// Text generation end to end on the shipped demo model (models/demo + the Llama 2 tokenizer from the
// npm cache): greedy text equals what transformers generated for the same weights, sampling is
// reproducible by seed, stop strings cut the text, and a follow-up turn reuses the cached prefix.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "backend/backend.h"
#include "runtime/session.h"
#include "test_helpers.h"

namespace ingot {
namespace {
namespace fs = std::filesystem;

std::string tokenizer_dir() {
  const char* c = std::getenv("INGOT_CACHE");
  return (c ? std::string(c) : std::string(INGOT_SOURCE_DIR) + "/.cache") + "/tokenizers/llama2";
}

class DemoModel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(tokenizer_dir() + "/tokenizer.json"))
      GTEST_SKIP() << "Llama 2 tokenizer not fetched (run scripts/fetch-tokenizers; make test does)";
    tk = std::make_unique<tok::Tokenizer>(tok::Tokenizer::from_file(tokenizer_dir() + "/tokenizer.json"));
    eng = std::make_unique<Engine>(build_engine(std::string(INGOT_SOURCE_DIR) + "/models/demo"));
    be = make_cpu_backend();
    RuntimeOptions rt;
    rt.capacity = 256;
    model = std::make_unique<Model>(*eng, *be, rt);
  }
  TextRequest request(const std::string& prompt, int max_new = 60) {
    TextRequest r;
    r.prompt_ids = tk->encode(prompt, true);
    r.max_new_tokens = max_new;
    r.eos_ids = {2};
    return r;
  }
  std::unique_ptr<tok::Tokenizer> tk;
  std::unique_ptr<Engine> eng;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
};

TEST_F(DemoModel, GreedyTextEqualsTransformers) {
  // Printed by tools/train_demo_model.py: transformers' greedy continuation of the saved weights.
  const std::string expected =
      "there was a brown dog. The dog was very happy. The dog ran to the hill and came back. The dog went to the "
      "river with Ella. Ella was happy.";
  Session s(*model, *tk);
  std::string streamed;
  TextResult r = s.generate(request("Once upon a time,"), [&](std::string_view p) { streamed += p; });
  EXPECT_EQ(r.text, expected);
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(r.stop_reason, "eos");
}

TEST_F(DemoModel, SamplingIsReproducibleBySeed) {
  TextRequest req = request("Tom had a");
  req.sampling.temperature = 0.9f;
  req.sampling.top_p = 0.95f;
  req.sampling.seed = 11;
  Session a(*model, *tk), b(*model, *tk);
  std::string first = a.generate(req).text;
  EXPECT_EQ(first, b.generate(req).text);
  std::set<std::string> seen;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    req.sampling.seed = seed;
    Session c(*model, *tk);
    seen.insert(c.generate(req).text);
  }
  EXPECT_GT(seen.size(), 1u);  // the seed reaches the sampler
}

TEST_F(DemoModel, StopStringCutsTheText) {
  TextRequest req = request("Once upon a time,");
  req.stop_strings = {"happy"};
  Session s(*model, *tk);
  std::string streamed;
  TextResult r = s.generate(req, [&](std::string_view p) { streamed += p; });
  EXPECT_EQ(r.text, "there was a brown dog. The dog was very ");
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(r.stop_reason, "stop_string");
}

TEST_F(DemoModel, FollowUpReusesTheCachedPrefix) {
  Session s(*model, *tk);
  TextRequest first = request("Once upon a time,", 12);
  TextResult r1 = s.generate(first);
  TextRequest second = first;
  second.prompt_ids.insert(second.prompt_ids.end(), r1.ids.begin(), r1.ids.end());
  for (int32_t t : tk->encode(" Then", false)) second.prompt_ids.push_back(t);
  second.max_new_tokens = 20;
  TextResult r2 = s.generate(second);
  EXPECT_LT(r2.prefilled_tokens, r2.prompt_tokens);
  EXPECT_EQ(r2.prefilled_tokens, int64_t(second.prompt_ids.size() - first.prompt_ids.size() - r1.ids.size() + 1));
  Session fresh(*model, *tk);
  EXPECT_EQ(fresh.generate(second).ids, r2.ids);  // same answer as computing everything again
}

TEST_F(DemoModel, OversizedRequestFailsBeforeCompute) {
  Session s(*model, *tk);
  TextRequest req = request("Once upon a time,", 300);
  test::expect_error([&] { s.generate(req); }, {"capacity is 256"});
}

TEST(PositionLimit, WarnsOnlyPastMaxPositionEmbeddingsNamingBothFigures) {
  // 10 prompt tokens and 503 new ones use 512 positions (the last token is never fed back).
  EXPECT_EQ(position_limit_warning(512, 10, 503), "");
  const std::string w = position_limit_warning(512, 10, 504);
  for (const char* f : {"10 tokens", "504 new tokens", "513 positions", "max_position_embeddings (512)"})
    EXPECT_NE(w.find(f), std::string::npos) << w << " lacks " << f;
  EXPECT_EQ(w.find('\n'), std::string::npos);  // one line
}

}  // namespace
}  // namespace ingot
