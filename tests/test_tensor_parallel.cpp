// Tensor parallelism over the CPU backend (docs/tensor-parallel.md): the in-process communicator's
// collectives, the split rules, and every fixture family at TP=2 and TP=4 against TP=1: logits within
// allclose(1e-4, 1e-4), greedy tokens identical, every rank's logits bitwise equal, and the
// transformers reference check passing through the split model; fixtures with fewer KV (or linear key)
// heads than ranks replicate them. `ingot check --tp 2 --device cpu` runs through the command line.
// The streamed slice (one rank's weights built alone, as each rank process does) is bitwise the slice
// of the whole engine; ranks as processes load one rank's slice each, also from an engine directory.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "backend/backend.h"
#include "backend/forwarding_backend.h"
#include "dist/in_process.h"
#include "dist/rank_threads.h"
#include "io/engine.h"
#include "io/model_config.h"
#include "runtime/generator.h"
#include "runtime/reference_check.h"
#include "runtime/tp_split.h"
#include "test_helpers.h"
#include <nlohmann/json.hpp>

namespace ingot {
namespace {

// --- the communicator ---

TEST(InProcessGroup, AllReduceSumsInRankOrderOnEveryRank) {
  const int world = 3;
  const int64_t n = 1000;
  InProcessGroup g(world);
  RankThreads threads(g);
  // Values whose f32 sum depends on the order of the additions.
  std::vector<std::vector<float>> bufs(world, std::vector<float>(n));
  for (int r = 0; r < world; ++r)
    for (int64_t i = 0; i < n; ++i) bufs[size_t(r)][size_t(i)] = (r == 1 ? -1.0f : 1.0f) * (1e8f + float(i)) + 0.37f * float(r + i % 7);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[size_t(i)] = (bufs[0][size_t(i)] + bufs[1][size_t(i)]) + bufs[2][size_t(i)];
  threads.run([&](int r) { g.comm(r).all_reduce_sum(bufs[size_t(r)].data(), n, DType::F32); });
  for (int r = 0; r < world; ++r)
    EXPECT_EQ(std::memcmp(bufs[size_t(r)].data(), want.data(), n * sizeof(float)), 0) << "rank " << r;
}

TEST(InProcessGroup, AllReduceBf16RoundsOnce) {
  const int world = 4;
  InProcessGroup g(world);
  RankThreads threads(g);
  std::vector<std::vector<uint16_t>> bufs(world, std::vector<uint16_t>(8));
  for (int r = 0; r < world; ++r)
    for (int i = 0; i < 8; ++i) bufs[size_t(r)][size_t(i)] = f32_to_bf16(1.0f + 0.01f * float(r * 8 + i));
  std::vector<uint16_t> want(8);
  for (int i = 0; i < 8; ++i) {
    float s = 0;
    for (int r = 0; r < world; ++r) s += bf16_to_f32(bufs[size_t(r)][size_t(i)]);
    want[size_t(i)] = f32_to_bf16(s);
  }
  threads.run([&](int r) { g.comm(r).all_reduce_sum(bufs[size_t(r)].data(), 8, DType::BF16); });
  for (int r = 0; r < world; ++r) EXPECT_EQ(bufs[size_t(r)], want) << "rank " << r;
}

TEST(InProcessGroup, AllGatherInPlaceAndFromSeparateBuffers) {
  const int world = 4;
  InProcessGroup g(world);
  RankThreads threads(g);
  std::vector<std::vector<int32_t>> recv(world, std::vector<int32_t>(world * 3, -1));
  threads.run([&](int r) {
    int32_t* mine = recv[size_t(r)].data() + r * 3;
    for (int i = 0; i < 3; ++i) mine[i] = r * 10 + i;
    if (r % 2 == 0) {
      g.comm(r).all_gather(mine, recv[size_t(r)].data(), 3 * sizeof(int32_t));  // in place
    } else {
      const std::vector<int32_t> send(mine, mine + 3);
      g.comm(r).all_gather(send.data(), recv[size_t(r)].data(), 3 * sizeof(int32_t));
    }
  });
  std::vector<int32_t> want;
  for (int r = 0; r < world; ++r)
    for (int i = 0; i < 3; ++i) want.push_back(r * 10 + i);
  for (int r = 0; r < world; ++r) EXPECT_EQ(recv[size_t(r)], want) << "rank " << r;
}

TEST(InProcessGroup, AFailingRankStopsTheOthersWithItsError) {
  InProcessGroup g(3);
  RankThreads threads(g);
  std::atomic<int> stopped{0};
  test::expect_error(
      [&] {
        threads.run([&](int r) {
          if (r == 2) throw Error("rank two's own failure");
          try {
            g.comm(r).barrier();  // would wait forever for rank 2
          } catch (const GroupStopped& e) {
            EXPECT_NE(std::string(e.what()).find("rank 2 failed"), std::string::npos) << e.what();
            ++stopped;
            throw;
          }
        });
      },
      {"rank two's own failure"});
  EXPECT_EQ(stopped.load(), 2);
  // The group is usable again.
  std::vector<float> v(3, 1.0f);
  threads.run([&](int r) { g.comm(r).all_reduce_sum(&v[size_t(r)], 1, DType::F32); });
  EXPECT_EQ(v, std::vector<float>(3, 3.0f));
}

TEST(InProcessGroup, RefusesGroupSizesOutsideTheLimit) {
  test::expect_error([] { InProcessGroup g(0); }, {"0 ranks", "[1, 64]"});
  test::expect_error([] { InProcessGroup g(65); }, {"65 ranks", "[1, 64]"});
}

// --- the split ---

TEST(TensorParallelSplit, RanksOwnWholeGroupsOrReplicateAKvHead) {
  // 8 query heads over 4 KV heads, 2 ranks: 4 query heads and their 2 KV heads each.
  RankHeads h = rank_heads(8, 4, 2, 1);
  EXPECT_EQ(h.q.first, 4);
  EXPECT_EQ(h.q.count, 4);
  EXPECT_EQ(h.kv.first, 2);
  EXPECT_EQ(h.kv.count, 2);
  // 4 query heads over 2 KV heads, 4 ranks: KV head 0 on ranks 0 and 1, KV head 1 on ranks 2 and 3.
  for (int r = 0; r < 4; ++r) {
    h = rank_heads(4, 2, 4, r);
    EXPECT_EQ(h.q.first, r);
    EXPECT_EQ(h.q.count, 1);
    EXPECT_EQ(h.kv.first, r / 2);
    EXPECT_EQ(h.kv.count, 1);
  }
}

ModelSpec dense_spec(int64_t heads, int64_t kv_heads, int64_t intermediate) {
  ModelSpec s = load_model_spec(test::fixture("llama3"));
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.intermediate = intermediate;
  return s;
}

TEST(TensorParallelSplit, RefusesWhatDoesNotSplitNamingTheFlagAndField) {
  test::expect_error([] { check_tensor_parallel(dense_spec(4, 2, 128), 0); }, {"--tp 0", "[1, 64]"});
  test::expect_error([] { check_tensor_parallel(dense_spec(4, 2, 128), 65); }, {"--tp 65", "[1, 64]"});
  test::expect_error([] { check_tensor_parallel(dense_spec(4, 2, 128), 3); },
                     {"--tp 3", "4 attention heads (num_attention_heads)", "3 ranks"});
  test::expect_error([] { check_tensor_parallel(dense_spec(12, 3, 128), 2); },
                     {"--tp 2", "6 of the 12", "whole groups", "num_key_value_heads"});
  test::expect_error([] { check_tensor_parallel(dense_spec(4, 2, 130), 4); }, {"--tp 4", "intermediate_size 130"});
  ModelSpec q35 = load_model_spec(test::fixture("qwen3_5_pattern"));  // 2 value heads
  test::expect_error([&] { check_tensor_parallel(q35, 4); }, {"--tp 4", "linear_num_value_heads"});
  check_tensor_parallel(dense_spec(4, 2, 128), 1);
  check_tensor_parallel(dense_spec(4, 2, 128), 4);
}

// INT4 column cuts take whole groups: a rank's share of o_proj's input that would cut a group is
// refused naming the weight, the rank's columns and the group size (the fixture: 4 heads of 16, so 2
// ranks hold 32 columns of o_proj's 64 each: groups of 64 cannot split).
TEST(TensorParallelSplit, RefusesInt4ColumnCutsThatSplitAGroup) {
  Engine e = random_engine(load_model_spec(test::fixture("llama3")), DType::F32, 1);
  quantize_engine_int4(e, 64);
  test::expect_error([&] { shard_engine(e, 2, 1); }, {"--tp 2", "INT4 weight", ".wo", "columns 32..63", "groups of 64"});
  Engine g32 = random_engine(load_model_spec(test::fixture("llama3")), DType::F32, 1);
  quantize_engine_int4(g32, 32);
  EXPECT_NO_THROW(shard_engine(g32, 2, 1));
  // The same refusals from the spec alone (what the loader asks before reading any weight).
  const ModelSpec spec = load_model_spec(test::fixture("llama3"));
  QuantConfig q;
  q.group_size = 64;
  test::expect_error([&] { check_int4_split(spec, q, 2); }, {"--tp 2", "INT4 weight", ".wo", "groups of 64"});
  EXPECT_NO_THROW(check_int4_split(spec, q, 1));
  q.group_size = 32;
  EXPECT_NO_THROW(check_int4_split(spec, q, 2));
  test::expect_error([&] { check_int4_split(spec, q, 4); }, {"--tp 4", ".wo", "columns 0..15", "groups of 32"});
  q.act_order = true;
  test::expect_error([&] { check_int4_split(spec, q, 2); }, {"--tp 2", "act-order"});
  q.act_order = false;
  q.group_size = -1;  // one group a row: any cut keeps it
  EXPECT_NO_THROW(check_int4_split(spec, q, 4));
}

// --- the streamed slice: one rank's weights built alone (runtime/tp_split.h) ---

void expect_same_slice(const Engine& want, const Engine& got, const std::string& what) {
  EXPECT_EQ(spec_to_json(want.spec), spec_to_json(got.spec)) << what;
  EXPECT_EQ(want.weight_dtype, got.weight_dtype) << what;
  ASSERT_EQ(want.weights.size(), got.weights.size()) << what;
  for (const auto& [name, t] : want.weights) {
    const HostTensor* g = got.find(name);
    ASSERT_NE(g, nullptr) << what << ": no '" << name << "'";
    EXPECT_EQ(t.dtype(), g->dtype()) << what << ": " << name;
    ASSERT_EQ(t.shape(), g->shape()) << what << ": " << name;
    ASSERT_EQ(t.nbytes(), g->nbytes()) << what << ": " << name;
    EXPECT_EQ(std::memcmp(t.data(), g->data(), t.nbytes()), 0) << what << ": '" << name << "' differs";
  }
}

size_t largest_weight(const Engine& e) {
  size_t n = 0;
  for (const auto& [name, t] : e.weights) n = std::max(n, t.nbytes());
  return n;
}

// What the streaming build held at most: its slice and the one whole weight it was slicing, never
// the whole model; and the slice is no bigger than shard_engine's.
void expect_held_one_whole_weight(const RankBuildStats& st, const Engine& whole, const Engine& slice,
                                  const std::string& what) {
  EXPECT_EQ(st.largest_whole_bytes, largest_weight(whole)) << what;
  EXPECT_LE(st.peak_bytes, slice.weight_bytes() + st.largest_whole_bytes) << what;
  EXPECT_GT(st.peak_bytes, 0u) << what;
}

class StreamedSlice : public ::testing::TestWithParam<std::string> {};

// Every rank of 2 and 4, from the checkpoint folder and from random weights of its config: bitwise
// shard_engine's slice of the whole engine (every name, shape, dtype and byte).
TEST_P(StreamedSlice, EqualsTheShardOfTheWholeEngine) {
  const std::string dir = test::fixture(GetParam());
  const Engine built = build_engine(dir);
  const ModelSpec spec = load_model_spec(dir);
  const Engine random = random_engine(spec, DType::BF16, 11);
  for (int world : {2, 4}) {
    for (int r = 0; r < world; ++r) {
      const std::string what = GetParam() + " rank " + std::to_string(r) + " of " + std::to_string(world);
      RankBuildStats st;
      const Engine a = build_rank_engine(dir, {}, world, r, &st);
      expect_same_slice(shard_engine(built, world, r), a, what + " (checkpoint)");
      expect_held_one_whole_weight(st, built, a, what + " (checkpoint)");
      RankBuildStats st2;
      const Engine b = random_rank_engine(spec, DType::BF16, 11, world, r, &st2);
      expect_same_slice(shard_engine(random, world, r), b, what + " (random)");
      expect_held_one_whole_weight(st2, random, b, what + " (random)");
    }
  }
  // A dtype asked for goes through the streamed build as through the whole one.
  BuildOptions bf16;
  bf16.dtype = DType::BF16;
  expect_same_slice(shard_engine(build_engine(dir, bf16), 2, 1), build_rank_engine(dir, bf16, 2, 1), GetParam() + " bf16");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, StreamedSlice, ::testing::Values("qwen3", "llama3", "qwen3_5_text"));

// Random weights: each weight's values depend only on (seed, its name), so a weight made alone is the
// weight made with all the others; different seeds still differ.
TEST(StreamedSlice, RandomWeightsDependOnlyOnSeedAndName) {
  const ModelSpec spec = load_model_spec(test::fixture("qwen3"));
  const Engine a = random_engine(spec, DType::F32, 5), b = random_engine(spec, DType::F32, 6);
  const HostTensor& x = a.get("layers.1.wo");
  const HostTensor& y = b.get("layers.1.wo");
  EXPECT_NE(std::memcmp(x.data(), y.data(), x.nbytes()), 0);
  EXPECT_NE(std::memcmp(a.get("layers.0.wo").data(), x.data(), x.nbytes()), 0);  // names differ, values differ
  // The same weight made by a sink that keeps only it.
  HostTensor alone;
  random_engine(spec, DType::F32, 5, [&](Engine&, const WeightSpec& w, HostTensor&& t) {
    if (w.name == "layers.1.wo") alone = std::move(t);
  });
  ASSERT_EQ(alone.nbytes(), x.nbytes());
  EXPECT_EQ(std::memcmp(alone.data(), x.data(), x.nbytes()), 0);
}

TEST(StreamedSlice, RefusesInt4) {
  BuildOptions o;
  o.int4_group_size = 32;
  test::expect_error([&] { build_rank_engine(test::fixture("llama3"), o, 2, 0); }, {"--tp 2", "INT4"});
  test::expect_error([&] { build_rank_engine(test::fixture("int4/gptq_v1_sym_g32"), {}, 2, 0); },
                     {"INT4", "one rank's share", "build the whole engine"});
}

// --- whole models against TP=1 ---

// Logits of every token of the reference rows (prefill), each row in its own cache row.
Batch prefill_batch(const Reference& ref) {
  Batch b;
  for (int64_t r = 0; r < ref.rows(); ++r) {
    BatchRow row;
    row.row = int(r);
    const int64_t* ids = ref.input_ids.as<int64_t>() + r * ref.seq();
    for (int64_t i = 0; i < ref.seq(); ++i) row.tokens.push_back(int32_t(ids[i]));
    row.all_logits = true;
    b.rows.push_back(std::move(row));
  }
  return b;
}

void expect_close(const HostTensor& want, const HostTensor& got, const std::string& what) {
  ASSERT_EQ(want.shape(), got.shape()) << what;
  const float* a = want.as<float>();
  const float* b = got.as<float>();
  double worst = 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    worst = std::max(worst, d);
    bad += !(d <= 1e-4 + 1e-4 * std::fabs(double(a[i])));
  }
  EXPECT_EQ(bad, 0) << what << ": max |dlogit| " << worst;
}

std::vector<int32_t> greedy(Model& m, const std::vector<int32_t>& prompt, int n) {
  Request r;
  r.prompt = prompt;
  r.max_new_tokens = n;
  return Generator(m).generate(std::move(r)).ids;
}

// Two rows decoded step by step through Model::decode after a batched prefill.
std::vector<int32_t> decode_steps(Model& m, const Reference& ref, int steps) {
  Batch b;
  std::vector<int> rows;
  std::vector<int32_t> tok;
  std::vector<int64_t> at;
  for (int r = 0; r < 2; ++r) {
    const int64_t len = 3 + 4 * r;
    BatchRow row;
    row.row = r;
    for (int64_t i = 0; i < len; ++i) row.tokens.push_back(int32_t(ref.input_ids.as<int64_t>()[r * ref.seq() + i]));
    b.rows.push_back(row);
    rows.push_back(r);
    at.push_back(len);
  }
  HostTensor lg = m.forward(b);
  for (int r = 0; r < 2; ++r) {
    const float* l = lg.as<float>() + r * lg.shape()[1];
    tok.push_back(int32_t(std::max_element(l, l + lg.shape()[1]) - l));
  }
  std::vector<int32_t> out = tok;
  for (int s = 0; s < steps; ++s) {
    tok = m.decode(rows, tok, at);
    for (int64_t& a : at) ++a;
    out.insert(out.end(), tok.begin(), tok.end());
  }
  return out;
}

class TensorParallel : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TensorParallel, MatchesOneRank) {
  const auto& [name, world] = GetParam();
  const std::string dir = test::fixture(name);
  Reference ref = load_reference(dir + "/reference.safetensors");
  Engine eng = build_engine(dir);
  RuntimeOptions rt;
  rt.max_batch = int(ref.rows());
  rt.capacity = reference_capacity(ref);
  auto be1 = make_cpu_backend();
  Model one(eng, *be1, rt);
  rt.tp = world;
  auto be = make_cpu_backend();
  Model tp(eng, *be, rt);
  ASSERT_EQ(tp.tp_world(), world);
  EXPECT_EQ(one.tp_world(), 1);

