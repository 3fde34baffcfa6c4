// `ingot inspect`: prints what an engine file says about itself (architecture, bounds, cache layout,
// requirements, tokenizer, provenance), as text or as JSON; --verify also checks every blob. An engine
// directory (`ingot build --tp N`): its manifest, each rank file, and rank 0's metadata.
#include <xxhash.h>

#include <cstdio>
#include <fstream>

#include "common.h"
#include "core/error.h"
#include "progress.h"
#include "runtime/tp_engine_dir.h"

namespace ingot::cli {

namespace {

// Embedded texts (tokenizer.json is megabytes) are shown by size and hash, not verbatim.
nlohmann::json summarise_texts(const nlohmann::json& tokenizer) {
  nlohmann::json out = nlohmann::json::object();
  for (auto it = tokenizer.begin(); it != tokenizer.end(); ++it) {
    if (it->is_string()) {
      const std::string& t = it->get_ref<const std::string&>();
      out[it.key()] = {{"bytes", t.size()}, {"xxh64", xxh64_hex(XXH64(t.data(), t.size(), 0))}};
    } else {
      out[it.key()] = nullptr;
    }
  }
  return out;
}

std::string ints(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s.empty() ? "none" : s;
}

// The JSON of one engine file: its path, format, size and metadata (embedded texts summarised).
nlohmann::json engine_json(const EngineFileInfo& f, bool verified) {
  nlohmann::json m = f.metadata;
  m["tokenizer"] = summarise_texts(m["tokenizer"]);
  return {{"file", f.path}, {"format_version", f.format_version}, {"file_bytes", f.file_bytes}, {"verified", verified},
          {"metadata", m}};
}

// One engine file's metadata as text.
void print_engine(const EngineFileInfo& f, bool verified) {
  nlohmann::json m = f.metadata;
  m["tokenizer"] = summarise_texts(m["tokenizer"]);
  const ModelSpec& s = f.spec;
  uint64_t weight_bytes = 0;
  for (const auto& t : f.tensors) weight_bytes += t.bytes;
  std::printf("engine       %s (format %u, %.2f MB)%s\n", f.path.c_str(), f.format_version, f.file_bytes / 1e6,
              verified ? ", checksums verified" : "");
  std::printf("built by     ingot %s (git %s)\n", m["tool"]["version"].get<std::string>().c_str(),
              m["tool"]["git_revision"].get<std::string>().c_str());
  std::printf("model        %s: %lld layers, hidden %lld, heads %lld (kv %lld), head_dim %lld, intermediate %lld, "
              "vocab %lld, max positions %lld, rope %s\n",
              s.family.c_str(), (long long)s.layers, (long long)s.hidden, (long long)s.heads, (long long)s.kv_heads,
              (long long)s.head_dim, (long long)s.intermediate, (long long)s.vocab, (long long)s.max_position,
              s.rope.type.c_str());
  std::string quant = "none";
  if (f.quant)
    quant = "int4 " + f.quant->method + (f.quant->format.empty() ? "" : " " + f.quant->format) + " (" +
            (f.quant->symmetric ? "symmetric" : "zero points") + (f.quant->act_order ? ", act-order" : "") + ", " +
            (f.quant->group_size < 0 ? std::string("one group per row") : "group " + std::to_string(f.quant->group_size)) +
            (f.quant->published_group == 0 ? std::string()
             : f.quant->published_group < 0
                 ? std::string(" (published: one group per row)")
                 : " (published: group " + std::to_string(f.quant->published_group) + ")") +
            ", " + std::string(dtype_name(f.weight_dtype)) + " scales) on " + std::to_string(f.quant->tensors.size()) +
            " linear weights";
  std::printf("weights      %s, quantization %s, %zu tensors, %.2f MB\n", std::string(dtype_name(f.weight_dtype)).c_str(),
              quant.c_str(), f.tensors.size(), weight_bytes / 1e6);
  std::printf("bounds       max batch %d, capacity %lld\n", f.bounds.max_batch, (long long)f.bounds.capacity);
  const nlohmann::json& kv = m["runtime"]["kv_cache"];
  std::printf("kv cache     %s %s per %slayer (K and V), axes %s, capacity on axis %d\n", layout_name(f.bounds.layout).c_str(),
              kv["shape"].dump().c_str(), kv.contains("attention_layers") ? "attention " : "",
              kv["axes"].dump().c_str(), kv["capacity_axis"].get<int>());
  if (kv.contains("attention_layers")) {
    const nlohmann::json& ls = kv["linear_state"];
    std::printf("layers       attention %s, linear attention %s (Gated DeltaNet: k heads %lld x %lld, v heads %lld x %lld, "
                "conv kernel %lld)\n",
                kv["attention_layers"].dump().c_str(), ls["layers"].dump().c_str(), (long long)s.linear.k_heads,
                (long long)s.linear.k_dim, (long long)s.linear.v_heads, (long long)s.linear.v_dim,
                (long long)s.linear.conv_kernel);
    std::printf("linear state f32 conv %s + recurrent %s per linear layer (no capacity)\n",
                ls["conv"]["shape"].dump().c_str(), ls["recurrent"]["shape"].dump().c_str());
  }
  std::printf("eos ids      %s\n", ints(s.eos_ids).c_str());
  std::printf("parallel     tensor-parallel world size %d, rank %d\n", f.tp_world_size, f.tp_rank);
  std::printf("requires     CUDA compute capability %d.%d or newer (%s)\n", f.min_cuda_major, f.min_cuda_minor,
              m["requirements"].value("reason", "").c_str());
  for (auto it = m["tokenizer"].begin(); it != m["tokenizer"].end(); ++it)
    std::printf("text         %-24s %s\n", it.key().c_str(),
                it->is_null() ? "absent" : (std::to_string((*it)["bytes"].get<uint64_t>()) + " bytes").c_str());
  std::printf("generation   %s\n", f.generation_defaults.dump().c_str());
  std::printf("build        %s\n", m["build_options"].dump().c_str());
  std::printf("source       %s\n", m["source"]["checkpoint"].get<std::string>().c_str());
  for (const auto& file : m["source"]["files"])
    std::printf("             %-36s %12llu bytes  xxh64 %s\n", file["name"].get<std::string>().c_str(),
                (unsigned long long)file["bytes"].get<uint64_t>(), file["xxh64"].get<std::string>().c_str());
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Print an engine file's (or engine directory's) metadata");
  struct Args {
    std::string path;
    bool json = false, verify = false, quiet = false;
  };
  auto a = std::make_shared<Args>();
  auto* pos = cmd->add_option("file", a->path,
                              "engine file or directory (or give it as --engine, as other commands take it)");
  cmd->add_option("--engine", a->path, "engine file, or a directory from `ingot build --tp N`")->excludes(pos);
  cmd->add_flag("--json", a->json, "print the metadata as JSON (embedded texts by size and hash)");
  cmd->add_flag("--verify", a->verify, "also check every weight's checksum");
  cmd->add_flag("--quiet", a->quiet, "no progress bar");
  cmd->callback([a] {
    if (a->path.empty()) throw Error("inspect: give the engine file (`ingot inspect FILE` or --engine FILE)");
    if (is_engine_dir(a->path)) {
      // The manifest and every rank file's header checked as a load checks them (no weight read), and
      // with --verify every file's checksum against the manifest.
      const TpEngineDir d = inspect_tp_engine_dir(a->path);
      if (a->verify) {
        ProgressBar bar("verifying", a->quiet);
        verify_tp_engine_dir(d, bar.fn());
      }
      if (a->json) {
        nlohmann::json ranks = nlohmann::json::array();
        for (const EngineFileInfo& f : d.ranks) ranks.push_back(engine_json(f, a->verify));
        std::ifstream in(d.dir + "/" + kTpManifestName);
        const nlohmann::json out = {{"directory", d.dir}, {"verified", a->verify}, {"manifest", nlohmann::json::parse(in)},
                                    {"ranks", ranks}};
        std::printf("%s\n", out.dump(2).c_str());
        return;
      }
      uint64_t bytes = 0;
      for (const TpRankFile& f : d.files) bytes += f.bytes;
      std::printf("directory    %s: split over %d ranks (%.2f MB in all), build %s%s\n", d.dir.c_str(), d.world,
                  bytes / 1e6, d.build_id.c_str(), a->verify ? ", checksums verified" : "");
      for (int r = 0; r < d.world; ++r) {
        const ModelSpec& w = d.ranks[size_t(r)].weights_spec;
        std::printf("rank %-7d %s, %llu bytes, xxh64 %016llx: heads %lld (kv %lld), intermediate %lld\n", r,
                    d.files[size_t(r)].name.c_str(), (unsigned long long)d.files[size_t(r)].bytes,
                    (unsigned long long)d.files[size_t(r)].xxh64, (long long)w.heads, (long long)w.kv_heads,
                    (long long)w.intermediate);
      }
      std::printf("--- rank 0's file (the model line is the whole model's)\n");
      print_engine(d.ranks[0], a->verify);
      return;
    }
    EngineFileInfo f;
    if (a->verify) {
      ProgressBar bar("verifying", a->quiet);
      LoadOptions lo;
      lo.progress = bar.fn();
      const EngineFileInfo header = inspect_engine(a->path);  // inspecting, not running: any rank will do
      lo.tp_world_size = header.tp_world_size;
      lo.tp_rank = header.tp_rank;
      f = load_engine(a->path, lo).info;
    } else {
      f = inspect_engine(a->path);
    }
    if (a->json) {
      std::printf("%s\n", engine_json(f, a->verify).dump(2).c_str());
      return;
    }
    print_engine(f, a->verify);
  });
}

}  // namespace ingot::cli
