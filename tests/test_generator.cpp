// The Generator on the CPU: a request's tokens do not depend on what else runs (concurrent requests
// of different lengths arriving at different steps, a full queue, chunked prefill, greedy and seeded
// sampling all give what the request gives alone), cancellation frees the slot within one step, eos /
// stop strings / max tokens / the cache's end stop a request, the prefill budget holds, a follow-up
// reuses its slot's cached prefix, a step with prompt chunks is one call carrying the decode rows too,
// and bad requests are refused before any compute.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "backend/backend.h"
#include "runtime/generator.h"
#include "test_helpers.h"

namespace ingot {
namespace {

struct Fx {
  Engine eng = build_engine(test::fixture("qwen3"));  // vocab 512, max_position 64
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  std::unique_ptr<Model> model(int batch, int64_t capacity = 64, int64_t max_tokens = 0) {
    RuntimeOptions rt;
    rt.max_batch = batch;
    rt.capacity = capacity;
    rt.max_tokens = max_tokens;
    return std::make_unique<Model>(eng, *be, rt);
  }
};

std::vector<int32_t> seq(int n, int start) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(int32_t((start + 37 * i) % 500));
  return v;
}

// One request of a scenario: what it asks for and the step at which it arrives.
struct Spec {
  std::vector<int32_t> prompt;
  int max_new = 8;
  SamplingParams sampling;
  int arrive = 0;
};

Request request(const Spec& s) {
  Request r;
  r.prompt = s.prompt;
  r.max_new_tokens = s.max_new;
  r.sampling = s.sampling;
  return r;
}

// The request alone: a fresh one-row model, the whole prompt in one forward.
std::vector<int32_t> alone(Fx& f, const Spec& s) {
  auto m = f.model(1);
  return Generator(*m).generate(request(s)).ids;
}

std::vector<Spec> scenario(bool sampled) {
  std::vector<Spec> out;
  const int lens[] = {3, 17, 9, 1, 22, 5, 12};
  for (int i = 0; i < 7; ++i) {
    Spec s;
    s.prompt = seq(lens[i], 11 * i + 2);
    s.max_new = 6 + (i * 5) % 9;
    s.arrive = (i * 3) % 5;
    if (sampled) {
      s.sampling.temperature = 0.7f + 0.1f * float(i % 3);
      s.sampling.top_p = 0.9f;
      s.sampling.top_k = i % 2 ? 40 : 0;
      s.sampling.repetition_penalty = i % 3 == 0 ? 1.2f : 1.0f;
      s.sampling.seed = uint64_t(100 + i);
    }
    out.push_back(s);
  }
  return out;
}

// Runs the scenario on `batch` slots with a prefill budget (and a workspace of max_tokens per
// forward); returns each request's tokens.
// overlap: GeneratorOptions::Overlap::On, else Off; overlapped (when given) counts the rows fed on the device.
std::vector<std::vector<int32_t>> together(Fx& f, const std::vector<Spec>& specs, int batch, int64_t budget,
                                           int64_t max_tokens = 0, bool overlap = false, int* overlapped = nullptr) {
  auto m = f.model(batch, 64, max_tokens);
  GeneratorOptions o;
  o.prefill_budget = budget;
  o.overlap = overlap ? GeneratorOptions::Overlap::On : GeneratorOptions::Overlap::Off;
  Generator g(*m, o);
  std::vector<std::vector<int32_t>> got(specs.size());
  std::vector<bool> done(specs.size(), false);
  for (int step = 0; step < 1000; ++step) {
    for (size_t i = 0; i < specs.size(); ++i)
      if (specs[i].arrive == step) {
        Request r = request(specs[i]);
        r.on_done = [&, i](const Completion& c) {
          EXPECT_NE(c.stop, StopReason::Error) << c.error;
          got[i] = c.ids;
          done[i] = true;
        };
        g.submit(std::move(r));
      }
    EXPECT_LE(g.busy_slots(), batch);
    const bool more = g.step();
    if (overlapped) *overlapped += g.last_step().overlapped_rows;
    if (!overlap) EXPECT_EQ(g.last_step().overlapped_rows, 0);
    if (!more && step > 10) break;
  }
  EXPECT_EQ(m->outstanding(), 0) << "the generator went idle with a launched step unread";
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_TRUE(done[i]) << "request " << i << " never finished";
  return got;
}

TEST(Generator, ConcurrentGreedyRequestsEqualEachAlone) {
  Fx f;
  const std::vector<Spec> specs = scenario(false);
  std::vector<std::vector<int32_t>> want;
  for (const Spec& s : specs) want.push_back(alone(f, s));
  // Every slot free, a full queue (3 slots for 7 requests), and chunked prefill mixed with decodes.
  for (auto [batch, budget] : {std::pair{8, int64_t(0)}, std::pair{3, int64_t(0)}, std::pair{4, int64_t(5)}}) {
    SCOPED_TRACE("batch " + std::to_string(batch) + ", budget " + std::to_string(budget));
    EXPECT_EQ(together(f, specs, batch, budget), want);
  }
  // A workspace of 3 tokens per call: prompts in chunks of 3, the 5 decode rows in two calls.
  EXPECT_EQ(together(f, specs, 5, 0, 3), want);
}

TEST(Generator, OverlappedDecodeStepsGiveTheTokensOfStepsInTurn) {
  // Decode steps launched before the host reads the step before them (fed its picks on the device)
  // give exactly what steps run one after the other give, greedy and sampled, with requests arriving,
  // queueing and stopping mid-run; and the overlap does happen.
  Fx f;
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled" : "greedy");
    const std::vector<Spec> specs = scenario(sampled);
    for (auto [batch, budget] : {std::pair{8, int64_t(0)}, std::pair{3, int64_t(5)}}) {
      int overlapped = 0;
      const auto in_turn = together(f, specs, batch, budget, 0, false);
      EXPECT_EQ(together(f, specs, batch, budget, 0, true, &overlapped), in_turn);
      EXPECT_GT(overlapped, 0);
    }
    // A workspace of 3 tokens per call: the decode rows in calls of their own, read at once.
    EXPECT_EQ(together(f, specs, 5, 0, 3, true), together(f, specs, 5, 0, 3, false));
  }
}

