// `ingot generate`: generation from token ids (greedy, or sampled with the sampling flags), one line per
// step as a debugging runner prints; or streamed text from a text prompt.
#include <algorithm>
#include <cstdio>

#include "common.h"
#include "core/error.h"
#include "options.h"
#include "runtime/chat.h"
#include "runtime/generator.h"
#include "text_generation.h"

namespace ingot::cli {

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate from token ids (one line per step) or from text");
  struct Args {
    ModelArgs model;
    TextArgs text;
    std::string prompt_ids, prompt;
    bool chat = false;
    int64_t capacity = 0;
    bool ignore_eos = false;
  };
  auto a = std::make_shared<Args>();
  a->text.max_new = 16;  // before add_to, so --help shows it as the default
  a->model.add_to(*cmd);
  a->model.add_tp_option(*cmd);
  a->text.add_to(*cmd);
  auto* ids = cmd->add_option("--prompt-ids", a->prompt_ids, "comma-separated token ids");
  cmd->add_option("--prompt", a->prompt, "prompt text (streams text out)")->excludes(ids);
  auto* chat = cmd->add_flag("--chat", a->chat, "wrap the prompt in the model's chat template");
  a->text.add_chat_template(*cmd)->needs(chat);
  cmd->add_option("--capacity", a->capacity, "cache slots (default: prompt + max new tokens - 1)")->check(at_least(0));
  cmd->add_flag("--ignore-eos", a->ignore_eos, "do not stop at the end-of-sequence ids");
  cmd->callback([a, cmd] {
    if (cmd->count("--prompt") && a->prompt.empty()) throw Error("generate: --prompt is empty (give the text to continue)");
    if (cmd->count("--prompt-ids") && parse_ids(a->prompt_ids).empty())
      throw Error("generate: --prompt-ids holds no token ids");
    if (a->prompt_ids.empty() == a->prompt.empty()) throw Error("generate: give exactly one of --prompt-ids or --prompt");
    if (!a->prompt.empty()) {
      std::vector<api::Message> messages;
      if (!a->text.system.empty()) messages.push_back({"system", a->text.system});
      messages.push_back({"user", a->prompt});
      const api::ChatConfig cc = chat_config(a->text);
      int64_t capacity = a->capacity;
      if (!capacity) {
        // The cache is sized to this request (an engine's bounds are only its upper limit), as for
        // --prompt-ids; that takes the prompt's length, so the tokenizer is read once here before the
        // model loads it again.
        tok::Tokenizer tk = load_tokenizer(a->model);
        nlohmann::ordered_json mj = nlohmann::ordered_json::array();
        for (const api::Message& m : messages) mj.push_back({{"role", m.role}, {"content", m.content}});
        ChatOptions co;
        if (cc.enable_thinking >= 0) co.enable_thinking = cc.enable_thinking == 1;
        const size_t n = !a->chat ? tk.encode(a->prompt, true).size()
                         : a->text.chat_template.empty()
                             ? ChatFormat::from_tokenizer(tk, a->model.source_name()).ids(tk, mj, co).size()
                             : ChatFormat::from_file(a->text.chat_template).ids(tk, mj, co).size();
        capacity = State::slots_needed(int64_t(n), a->text.max_new);
      }
      api::Model model = load_text_model(a->model, a->text, capacity, a->chat);
      const api::GenerateConfig gc = generate_config(a->text, a->ignore_eos);
      stream_generation(
          [&](const api::OnToken& on_token) {
            return a->chat ? model.chat(messages, gc, on_token, cc) : model.generate(a->prompt, gc, on_token);
          },
          a->text.stats);
      return;
    }
    // Token ids: one line per step, through the same API with the cache sized to the request.
    const int max_new = a->text.max_new;
    const std::vector<int32_t> prompt = parse_ids(a->prompt_ids);
    const int64_t need = State::slots_needed(int64_t(prompt.size()), max_new);
    if (a->capacity && need > a->capacity)  // refused before any weights are read
      throw Error("generate: the prompt's " + std::to_string(prompt.size()) + " tokens and --max-new-tokens " +
                  std::to_string(max_new) + " need " + std::to_string(need) + " cache slots, beyond --capacity " +
                  std::to_string(a->capacity));
    api::Model model = load_text_model(a->model, a->text, a->capacity ? a->capacity : need, false);
    int step = 0;
    const api::Result r = model.generate(prompt, generate_config(a->text, a->ignore_eos), [&](int32_t tok, std::string_view) {
      if (tok < 0) return;  // the closing text event: no token
      std::printf("step %d %s token %d\n", step, step == 0 ? "prefill" : "decode", tok);
      std::fflush(stdout);
      ++step;
    });
    std::printf("generated %zu tokens\n", r.token_ids.size());
  });
}

}  // namespace ingot::cli