  // Each rank's cache holds its KV heads only.
  const ModelSpec rs = rank_spec(eng.spec, world, 0);
  EXPECT_EQ(tp.state().bytes(), State::bytes(rs, tp.plan().options, DType::F32).value());

  // Prefill logits: within f32 tolerance of one rank, bitwise equal across ranks.
  const Batch b = prefill_batch(ref);
  const HostTensor want = one.forward(b);
  const std::vector<HostTensor> got = tp.forward_ranks(b);
  ASSERT_EQ(got.size(), size_t(world));
  expect_close(want, got[0], name + " prefill");
  for (int r = 1; r < world; ++r)
    EXPECT_EQ(std::memcmp(got[0].data(), got[size_t(r)].data(), got[0].nbytes()), 0) << "rank " << r << " differs from rank 0";

  // Greedy tokens: the Generator (launch_forward + decode) and Model::decode over two rows.
  const std::vector<int32_t> prompt(ref.input_ids.as<int64_t>(), ref.input_ids.as<int64_t>() + 5);
  const int n = int(std::min<int64_t>(8, rt.capacity - 5));
  const std::vector<int32_t> g1 = greedy(one, prompt, n), gt = greedy(tp, prompt, n);
  EXPECT_EQ(g1.size(), size_t(n));
  EXPECT_EQ(g1, gt);
  EXPECT_EQ(decode_steps(one, ref, 4), decode_steps(tp, ref, 4));

