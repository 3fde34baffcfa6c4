// Generation stops with an Error naming the step when a step's logits have no pick (a NaN or +inf, or
// none finite), whether the pick is made on the host (the prefill's token) or by the decode op, greedy
// or sampling, instead of emitting a made-up token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "backend/backend.h"
#include "runtime/generator.h"
#include "runtime/text_decoder.h"
#include "test_helpers.h"

namespace ingot {
namespace {

std::string tokenizer_dir() {
  const char* c = std::getenv("INGOT_CACHE");
  return (c ? std::string(c) : std::string(INGOT_SOURCE_DIR) + "/.cache") + "/tokenizers/llama2";
}

class NonFinite : public ::testing::Test {
 protected:
  void SetUp() override { fresh(); }
  // A fresh engine and backend (tests break the weights).
  void fresh() {
    eng = std::make_unique<Engine>(build_engine(test::fixture("llama3")));
    be = make_cpu_backend(2);
  }
  std::vector<int32_t> run(int max_new) {
    RuntimeOptions rt;
    rt.capacity = 64;
    Model m(*eng, *be, rt);  // the CPU backend uses the engine's weights in place
    Request q;
    q.prompt = prompt;
    q.max_new_tokens = max_new;
    return Generator(m).generate(std::move(q)).ids;
  }
  void poison_embedding_row(int32_t id) {
    HostTensor& emb = eng->weights.at("tok_embeddings");
    emb.as<float>()[int64_t(id) * emb.shape()[1]] = NAN;
  }
  std::unique_ptr<Engine> eng;
  std::unique_ptr<Backend> be;
  const std::vector<int32_t> prompt = {5, 17, 200, 3};
};

TEST_F(NonFinite, PrefillLogitsStopGenerationAtStep0) {
  eng->weights.at("final_norm").as<float>()[0] = INFINITY;  // inf * 0-ish values: NaN or inf logits
  test::expect_error([&] { run(4); }, {"non-finite logits", "decode step 0"});
}

TEST_F(NonFinite, DecodeLogitsStopGenerationAtTheirStep) {
  // The first generated token's embedding row is broken: the prefill is clean, the first decode step
  // (which feeds that token) is not.
  const std::vector<int32_t> clean = run(3);
  ASSERT_EQ(clean.size(), 3u);
  poison_embedding_row(clean[0]);
  test::expect_error([&] { run(3); }, {"non-finite logits", "decode step 1"});
}

// Text generation, greedy and sampling (the host Sampler picks the first token, the device the rest).
// Only its stream decoder reads the tokenizer: any tokenizer covering the fixture's 512 ids will do.
TEST_F(NonFinite, TextGenerationStopsWithTheStep) {
  if (!std::filesystem::exists(tokenizer_dir() + "/tokenizer.json"))
    GTEST_SKIP() << "Llama 2 tokenizer not fetched (run scripts/fetch-tokenizers; make test does)";
  const tok::Tokenizer tk = tok::Tokenizer::from_file(tokenizer_dir() + "/tokenizer.json");
  for (float temperature : {0.0f, 0.8f}) {
    SCOPED_TRACE(temperature);
    fresh();
    auto req = [&] {
      Request q;
      q.prompt = prompt;
      q.max_new_tokens = 4;
      q.sampling.temperature = temperature;
      q.sampling.seed = 3;
      q.text = text_decoder(tk);
      return q;
    };
    RuntimeOptions rt;
    rt.capacity = 64;
    int32_t first = 0;
    {
      Model m(*eng, *be, rt);
      first = Generator(m).generate(req()).ids.at(0);
    }
    // The prefill must stay clean: the token may not be one of the prompt's.
    ASSERT_EQ(std::count(prompt.begin(), prompt.end(), first), 0) << first;
    poison_embedding_row(first);
    {
      Model m(*eng, *be, rt);
      Generator g(m);
      test::expect_error([&] { g.generate(req()); }, {"non-finite logits", "decode step 1"});
      EXPECT_EQ(g.busy_slots(), 0);  // the failed request gave its slot back
    }
    eng->weights.at("final_norm").as<float>()[0] = NAN;
    Model m(*eng, *be, rt);
    Generator g(m);
    test::expect_error([&] { g.generate(req()); }, {"non-finite logits", "decode step 0"});
  }
}

}  // namespace
}  // namespace ingot
