#include "runtime/tp_engine_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/files.h"
#include "core/mapped_file.h"
#include "core/revision.h"
#include "dist/communicator.h"
#include "models/tp_spec.h"
#include "runtime/tp_split.h"

namespace ingot {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// What the manifest says about the whole model: enough to tell two models apart at a glance and to
// check every rank file's architecture against (the files carry the full spec).
json model_summary(const ModelSpec& s, DType weight_dtype) {
  json m = {{"family", s.family},   {"vocab", s.vocab},           {"hidden", s.hidden},
            {"layers", s.layers},   {"heads", s.heads},           {"kv_heads", s.kv_heads},
            {"head_dim", s.head_dim}, {"intermediate", s.intermediate},
            {"weight_dtype", std::string(dtype_name(weight_dtype))}};
  if (s.has_linear_layers()) {
    m["linear_value_heads"] = s.linear.v_heads;
    m["linear_key_heads"] = s.linear.k_heads;
  }
  return m;
}

json share(int64_t first, int64_t count) { return json::array({first, count}); }

// Per rank, [first, count] of each split dimension (docs/tensor-parallel.md, "The split").
json split_json(const ModelSpec& s, int world) {
  json out = json::array();
  for (int r = 0; r < world; ++r) {
    const RankHeads a = rank_heads(s.heads, s.kv_heads, world, r);
    const int64_t inter = s.intermediate / world, rows = (s.vocab + world - 1) / world;
    json e = {{"rank", r},
              {"heads", share(a.q.first, a.q.count)},
              {"kv_heads", share(a.kv.first, a.kv.count)},
              {"intermediate", share(r * inter, inter)},
              {"vocab_rows", share(r * rows, rows)}};
    if (s.has_linear_layers()) {
      const RankHeads l = rank_heads(s.linear.v_heads, s.linear.k_heads, world, r);
      e["linear_value_heads"] = share(l.q.first, l.q.count);
      e["linear_key_heads"] = share(l.kv.first, l.kv.count);
    }
    out.push_back(e);
  }
  return out;
}

// 128 random bits as hex: one per build, written into every file it makes.
std::string new_build_id() {
  std::random_device rd;
  char b[33];
  std::snprintf(b, sizeof b, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  return b;
}

uint64_t hash_file(const std::string& path, const ProgressFn& tick, uint64_t base, uint64_t total) {
  MappedFile map(path);
  uint64_t done = base;
  return xxh64_of(map.data(), map.size(), [&](uint64_t c) {
    done += c;
    if (tick) tick(done, total);
  });
}

// Typed access to the manifest's fields; errors name the manifest and the field's path.
class ManifestFields {
 public:
  explicit ManifestFields(std::string file) : file_(std::move(file)) {}
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw Error(file_ + ": " + path + " " + what);
  }
  const json& field(const json& o, const std::string& path, const char* key) const {
    auto it = o.find(key);
    if (it == o.end()) fail(path, "is missing");
    return *it;
  }
  int64_t integer(const json& o, const std::string& path, const char* key, int64_t lo, int64_t hi) const {
    const json& v = field(o, path, key);
    if (!v.is_number_integer()) fail(path, "must be an integer");
    const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
    if (x < lo || x > hi) fail(path, "is " + std::to_string(x) + ", outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return x;
  }
  uint64_t unsigned_(const json& o, const std::string& path, const char* key) const {
    const json& v = field(o, path, key);
    if (!v.is_number_unsigned()) fail(path, "must be a non-negative integer");
    return v.get<uint64_t>();
  }
  std::string string(const json& o, const std::string& path, const char* key) const {
    const json& v = field(o, path, key);
    if (!v.is_string()) fail(path, "must be a string");
    return v.get<std::string>();
  }
  const json& array(const json& o, const std::string& path, const char* key) const {
    const json& v = field(o, path, key);
    if (!v.is_array()) fail(path, "must be an array");
    return v;
  }

 private:
  std::string file_;
};

}  // namespace

std::string tp_rank_file_name(int rank) { return "rank-" + std::to_string(rank) + ".ingot"; }

std::string TpEngineDir::path(int rank) const { return (fs::path(dir) / files[size_t(rank)].name).string(); }

bool is_engine_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

void check_engine_dir_output(const std::string& dir, int world, bool force, const std::vector<std::string>& inputs) {
  if (dir.empty()) throw Error("-o: the output path is empty");
  const std::string what = "-o " + dir + ": ";
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      throw Error(what + "is a file; build --tp writes a directory (one engine file per rank and a manifest)");
    std::error_code ec;
    const bool empty = fs::is_empty(dir, ec);
    // Inputs first: --force never replaces one.
    std::vector<std::string> outs = {kTpManifestName};
    for (int r = 0; r < world; ++r) outs.push_back(tp_rank_file_name(r));
    for (const std::string& o : outs) {
      const std::string p = (fs::path(dir) / o).string();
      check_output_path(p, "-o", true, inputs);
    }
    if (!empty && !force) throw Error(what + "the directory exists and is not empty; pass --force to write into it");
  } else {
    if (errno != ENOENT) throw Error(what + std::strerror(errno));
    std::string parent = fs::path(dir).lexically_normal().parent_path().string();
    if (parent.empty()) parent = ".";
    if (::stat(parent.c_str(), &st) != 0) throw Error(what + "cannot create it in " + parent + ": " + std::strerror(errno));
    if (!S_ISDIR(st.st_mode)) throw Error(what + parent + " is not a directory");
    if (::access(parent.c_str(), W_OK) != 0) throw Error(what + "cannot create it in " + parent + ": " + std::strerror(errno));
  }
}

