// Per-rank engine files (`ingot build --tp N -o DIR`, runtime/tp_engine_dir.h): what the directory
// holds, loading it bitwise equal to slicing the same weights at load, the checks made against the
// manifest before any weight is read, and `chat` at --tp 2 against --tp 1 (and from the directory).
// The command-line refusals are data-driven in tests/data/bad_input/tensor_parallel.json.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/engine.h"
#include "io/engine_file.h"
#include "runtime/loader.h"
#include "runtime/tp_engine_dir.h"
#include "test_helpers.h"

namespace ingot {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::q;
using test::sh;

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// The fixture split over `world` ranks into `dir`, as `ingot build --tp` writes it.
void build_dir(const std::string& fixture, int world, const std::string& dir) {
  const Engine whole = build_engine(test::fixture(fixture), {});
  EngineBuildInfo info;
  info.bounds.max_batch = 2;
  info.bounds.capacity = 64;
  save_tp_engine_dir(whole, info, world, dir);
}

TEST(TpEngineDir, BuildWritesOneFilePerRankAndAManifest) {
  test::TempDir d;
  const std::string dir = d.file("e");
  auto [rc, out] = sh(q(INGOT_BINARY) + " build --quiet --model " + q(test::fixture("llama3")) + " --tp 2 -o " + q(dir));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("split over 2 ranks"), std::string::npos) << out;
  const json m = read_json(dir + "/manifest.json");
  EXPECT_EQ(m["format"], kTpManifestFormat);
  EXPECT_EQ(m["format_version"], kTpManifestVersion);
  EXPECT_EQ(m["world_size"], 2);
  EXPECT_EQ(m["model"]["heads"], 4);
  EXPECT_EQ(m["model"]["kv_heads"], 2);
  EXPECT_EQ(m["model"]["vocab"], 512);
  ASSERT_EQ(m["split"].size(), 2u);
  EXPECT_EQ(m["split"][1]["heads"], json::array({2, 2}));
  EXPECT_EQ(m["split"][1]["kv_heads"], json::array({1, 1}));
  EXPECT_EQ(m["split"][1]["intermediate"], json::array({64, 64}));
  EXPECT_EQ(m["split"][1]["vocab_rows"], json::array({256, 256}));
  ASSERT_EQ(m["files"].size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const json& f = m["files"][size_t(r)];
    const std::string path = dir + "/" + f["name"].get<std::string>();
    EXPECT_EQ(f["name"], tp_rank_file_name(r));
    EXPECT_EQ(f["bytes"].get<uint64_t>(), fs::file_size(path));
    EXPECT_EQ(f["xxh64"].get<std::string>().size(), 16u);
    const EngineFileInfo info = inspect_engine(path);
    EXPECT_EQ(info.tp_world_size, 2);
    EXPECT_EQ(info.tp_rank, r);
    EXPECT_EQ(info.tp_build_id, m["build_id"]);
    EXPECT_EQ(info.spec.heads, 4);          // the architecture: the whole model
    EXPECT_EQ(info.weights_spec.heads, 2);  // the weights: the rank's share
    EXPECT_EQ(info.weights_spec.tp.rank, r);
  }
  // A second build gets another id, so files of the two never pass as one build.
  const std::string dir2 = d.file("e2");
  ASSERT_EQ(sh(q(INGOT_BINARY) + " build --quiet --model " + q(test::fixture("llama3")) + " --tp 2 -o " + q(dir2)).first, 0);
  EXPECT_NE(read_json(dir2 + "/manifest.json")["build_id"], m["build_id"]);
  // An existing non-empty directory needs --force; with it the build is replaced.
  auto [rc3, again] = sh(q(INGOT_BINARY) + " build --quiet --model " + q(test::fixture("llama3")) + " --tp 2 -o " + q(dir));
  EXPECT_NE(rc3, 0);
  EXPECT_NE(again.find("--force"), std::string::npos) << again;
  auto [rc4, forced] =
      sh(q(INGOT_BINARY) + " build --quiet --force --model " + q(test::fixture("llama3")) + " --tp 2 -o " + q(dir));
  EXPECT_EQ(rc4, 0) << forced;
  EXPECT_NE(read_json(dir + "/manifest.json")["build_id"], m["build_id"]);
}

// Loading the directory gives the same logits, bit for bit, as slicing the whole model at load.
class TpEngineDirLoad : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

