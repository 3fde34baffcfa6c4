#include "text_generation.h"

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "options.h"
#include "io/engine_tokenizer.h"
#include "progress.h"
#include "runtime/tp_engine_dir.h"

namespace ingot::cli {

void TextArgs::add_to(CLI::App& app) {
  app.add_option("--max-new-tokens", max_new, "most tokens to generate")->check(at_least(1));
  app.add_option("--temperature", sampling.temperature, "0 = greedy (default)");
  app.add_option("--top-k", sampling.top_k, "keep the k most likely tokens (0 = off)");
  app.add_option("--top-p", sampling.top_p, "keep the smallest set with this probability mass (1 = off)");
  app.add_option("--min-p", sampling.min_p, "drop tokens below min-p x the top probability (0 = off)");
  app.add_option("--repetition-penalty", sampling.repetition_penalty, "penalise earlier tokens (1 = off)");
  app.add_option("--frequency-penalty", sampling.frequency_penalty,
                 "subtract this x the times a token was generated from its logit ([-2, 2], 0 = off)");
  app.add_option("--presence-penalty", sampling.presence_penalty,
                 "subtract this from the logit of a token already generated ([-2, 2], 0 = off)");
  app.add_option("--seed", sampling.seed, "sampling seed: the same seed gives the same text");
  app.add_option("--stop", stop, "stop when this text is generated (repeatable)");
  app.add_option("--system", system, "system message (chat)");
  app.add_option("--enable-thinking", thinking, "true or false (templates that support it)")
      ->check(CLI::IsMember({"true", "false"}));
  app.add_flag("!--no-stats", stats, "no closing statistics line");
}

CLI::Option* TextArgs::add_chat_template(CLI::App& app) {
  return app.add_option("--chat-template", chat_template,
                        "file with a Jinja chat template to use instead of the model's (needed when it has none)");
}

tok::Tokenizer load_tokenizer(const ModelArgs& a) {
  if (!a.engine_path.empty()) {
    std::optional<tok::Tokenizer> t = tokenizer_from_engine(
        is_engine_dir(a.engine_path) ? inspect_tp_engine_dir(a.engine_path).ranks[0] : inspect_engine(a.engine_path));
    if (!t) throw Error(a.engine_path + ": the engine carries no tokenizer (its checkpoint had no tokenizer.json)");
    return std::move(*t);
  }
  if (a.model_dir.empty()) throw Error("text prompts need a tokenizer: pass --model DIR or --engine FILE");
  return tok::Tokenizer::from_folder(a.model_dir);
}

api::Model load_text_model(const ModelArgs& a, const TextArgs& t, int64_t capacity, bool chat) {
  if (a.model_dir.empty() == a.engine_path.empty()) throw Error("give exactly one of --model DIR or --engine FILE");
  // The API tells a checkpoint folder from an engine by looking; --engine names an engine file or an
  // engine directory (with its manifest), whatever is there.
  if (!a.engine_path.empty() && is_engine_dir(a.engine_path))
    (void)inspect_tp_engine_dir(a.engine_path);  // refuses a folder without a manifest, naming --engine's path
  a.check_tp();
  api::LoadConfig c;
  c.device = a.device;
  c.tp = a.tp_given() ? a.tp : 0;  // 0: an engine directory's own world size
  c.threads = a.threads;
  c.batch_invariant = a.batch_invariant;
  c.verify = !a.no_verify;
  c.dtype = a.dtype;
  c.activations = a.activations;
  c.int4_group_size = int4_group_option(a.quantize, a.group_size).value_or(0);
  c.calibration_text = a.calibration;
  c.calibration_ids = a.calibration_ids;
  c.quantize_lm_head = a.quantize_lm_head;
  c.capacity = capacity;
  c.chat = chat;
  c.chat_template_file = t.chat_template;
  ProgressBar bar("verifying", a.quiet);
  c.progress = bar.fn();
  return api::Model::load(a.source_name(), c);
}

api::GenerateConfig generate_config(const TextArgs& t, bool ignore_eos) {
  api::GenerateConfig g;
  g.max_new_tokens = t.max_new;
  g.sampling = t.sampling;
  g.stop = t.stop;
  g.ignore_eos = ignore_eos;
  g.on_warning = [](const std::string& w) { std::fprintf(stderr, "warning: %s\n", w.c_str()); };
  return g;
}

api::ChatConfig chat_config(const TextArgs& t) {
  api::ChatConfig c;
  if (!t.thinking.empty()) c.enable_thinking = t.thinking == "true" ? 1 : 0;
  return c;
}

api::Result stream_generation(const std::function<api::Result(const api::OnToken&)>& run, bool print_stats) {
  bool line_open = false;  // stdout's last byte is not a newline
  auto end_line = [&] {
    if (line_open) std::fputc('\n', stdout);
    line_open = false;
    std::fflush(stdout);
  };
  api::Result r;
  try {
    r = run([&](int32_t, std::string_view piece) {
      if (piece.empty()) return;
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      line_open = piece.back() != '\n';
    });
  } catch (...) {
    end_line();  // the error message that follows starts a line too
    throw;
  }
  end_line();
  if (print_stats)
    std::fprintf(stderr, "[prompt %lld tokens (%lld computed), generated %zu, ttft %.1f ms, %.2f tok/s, stop: %s]\n",
                 (long long)r.prompt_tokens, (long long)r.computed_prompt_tokens, r.token_ids.size(), r.ttft_s * 1e3,
                 r.decode_tokens_per_s(), r.stop_reason.c_str());
  return r;
}

}  // namespace ingot::cli