TEST(Generator, ConcurrentSampledRequestsEqualEachAloneBySeed) {
  Fx f;
  const std::vector<Spec> specs = scenario(true);
  std::vector<std::vector<int32_t>> want;
  for (const Spec& s : specs) want.push_back(alone(f, s));
  for (auto [batch, budget] : {std::pair{8, int64_t(0)}, std::pair{2, int64_t(4)}}) {
    SCOPED_TRACE("batch " + std::to_string(batch) + ", budget " + std::to_string(budget));
    EXPECT_EQ(together(f, specs, batch, budget), want);
  }
  // The seed reaches the sampler: another seed, other tokens.
  Spec other = specs[1];
  other.sampling.seed += 1000;
  other.max_new = 14;
  Spec same = specs[1];
  same.max_new = 14;
  EXPECT_NE(alone(f, other), alone(f, same));
}

void cancellation_frees_the_slot(GeneratorOptions::Overlap overlap) {
  Fx f;
  auto m = f.model(2);
  GeneratorOptions o;
  o.overlap = overlap;
  Generator g(*m, o);
  auto flag = std::make_shared<std::atomic<bool>>(false);
  std::optional<Completion> a_done;
  int a_tokens = 0;
  Request a = request(Spec{seq(6, 1), 40});
  a.cancel = flag;
  a.on_token = [&](const TokenEvent&) { ++a_tokens; };
  a.on_done = [&](const Completion& c) { a_done = c; };
  g.submit(std::move(a));
  g.submit(request(Spec{seq(4, 9), 40}));
  std::optional<Completion> c_done;
  Request c = request(Spec{seq(5, 3), 4});
  c.on_done = [&](const Completion& x) { c_done = x; };
  g.submit(std::move(c));  // waits: both slots are busy
  for (int i = 0; i < 3; ++i) g.step();
  EXPECT_EQ(g.busy_slots(), 2);
  EXPECT_EQ(g.queued(), 1u);
  const int before = a_tokens;
  ASSERT_GT(before, 0);
  flag->store(true);  // as another thread would
  g.step();
  ASSERT_TRUE(a_done);
  EXPECT_EQ(a_done->stop, StopReason::Cancelled);
  EXPECT_EQ(a_tokens, before);  // nothing after the cancel
  EXPECT_EQ(int(a_done->ids.size()), before);
  EXPECT_EQ(g.queued(), 0u);  // the freed slot went to the waiting request in the same step
  EXPECT_EQ(g.busy_slots(), 2);
  g.run();
  ASSERT_TRUE(c_done);
  EXPECT_EQ(c_done->ids, alone(f, Spec{seq(5, 3), 4}));

  // A queued request cancelled by id never takes a slot.
  std::optional<Completion> q_done;
  g.submit(request(Spec{seq(3, 1), 30}));
  g.submit(request(Spec{seq(3, 2), 30}));
  Request q = request(Spec{seq(3, 3), 30});
  q.on_done = [&](const Completion& x) { q_done = x; };
  const RequestId qid = g.submit(std::move(q));
  g.step();
  g.cancel(qid);
  g.step();
  ASSERT_TRUE(q_done);
  EXPECT_EQ(q_done->stop, StopReason::Cancelled);
  EXPECT_EQ(q_done->slot, -1);
  EXPECT_TRUE(q_done->ids.empty());
  g.run();
  EXPECT_TRUE(g.idle());
}

