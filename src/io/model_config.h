// Reading a ModelSpec (models/spec.h) from a checkpoint's config.json and generation_config.json: the
// fields every family shares and the rope settings here, each family's own through its configure
// hook (models/family.h); and the spec's JSON form in engine metadata.
#pragma once
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "models/spec.h"

namespace ingot {

// Parses config.json content; `source` names the file in errors.
ModelSpec parse_model_config(const nlohmann::json& config, const std::string& source);
// Reads one config.json-style file (e.g. a shapes file for benchmarks with random weights).
ModelSpec load_config_file(const std::string& path);
// Reads DIR/config.json and, if present, DIR/generation_config.json (its eos/bos win over config.json's).
ModelSpec load_model_spec(const std::string& dir);
// Serialises the spec (for engine metadata and `inspect`).
nlohmann::json spec_to_json(const ModelSpec& spec);
ModelSpec spec_from_json(const nlohmann::json& j);

}  // namespace ingot