TEST_P(TpEngineDirLoad, LogitsEqualSlicingAtLoad) {
  const auto [fixture, world] = GetParam();
  test::TempDir d;
  const std::string dir = d.file("e");
  build_dir(fixture, world, dir);
  RuntimeOptions rt;
  rt.max_batch = 2;
  rt.capacity = 32;
  LoadSpec from_dir;
  from_dir.engine_path = dir;
  from_dir.device = "cpu";
  from_dir.threads = 2;
  Loaded a = load(from_dir, rt);  // --tp not given: the manifest's world size
  LoadSpec sliced = from_dir;
  sliced.engine_path.clear();
  sliced.model_dir = test::fixture(fixture);
  sliced.tp_given = true;
  RuntimeOptions rt_tp = rt;
  rt_tp.tp = world;
  Loaded b = load(sliced, rt_tp);
  EXPECT_EQ(a.model->tp_world(), world);
  EXPECT_EQ(a.engine->spec.heads, b.engine->spec.heads);  // the whole model's spec, as from a folder
  Batch batch;
  batch.rows.push_back(BatchRow{0, {1, 2, 3, 500, 7, 9}, 0, {}, true});
  batch.rows.push_back(BatchRow{1, {11, 5}, 0, {}, true});
  const std::vector<HostTensor> la = a.model->forward_ranks(batch), lb = b.model->forward_ranks(batch);
  ASSERT_EQ(la.size(), size_t(world));
  for (size_t r = 0; r < la.size(); ++r) {
    ASSERT_EQ(la[r].shape(), lb[r].shape());
    EXPECT_EQ(std::memcmp(la[r].data(), lb[r].data(), la[r].nbytes()), 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TpEngineDirLoad,
                         ::testing::Values(std::make_tuple("llama3", 2), std::make_tuple("qwen3", 2),
                                           std::make_tuple("qwen3", 4), std::make_tuple("qwen3_5_text", 2)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_tp" + std::to_string(std::get<1>(info.param));
                         });

// Every check names the file and the field, and comes before any weight is read (inspect reads none).
TEST(TpEngineDir, RefusesWhatDisagreesWithTheManifest) {
  test::TempDir d;
  const std::string dir = d.file("e"), other = d.file("other");
  build_dir("llama3", 2, dir);
  build_dir("llama3", 2, other);
  const std::string manifest = dir + "/manifest.json", keep = d.file("keep.json");
  fs::copy_file(manifest, keep);
  auto restore = [&] {
    fs::copy_file(keep, manifest, fs::copy_options::overwrite_existing);
    fs::copy_file(d.file("e_rank1"), dir + "/rank-1.ingot", fs::copy_options::overwrite_existing);
  };
  fs::copy_file(dir + "/rank-1.ingot", d.file("e_rank1"));
  auto edit = [&](const std::function<void(json&)>& f) {
    json m = read_json(keep);
    f(m);
    std::ofstream(manifest) << m.dump();
  };
  auto refused = [&](std::initializer_list<std::string> words) {
    test::expect_error([&] { inspect_tp_engine_dir(dir); }, words);
    restore();
  };
  EXPECT_NO_THROW(inspect_tp_engine_dir(dir));
  edit([](json& m) { m.erase("world_size"); });
  refused({"manifest.json", "world_size is missing"});
  edit([](json& m) { m["world_size"] = 4; });
  refused({"manifest.json", "files lists 2 files for world_size 4"});
  edit([](json& m) { m["files"][1]["bytes"] = 5; });
  refused({"rank-1.ingot", "files[1].bytes says 5"});
  edit([](json& m) { m["files"][1]["name"] = "../x.ingot"; });
  refused({"files[1].name", "must be a file name in the directory"});
  edit([](json& m) { m["split"][0]["heads"] = json::array({0, 4}); });
  refused({"manifest.json", "split"});
  edit([](json& m) { m["model"]["layers"] = 3; });
  refused({"rank-0.ingot", "model"});
  std::ofstream(manifest) << "{\"format\": ";
  refused({"manifest.json", "not valid JSON"});
  fs::remove(dir + "/rank-1.ingot");
  refused({"rank-1.ingot", "does not exist", "files[1]"});
  fs::copy_file(other + "/rank-1.ingot", dir + "/rank-1.ingot", fs::copy_options::overwrite_existing);
  refused({"rank-1.ingot", "parallel.build_id", "different builds"});
  fs::copy_file(dir + "/rank-0.ingot", dir + "/rank-1.ingot", fs::copy_options::overwrite_existing);
  refused({"rank-1.ingot", "parallel.tp_rank is 0"});
  // A flipped byte in a blob: the header still parses; the whole-file checksum catches it.
  {
    std::fstream f(dir + "/rank-1.ingot", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('\x5a');
  }
  const TpEngineDir ok = inspect_tp_engine_dir(dir);
  test::expect_error([&] { verify_tp_engine_dir(ok); }, {"rank-1.ingot", "files[1].xxh64"});
  restore();
  EXPECT_NO_THROW(verify_tp_engine_dir(inspect_tp_engine_dir(dir)));
}

TEST(TpEngineDir, LoadRefusesAnotherWorldSizeAndALoneRankFile) {
  test::TempDir d;
  const std::string dir = d.file("e");
  build_dir("llama3", 2, dir);
  LoadSpec ls;
  ls.engine_path = dir;
  ls.device = "cpu";
  ls.tp_given = true;
  RuntimeOptions rt;
  rt.tp = 4;
  test::expect_error([&] { load(ls, rt); }, {"--tp 4", "split over 2 ranks", "world_size 2"});
  ls.engine_path = dir + "/rank-1.ingot";
  ls.tp_given = false;
  rt.tp = 1;
  test::expect_error([&] { load(ls, rt); }, {"rank-1.ingot", "rank 1 of a model split over 2 ranks", "load the directory"});
  ls.engine_path = test::fixture("llama3");
  test::expect_error([&] { load(ls, rt); }, {"without manifest.json"});
}

// INT4 engine directories (`build --tp 2 --quantize int4`, and a published INT4 folder built with
// --tp 2): the tokens equal those of one INT4 engine file split at load (`--engine F --tp 2`), with the
// ranks as threads and as processes; a published folder's directory passes its transformers reference;
// group cuts and act-order weights are refused before anything is written.
TEST(TpEngineDir, Int4DirectoriesEqualTheFileSplitAtLoad) {
  test::TempDir d;
  const std::string ingot = q(INGOT_BINARY);
  struct Case {
    std::string fixture, flags;
  };
  for (const Case& c : {Case{"llama3", "--quantize int4 --group-size 32 --quantize-lm-head"},
                        Case{"qwen3_5_text", "--quantize int4 --group-size 32"}}) {
    const std::string dir = d.file(c.fixture + "_dir"), file = d.file(c.fixture + ".ingot");
    const std::string from = " --quiet --model " + q(test::fixture(c.fixture)) + " " + c.flags;
    auto [b1, out1] = sh(ingot + " build" + from + " --tp 2 -o " + q(dir));
    ASSERT_EQ(b1, 0) << out1;
    EXPECT_NE(out1.find("+ int4 (group 32) weights"), std::string::npos) << out1;
    auto [b2, out2] = sh(ingot + " build" + from + " -o " + q(file));
    ASSERT_EQ(b2, 0) << out2;
    const std::string gen = " generate --device cpu --prompt-ids 1,2,3 --max-new-tokens 12 --ignore-eos";
    auto [r1, split] = sh(ingot + gen + " --engine " + q(file) + " --tp 2");
    auto [r2, threads] = sh(ingot + gen + " --engine " + q(dir));
    auto [r3, procs] = sh("INGOT_TP_PROCESSES=1 " + ingot + gen + " --engine " + q(dir));
    EXPECT_EQ(r1 | r2 | r3, 0) << split << threads << procs;
    EXPECT_NE(split.find("generated 12 tokens"), std::string::npos) << split;
    EXPECT_EQ(threads, split) << c.fixture;
    EXPECT_EQ(procs, split) << c.fixture;
  }
  for (const char* f : {"int4/gptq_v1_sym_g32", "int4/awq_gemm_g32", "int4/ct_group_sym_g32_qwen3"}) {
    const std::string dir = d.file(fs::path(f).filename().string());
    auto [b, out] = sh(ingot + " build --quiet --max-batch 4 --model " + q(test::fixture(f)) + " --tp 2 -o " + q(dir));
    ASSERT_EQ(b, 0) << f << ": " << out;
    auto [rc, check] = sh(ingot + " check --device cpu --engine " + q(dir) + " --reference " +
                          q(test::fixture(f) + "/reference.safetensors"));
    EXPECT_EQ(rc, 0) << f << ": " << check;
    EXPECT_NE(check.find("check passed"), std::string::npos) << f << ": " << check;
  }
  // wo's 64 input columns over 2 ranks: 32 a rank, which groups of 64 would cut.
  const std::string cut = d.file("cut");
  auto [rc1, out1] = sh(ingot + " build --quiet --model " + q(test::fixture("llama3")) +
                        " --quantize int4 --group-size 64 --tp 2 -o " + q(cut));
  EXPECT_NE(rc1, 0);
  EXPECT_NE(out1.find("would cut its groups of 64 columns"), std::string::npos) << out1;
  EXPECT_FALSE(fs::exists(cut)) << "the directory was made before the refusal";
  auto [rc2, out2] = sh(ingot + " build --quiet --model " + q(test::fixture("int4/gptq_v1_asym_actorder_g32")) +
                        " --tp 2 -o " + q(cut));
  EXPECT_NE(rc2, 0);
  EXPECT_NE(out2.find("is act-order"), std::string::npos) << out2;
  EXPECT_FALSE(fs::exists(cut));
}

// `ingot inspect` on an engine directory: the manifest's world size and build, each rank file with its
// share of the heads, rank 0's metadata; --json holds the manifest and every rank's metadata; --verify
// checks every file against the manifest.
TEST(TpEngineDir, InspectShowsTheDirectory) {
  test::TempDir d;
  const std::string dir = d.file("e");
  build_dir("qwen3", 2, dir);
  auto [rc, out] = sh(q(INGOT_BINARY) + " inspect " + q(dir));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("split over 2 ranks"), std::string::npos) << out;
  EXPECT_NE(out.find("rank-1.ingot"), std::string::npos) << out;
  EXPECT_NE(out.find("heads 2 (kv 1)"), std::string::npos) << out;
  EXPECT_NE(out.find("qwen3: 2 layers"), std::string::npos) << out;
  auto [rcv, verified] = sh(q(INGOT_BINARY) + " inspect --verify --quiet --engine " + q(dir));
  EXPECT_EQ(rcv, 0) << verified;
  EXPECT_NE(verified.find("checksums verified"), std::string::npos) << verified;
  auto [rcj, js] = sh(q(INGOT_BINARY) + " inspect --json " + q(dir) + " 2>/dev/null");
  ASSERT_EQ(rcj, 0) << js;
  const json j = json::parse(js);
  EXPECT_EQ(j["manifest"]["world_size"], 2);
  ASSERT_EQ(j["ranks"].size(), 2u);
  EXPECT_EQ(j["ranks"][1]["metadata"]["parallel"]["tp_rank"], 1);
}

// A folder of the qwen3 fixture with the byte-level test tokenizer (tests/data/api), for text commands.
std::string text_model(test::TempDir& d) {
  const fs::path folder = d.file("model");
  fs::create_directories(folder);
  for (const auto& e : fs::directory_iterator(test::fixture("qwen3")))
    if (e.path().filename() != "reference.safetensors") fs::copy(e.path(), folder / e.path().filename());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy(std::string(INGOT_SOURCE_DIR) + "/tests/data/api/" + f, folder / f);
  return folder.string();
}

TEST(TpCli, ChatAtTp2EqualsTp1AndTheEngineDirectory) {
  test::TempDir d;
  const std::string model = text_model(d), dir = d.file("e");
  ASSERT_EQ(sh(q(INGOT_BINARY) + " build --quiet --model " + q(model) + " --tp 2 -o " + q(dir)).first, 0);
  // The fixture's 64 positions: a short turn, and the capacity the directory was built with.
  const std::string chat = "printf 'Hi\\n' | " + q(INGOT_BINARY) +
                           " chat --device cpu --threads 2 --capacity 64 --max-new-tokens 8 --no-stats ";
  auto [rc1, one] = sh(chat + "--model " + q(model));
  auto [rc2, two] = sh(chat + "--model " + q(model) + " --tp 2");
  auto [rc3, from_dir] = sh(chat + "--engine " + q(dir));
  ASSERT_EQ(rc1, 0) << one;
  EXPECT_EQ(rc2, 0) << two;
  EXPECT_EQ(rc3, 0) << from_dir;
  EXPECT_FALSE(one.empty());
  EXPECT_EQ(two, one);
  EXPECT_EQ(from_dir, one);
  // Ranks as processes (as on the GPU): rank 0 reads the terminal and leads the other process
  // (Model::lead_ranks); several turns and a /reset, from the checkpoint and from the directory.
  const std::string turns = "printf 'Hi\\nHow are you\\n/reset\\nHi\\n' | ";
  const std::string chat_cmd = " chat --device cpu --threads 2 --capacity 64 --max-new-tokens 8 --no-stats ";
  auto [rc5, threads] = sh(turns + q(INGOT_BINARY) + chat_cmd + "--model " + q(model) + " --tp 2");
  auto [rc6, procs] = sh(turns + "INGOT_TP_PROCESSES=1 " + q(INGOT_BINARY) + chat_cmd + "--model " + q(model) + " --tp 2");
  auto [rc7, procs_dir] = sh(turns + "INGOT_TP_PROCESSES=1 " + q(INGOT_BINARY) + chat_cmd + "--engine " + q(dir));
  auto [rc8, threads_dir] = sh(turns + q(INGOT_BINARY) + chat_cmd + "--engine " + q(dir));
  ASSERT_EQ(rc5, 0) << threads;
  ASSERT_EQ(rc8, 0) << threads_dir;
  EXPECT_EQ(rc6, 0) << procs;
  EXPECT_EQ(rc7, 0) << procs_dir;
  EXPECT_NE(threads.find("[conversation reset]"), std::string::npos) << threads;
  EXPECT_EQ(procs, threads);
  EXPECT_EQ(procs_dir, threads_dir);  // an engine's note on a full cache differs from a folder's
  auto [rc4, bad] = sh(chat + "--engine " + q(dir) + " --tp 4");
  EXPECT_NE(rc4, 0);
  EXPECT_NE(bad.find("--tp 4"), std::string::npos) << bad;
}

}  // namespace
}  // namespace ingot