TEST(Generator, CancellationFreesTheSlotWithinOneStep) {
  for (auto overlap : {GeneratorOptions::Overlap::Off, GeneratorOptions::Overlap::On}) {
    SCOPED_TRACE(overlap == GeneratorOptions::Overlap::On ? "overlapped steps" : "steps in turn");
    cancellation_frees_the_slot(overlap);
  }
}

// A text layer for tests: token id -> one letter, and one held-back "!" released at the end.
class Letters : public TextDecoder {
 public:
  std::string push(int32_t id) override { return std::string(1, char('a' + id % 26)); }
  std::string flush() override { return "!"; }
};

void stops_at_eos_stop_strings_and_max_tokens(GeneratorOptions::Overlap overlap) {
  Fx f;
  auto m = f.model(2);
  GeneratorOptions o;
  o.overlap = overlap;
  Generator g(*m, o);
  const Spec s{seq(7, 5), 12};
  const std::vector<int32_t> ids = alone(f, s);
  ASSERT_EQ(ids.size(), 12u);

  Request r = request(s);
  EXPECT_EQ(g.generate(std::move(r)).stop, StopReason::Length);

  // eos: the token is the last one, and releases no text.
  r = request(s);
  r.eos_ids = {ids[4]};
  r.text = std::make_unique<Letters>();
  std::string streamed;
  std::vector<int32_t> streamed_ids;
  r.on_token = [&](const TokenEvent& e) {
    streamed += e.text;
    streamed_ids.push_back(e.id);
  };
  Completion c = g.generate(std::move(r));
  const size_t at = size_t(std::find(ids.begin(), ids.end(), ids[4]) - ids.begin());
  EXPECT_EQ(c.stop, StopReason::Eos);
  EXPECT_EQ(c.ids, std::vector<int32_t>(ids.begin(), ids.begin() + long(at) + 1));
  std::string letters;
  for (size_t i = 0; i < at; ++i) letters += char('a' + ids[i] % 26);
  EXPECT_EQ(c.text, letters + "!");  // the held-back text comes last, with id -1
  EXPECT_EQ(streamed, c.text);
  EXPECT_EQ(streamed_ids.back(), -1);

  // A stop string over two tokens: the text stops before it, nothing after it is generated.
  std::string all;
  for (int32_t t : ids) all += char('a' + t % 26);
  const std::string stop = all.substr(5, 2);
  const size_t cut = all.find(stop);
  r = request(s);
  r.stop = {stop};
  r.text = std::make_unique<Letters>();
  streamed.clear();
  r.on_token = [&](const TokenEvent& e) { streamed += e.text; };
  c = g.generate(std::move(r));
  EXPECT_EQ(c.stop, StopReason::StopString);
  EXPECT_EQ(c.text, all.substr(0, cut));
  EXPECT_EQ(streamed, c.text);
  EXPECT_EQ(c.ids.size(), cut + 2);

  // The cache's end, under fit_capacity: 60 prompt tokens leave room for 5 new ones in 64 slots.
  r = request(Spec{seq(60, 1), 20});
  r.fit_capacity = true;
  c = g.generate(std::move(r));
  EXPECT_EQ(c.stop, StopReason::Capacity);
  EXPECT_EQ(c.ids.size(), 5u);
  r = request(Spec{seq(65, 1), 20});
  r.fit_capacity = true;
  c = g.generate(std::move(r));
  EXPECT_EQ(c.stop, StopReason::Capacity);
  EXPECT_TRUE(c.ids.empty());
  EXPECT_EQ(c.computed_prompt_tokens, 0);
}

