// Tokenizer encode throughput, single-threaded, for the Qwen3, Llama 3 and Llama 2 tokenizer.json
// files: the conformance corpus (one encode per string) and a few MiB of mixed text built from it
// (one encode). bench/peer_tokenizers.py times the Hugging Face `tokenizers` library on exactly the
// same inputs, so the two reports compare directly (bytes/s and tokens/s).
//
// Files: <root>/.cache/tokenizers (or $INGOT_CACHE/tokenizers) from scripts/fetch-tokenizers and
// <root>/tests/data/tokenizer/corpus.jsonl, where <root> is the current directory when it holds
// the corpus, else the source tree this was built from.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace {

constexpr size_t kMixedBytes = 4u << 20;

fs::path repo_root() {
  if (fs::exists("tests/data/tokenizer/corpus.jsonl")) return fs::current_path();
  return INGOT_SOURCE_DIR;
}

fs::path tokenizers_root() {
  if (const char* c = std::getenv("INGOT_CACHE"); c && *c) return fs::path(c) / "tokenizers";
  return repo_root() / ".cache" / "tokenizers";
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> out;
    std::ifstream in(repo_root() / "tests/data/tokenizer/corpus.jsonl", std::ios::binary);
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) out.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
    return out;
  }();
  return texts;
}

// Corpus strings drawn by a 64-bit LCG and joined with "\n" until kMixedBytes is reached; the
// peer script builds the identical string.
const std::string& mixed_text() {
  static const std::string text = [] {
    const auto& c = corpus();
    std::string out;
    uint64_t x = 20261130;
    while (out.size() < kMixedBytes) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      out += c[(x >> 33) % c.size()];
      out += '\n';
    }
    return out;
  }();
  return text;
}

const ingot::tok::Tokenizer* load(const std::string& name) {
  static std::map<std::string, ingot::tok::Tokenizer> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return &it->second;
  const fs::path dir = tokenizers_root() / name;
  if (!fs::exists(dir / "tokenizer.json")) return nullptr;
  return &cache.emplace(name, ingot::tok::Tokenizer::from_folder(dir.string())).first->second;
}

void BM_EncodeCorpus(benchmark::State& state, const std::string& name) {
  const ingot::tok::Tokenizer* tok = load(name);
  if (!tok || corpus().empty()) {
    state.SkipWithError("tokenizer files or corpus missing: run scripts/fetch-tokenizers");
    return;
  }
  size_t bytes = 0, tokens = 0;
  for (const auto& t : corpus()) bytes += t.size();
  for (auto _ : state) {
    tokens = 0;
    for (const auto& t : corpus()) {
      auto ids = tok->encode(t, false);
      tokens += ids.size();
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["tokens"] = benchmark::Counter(static_cast<double>(tokens) * state.iterations(), benchmark::Counter::kIsRate);
}

void BM_EncodeMixed(benchmark::State& state, const std::string& name) {
  const ingot::tok::Tokenizer* tok = load(name);
  if (!tok || corpus().empty()) {
    state.SkipWithError("tokenizer files or corpus missing: run scripts/fetch-tokenizers");
    return;
  }
  const std::string& text = mixed_text();
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text, false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = benchmark::Counter(static_cast<double>(tokens) * state.iterations(), benchmark::Counter::kIsRate);
}

void BM_DecodeStream(benchmark::State& state, const std::string& name) {
  const ingot::tok::Tokenizer* tok = load(name);
  if (!tok || corpus().empty()) {
    state.SkipWithError("tokenizer files or corpus missing: run scripts/fetch-tokenizers");
    return;
  }
  const std::vector<int32_t> ids = tok->encode(mixed_text().substr(0, 1 << 18), false);
  for (auto _ : state) {
    ingot::tok::StreamDecoder dec(*tok);
    size_t n = 0;
    for (int32_t id : ids) n += dec.push(id).size();
    benchmark::DoNotOptimize(n);
  }
  state.counters["tokens"] = benchmark::Counter(static_cast<double>(ids.size()) * state.iterations(), benchmark::Counter::kIsRate);
}

}  // namespace

int main(int argc, char** argv) {
  for (const std::string name : {"qwen3", "llama3", "llama2"}) {
    benchmark::RegisterBenchmark(("encode_corpus/" + name).c_str(), BM_EncodeCorpus, name)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("encode_mixed_4MiB/" + name).c_str(), BM_EncodeMixed, name)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("stream_decode/" + name).c_str(), BM_DecodeStream, name)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