  // The transformers reference through every forward path of the split model.
  CheckOptions co;
  for (const CaseResult& c : run_reference_check(tp, ref, co)) {
    SCOPED_TRACE(name + " tp " + std::to_string(world) + " " + c.mode);
    EXPECT_TRUE(c.allclose) << "max |dlogit| " << c.max_abs;
    EXPECT_EQ(c.agree, c.total);
    EXPECT_GT(c.total, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallel,
                         ::testing::Values(std::tuple{"llama3", 2}, std::tuple{"llama3", 4}, std::tuple{"qwen2", 2},
                                           std::tuple{"qwen2", 4}, std::tuple{"qwen3", 2}, std::tuple{"qwen3", 4},
                                           std::tuple{"qwen3_swa", 2}, std::tuple{"qwen3_swa", 4},
                                           std::tuple{"qwen3_5_text", 2}, std::tuple{"qwen3_5_text", 4},
                                           std::tuple{"qwen3_5_wrapped", 2}, std::tuple{"qwen3_5_pattern", 2}),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param));
                         });

// The split model against the same engine on one rank: prefill logits of a two-row batch within the
// f32 tolerance, every rank's bitwise equal, greedy tokens identical; with `ref`, the transformers
// reference through every forward path of the split model; `also` sees the split model first.
void expect_split_matches_one_rank(const Engine& eng, int world, const std::string& what, const Reference* ref,
                                   const std::function<void(Model&)>& also = {}) {
  RuntimeOptions rt;
  rt.max_batch = 2;
  rt.capacity = ref ? reference_capacity(*ref) : 24;
  if (ref) rt.max_batch = int(ref->rows());
  auto be1 = make_cpu_backend(), be = make_cpu_backend();
  Model one(eng, *be1, rt);
  rt.tp = world;
  Model tp(eng, *be, rt);
  ASSERT_EQ(tp.tp_world(), world);
  if (also) also(tp);
  Batch b;
  b.rows.push_back(BatchRow{0, {1, 2, 3, 40, 41, 42, 7, 9, 11}, 0, {}, true});
  b.rows.push_back(BatchRow{1, {5, 6, 8, 10}, 0, {}, true});
  const HostTensor want = one.forward(b);
  const std::vector<HostTensor> got = tp.forward_ranks(b);
  ASSERT_EQ(got.size(), size_t(world));
  expect_close(want, got[0], what);
  for (int r = 1; r < world; ++r)
    EXPECT_EQ(std::memcmp(got[0].data(), got[size_t(r)].data(), got[0].nbytes()), 0) << what << ": rank " << r;
  EXPECT_EQ(greedy(one, {3, 4, 5, 6, 7}, 10), greedy(tp, {3, 4, 5, 6, 7}, 10)) << what;
  if (!ref) return;
  CheckOptions co;
  for (const CaseResult& c : run_reference_check(tp, *ref, co)) {
    SCOPED_TRACE(what + " " + c.mode);
    EXPECT_TRUE(c.allclose) << "max |dlogit| " << c.max_abs;
    EXPECT_EQ(c.agree, c.total);
    EXPECT_GT(c.total, 0);
  }
}

