// Engine files: a build saved and reloaded (in this process and in a separate `ingot` process) runs
// bitwise like the in-memory build, keeps its bounds and cache layout, and every kind of damage or
// mismatch is refused with an error naming the problem.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "io/engine.h"
#include "io/engine_file.h"
#include "io/model_config.h"
#include "runtime/generator.h"
#include "runtime/model.h"
#include "runtime/tp_split.h"
#include "test_helpers.h"

namespace ingot {
namespace {

using nlohmann::json;
using Bytes = std::vector<uint8_t>;

const char* const kFixtures[] = {"llama3", "qwen2", "qwen3", "qwen3_swa", "qwen3_5_text", "qwen3_5_wrapped", "qwen3_5_pattern"};

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_file(const std::string& path, const Bytes& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}
uint64_t u64_at(const Bytes& b, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[at + size_t(i)];
  return v;
}
void set_u64(Bytes& b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + size_t(i)] = uint8_t(v >> (8 * i));
}
void set_u32(Bytes& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + size_t(i)] = uint8_t(v >> (8 * i));
}

// The file with its metadata replaced: by `mutate` applied to the parsed JSON, or by raw text. The
// blobs move 4096 bytes later (offsets in the table follow them before `mutate` runs), so edits that
// lengthen the metadata still fit; header lengths and checksum are recomputed so only the edit differs.
Bytes with_metadata(const Bytes& file, const std::function<void(json&)>& mutate, const std::string* raw = nullptr) {
  const uint64_t mlen = u64_at(file, 16), doff = u64_at(file, 32);
  json m = json::parse(file.begin() + 64, file.begin() + 64 + long(mlen));
  constexpr uint64_t kShift = 4096;
  for (json& t : m["tensors"]) t["offset"] = t["offset"].get<uint64_t>() + kShift;
  if (mutate) mutate(m);
  const std::string text = raw ? *raw : m.dump();
  const uint64_t new_doff = doff + kShift;
  EXPECT_LE(64 + text.size(), new_doff);
  Bytes out(file.begin(), file.begin() + 64);
  set_u64(out, 16, text.size());
  set_u64(out, 24, XXH64(text.data(), text.size(), 0));
  set_u64(out, 32, new_doff);
  set_u64(out, 40, file.size() + kShift);
  out.insert(out.end(), text.begin(), text.end());
  out.resize(new_doff, 0);
  out.insert(out.end(), file.begin() + long(doff), file.end());
  return out;
}

// A saved engine of one fixture, with the in-memory build it came from.
struct Saved {
  test::TempDir dir;
  Engine built;
  std::string path;
  RuntimeOptions bounds;
  Saved(const std::string& fixture, RuntimeOptions b, std::optional<DType> dtype = std::nullopt) : bounds(b) {
    BuildOptions bo;
    bo.dtype = dtype;
    built = build_engine(test::fixture(fixture), bo);
    EngineBuildInfo info;
    info.bounds = b;
    info.requested_dtype = dtype;
    info.source = describe_checkpoint(test::fixture(fixture));
    path = dir.file(fixture + ".ingot");
    save_engine(built, info, path);
  }
};

RuntimeOptions bounds(int max_batch, int64_t capacity, CacheLayout layout = CacheLayout::HeadsFirst) {
  RuntimeOptions o;
  o.max_batch = max_batch;
  o.capacity = capacity;
  o.layout = layout;
  return o;
}

std::vector<int32_t> seq(int n, int start) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(int32_t((start + 37 * i) % 500));
  return v;
}