void save_tp_engine_dir(const Engine& whole, EngineBuildInfo info, int world, const std::string& dir,
                        const ProgressFn& progress) {
  check_tensor_parallel(whole.spec, world, "build --tp");
  if (world < 2) throw Error("build --tp " + std::to_string(world) + ": an engine directory holds 2 or more ranks");
  if (whole.quant) check_int4_split(whole.spec, *whole.quant, world, "build --tp");
  std::error_code ec;
  fs::create_directory(dir, ec);
  if (ec) throw Error("-o " + dir + ": cannot create the directory: " + ec.message());
  info.tp_world_size = world;
  info.whole_spec = whole.spec;
  info.build_id = new_build_id();
  json files = json::array();
  for (int r = 0; r < world; ++r) {
    const Engine slice = shard_engine(whole, world, r);
    info.tp_rank = r;
    const std::string name = tp_rank_file_name(r), path = (fs::path(dir) / name).string();
    // Progress over ranks: each file's share of 1000 steps per rank.
    save_engine(slice, info, path, progress ? ProgressFn([&](uint64_t d, uint64_t t) {
      progress(uint64_t(r) * 1000 + (t ? d * 1000 / t : 1000), uint64_t(world) * 1000);
    }) : ProgressFn());
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw Error(path + ": " + std::strerror(errno));
    files.push_back({{"rank", r}, {"name", name}, {"bytes", uint64_t(st.st_size)},
                     {"xxh64", xxh64_hex(hash_file(path, {}, 0, 0))}});
  }
  json m = {{"format", kTpManifestFormat},
            {"format_version", kTpManifestVersion},
            {"tool", {{"name", "ingot"}, {"version", INGOT_VERSION}, {"git_revision", git_revision()}}},
            {"build_id", info.build_id},
            {"world_size", world},
            {"model", model_summary(whole.spec, whole.weight_dtype)},
            {"split", split_json(whole.spec, world)},
            {"files", files}};
  const std::string text = m.dump(2) + "\n";
  OutputFile out((fs::path(dir) / kTpManifestName).string());
  out.write(text.data(), text.size());
  out.commit();
}