// TP = 8 (and 4) on every fixture family's architecture: the fixtures have 4 query heads, too few for
// 8 ranks, so each family's spec is widened to 8 query heads (keeping its 1 or 2 KV heads: every KV head
// replicated over 4 or 8 ranks) and, for Qwen3.5, 8 linear-attention value heads over its key heads,
// with random weights; the split model against one rank as MatchesOneRank does (prefill logits within
// the f32 tolerance, every rank's bitwise equal, greedy tokens and two-row decode identical).
class TensorParallelWide : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TensorParallelWide, MatchesOneRank) {
  const auto& [name, world] = GetParam();
  ModelSpec s = load_model_spec(test::fixture(name));
  const int64_t kv_before = s.kv_heads;
  s.heads = 8;
  s.intermediate = 8 * ((s.intermediate + 7) / 8);
  if (s.has_linear_layers()) s.linear.v_heads = 8;
  ASSERT_LT(s.kv_heads, world) << "the case is meant to replicate KV heads";
  const Engine eng = random_engine(s, DType::F32, 5);
  expect_split_matches_one_rank(eng, world, name + " widened, tp " + std::to_string(world), nullptr, [&](Model& tp) {
    const ModelSpec rs = rank_spec(eng.spec, world, world - 1);
    EXPECT_EQ(rs.kv_heads, 1) << "rank " << world - 1 << " of " << world << " holds one (replicated) KV head of "
                              << kv_before;
    EXPECT_EQ(tp.state().bytes(), State::bytes(rs, tp.plan().options, DType::F32).value());
  });
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelWide,
                         ::testing::Values(std::tuple{"llama3", 8}, std::tuple{"qwen2", 8}, std::tuple{"qwen3", 8},
                                           std::tuple{"qwen3_swa", 8}, std::tuple{"qwen3_5_text", 8},
                                           std::tuple{"qwen3_5_wrapped", 4}, std::tuple{"qwen3_5_wrapped", 8},
                                           std::tuple{"qwen3_5_pattern", 4}, std::tuple{"qwen3_5_pattern", 8}),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param));
                         });

// INT4 engines split over ranks (shard_engine: the packed rows with their scales and zeros, whole
// groups of columns): the split model against the same INT4 engine on one rank (prefill logits within
// the f32 tolerance, every rank's bitwise equal, greedy tokens identical) and, for the published-format
// fixtures, the transformers reference of their dequantized weights through every forward path.
// Fixtures whose split would cut a group (groups of 64 and whole rows re-expressed as 64 against
// o_proj's 32 columns a rank) or an act-order weight's columns are refused, naming which.
TEST(TensorParallelInt4, PublishedFormatsSplitOrAreRefusedNamingWhy) {
  int split = 0;
  for (const std::string name : {"awq_gemm_g32", "ct_channel_asym", "ct_channel_sym_qwen2", "ct_group_asym_g64",
                                 "ct_group_sym_g32_qwen3", "gptq_v1_asym_actorder_g32", "gptq_v1_sym_g32",
                                 "gptq_v2_asym_row_qwen2", "gptq_v2_sym_actorder_g64_qwen3"}) {
    const std::string dir = test::fixture("int4/" + name);
    const Engine eng = build_engine(dir);
    ASSERT_TRUE(eng.quant) << name;
    const QuantConfig& q = *eng.quant;
    // What the split must do: refuse act-order (o_proj and down are cut by columns), and group sizes
    // that do not divide a rank's 32 o_proj columns; split the rest.
    const bool refuse = q.act_order || 32 % q.group(eng.spec.heads * eng.spec.head_dim) != 0;
    if (refuse) {
      test::expect_error([&] { shard_engine(eng, 2, 0); },
                         {"--tp 2", "INT4 weight", q.act_order ? "act-order" : "cut its groups"});
      continue;
    }
    ++split;
    const Reference ref = load_reference(dir + "/reference.safetensors");
    expect_split_matches_one_rank(eng, 2, name + " tp 2", &ref);
  }
  EXPECT_GE(split, 3) << "too few published-format fixtures split: the test would say little";
}