// Logits of a fixed two-row prefill followed by a decode step on row 0: every path that reads weights.
HostTensor run(const Engine& eng, const RuntimeOptions& rt) {
  auto be = make_cpu_backend();
  Model m(eng, *be, rt);
  HostTensor a = m.forward(Batch{{BatchRow{0, seq(9, 3), 0, {}, true}, BatchRow{1, seq(5, 11), 0, {}, true}}});
  HostTensor b = m.forward(Batch{{BatchRow{0, {17}, 9, {}, false}}});
  HostTensor out(DType::F32, {a.shape()[0] + b.shape()[0], a.shape()[1]});
  std::memcpy(out.data(), a.data(), a.nbytes());
  std::memcpy(static_cast<uint8_t*>(out.data()) + a.nbytes(), b.data(), b.nbytes());
  return out;
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

using test::q;
using test::sh;

// ---------------------------------------------------------------------------------------------

class RoundTrip : public ::testing::TestWithParam<const char*> {};

TEST_P(RoundTrip, ReloadGivesBitwiseTheSameWeightsMetadataAndLogits) {
  const std::string fx = GetParam();
  Saved s(fx, bounds(2, 32));
  LoadedEngine le = load_engine(s.path);
  const Engine& e = le.engine;

  EXPECT_EQ(spec_to_json(e.spec), spec_to_json(s.built.spec));
  EXPECT_EQ(e.weight_dtype, s.built.weight_dtype);
  ASSERT_EQ(e.weights.size(), s.built.weights.size());
  for (auto& [name, t] : s.built.weights) {
    const HostTensor* r = e.find(name);
    ASSERT_NE(r, nullptr) << name;
    EXPECT_TRUE(r->borrowed()) << name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r->data()) % kEngineAlignment, 0u) << name;
    EXPECT_TRUE(same_bytes(*r, t)) << name;
  }
  EXPECT_EQ(le.info.bounds.max_batch, 2);
  EXPECT_EQ(le.info.bounds.capacity, 32);
  EXPECT_EQ(le.info.bounds.layout, CacheLayout::HeadsFirst);
  EXPECT_EQ(le.info.tp_world_size, 1);
  EXPECT_EQ(le.info.tp_rank, 0);
  EXPECT_EQ(le.info.metadata["weights"]["quantization"], "none");
  EXPECT_EQ(le.info.metadata["tool"]["version"], INGOT_VERSION);
  EXPECT_EQ(le.info.spec.eos_ids, s.built.spec.eos_ids);
  // Generation defaults are generation_config.json as written.
  std::ifstream gin(test::fixture(fx) + "/generation_config.json");
  EXPECT_EQ(le.info.generation_defaults, json::parse(gin));
  // Every source file is listed with its size and hash.
  bool saw_config = false;
  for (const json& f : le.info.metadata["source"]["files"]) {
    const Bytes b = read_file(test::fixture(fx) + "/" + f["name"].get<std::string>());
    EXPECT_EQ(f["bytes"].get<uint64_t>(), b.size());
    EXPECT_EQ(f["xxh64"], xxh64_hex(XXH64(b.data(), b.size(), 0)));
    saw_config = saw_config || f["name"] == "config.json";
  }
  EXPECT_TRUE(saw_config);

  EXPECT_TRUE(same_bytes(run(s.built, s.bounds), run(e, RuntimeOptions{le.info.bounds})));
  // A load without verification maps the same bytes.
  LoadOptions nv;
  nv.verify = false;
  EXPECT_TRUE(same_bytes(run(load_engine(s.path, nv).engine, s.bounds), run(s.built, s.bounds)));
}

TEST_P(RoundTrip, BothCacheLayoutsGiveTheSameLogitsAndSayWhichTheyAre) {
  const std::string fx = GetParam();
  Saved hf(fx, bounds(2, 32, CacheLayout::HeadsFirst));
  Saved fl(fx, bounds(2, 32, CacheLayout::Flattened));
  LoadedEngine a = load_engine(hf.path), b = load_engine(fl.path);
  EXPECT_EQ(a.info.bounds.layout, CacheLayout::HeadsFirst);
  EXPECT_EQ(b.info.bounds.layout, CacheLayout::Flattened);
  const json& ka = a.info.metadata["runtime"]["kv_cache"];
  const json& kb = b.info.metadata["runtime"]["kv_cache"];
  const ModelSpec& sp = a.info.spec;
  EXPECT_EQ(ka["capacity_axis"], 2);
  EXPECT_EQ(ka["shape"], json({2, sp.kv_heads, 32, sp.head_dim}));
  EXPECT_EQ(kb["capacity_axis"], 1);
  EXPECT_EQ(kb["shape"], json({2, 32, sp.kv_heads * sp.head_dim}));
  EXPECT_TRUE(same_bytes(run(a.engine, RuntimeOptions{a.info.bounds}), run(b.engine, RuntimeOptions{b.info.bounds})));
}