TpEngineDir inspect_tp_engine_dir(const std::string& dir) {
  TpEngineDir d;
  d.dir = dir;
  const std::string mpath = (fs::path(dir) / kTpManifestName).string();
  std::error_code ec;
  if (!fs::exists(mpath, ec))
    throw Error(dir + ": is a directory without " + kTpManifestName + ": not an engine directory from `ingot build --tp N` "
                "(a checkpoint folder goes to --model)");
  const std::string text = read_file(mpath);
  json m;
  try {
    m = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(mpath + ": is not valid JSON: " + e.what());
  }
  if (!m.is_object()) throw Error(mpath + ": is not a JSON object");
  const ManifestFields f(mpath);
  if (f.string(m, "format", "format") != kTpManifestFormat)
    f.fail("format", "is not \"" + std::string(kTpManifestFormat) + "\"");
  const int64_t version = f.integer(m, "format_version", "format_version", 1, INT64_MAX);
  if (version > kTpManifestVersion)
    f.fail("format_version", "is " + std::to_string(version) + ", newer than this ingot reads (" +
                                 std::to_string(kTpManifestVersion) + "); use a newer ingot or rebuild");
  d.build_id = f.string(m, "build_id", "build_id");
  if (d.build_id.empty()) f.fail("build_id", "is empty");
  d.world = int(f.integer(m, "world_size", "world_size", 2, kMaxTensorParallel));
  if (!f.field(m, "model", "model").is_object()) f.fail("model", "must be an object");
  const json& split = f.array(m, "split", "split");
  const json& files = f.array(m, "files", "files");
  if (int64_t(files.size()) != d.world)
    f.fail("files", "lists " + std::to_string(files.size()) + " files for world_size " + std::to_string(d.world));
  for (int r = 0; r < d.world; ++r) {
    const std::string p = "files[" + std::to_string(r) + "]";
    const json& e = files[size_t(r)];
    if (!e.is_object()) f.fail(p, "must be an object");
    if (f.integer(e, p + ".rank", "rank", 0, d.world - 1) != r) f.fail(p + ".rank", "must be " + std::to_string(r));
    TpRankFile rf;
    rf.name = f.string(e, p + ".name", "name");
    if (rf.name.empty() || rf.name.find('/') != std::string::npos || rf.name == "." || rf.name == "..")
      f.fail(p + ".name", "'" + rf.name + "' must be a file name in the directory");
    rf.bytes = f.unsigned_(e, p + ".bytes", "bytes");
    if (!parse_xxh64_hex(f.string(e, p + ".xxh64", "xxh64"), rf.xxh64)) f.fail(p + ".xxh64", "must be 16 lowercase hex digits");
    d.files.push_back(rf);
  }
  // Every file: present, the manifest's size, then its header and metadata (validated by the engine
  // format's own parser) naming this build, this world and this rank.
  for (int r = 0; r < d.world; ++r) {
    const std::string path = d.path(r), p = "files[" + std::to_string(r) + "]";
    const std::string of = " (" + std::string(kTpManifestName) + " " + p + ")";
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw Error(read_error(path, errno) + of);
    if (S_ISDIR(st.st_mode)) throw Error(read_error(path, EISDIR) + of);
    if (uint64_t(st.st_size) != d.files[size_t(r)].bytes)
      throw Error(path + ": has " + std::to_string(st.st_size) + " bytes; " + kTpManifestName + " " + p + ".bytes says " +
                  std::to_string(d.files[size_t(r)].bytes) + " (truncated, replaced, or from another build)");
    EngineFileInfo info = inspect_engine(path);
    if (info.tp_world_size != d.world)
      throw Error(path + ": parallel.tp_world_size is " + std::to_string(info.tp_world_size) + "; " + kTpManifestName +
                  " world_size is " + std::to_string(d.world));
    if (info.tp_rank != r)
      throw Error(path + ": parallel.tp_rank is " + std::to_string(info.tp_rank) + "; " + kTpManifestName + " lists it as " +
                  p + ", rank " + std::to_string(r));
    if (info.tp_build_id != d.build_id)
      throw Error(path + ": parallel.build_id is " + info.tp_build_id + "; " + kTpManifestName + " build_id is " +
                  d.build_id + ": the directory mixes files of different builds");
    const json summary = model_summary(info.spec, info.weight_dtype);
    if (m.at("model") != summary)
      throw Error(path + ": its architecture " + summary.dump() + " is not " + kTpManifestName + "'s model " +
                  m.at("model").dump());
    if (r > 0) {
      const EngineFileInfo& first = d.ranks[0];
      if (info.bounds.max_batch != first.bounds.max_batch || info.bounds.capacity != first.bounds.capacity ||
          info.bounds.layout != first.bounds.layout)
        throw Error(path + ": runtime bounds differ from " + d.path(0) + "'s");
    }
    d.ranks.push_back(std::move(info));
  }
  const json want = split_json(d.ranks[0].spec, d.world);
  if (split != want) f.fail("split", "is not the split of the model over " + std::to_string(d.world) + " ranks (" + want.dump() + ")");
  return d;
}

void verify_tp_engine_dir(const TpEngineDir& d, const ProgressFn& progress, int only_rank) {
  const auto hashed = [&](int r) { return only_rank < 0 || r == only_rank; };
  uint64_t total = 0, done = 0;
  for (int r = 0; r < d.world; ++r)
    if (hashed(r)) total += d.files[size_t(r)].bytes;
  for (int r = 0; r < d.world; ++r) {
    if (!hashed(r)) continue;
    const TpRankFile& f = d.files[size_t(r)];
    const uint64_t h = hash_file(d.path(r), progress, done, total);
    done += f.bytes;
    if (h != f.xxh64)
      throw Error(d.path(r) + ": the file hashes to xxh64 " + xxh64_hex(h) + "; " + kTpManifestName + " files[" +
                  std::to_string(r) + "].xxh64 says " + xxh64_hex(f.xxh64) + " (the file is corrupt or was replaced)");
  }
}

std::vector<Engine> load_tp_engine_dir(const TpEngineDir& d, bool verify, const ProgressFn& progress, int only_rank) {
  if (only_rank >= d.world)
    throw Error(d.dir + ": rank " + std::to_string(only_rank) + " of a directory of " + std::to_string(d.world) + " ranks");
  // The whole-file checksum covers every byte, blobs included, so the per-blob pass is not repeated.
  if (verify) verify_tp_engine_dir(d, progress, only_rank);
  std::vector<Engine> out;
  for (int r = 0; r < d.world; ++r) {
    if (only_rank >= 0 && r != only_rank) continue;
    LoadOptions lo;
    lo.verify = false;
    lo.tp_world_size = d.world;
    lo.tp_rank = r;
    out.push_back(load_engine(d.path(r), lo).engine);
  }
  return out;
}

}  // namespace ingot