TEST(TensorParallelInt4, RoundToNearestSplitsOnEveryFamily) {
  for (const std::string name : {"llama3", "qwen2", "qwen3", "qwen3_swa", "qwen3_5_text"}) {
    Engine eng = random_engine(load_model_spec(test::fixture(name)), DType::F32, 3);
    quantize_engine_int4(eng, 32);
    expect_split_matches_one_rank(eng, 2, name + " RTN g32 tp 2", nullptr);
  }
  // An untied INT4 LM head, split by the vocabulary like the 16-bit one.
  Engine head = random_engine(load_model_spec(test::fixture("llama3")), DType::F32, 4);
  quantize_engine_int4(head, 32, "--group-size", true);
  ASSERT_TRUE(head.find("lm_head.scales"));
  expect_split_matches_one_rank(head, 2, "llama3 INT4 LM head tp 2", nullptr);
  const Engine r1 = shard_engine(head, 2, 1);
  EXPECT_EQ(r1.get("lm_head").shape()[0], r1.spec.tp.vocab_rows);
}

// The llama3 fixture's shapes with another vocabulary, random f32 weights of `seed`.
Engine llama3_with_vocab(int64_t vocab, uint64_t seed) {
  ModelSpec s = load_model_spec(test::fixture("llama3"));
  s.vocab = vocab;
  return random_engine(s, DType::F32, seed);
}

// A vocabulary that is not a multiple of the ranks: the last rank's LM-head rows are padded, and the
// padding never reaches the logits.
TEST(TensorParallelModel, PaddedVocabularyMatchesOneRank) {
  Engine eng = llama3_with_vocab(509, 7);
  RuntimeOptions rt;
  rt.max_batch = 2;
  rt.capacity = 16;
  auto be1 = make_cpu_backend(), be = make_cpu_backend();
  Model one(eng, *be1, rt);
  rt.tp = 4;
  Model tp(eng, *be, rt);
  Batch b;
  b.rows.push_back(BatchRow{0, {1, 2, 3, 500, 508}, 0, {}, true});
  b.rows.push_back(BatchRow{1, {7, 8}, 0, {}, true});
  const HostTensor want = one.forward(b);
  const std::vector<HostTensor> got = tp.forward_ranks(b);
  ASSERT_EQ(got[0].shape(), (Shape{7, 509}));
  expect_close(want, got[0], "vocab 509 over 4 ranks");
  for (int r = 1; r < 4; ++r) EXPECT_EQ(std::memcmp(got[0].data(), got[size_t(r)].data(), got[0].nbytes()), 0);
  EXPECT_EQ(greedy(one, {5, 6, 7}, 6), greedy(tp, {5, 6, 7}, 6));
}

// The split-pick tests' two prompts (row 0: 1 2 3 4 5, row 1: `second`) launched on one rank and on
// the split model: each model's picks (the callers assert them equal).
std::pair<std::vector<int32_t>, std::vector<int32_t>> launch_two_prompts(Model& one, Model& tp,
                                                                         std::vector<int32_t> second = {9, 8, 7}) {
  Batch prompt;
  prompt.rows.push_back(BatchRow{0, {1, 2, 3, 4, 5}, 0, {}, false});
  prompt.rows.push_back(BatchRow{1, std::move(second), 0, {}, false});
  one.launch_forward(prompt);
  tp.launch_forward(prompt);
  std::vector<int32_t> t1 = one.finish_launch(), t2 = tp.finish_launch();
  return {std::move(t1), std::move(t2)};
}

// A vocabulary of 9 over 4 ranks leaves rank 3 no vocabulary rows (3, 3, 3, 0): every split pick
// that rank 0 merges holds "no finite logit" and no candidate from rank 3, in calls of 2 rows, then 1,
// then 2 again (a gather of one call's n lays the ranks' parts out where another n's were), greedy and
// then drawn with top_k; and the tokens are one rank's.
TEST(TensorParallelModel, RankWithoutVocabularyRowsMatchesOneRank) {
  struct Inspect : ForwardingBackend {
    using ForwardingBackend::ForwardingBackend;
    int merges = 0, wrong = 0;
    void argmax_merge(const ArgmaxPart* p, int64_t rows, int world, int32_t* o) override {
      for (int64_t r = 0; r < rows; ++r) wrong += p[(world - 1) * rows + r].index != kPartNoFinite;
      ++merges;
      ForwardingBackend::argmax_merge(p, rows, world, o);
    }
    void sample_merge(const SampleCandidate* p, int64_t rows, int world, const SampleState& st, int32_t* o) override {
      for (int64_t r = 0; r < rows; ++r) {
        const SampleCandidate* c = p + ((world - 1) * rows + r) * kSampleCandidates;
        wrong += c[0].flag != kPartNoFinite;
        for (int k = 0; k < kSampleCandidates; ++k) wrong += c[k].key != 0;
      }
      ++merges;
      ForwardingBackend::sample_merge(p, rows, world, st, o);
    }
  };
  Engine eng = llama3_with_vocab(9, 3);
  RuntimeOptions rt;
  rt.max_batch = 2;
  rt.capacity = 32;
  auto be1 = make_cpu_backend();
  Inspect be(make_cpu_backend());
  Model one(eng, *be1, rt);
  rt.tp = 4;
  Model tp(eng, be, rt);
  for (const bool drawn : {false, true}) {
    SCOPED_TRACE(drawn ? "top_k draws" : "greedy");
    if (drawn) {
      SamplingParams sp;
      sp.temperature = 1.5f, sp.top_k = 4, sp.seed = 21;
      for (Model* m : {&one, &tp}) m->set_sampling(0, sp), m->set_sampling(1, sp);
    }
    auto [t, t_tp] = launch_two_prompts(one, tp, {8, 7, 6});  // tokens below the vocabulary of 9
    ASSERT_EQ(t, t_tp);
    std::vector<int64_t> at = {5, 3};
    for (int step = 0; step < 6; ++step) {
      const std::vector<int> rows = step == 2 || step == 3 ? std::vector<int>{1} : std::vector<int>{0, 1};
      std::vector<int32_t> tok;
      std::vector<int64_t> w;
      for (int r : rows) tok.push_back(t[size_t(r)]), w.push_back(at[size_t(r)]);
      const std::vector<int32_t> a = one.decode(rows, tok, w), b = tp.decode(rows, tok, w);
      ASSERT_EQ(a, b) << "step " << step;
      for (size_t i = 0; i < rows.size(); ++i) t[size_t(rows[i])] = a[i], ++at[size_t(rows[i])];
    }
  }
  EXPECT_EQ(be.merges, 14);
  EXPECT_EQ(be.wrong, 0) << "rank 3's parts as rank 0 merged them";
}