TEST_P(RoundTrip, ReloadInASeparateProcessPassesTheReferenceCheck) {
  const std::string fx = GetParam();
  test::TempDir d;
  const std::string eng = d.file("m.ingot"), dir = test::fixture(fx);
  for (const char* layout : {"heads_first", "flattened"}) {
    auto [rc, out] = sh(q(INGOT_BINARY) + " build --quiet --force --model " + q(dir) + " -o " + q(eng) +
                        " --max-batch 4 --layout " + layout);
    ASSERT_EQ(rc, 0) << out;
    auto [rc2, out2] = sh(q(INGOT_BINARY) + " check --engine " + q(eng) + " --reference " + q(dir + "/reference.safetensors"));
    EXPECT_EQ(rc2, 0) << out2;
    EXPECT_NE(out2.find("check passed"), std::string::npos) << out2;
    EXPECT_NE(out2.find(std::string("layout ") + layout), std::string::npos) << out2;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RoundTrip, ::testing::ValuesIn(kFixtures));

// ---------------------------------------------------------------------------------------------

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(EngineBounds, RequestsBeyondTheStoredBoundsFailAsBeforeSaving) {
  Saved s("qwen3_swa", bounds(2, 16));
  LoadedEngine le = load_engine(s.path);
  auto be = make_cpu_backend();
  Model before(s.built, *be, s.bounds);
  Model after(le.engine, *be, RuntimeOptions{le.info.bounds});
  EXPECT_EQ(after.state().max_batch(), 2);
  EXPECT_EQ(after.state().capacity(), 16);
  const Batch too_long{{BatchRow{0, seq(17, 1), 0, {}, false}}};
  const Batch bad_row{{BatchRow{2, seq(3, 1), 0, {}, false}}};
  for (const Batch* b : {&too_long, &bad_row}) {
    const std::string m1 = error_of([&] { before.forward(*b); });
    const std::string m2 = error_of([&] { after.forward(*b); });
    EXPECT_FALSE(m1.empty());
    EXPECT_EQ(m1, m2);
  }
  auto request = [] {
    Request q;
    q.prompt = seq(10, 2);
    q.max_new_tokens = 8;
    return q;
  };
  const std::string g1 = error_of([&] { Generator(before).generate(request()); });
  const std::string g2 = error_of([&] { Generator(after).generate(request()); });
  EXPECT_NE(g1.find("capacity is 16"), std::string::npos) << g1;
  EXPECT_EQ(g1, g2);
}

TEST(EngineBounds, TheCommandLineEnforcesThemInANewProcess) {
  test::TempDir d;
  const std::string dir = test::fixture("qwen3"), eng = d.file("small.ingot");
  auto [rc, out] = sh(q(INGOT_BINARY) + " build --quiet --model " + q(dir) + " -o " + q(eng) + " --max-batch 1 --capacity 12");
  ASSERT_EQ(rc, 0) << out;
  // The reference check needs 4 rows: more than the engine's max batch.
  auto [rc2, out2] = sh(q(INGOT_BINARY) + " check --engine " + q(eng) + " --reference " + q(dir + "/reference.safetensors"));
  EXPECT_NE(rc2, 0);
  EXPECT_NE(out2.find("needs max batch 4 but the engine was built for at most 1"), std::string::npos) << out2;
  // A request over capacity: the same error with --model and the same cache, and with the engine.
  const std::string ids = " --prompt-ids 1,2,3,4,5,6,7,8,9,10 --max-new-tokens 4 --capacity 12";
  auto [rc3, out3] = sh(q(INGOT_BINARY) + " generate --engine " + q(eng) + ids);
  auto [rc4, out4] = sh(q(INGOT_BINARY) + " generate --model " + q(dir) + ids);
  EXPECT_NE(rc3, 0);
  EXPECT_NE(out3.find("need 13 cache slots, beyond --capacity 12"), std::string::npos) << out3;
  EXPECT_EQ(out3, out4);
  // Without --capacity the request (13 slots) is checked against the stored bound before loading a model.
  auto [rc5, out5] = sh(q(INGOT_BINARY) + " generate --engine " + q(eng) + " --prompt-ids 1,2,3,4,5,6,7,8,9,10 --max-new-tokens 4");
  EXPECT_NE(rc5, 0);
  EXPECT_NE(out5.find("needs capacity 13 cache slots but the engine was built for at most 12"), std::string::npos) << out5;
  // A different layout than the engine's is refused rather than silently replaced.
  const std::string eng4 = d.file("batch4.ingot");
  auto [rc7, out7] = sh(q(INGOT_BINARY) + " build --quiet --model " + q(dir) + " -o " + q(eng4) + " --max-batch 4");
  ASSERT_EQ(rc7, 0) << out7;
  auto [rc6, out6] = sh(q(INGOT_BINARY) + " check --engine " + q(eng4) + " --layout flattened --reference " +
                        q(dir + "/reference.safetensors"));
  EXPECT_NE(rc6, 0);
  EXPECT_NE(out6.find("built for the heads_first cache layout, not flattened"), std::string::npos) << out6;
}

TEST(EngineCli, InspectPrintsTheMetadata) {
  Saved s("qwen2", bounds(3, 40, CacheLayout::Flattened));
  auto [rc, out] = sh(q(INGOT_BINARY) + " inspect --json --verify " + q(s.path));
  ASSERT_EQ(rc, 0) << out;
  const json j = json::parse(out);
  EXPECT_EQ(j["format_version"], 1);
  EXPECT_EQ(j["verified"], true);
  EXPECT_EQ(j["metadata"]["runtime"]["max_batch"], 3);
  EXPECT_EQ(j["metadata"]["runtime"]["layout"], "flattened");
  EXPECT_EQ(j["metadata"]["architecture"]["family"], "qwen2");
  auto [rc2, text] = sh(q(INGOT_BINARY) + " inspect " + q(s.path));
  ASSERT_EQ(rc2, 0) << text;
  EXPECT_NE(text.find("capacity 40"), std::string::npos) << text;
  EXPECT_NE(text.find("capacity on axis 1"), std::string::npos) << text;
  EXPECT_NE(text.find("eos ids"), std::string::npos) << text;
}

// Benchmarks' random weights repeat a block of 65,536 values; each repetition is rotated, so a wide
// matrix's rows stay distinct (unrotated, a 152k x 1024 LM head had 64 distinct rows and its logits
// tied in groups of thousands, which made sampled decode a case no trained model presents).
TEST(RandomEngine, WideMatricesDoNotRepeatTheirRows) {
  ModelSpec spec = load_model_spec(test::fixture("qwen3"));
  spec.vocab = 8192;  // the [8192, 64] embedding spans eight blocks of the fill
  const Engine e = random_engine(spec, DType::BF16, 3);
  const HostTensor& t = e.weights.at("tok_embeddings");
  const size_t row_bytes = size_t(spec.hidden) * dtype_size(DType::BF16);
  std::set<std::string> rows;
  for (int64_t r = 0; r < spec.vocab; ++r)
    rows.insert(std::string(static_cast<const char*>(t.data()) + size_t(r) * row_bytes, row_bytes));
  EXPECT_EQ(int64_t(rows.size()), spec.vocab);
}

TEST(EngineCli, BuildFromAConfigGivesRandomWeightsOfItsShapes) {
  test::TempDir d;
  const std::string eng = d.file("r.ingot"), cfg = test::fixture("qwen3") + "/config.json";
  auto [rc, out] = sh(q(INGOT_BINARY) + " build --quiet --config " + q(cfg) + " --dtype bf16 --seed 7 --capacity 32 -o " + q(eng));
  ASSERT_EQ(rc, 0) << out;
  const EngineFileInfo f = inspect_engine(eng);
  EXPECT_EQ(f.weight_dtype, DType::BF16);
  std::ifstream cin(cfg);
  EXPECT_EQ(spec_to_json(f.spec), spec_to_json(parse_model_config(json::parse(cin), cfg)));
  EXPECT_NE(f.metadata["source"]["checkpoint"].get<std::string>().find("random weights (seed 7)"), std::string::npos);
  auto [rc2, bench] = sh(q(INGOT_BINARY) + " bench --engine " + q(eng) + " --device cpu --prompt-len 4 --new-tokens 3 --json");
  ASSERT_EQ(rc2, 0) << bench;
  const json b = json::parse(bench);
  EXPECT_TRUE(b[0].contains("load_s"));
  EXPECT_TRUE(b[0].contains("model_init_s"));
  auto [rc3, both] = sh(q(INGOT_BINARY) + " build --config " + q(cfg) + " --model " + q(test::fixture("qwen3")) + " -o " + q(eng));
  EXPECT_NE(rc3, 0);
}

TEST(EngineCli, TextPromptsUseTheEmbeddedTokenizer) {
  test::TempDir d;
  const std::filesystem::path folder = d.file("model");
  std::filesystem::create_directories(folder);
  for (const auto& e : std::filesystem::directory_iterator(test::fixture("qwen3")))
    if (e.path().filename() != "reference.safetensors") std::filesystem::copy(e.path(), folder / e.path().filename());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy(std::string(INGOT_SOURCE_DIR) + "/tests/data/api/" + f, folder / f);
  const std::string eng = d.file("m.ingot");
  auto [rc, out] = sh(q(INGOT_BINARY) + " build --quiet --model " + q(folder.string()) + " -o " + q(eng));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(inspect_engine(eng).tokenizer_json.has_value());
  const std::string args = " --prompt Hello --max-new-tokens 6 --ignore-eos --no-stats";
  auto [rc1, from_engine] = sh(q(INGOT_BINARY) + " generate --engine " + q(eng) + args);
  auto [rc2, from_folder] = sh(q(INGOT_BINARY) + " generate --model " + q(folder.string()) + args);
  EXPECT_EQ(rc1, 0) << from_engine;
  EXPECT_EQ(rc2, 0) << from_folder;
  EXPECT_FALSE(from_engine.empty());
  EXPECT_EQ(from_engine, from_folder);
  // chat takes the engine's capacity unless asked for a number, which must fit within it.
  auto [rc3, chat] = sh("printf 'Hello\\n' | " + q(INGOT_BINARY) + " chat --engine " + q(eng) + " --max-new-tokens 3");
  EXPECT_EQ(rc3, 0) << chat;
  EXPECT_NE(chat.find("generated 3"), std::string::npos) << chat;
  auto [rc4, big] = sh("printf 'Hello\\n' | " + q(INGOT_BINARY) + " chat --engine " + q(eng) + " --capacity 100");
  EXPECT_NE(rc4, 0);
  EXPECT_NE(big.find("needs capacity 100 cache slots"), std::string::npos) << big;
}

// ---------------------------------------------------------------------------------------------
// Refusals

class Refusal : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { saved_ = new Saved("qwen2", bounds(2, 32)); }
  static void TearDownTestSuite() {
    delete saved_;
    saved_ = nullptr;
  }
  const Bytes& good() {
    static const Bytes b = read_file(saved_->path);
    return b;
  }
  // Writes `bytes` to a file and returns what loading it throws ("" when it loads).
  std::string load_error(const Bytes& bytes, const LoadOptions& o = {}) {
    write_file(dir_.file("x.ingot"), bytes);
    return error_of([&] { load_engine(dir_.file("x.ingot"), o); });
  }
  void expect_refused(const Bytes& bytes, std::initializer_list<std::string> fragments, const LoadOptions& o = {}) {
    const std::string e = load_error(bytes, o);
    EXPECT_FALSE(e.empty()) << "the file was accepted";
    for (const std::string& f : fragments) EXPECT_NE(e.find(f), std::string::npos) << "'" << e << "' lacks '" << f << "'";
  }
  void expect_meta_refused(const std::function<void(json&)>& mutate, std::initializer_list<std::string> fragments) {
    expect_refused(with_metadata(good(), mutate), fragments);
  }
  static Saved* saved_;
  test::TempDir dir_;
};
Saved* Refusal::saved_ = nullptr;

