// Engine file load time: the fixtures (target: <= 50 ms each on the CPU, verification included) and
// a larger random engine to show the verification rate in bytes per second.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <random>

#include "io/engine_file.h"

namespace {

namespace fs = std::filesystem;

// Builds each engine file once per process, in a temporary folder removed at exit.
class Files {
 public:
  static Files& get() {
    static Files f;
    return f;
  }
  const std::string& fixture(const std::string& name) {
    auto it = paths_.find(name);
    if (it != paths_.end()) return it->second;
    const std::string dir = std::string(INGOT_SOURCE_DIR) + "/tests/data/models/" + name;
    ingot::EngineBuildInfo info;
    info.source = ingot::describe_checkpoint(dir);
    const std::string path = (root_ / (name + ".ingot")).string();
    ingot::save_engine(ingot::build_engine(dir, {}), info, path);
    return paths_[name] = path;
  }
  const std::string& random_engine(int layers) {
    const std::string key = "random" + std::to_string(layers);
    auto it = paths_.find(key);
    if (it != paths_.end()) return it->second;
    ingot::ModelSpec s;
    s.family = "llama";
    s.vocab = 32000;
    s.hidden = 1024;
    s.intermediate = 2816;
    s.layers = layers;
    s.heads = 16;
    s.kv_heads = 4;
    s.head_dim = 64;
    s.max_position = 4096;
    s.window.assign(size_t(layers), 0);
    s.eos_ids = {2};
    ingot::EngineBuildInfo info;
    info.bounds.capacity = 4096;
    const std::string path = (root_ / (key + ".ingot")).string();
    ingot::save_engine(ingot::random_engine(s, ingot::DType::BF16, 1), info, path);
    return paths_[key] = path;
  }
  ~Files() { fs::remove_all(root_); }

 private:
  Files() {
    std::random_device rd;
    root_ = fs::temp_directory_path() / ("ingot-bench-" + std::to_string(rd()));
    fs::create_directories(root_);
  }
  fs::path root_;
  std::map<std::string, std::string> paths_;
};

void load(benchmark::State& state, const std::string& path, bool verify) {
  ingot::LoadOptions o;
  o.verify = verify;
  uint64_t bytes = 0;
  for (auto _ : state) {
    ingot::LoadedEngine e = ingot::load_engine(path, o);
    bytes = e.engine.weight_bytes();
    benchmark::DoNotOptimize(e.engine.weights.size());
  }
  state.SetBytesProcessed(int64_t(state.iterations() * bytes));
}

void BM_LoadFixture(benchmark::State& state, const char* name, bool verify) {
  load(state, Files::get().fixture(name), verify);
}
BENCHMARK_CAPTURE(BM_LoadFixture, llama3_verify, "llama3", true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LoadFixture, qwen2_verify, "qwen2", true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LoadFixture, qwen3_verify, "qwen3", true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LoadFixture, qwen3_swa_verify, "qwen3_swa", true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LoadFixture, qwen3_swa_no_verify, "qwen3_swa", false)->Unit(benchmark::kMillisecond);

// ~0.3 GB of bf16 weights (8 layers): verification throughput.
void BM_LoadRandom(benchmark::State& state) { load(state, Files::get().random_engine(8), state.range(0) != 0); }
BENCHMARK(BM_LoadRandom)->Arg(1)->Arg(0)->ArgName("verify")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