// Greedy steps of a split model pick from each rank's share of the vocabulary without gathering the
// logits; decode_logprobs gathers them afterwards, from the head's input the step left: the same
// log-probabilities as one rank's (f32 tolerance), after a decode step and after a launch_forward, and a
// sampled step in between (which gathers its logits) changes nothing.
TEST(TensorParallelModel, LogprobsAfterASplitPickMatchOneRank) {
  Engine eng = build_engine(test::fixture("llama3"));
  RuntimeOptions rt;
  rt.max_batch = 2;
  rt.capacity = 32;
  auto be1 = make_cpu_backend(), be = make_cpu_backend();
  Model one(eng, *be1, rt);
  rt.tp = 2;
  Model tp(eng, *be, rt);
  auto expect_same = [&](const std::string& what) {
    const Model::StepLogprobs a = one.decode_logprobs(4), b = tp.decode_logprobs(4);
    ASSERT_EQ(a.chosen.size(), b.chosen.size()) << what;
    EXPECT_EQ(a.top_ids, b.top_ids) << what;
    for (size_t i = 0; i < a.chosen.size(); ++i) EXPECT_NEAR(a.chosen[i], b.chosen[i], 1e-4f) << what;
    for (size_t i = 0; i < a.top.size(); ++i) EXPECT_NEAR(a.top[i], b.top[i], 1e-4f) << what;
  };
  auto [t1, t2] = launch_two_prompts(one, tp);
  ASSERT_EQ(t1, t2);
  expect_same("launch_forward");
  std::vector<int64_t> at = {5, 3};
  for (int step = 0; step < 4; ++step) {
    if (step == 2) {
      SamplingParams sp;
      sp.temperature = 0.9f;
      sp.seed = 5;
      one.set_sampling(1, sp);
      tp.set_sampling(1, sp);
    }
    t1 = one.decode({0, 1}, t1, at);
    t2 = tp.decode({0, 1}, t2, at);
    ASSERT_EQ(t1, t2) << "step " << step;
    if (step != 1) expect_same("decode step " + std::to_string(step));  // step 1: logits left ungathered
    for (int64_t& i : at) ++i;
  }
}

// Drawn steps of a split model whose rows all keep at most kSampleCandidates candidates (top_k set)
// draw from the ranks' candidate lists without gathering the logits (rank 0's backend sees sample_part,
// never the whole-row sample op): the same tokens as one rank's, prompt and decode steps, with the
// penalties, top-p and min-p on; decode_logprobs afterwards gathers and matches; a row of top_k 0 then
// makes its steps gather and draw over whole rows, still as one rank does.
TEST(TensorParallelModel, SplitDrawMatchesOneRank) {
  struct Counting : ForwardingBackend {
    using ForwardingBackend::ForwardingBackend;
    int parts = 0, whole = 0;
    void sample_part(const Mat& l, int64_t off, const SampleState& st, SampleCandidate* o) override {
      ++parts;
      ForwardingBackend::sample_part(l, off, st, o);
    }
    void sample(const Mat& l, const SampleState& st, int32_t* o) override {
      ++whole;
      ForwardingBackend::sample(l, st, o);
    }
  };
  Engine eng = build_engine(test::fixture("llama3"));
  for (int world : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(world));
    RuntimeOptions rt;
    rt.max_batch = 2;
    rt.capacity = 32;
    auto be1 = make_cpu_backend();
    Counting be(make_cpu_backend());
    Model one(eng, *be1, rt);
    rt.tp = world;
    Model tp(eng, be, rt);
    SamplingParams a, b;
    a.temperature = 0.8f, a.top_k = 5, a.top_p = 0.9f, a.repetition_penalty = 1.2f, a.seed = 11;
    b.temperature = 1.1f, b.top_k = 40, b.min_p = 0.02f, b.frequency_penalty = 0.3f, b.seed = 12;
    for (Model* m : {&one, &tp}) m->set_sampling(0, a), m->set_sampling(1, b);
    auto [t1, t2] = launch_two_prompts(one, tp);
    ASSERT_EQ(t1, t2);
    std::vector<int64_t> at = {5, 3};
    std::vector<int32_t> drawn;
    for (int step = 0; step < 8; ++step) {
      if (step == 6) {
        b.top_k = 0;
        one.set_sampling(1, b);
        tp.set_sampling(1, b);
        EXPECT_EQ(be.whole, 0) << "a step of top_k rows gathered its logits";
        EXPECT_GE(be.parts, 7);
      }
      t1 = one.decode({0, 1}, t1, at);
      t2 = tp.decode({0, 1}, t2, at);
      ASSERT_EQ(t1, t2) << "step " << step;
      drawn.insert(drawn.end(), t1.begin(), t1.end());
      if (step == 3) {
        const Model::StepLogprobs x = one.decode_logprobs(3), y = tp.decode_logprobs(3);
        EXPECT_EQ(x.top_ids, y.top_ids);
        for (size_t i = 0; i < x.chosen.size(); ++i) EXPECT_NEAR(x.chosen[i], y.chosen[i], 1e-4f);
      }
      for (int64_t& i : at) ++i;
    }
    EXPECT_GT(be.whole, 0) << "the top_k 0 row's steps drew over whole rows";
    // The draws are draws: the tokens are not one token repeated.
    EXPECT_GT(std::set<int32_t>(drawn.begin(), drawn.end()).size(), size_t(3));
  }
}