TEST_F(Refusal, TheUnmodifiedFileAndTheRewriteHelperAreAccepted) {
  EXPECT_EQ(load_error(good()), "");
  EXPECT_EQ(load_error(with_metadata(good(), {})), "");
}

TEST_F(Refusal, TruncatedFiles) {
  const Bytes& g = good();
  expect_refused(Bytes(g.begin(), g.end() - 1), {"truncated", std::to_string(g.size() - 1), std::to_string(g.size())});
  expect_refused(Bytes(g.begin(), g.begin() + long(g.size() / 2)), {"truncated"});
  expect_refused(Bytes(g.begin(), g.begin() + 100), {"truncated"});
  expect_refused(Bytes(g.begin(), g.begin() + 10), {"too short", "64-byte engine header"});
  expect_refused(Bytes(), {"too short"});
  Bytes longer = g;
  longer.push_back(0);
  expect_refused(longer, {"1 bytes beyond"});
}

TEST_F(Refusal, AFlippedByteInAnyBlobNamesTheTensor) {
  const EngineFileInfo info = inspect_engine(saved_->path);
  ASSERT_FALSE(info.tensors.empty());
  for (const EngineTensorRecord& t : info.tensors) {
    for (uint64_t at : {t.offset, t.offset + t.bytes / 2, t.offset + t.bytes - 1}) {
      Bytes b = good();
      b[at] ^= 0x01;
      expect_refused(b, {"tensor '" + t.name + "' is corrupt"});
    }
  }
  // --no-verify skips exactly this check.
  Bytes b = good();
  b[info.tensors.front().offset] ^= 0x80;
  LoadOptions nv;
  nv.verify = false;
  EXPECT_EQ(load_error(b, nv), "");
}

