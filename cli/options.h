// Option checks shared by the commands, with short messages that name the flag and the limit (CLI11's
// own ranges print the type's limits, 310 digits for a double).
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "common.h"

namespace ingot::cli {

// A number >= min: "--max-new-tokens: must be at least 1 (got 0)".
CLI::Validator at_least(double min);

// The dtype names of the documentation (fp32, fp16, bf16) and the names ingot prints (f32, f16).
CLI::Validator dtype_names();

// The name of the known command nearest to `word` by edit distance, or "" when none is close.
std::string nearest_command(const CLI::App& app, const std::string& word);
// Throws Error unless `word` names a command: "unknown command 'generat'; did you mean 'generate'?".
void check_command(const CLI::App& app, const std::string& word);

// The files a command reads through --model or --engine: what its output must never replace.
std::vector<std::string> model_inputs(const ModelArgs& m);

// Adds `ingot help [command]`.
void add_help(CLI::App& app);

}  // namespace ingot::cli