TEST(Generator, StopsAtEosStopStringsAndMaxTokens) {
  for (auto overlap : {GeneratorOptions::Overlap::Off, GeneratorOptions::Overlap::On}) {
    SCOPED_TRACE(overlap == GeneratorOptions::Overlap::On ? "overlapped steps" : "steps in turn");
    stops_at_eos_stop_strings_and_max_tokens(overlap);
  }
}

TEST(Generator, PrefillBudgetBoundsEveryStep) {
  Fx f;
  auto m = f.model(3);
  GeneratorOptions o;
  o.prefill_budget = 5;
  Generator g(*m, o);
  int first_at = -1, step = 0;
  Request r = request(Spec{seq(17, 4), 3});
  r.on_token = [&](const TokenEvent& e) {
    if (e.index == 0) first_at = step;
  };
  g.submit(std::move(r));
  g.submit(request(Spec{seq(8, 2), 6}));
  int64_t total = 0;
  int mixed = 0;  // steps whose one forward carried decode rows and a prompt chunk together
  auto count = [&] {
    const StepStats& st = g.last_step();
    EXPECT_LE(st.prefill_tokens, 5);
    EXPECT_EQ(st.model_calls, st.decode_rows + st.prefill_rows > 0 ? 1 : 0) << "step " << step;
    mixed += st.decode_rows > 0 && st.prefill_rows > 0;
    total += st.prefill_tokens;
  };
  for (; g.step(); ++step) count();
  count();
  EXPECT_EQ(total, 17 + 8);
  EXPECT_GE(mixed, 1);
  EXPECT_EQ(first_at, 3);  // 17 tokens in chunks of 5: the fourth step completes the prompt
  Spec s{seq(17, 4), 3};
  Generator h(*m, o);
  EXPECT_EQ(h.generate(request(s)).ids, alone(f, s));
}

TEST(Generator, AFollowUpReusesItsSlotsCachedPrefix) {
  Fx f;
  auto m = f.model(2);
  Generator g(*m);
  const Spec first{seq(10, 3), 6};
  Completion c1 = g.generate(request(first));
  EXPECT_EQ(c1.computed_prompt_tokens, 10);
  // Another conversation in the other slot, so the follow-up must find its own.
  g.generate(request(Spec{seq(9, 100), 4}));
  Spec next = first;
  next.prompt.insert(next.prompt.end(), c1.ids.begin(), c1.ids.end());
  for (int32_t t : seq(4, 77)) next.prompt.push_back(t);
  next.max_new = 7;
  Completion c2 = g.generate(request(next));
  EXPECT_EQ(c2.slot, c1.slot);
  // The first prompt and all but the last generated token were cached.
  EXPECT_EQ(c2.computed_prompt_tokens, int64_t(next.prompt.size()) - (10 + 6 - 1));
  EXPECT_EQ(c2.ids, alone(f, next));
  // The same prompt again: only its last token is computed (its logits are needed).
  Completion c3 = g.generate(request(next));
  EXPECT_EQ(c3.computed_prompt_tokens, 1);
  EXPECT_EQ(c3.ids, c2.ids);
  // A pinned slot is used whatever it holds.
  Request pinned = request(next);
  pinned.slot = 1 - c1.slot;
  Completion c4 = g.generate(std::move(pinned));
  EXPECT_EQ(c4.slot, 1 - c1.slot);
  EXPECT_EQ(c4.ids, c2.ids);
  g.forget_all();
  EXPECT_EQ(g.generate(request(next)).computed_prompt_tokens, int64_t(next.prompt.size()));
}