TEST_F(Refusal, DamagedHeaderOrMetadata) {
  Bytes b = good();
  b[0] = 'X';
  expect_refused(b, {"not an ingot engine file"});
  b = good();
  set_u32(b, 8, kEngineFormatVersion + 1);
  expect_refused(b, {"format version 2 is newer", "rebuild"});
  b = good();
  set_u32(b, 8, 0);
  expect_refused(b, {"format version 0"});
  b = good();
  set_u32(b, 12, 4);
  expect_refused(b, {"flags 0x00000004"});
  b = good();
  b[60] = 1;
  expect_refused(b, {"reserved header bytes"});
  b = good();
  b[64 + 10] ^= 0x20;  // inside the metadata text
  expect_refused(b, {"metadata checksum mismatch"});
  b = good();
  set_u64(b, 16, u64_at(b, 32));  // metadata longer than the room before the data
  expect_refused(b, {"runs past the data offset"});
  b = good();
  set_u64(b, 16, uint64_t(1) << 40);
  expect_refused(b, {"metadata length", "exceeds the limit"});
  b = good();
  set_u64(b, 32, u64_at(b, 32) + 8);
  expect_refused(b, {"data offset", "not a multiple of 256"});
  b = good();
  set_u64(b, 32, uint64_t(1) << 50);
  expect_refused(b, {"beyond the end of the file"});
}

