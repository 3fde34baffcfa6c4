// Text generation shared by `ingot generate --prompt` and `ingot chat`: sampling flags, the tokenizer
// of the model, streaming output and the closing statistics line.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "common.h"
#include "ingot/ingot.h"
#include "tokenizer/tokenizer.h"

namespace ingot::cli {

struct TextArgs {
  int max_new = 256;
  api::Sampling sampling;  // the API's settings: the runtime's are derived from them in one place
  std::vector<std::string> stop;
  std::string system;
  std::string thinking;  // "", "true" or "false"
  bool stats = true;
  std::string chat_template;  // --chat-template FILE ("" = the model's)
  void add_to(CLI::App& app);
  // --chat-template, for the commands that chat (returned so a command can tie it to its --chat).
  CLI::Option* add_chat_template(CLI::App& app);
};

tok::Tokenizer load_tokenizer(const ModelArgs& a);
// The model for generation (text or token ids), through the public API (include/ingot/ingot.h):
// --engine as built (capacity 0 = the engine's), or --model with `capacity` cache slots. With `chat`, a model without a
// chat template (its own or t.chat_template) is refused before its weights are read.
api::Model load_text_model(const ModelArgs& a, const TextArgs& t, int64_t capacity, bool chat);
// Warnings (a request past max_position_embeddings) go to stderr as "warning: ..." lines.
api::GenerateConfig generate_config(const TextArgs& t, bool ignore_eos);
api::ChatConfig chat_config(const TextArgs& t);
// Runs one generation (given the streaming callback), writing its text to stdout as it comes, ending
// its last line (also when the run fails midway), flushing stdout, and only then writing the closing
// statistics line to stderr, so that with both streams on one terminal or pipe the line starts a line
// of its own.
api::Result stream_generation(const std::function<api::Result(const api::OnToken&)>& run, bool print_stats);

}  // namespace ingot::cli