// A bad call is refused on every rank before any collective, and the group keeps working.
TEST(TensorParallelModel, BadCallIsRefusedAndTheGroupRecovers) {
  Engine eng = build_engine(test::fixture("qwen3"));
  RuntimeOptions rt;
  rt.max_batch = 1;
  rt.capacity = 8;
  rt.tp = 2;
  auto be = make_cpu_backend();
  Model tp(eng, *be, rt);
  test::expect_error([&] { tp.forward(Batch{{BatchRow{0, {1, 100000}, 0, {}, false}}}); }, {"token id 100000", "vocabulary of 512"});
  test::expect_error([&] { tp.forward(Batch{{BatchRow{0, std::vector<int32_t>(9, 1), 0, {}, false}}}); }, {"capacity"});
  EXPECT_EQ(tp.forward(Batch{{BatchRow{0, {1, 2, 3}, 0, {}, false}}}).shape(), (Shape{1, 512}));
}

TEST(TensorParallelModel, RefusesANonHostBackendOrUnsplittableModel) {
  Engine eng = build_engine(test::fixture("llama3"));  // 4 heads
  RuntimeOptions rt;
  rt.max_batch = 1;
  rt.capacity = 8;
  rt.tp = 3;
  auto be = make_cpu_backend();
  test::expect_error([&] { Model m(eng, *be, rt); }, {"--tp 3", "num_attention_heads"});
}

// `ingot check --tp 2 --device cpu` from the command line.
TEST(TensorParallelCli, CheckPassesAtTp2) {
  const std::string cmd = std::string(INGOT_BINARY) + " check --tp 2 --device cpu --model " + test::fixture("qwen3") +
                          " --reference " + test::fixture("qwen3") + "/reference.safetensors > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// A published INT4 folder split over two ranks from the command line: the transformers reference of its
// dequantized weights passes, with the ranks as threads (the whole engine built, then sliced:
// TpGroup::make) and as processes (each process builds the whole INT4 engine and keeps its share).
// And --quantize int4 over rank processes gives the same logits as one rank.
TEST(TensorParallelCli, Int4CheckPassesAtTp2) {
  const std::string dir = test::fixture("int4/gptq_v1_sym_g32");
  for (const std::string env : {"", "INGOT_TP_PROCESSES=1 "}) {
    const std::string cmd = env + std::string(INGOT_BINARY) + " check --tp 2 --device cpu --model " + dir +
                            " --reference " + dir + "/reference.safetensors > /dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  const auto prefill_line = [](const std::string& env, const std::string& tp) {
    const std::string fix = test::fixture("llama3");
    const std::string cmd = env + std::string(INGOT_BINARY) + " check --device cpu --quantize int4 --group-size 32 --model " +
                            fix + " --reference " + fix + "/reference.safetensors" + tp + " 2>&1";
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);  // fails: INT4 against the unquantized reference; the figures are what is compared
    const size_t at = out.find("prefill ");
    return at == std::string::npos ? out : out.substr(at, out.find('\n', at) - at);
  };
  const std::string one = prefill_line("", ""), two = prefill_line("INGOT_TP_PROCESSES=1 ", " --tp 2");
  EXPECT_EQ(one.rfind("prefill ", 0), 0u) << one;
  EXPECT_EQ(one, two);
}

}  // namespace
}  // namespace ingot