TEST_F(Refusal, MalformedMetadata) {
  const std::string not_json = "{\"tool\": ";
  expect_refused(with_metadata(good(), {}, &not_json), {"metadata is not valid JSON"});
  const std::string array = "[1, 2]";
  expect_refused(with_metadata(good(), {}, &array), {"metadata is not a JSON object"});
  expect_meta_refused([](json& m) { m.erase("runtime"); }, {"'runtime' is missing"});
  expect_meta_refused([](json& m) { m["runtime"]["capacity"] = -1; }, {"'runtime.capacity' must lie in"});
  expect_meta_refused([](json& m) { m["runtime"]["capacity"] = 1e300; }, {"'runtime.capacity' must be an integer"});
  expect_meta_refused([](json& m) { m["runtime"]["max_batch"] = "two"; }, {"'runtime.max_batch' must be an integer"});
  expect_meta_refused([](json& m) { m["runtime"]["layout"] = "rows_first"; }, {"'runtime.layout'", "rows_first"});
  expect_meta_refused([](json& m) { m["runtime"]["kv_cache"]["capacity_axis"] = 1; }, {"'runtime.kv_cache' disagrees"});
  expect_meta_refused([](json& m) { m["runtime"]["capacity"] = 33; }, {"'runtime.kv_cache' disagrees"});
  expect_meta_refused([](json& m) { m["architecture"]["layers"] = "two"; }, {"'architecture.layers' must be an integer"});
  expect_meta_refused([](json& m) { m["architecture"]["layers"] = 1 << 20; }, {"'architecture.layers' must lie in"});
  expect_meta_refused([](json& m) { m["architecture"]["family"] = "gpt2"; }, {"'architecture.family'", "gpt2"});
  expect_meta_refused([](json& m) { m["architecture"]["kv_heads"] = 3; }, {"not a multiple of kv_heads"});
  expect_meta_refused([](json& m) { m["architecture"]["eos_ids"] = {100000}; }, {"'architecture.eos_ids'", "vocabulary"});
  expect_meta_refused([](json& m) { m["architecture"]["rope"].erase("theta"); }, {"'architecture.rope.theta' is missing"});
  expect_meta_refused([](json& m) { m["weights"]["quantization"] = "int4"; }, {"'weights.quantization'", "int4"});
  // An INT4 description (docs/quantization.md): every field checked, and the table must then hold packed tensors.
  auto int4 = [](json& m, const char* field, json value) {
    m["weights"]["quantization"] = {{"method", "rtn"}, {"bits", 4}, {"group_size", 32}, {"symmetric", true},
                                    {"layout", "int4_rows_low_nibble_first"}, {"scale_dtype", m["weights"]["dtype"]},
                                    {"tensors", {"layers.0.wo"}}};
    if (field) m["weights"]["quantization"][field] = std::move(value);
  };
  expect_meta_refused([&](json& m) { int4(m, "method", "nf4"); }, {"'weights.quantization.method'", "nf4"});
  // The published methods record their checkpoint format, which must be one of theirs; rtn has no zero
  // points, no act-order and no whole-row group.
  expect_meta_refused([&](json& m) { int4(m, "method", "gptq"); }, {"'weights.quantization.format' is missing"});
  expect_meta_refused([&](json& m) {
    int4(m, "method", "awq");
    m["weights"]["quantization"]["format"] = "gptq_v2";
  }, {"'weights.quantization.format'", "'gptq_v2' is not a format of method 'awq'"});
  expect_meta_refused([&](json& m) { int4(m, "act_order", true); }, {"'weights.quantization.act_order' must be false for rtn"});
  expect_meta_refused([&](json& m) { int4(m, "act_order", 1); }, {"'weights.quantization.act_order'"});
  expect_meta_refused([&](json& m) { int4(m, "group_size", -1); }, {"'weights.quantization.group_size' must lie in [32, 256]"});
  expect_meta_refused([&](json& m) {
    int4(m, "method", "gptq");
    m["weights"]["quantization"]["format"] = "gptq";
    m["weights"]["quantization"]["group_size"] = 31;
  }, {"'weights.quantization.group_size' must be -1 (whole row) or an even size >= 2"});
  // published_group_size (a published checkpoint's own groups, re-expressed): not for rtn, and a
  // whole row or a multiple of the runtime group.
  expect_meta_refused([&](json& m) { int4(m, "published_group_size", -1); },
                      {"'weights.quantization.published_group_size' is for a published method, not rtn"});
  expect_meta_refused([&](json& m) {
    int4(m, "method", "gptq");
    m["weights"]["quantization"]["format"] = "gptq_v2";
    m["weights"]["quantization"]["published_group_size"] = 48;
  }, {"'weights.quantization.published_group_size' must be -1 (whole row) or an even multiple of group_size"});
  expect_meta_refused([&](json& m) {
    int4(m, "method", "gptq");
    m["weights"]["quantization"]["format"] = "gptq_v2";
    m["weights"]["quantization"]["published_group_size"] = "row";
  }, {"'weights.quantization.published_group_size'"});
  expect_meta_refused([&](json& m) { int4(m, "bits", 8); }, {"'weights.quantization.bits' must lie in [4, 4]"});
  expect_meta_refused([&](json& m) { int4(m, "group_size", 48); }, {"'weights.quantization.group_size' must be a power of two"});
  expect_meta_refused([&](json& m) { int4(m, "group_size", 512); }, {"'weights.quantization.group_size' must lie in [32, 256]"});
  expect_meta_refused([&](json& m) { int4(m, "symmetric", false); }, {"'weights.quantization.symmetric' must be true"});
  expect_meta_refused([&](json& m) { int4(m, "layout", "marlin"); }, {"'weights.quantization.layout'"});
  expect_meta_refused([&](json& m) { int4(m, "scale_dtype", "f16"); }, {"'weights.quantization.scale_dtype'", "f16"});
  expect_meta_refused([&](json& m) { int4(m, "tensors", json::array()); }, {"'weights.quantization.tensors' must list"});
  expect_meta_refused([&](json& m) { int4(m, "tensors", {"tok_embeddings"}); },
                      {"'weights.quantization.tensors[0]'", "tok_embeddings", "is not a weight of this architecture that can be INT4"});
  expect_meta_refused([&](json& m) { int4(m, "tensors", {"layers.0.wo", "layers.0.wo"}); }, {"listed twice"});
  expect_meta_refused([&](json& m) { int4(m, nullptr, nullptr); }, {"the architecture implies"});
  expect_meta_refused([](json& m) { m["weights"]["dtype"] = "f8"; }, {"'weights.dtype'"});
  expect_meta_refused([](json& m) { m["tokenizer"]["tokenizer.json"] = 5; }, {"'tokenizer.tokenizer.json' must be a string"});
  expect_meta_refused([](json& m) { m["requirements"]["cuda_min_capability"] = {7}; }, {"[major, minor]"});
  expect_meta_refused([](json& m) { m["parallel"]["tp_rank"] = 1; }, {"'parallel.tp_rank' must lie in [0, 0]"});
  expect_meta_refused([](json& m) { m["source"]["files"][0]["xxh64"] = "xyz"; }, {"'source.files[0].xxh64'"});
}

