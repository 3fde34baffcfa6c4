// Text generation shared by `ingot generate --prompt` and `ingot chat`: sampling flags, the tokenizer
// of the model, streaming output and the closing statistics line.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "common.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

namespace ingot::cli {

struct TextArgs {
  int max_new = 256;
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::string system;
  std::string thinking;  // "", "true" or "false"
  bool stats = true;
  void add_to(CLI::App& app);
};

tok::Tokenizer load_tokenizer(const ModelArgs& a);
// Streams one generation to stdout and prints the closing line to stderr.
TextResult stream_generation(Session& s, const TextRequest& req, bool print_stats);

}  // namespace ingot::cli