// Ranks as processes (INGOT_TP_PROCESSES=1, dist/process_group.h): the same command passes the
// check, and generates the same tokens as the thread group and as one rank.
namespace ingot {
namespace {

std::string run_cli(const std::string& env, const std::string& args, int* status) {
  const std::string cmd = env + " " + std::string(INGOT_BINARY) + " " + args + " 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *status = ::pclose(p);
  return out;
}

TEST(TensorParallelProcesses, CheckPassesAndTokensMatchThreadsAndOneRank) {
  for (const char* m : {"qwen3", "llama3"}) {
    int st = 0;
    const std::string check = "check --tp 2 --device cpu --model " + test::fixture(m) + " --reference " +
                              test::fixture(m) + "/reference.safetensors";
    const std::string out = run_cli("INGOT_TP_PROCESSES=1", check, &st);
    EXPECT_EQ(st, 0) << m << ": " << out;
    EXPECT_NE(out.find("check passed"), std::string::npos) << out;
    const std::string gen = "generate --device cpu --model " + test::fixture(m) + " --prompt-ids 1,2,3";
    int s1 = 0, s2 = 0, s3 = 0;
    const std::string procs = run_cli("INGOT_TP_PROCESSES=1", gen + " --tp 2", &s1);
    const std::string threads = run_cli("INGOT_TP_PROCESSES=0", gen + " --tp 2", &s2);
    const std::string one = run_cli("", gen, &s3);
    EXPECT_EQ(s1 | s2 | s3, 0) << procs;
    EXPECT_NE(procs.find("generated 16 tokens"), std::string::npos) << procs;
    EXPECT_EQ(procs, threads) << m;
    EXPECT_EQ(procs, one) << m;
  }
}

TEST(TensorParallelProcesses, RefusesABadValue) {
  int st = 0;
  const std::string out = run_cli("INGOT_TP_PROCESSES=yes", "generate --tp 2 --device cpu --model " +
                                                                 test::fixture("qwen3") + " --prompt-ids 1,2,3", &st);
  EXPECT_NE(st, 0);
  EXPECT_NE(out.find("INGOT_TP_PROCESSES=yes: must be 1 (ranks as processes) or 0 (threads)"), std::string::npos) << out;
}

// An engine directory with ranks as processes: each process verifies and maps only its own rank's
// file (after the manifest and every file's header are checked, as with threads), and the tokens are
// the thread group's. A rank's own file missing or corrupt gives the same errors as with threads.
TEST(TensorParallelProcesses, EngineDirectoryLoadsOneRankFilePerProcess) {
  const std::string dir = ::testing::TempDir() + "ingot_tp_proc_engine";
  std::filesystem::remove_all(dir);
  int st = 0;
  run_cli("", "build --tp 2 --model " + test::fixture("qwen3") + " -o " + dir, &st);
  ASSERT_EQ(st, 0);
  const std::string gen = "generate --device cpu --engine " + dir + " --prompt-ids 1,2,3";
  int s1 = 0, s2 = 0;
  const std::string procs = run_cli("INGOT_TP_PROCESSES=1", gen + " --tp 2", &s1);
  const std::string threads = run_cli("INGOT_TP_PROCESSES=0", gen, &s2);
  EXPECT_EQ(s1 | s2, 0) << procs;
  EXPECT_NE(procs.find("generated 16 tokens"), std::string::npos) << procs;
  EXPECT_EQ(procs, threads);

  // Rank 1's file corrupt (one byte near its end, the size kept): the worker that loads it refuses it.
  const std::string rank1 = dir + "/rank-1.ingot", saved = dir + "/rank-1.saved";
  std::filesystem::copy_file(rank1, saved);
  {
    std::fstream f(rank1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('Z');
  }
  std::string out = run_cli("INGOT_TP_PROCESSES=1", gen, &st);
  EXPECT_NE(st, 0);
  EXPECT_NE(out.find("rank-1.ingot: the file hashes to xxh64"), std::string::npos) << out;
  EXPECT_NE(out.find("files[1].xxh64"), std::string::npos) << out;
  EXPECT_EQ(out.find("generated"), std::string::npos) << out;
  // Missing: refused by the manifest checks every process makes, before any weight is read.
  std::filesystem::remove(rank1);
  out = run_cli("INGOT_TP_PROCESSES=1", gen, &st);
  EXPECT_NE(st, 0);
  EXPECT_NE(out.find("rank-1.ingot"), std::string::npos) << out;
  EXPECT_NE(out.find("does not exist"), std::string::npos) << out;
  // Rank 0's own file corrupt: rank 0 refuses it before it starts any worker.
  std::filesystem::rename(saved, rank1);
  {
    std::fstream f(dir + "/rank-0.ingot", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('Z');
  }
  out = run_cli("INGOT_TP_PROCESSES=1", gen, &st);
  EXPECT_NE(st, 0);
  EXPECT_NE(out.find("rank-0.ingot: the file hashes to xxh64"), std::string::npos) << out;
  EXPECT_EQ(out.find("generated"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}


}  // namespace
}  // namespace ingot

// Tensor parallelism on the GPU (one process per GPU over NCCL), as far as a machine without enough
// GPUs can check it: the refusals come before any weight is read (the model folder here has only its
// config.json, so a load would fail on the missing weights instead), each naming what is missing. The
// runs themselves are tests/test_cuda_tp.cpp's, on 2 GPUs.
namespace ingot {
namespace {

// --tp 2 on the GPU without 2 GPUs (or without CUDA or NCCL in the build) is refused before any weight
// (a model folder with no weights) naming what is missing, by generate and by serve and chat (which run
// their ranks as processes led by rank 0, Model::lead_ranks), the latter before the tokenizer too.
TEST(TensorParallelGpu, RefusedBeforeAnyWeightWithoutEnoughGpus) {
#if defined(INGOT_WITH_CUDA) && defined(INGOT_WITH_NCCL)
  const int n = cuda_device_count();
  if (n >= 2) GTEST_SKIP() << "this machine has " << n << " GPUs: tests/test_cuda_tp.cpp runs --tp 2 on them";
#endif
  test::TempDir dir;
  std::filesystem::copy_file(test::fixture("qwen3") + "/config.json", dir.file("config.json"));
  for (const std::string cmd : {"generate --prompt-ids 1,2,3", "serve", "chat"}) {
    int st = 0;
    const std::string out = run_cli("", cmd + " --tp 2 --device cuda --model " + dir.str() + " < /dev/null", &st);
    EXPECT_NE(st, 0) << cmd << ": " << out;
    EXPECT_NE(out.find("--tp 2 --device cuda"), std::string::npos) << cmd << ": " << out;
#if !defined(INGOT_WITH_CUDA)
    EXPECT_NE(out.find("this build of ingot has no CUDA backend"), std::string::npos) << cmd << ": " << out;
#elif !defined(INGOT_WITH_NCCL)
    EXPECT_NE(out.find("this build of ingot has no NCCL"), std::string::npos) << cmd << ": " << out;
#else
    EXPECT_NE(out.find("--tp 2 --device cuda needs 2 GPUs (one process per GPU); this machine has " + std::to_string(n)),
              std::string::npos) << cmd << ": " << out;
#endif
    EXPECT_EQ(out.find("safetensors"), std::string::npos) << cmd << ": the refusal came after the weights:\n" << out;
    EXPECT_EQ(out.find("tokenizer"), std::string::npos) << cmd << ": the refusal came after the tokenizer:\n" << out;
    EXPECT_EQ(out.find("not implemented yet"), std::string::npos) << cmd << ": " << out;
  }
}

// INGOT_TP_PROCESSES=0 (threads) with --device cuda is refused: threads are no option on the GPU. In a
// build without CUDA the device is refused first.
TEST(TensorParallelGpu, ThreadsRefusedOnTheGpu) {
#if defined(INGOT_WITH_CUDA) && defined(INGOT_WITH_NCCL)
  if (cuda_device_count() < 2) GTEST_SKIP() << "the GPU count is refused first on this machine";
  int st = 0;
  const std::string out = run_cli("INGOT_TP_PROCESSES=0", "generate --tp 2 --device cuda --model " +
                                  test::fixture("qwen3") + " --prompt-ids 1,2,3", &st);
  EXPECT_NE(st, 0) << out;
  EXPECT_NE(out.find("INGOT_TP_PROCESSES=0 asks for ranks as threads, but on the GPU the ranks are processes"),
            std::string::npos) << out;
#else
  GTEST_SKIP() << "no CUDA backend with NCCL in this build";
#endif
}

// bench makes one Model per run; with ranks as processes they share the one process group, so every
// process's runs pair up in order (two batch sizes, two prompt lengths: four Models).
TEST(TensorParallelProcesses, BenchRunsSeveralModelsOverOneGroup) {
  int st = 0;
  const std::string out = run_cli("INGOT_TP_PROCESSES=1", "bench --config " + test::fixture("qwen3") +
                                  "/config.json --device cpu --tp 2 --batch 1,2 --prompt-len 4,6 --new-tokens 3 "
                                  "--json --quiet", &st);
  ASSERT_EQ(st, 0) << out;
  const size_t open = out.find('['), close = out.rfind(']');
  ASSERT_TRUE(open != std::string::npos && close != std::string::npos && close > open) << out;
  const nlohmann::json runs = nlohmann::json::parse(out.substr(open, close - open + 1));
  ASSERT_EQ(runs.size(), 4u) << out;
  for (const auto& r : runs) {
    EXPECT_EQ(r.at("tp").get<int>(), 2) << r.dump();
    // What carried the collectives is part of the result (on the GPU: NCCL, or the peer-to-peer one-shot).
    EXPECT_EQ(r.at("tp_collectives").get<std::string>(), "processes over local sockets (rank-order sums)") << r.dump();
  }
}

}  // namespace
}  // namespace ingot