TEST_F(Refusal, TensorTableOutOfBoundsOverlappingMisalignedOrWrong) {
  expect_meta_refused([](json& m) { m["tensors"][0]["offset"] = m["tensors"][0]["offset"].get<uint64_t>() + 8; },
                      {"tensors[0].offset", "not a multiple of 256"});
  expect_meta_refused([](json& m) { m["tensors"][1]["offset"] = m["tensors"][0]["offset"]; }, {"overlap"});
  expect_meta_refused([](json& m) { m["tensors"][0]["offset"] = 0; }, {"lies before the data offset"});
  expect_meta_refused([](json& m) { m["tensors"].back()["offset"] = m["tensors"].back()["offset"].get<uint64_t>() + 4096; },
                      {"lie outside the file"});
  expect_meta_refused([](json& m) { m["tensors"][0]["offset"] = uint64_t(-256); }, {"lie outside the file"});
  expect_meta_refused([](json& m) { m["tensors"][0]["bytes"] = 4; }, {"tensors[0].bytes", "dtype and shape give"});
  expect_meta_refused([](json& m) { m["tensors"][0]["shape"][0] = 7; }, {"tensors[0].shape", "architecture implies"});
  expect_meta_refused([](json& m) { m["tensors"][0]["dtype"] = "bf16"; }, {"tensors[0].dtype"});
  expect_meta_refused([](json& m) { m["tensors"].erase(m["tensors"].size() - 1); }, {"the architecture implies"});
  expect_meta_refused([](json& m) { m["tensors"][1]["name"] = m["tensors"][0]["name"]; }, {"listed twice"});
  expect_meta_refused([](json& m) { m["tensors"][0]["name"] = "layers.9.wqkv"; }, {"'layers.9.wqkv' is not a weight"});
  expect_meta_refused([](json& m) { m["tensors"][0]["xxh64"] = "0123"; }, {"16 lowercase hex digits"});
  expect_meta_refused([](json& m) { m["tensors"][0]["offset"] = -256; }, {"tensors[0].offset", "non-negative integer"});
}

