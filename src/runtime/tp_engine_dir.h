// Per-rank engine files (docs/tensor-parallel.md): `ingot build --tp N -o DIR` writes DIR/rank-0.ingot
// .. rank-(N-1).ingot, each an ordinary engine file (io/engine_file.h) holding one rank's slice
// (shard_engine), and DIR/manifest.json naming them with their sizes, checksums and the build id they
// share. Loading checks the manifest and every file's header and metadata against it before any
// weight is read, so a missing file, a file of another build or world size, or a corrupt one is
// refused before the weights reach a backend.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/engine_file.h"

namespace ingot {

inline constexpr char kTpManifestName[] = "manifest.json";
inline constexpr char kTpManifestFormat[] = "ingot-tensor-parallel-engine";
inline constexpr int kTpManifestVersion = 1;

// "rank-<rank>.ingot": the name build gives rank `rank`'s file.
std::string tp_rank_file_name(int rank);

// One rank's file as the manifest lists it.
struct TpRankFile {
  std::string name;  // relative to the directory, a plain file name
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;  // of the whole file
};

// A checked engine directory: the manifest, and every rank file's header and metadata (no blob read).
struct TpEngineDir {
  std::string dir;
  int world = 0;
  std::string build_id;
  std::vector<TpRankFile> files;      // [world]
  std::vector<EngineFileInfo> ranks;  // [world]; info.spec is the whole model, info.weights_spec the rank's
  std::string path(int rank) const;   // dir/files[rank].name
};

// Whether `path` names a directory (the caller then expects an engine directory in it).
bool is_engine_dir(const std::string& path);

// Refuses, before any long work, an output directory `dir` (flag "-o") that cannot or must not be
// written: a file where the directory should be, a missing parent, an existing non-empty directory
// without `force`, or one whose rank files or manifest would be one of `inputs` (never, even with force).
void check_engine_dir_output(const std::string& dir, int world, bool force, const std::vector<std::string>& inputs);

// Writes `whole` split over `world` ranks into `dir` (created when missing): every rank file through
// save_engine (temporary file renamed at the end), then the manifest the same way, last, so a failed
// build never leaves a manifest naming files it did not finish. `info`'s tp fields are set here.
void save_tp_engine_dir(const Engine& whole, EngineBuildInfo info, int world, const std::string& dir,
                        const ProgressFn& progress = {});

// Reads dir/manifest.json and checks it and every rank file's header and metadata against it: the
// fields present and well-formed, every file present with the manifest's size, its parallel section
// naming the manifest's world size, its own rank and the build id, its architecture the manifest's
// model, its split the manifest's. Throws Error naming the file and the field. Reads no blob.
TpEngineDir inspect_tp_engine_dir(const std::string& dir);

// The rank files' whole-file checksums against the manifest (progress over the bytes hashed); with
// `only_rank` >= 0 that rank's file alone.
void verify_tp_engine_dir(const TpEngineDir& d, const ProgressFn& progress = {}, int only_rank = -1);

// Maps every rank file (checked by inspect_tp_engine_dir, and by verify_tp_engine_dir when `verify`);
// engine r is rank r's slice, its weights borrowing the file's mapping. With `only_rank` >= 0 (ranks
// as processes: each process loads its own rank's file) only that file is verified and mapped, and the
// one engine returned is its slice.
std::vector<Engine> load_tp_engine_dir(const TpEngineDir& d, bool verify, const ProgressFn& progress = {},
                                       int only_rank = -1);

}  // namespace ingot
