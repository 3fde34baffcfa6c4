#include "text_generation.h"

#include <cstdio>

#include "core/error.h"
#include "io/engine_tokenizer.h"

namespace ingot::cli {

void TextArgs::add_to(CLI::App& app) {
  app.add_option("--max-new-tokens", max_new, "most tokens to generate")->check(CLI::PositiveNumber);
  app.add_option("--temperature", sampling.temperature, "0 = greedy (default)");
  app.add_option("--top-k", sampling.top_k, "keep the k most likely tokens (0 = off)");
  app.add_option("--top-p", sampling.top_p, "keep the smallest set with this probability mass (1 = off)");
  app.add_option("--min-p", sampling.min_p, "drop tokens below min-p x the top probability (0 = off)");
  app.add_option("--repetition-penalty", sampling.repetition_penalty, "penalise earlier tokens (1 = off)");
  app.add_option("--seed", sampling.seed, "sampling seed: the same seed gives the same text");
  app.add_option("--stop", stop, "stop when this text is generated (repeatable)");
  app.add_option("--system", system, "system message (chat)");
  app.add_option("--enable-thinking", thinking, "true or false (templates that support it)")
      ->check(CLI::IsMember({"true", "false"}));
  app.add_flag("!--no-stats", stats, "no closing statistics line");
}

tok::Tokenizer load_tokenizer(const ModelArgs& a) {
  if (!a.engine_path.empty()) {
    std::optional<tok::Tokenizer> t = tokenizer_from_engine(inspect_engine(a.engine_path));
    if (!t) throw Error(a.engine_path + ": the engine carries no tokenizer (its checkpoint had no tokenizer.json)");
    return std::move(*t);
  }
  if (a.model_dir.empty()) throw Error("text prompts need a tokenizer: pass --model DIR or --engine FILE");
  return tok::Tokenizer::from_folder(a.model_dir);
}

TextResult stream_generation(Session& s, const TextRequest& req, bool print_stats) {
  TextResult r = s.generate(req, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  std::printf("\n");
  if (print_stats)
    std::fprintf(stderr, "[prompt %lld tokens (%lld computed), generated %zu, ttft %.1f ms, %.2f tok/s, stop: %s]\n",
                 (long long)r.prompt_tokens, (long long)r.prefilled_tokens, r.ids.size(), r.ttft_s * 1e3,
                 r.decode_tok_s(), r.stop_reason.c_str());
  return r;
}

}  // namespace ingot::cli