TEST_F(Refusal, ADifferentTensorParallelSetting) {
  // A file claiming to be one rank's slice is validated as one: it needs its build's id, and its
  // tensors must be the rank's shares of the whole architecture it states.
  expect_meta_refused([](json& m) { m["parallel"] = {{"tp_world_size", 2}, {"tp_rank", 1}}; }, {"parallel.build_id", "is missing"});
  expect_meta_refused([](json& m) { m["parallel"] = {{"tp_world_size", 2}, {"tp_rank", 1}, {"build_id", "b"}}; },
                      {"runtime.kv_cache", "disagrees"});  // the rank's cache: its own KV heads
  expect_meta_refused([](json& m) { m["parallel"] = {{"tp_world_size", 3}, {"tp_rank", 1}, {"build_id", "b"}}; },
                      {"parallel.tp_world_size", "does not split"});
  // A real slice (as `ingot build --tp 2` writes it) loads only as its rank of its world.
  EngineBuildInfo info;
  info.bounds = saved_->bounds;
  info.tp_world_size = 2;
  info.tp_rank = 1;
  info.whole_spec = saved_->built.spec;
  info.build_id = "0123";
  const std::string path = dir_.file("slice.ingot");
  save_engine(shard_engine(saved_->built, 2, 1), info, path);
  const Bytes slice = read_file(path);
  expect_refused(slice, {"built for tensor-parallel world size 2, rank 1", "this process runs world size 1, rank 0"});
  LoadOptions o;
  o.tp_world_size = 2;
  o.tp_rank = 1;
  EXPECT_EQ(load_error(slice, o), "");
  EXPECT_EQ(inspect_engine(path).weights_spec.heads, saved_->built.spec.heads / 2);
  o.tp_rank = 0;
  expect_refused(slice, {"rank 1", "world size 2, rank 0"}, o);
  expect_refused(good(), {"world size 1, rank 0", "this process runs world size 2, rank 0"}, o);
  // save_engine refuses a slice without the whole model, or labelled as another rank.
  info.tp_rank = 0;
  test::expect_error([&] { save_engine(shard_engine(saved_->built, 2, 1), info, dir_.file("bad.ingot")); },
                     {"is not rank 0 of 2's slice"});
  info.whole_spec.reset();
  test::expect_error([&] { save_engine(shard_engine(saved_->built, 2, 0), info, dir_.file("bad.ingot")); },
                     {"needs the whole model's spec"});
}

TEST(EngineDevice, AGpuWithoutTheNeededCapabilityIsRefused) {
  Saved bf("qwen3", bounds(1, 16), DType::BF16);
  const EngineFileInfo b = inspect_engine(bf.path);
  EXPECT_EQ(b.weight_dtype, DType::BF16);
  EXPECT_EQ(b.min_cuda_major, 8);
  test::expect_error([&] { check_device_capability(b, 7, 5); }, {"compute capability 8.0", "bf16", "this GPU has 7.5"});
  EXPECT_NO_THROW(check_device_capability(b, 8, 0));
  EXPECT_NO_THROW(check_device_capability(b, 9, 0));
  Saved f32("qwen3", bounds(1, 16));
  const EngineFileInfo f = inspect_engine(f32.path);
  EXPECT_NO_THROW(check_device_capability(f, 7, 0));
  test::expect_error([&] { check_device_capability(f, 6, 1); }, {"compute capability 7.0", "6.1"});
  // A stored requirement below what the dtype needs is inconsistent, not a loophole.
  const Bytes low = with_metadata(read_file(bf.path), [](json& m) { m["requirements"]["cuda_min_capability"] = {7, 0}; });
  test::TempDir d;
  write_file(d.file("low.ingot"), low);
  test::expect_error([&] { inspect_engine(d.file("low.ingot")); }, {"cuda_min_capability", "below the 8.0"});
}

// Bounds that name no capacity store the one default every run and `ingot build` use:
// min(4096, max_position_embeddings), not the whole position range.
TEST(EngineSave, ACapacityOfZeroStoresTheDefaultCapacity) {
  test::TempDir d;
  Engine e = build_engine(test::fixture("qwen3"));
  for (int64_t max_pos : {int64_t(64), int64_t(32768)}) {
    e.spec.max_position = max_pos;
    EngineBuildInfo info;
    info.bounds = bounds(1, 0);
    const std::string path = d.file("cap" + std::to_string(max_pos) + ".ingot");
    save_engine(e, info, path);
    EXPECT_EQ(inspect_engine(path).bounds.capacity, std::min<int64_t>(max_pos, 4096)) << max_pos;
  }
}

TEST(EngineSave, RefusesEnginesThatDoNotMatchTheirSpecAndBadBounds) {
  test::TempDir d;
  Engine e = build_engine(test::fixture("qwen3"));
  EngineBuildInfo info;
  info.bounds = bounds(1, 16);
  info.bounds.capacity = int64_t(1) << 31;
  test::expect_error([&] { save_engine(e, info, d.file("a.ingot")); }, {"capacity 2147483648"});
  info.bounds = bounds(1, 16);
  test::expect_error([&] { save_engine(e, info, d.str() + "/no/such/dir/a.ingot"); },
                     {"cannot write in folder", "/no/such/dir", "No such file or directory"});
  e.weights.erase("final_norm");
  test::expect_error([&] { save_engine(e, info, d.file("b.ingot")); }, {"no weight 'final_norm'"});
  EXPECT_FALSE(std::filesystem::exists(d.file("b.ingot")));
}

}  // namespace
}  // namespace ingot