TEST(Generator, BadRequestsAreRefusedBeforeCompute) {
  Fx f;
  auto m = f.model(2, 20);
  Generator g(*m);
  const std::vector<uint8_t> before = m->state().read_row(0);
  auto refused = [&](Request r, std::initializer_list<std::string> words) {
    test::expect_error([&] { g.submit(std::move(r)); }, words);
    EXPECT_TRUE(g.idle());
  };
  refused(request(Spec{{}, 4}), {"the prompt is empty"});
  refused(request(Spec{seq(12, 1), 10}), {"21 cache slots", "capacity is 20"});
  refused(request(Spec{seq(21, 1), 1}), {"21 cache slots", "capacity is 20"});
  refused(request(Spec{{1, 512}, 4}), {"512", "vocabulary of 512"});
  refused(request(Spec{{1, -3}, 4}), {"-3", "vocabulary"});
  refused(request(Spec{seq(3, 1), 0}), {"max_new_tokens must be at least 1"});
  Request r = request(Spec{seq(3, 1), 4});
  r.sampling.top_p = 0.0f;
  refused(std::move(r), {"--top-p"});
  r = request(Spec{seq(3, 1), 4});
  r.slot = 2;
  refused(std::move(r), {"slot 2", "[0, 2)"});
  r = request(Spec{seq(3, 1), 4});
  r.stop = {"x"};
  refused(std::move(r), {"stop strings need"});
  EXPECT_EQ(m->state().read_row(0), before);
  // Exactly full is accepted.
  EXPECT_EQ(g.generate(request(Spec{seq(12, 1), 9})).ids.size(), 9u);
}

TEST(Generator, AFailingCallbackStopsOnlyItsRequest) {
  Fx f;
  auto m = f.model(2);
  Generator g(*m);
  std::optional<Completion> bad, good, later;
  Request r = request(Spec{seq(5, 1), 10});
  r.on_token = [](const TokenEvent& e) {
    if (e.index == 2) throw std::runtime_error("the client went away");
  };
  r.on_done = [&](const Completion& c) { bad = c; };
  g.submit(std::move(r));
  const Spec other{seq(8, 3), 10};
  r = request(other);
  r.on_done = [&](const Completion& c) {
    good = c;
    // A completion may submit the next request from its callback.
    Request next = request(Spec{seq(4, 2), 3});
    next.on_done = [&](const Completion& x) { later = x; };
    g.submit(std::move(next));
  };
  g.submit(std::move(r));
  g.run();
  ASSERT_TRUE(bad && good && later);
  EXPECT_EQ(bad->stop, StopReason::Error);
  EXPECT_EQ(bad->error, "the client went away");
  EXPECT_EQ(bad->ids.size(), 3u);
  EXPECT_EQ(good->ids, alone(f, other));
  EXPECT_EQ(later->ids.size(), 3u);
  EXPECT_TRUE(g.idle());
}

TEST(Generator, WarnsPastMaxPositionEmbeddingsAtSubmit) {
  Fx f;
  auto m = f.model(1, 80);  // the fixture's max_position_embeddings is 64
  Generator g(*m);
  std::vector<std::string> warnings;
  Request r = request(Spec{seq(62, 1), 4});
  r.on_warning = [&](const std::string& w) { warnings.push_back(w); };
  g.submit(std::move(r));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("65 positions"), std::string::npos) << warnings[0];
  g.run();
}

}  // namespace
}  // namespace ingot
