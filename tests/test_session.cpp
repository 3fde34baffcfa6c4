// Text generation end to end through the Generator on the shipped demo model (models/demo + the
// Llama 2 tokenizer from the npm cache): greedy text equals what transformers generated for the same
// weights, sampling is reproducible by seed, stop strings cut the text, and a follow-up turn reuses
// the cached prefix (what the Session these tests were written for did).
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "backend/backend.h"
#include "runtime/generator.h"
#include "runtime/text_decoder.h"
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
  Request request(const std::string& prompt, int max_new = 60) {
    Request r;
    r.prompt = tk->encode(prompt, true);
    r.max_new_tokens = max_new;
    r.eos_ids = {2};
    r.text = text_decoder(*tk);
    return r;
  }
  // The same request again (a Request owns its text decoder, so it is not copied).
  Request again(const Request& r) {
    Request c;
    c.prompt = r.prompt;
    c.max_new_tokens = r.max_new_tokens;
    c.sampling = r.sampling;
    c.eos_ids = r.eos_ids;
    c.stop = r.stop;
    c.text = text_decoder(*tk);
    return c;
  }
  static std::function<void(const TokenEvent&)> collect(std::string& into) {
    return [&into](const TokenEvent& e) { into += e.text; };
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
  Generator g(*model);
  std::string streamed;
  Request req = request("Once upon a time,");
  req.on_token = collect(streamed);
  Completion r = g.generate(std::move(req));
  EXPECT_EQ(r.text, expected);
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(r.stop, StopReason::Eos);
}

TEST_F(DemoModel, SamplingIsReproducibleBySeed) {
  Request req = request("Tom had a");
  req.sampling.temperature = 0.9f;
  req.sampling.top_p = 0.95f;
  req.sampling.seed = 11;
  Generator a(*model), b(*model);
  std::string first = a.generate(again(req)).text;
  EXPECT_EQ(first, b.generate(again(req)).text);
  std::set<std::string> seen;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    req.sampling.seed = seed;
    Generator c(*model);
    seen.insert(c.generate(again(req)).text);
  }
  EXPECT_GT(seen.size(), 1u);  // the seed reaches the sampler
}

TEST_F(DemoModel, StopStringCutsTheText) {
  Request req = request("Once upon a time,");
  req.stop = {"happy"};
  Generator g(*model);
  std::string streamed;
  req.on_token = collect(streamed);
  Completion r = g.generate(std::move(req));
  EXPECT_EQ(r.text, "there was a brown dog. The dog was very ");
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(r.stop, StopReason::StopString);
}

TEST_F(DemoModel, FollowUpReusesTheCachedPrefix) {
  Generator g(*model);
  Request first = request("Once upon a time,", 12);
  const size_t first_len = first.prompt.size();
  Completion r1 = g.generate(again(first));
  Request second = again(first);
  second.prompt.insert(second.prompt.end(), r1.ids.begin(), r1.ids.end());
  for (int32_t t : tk->encode(" Then", false)) second.prompt.push_back(t);
  second.max_new_tokens = 20;
  Completion r2 = g.generate(again(second));
  EXPECT_LT(r2.computed_prompt_tokens, r2.prompt_tokens);
  EXPECT_EQ(r2.computed_prompt_tokens, int64_t(second.prompt.size() - first_len - r1.ids.size() + 1));
  Generator fresh(*model);
  EXPECT_EQ(fresh.generate(std::move(second)).ids, r2.ids);  // same answer as computing everything again
}

TEST_F(DemoModel, OversizedRequestFailsBeforeCompute) {
  Generator g(*model);
  test::expect_error([&] { g.submit(request("Once upon a time,", 300)); }, {"capacity is 256"});
  EXPECT_TRUE(g.idle());
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
