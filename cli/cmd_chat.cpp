// `ingot chat`: an interactive conversation. The conversation stays in the static cache; each turn
// prefills only the tokens that differ from what is cached (the rendered new turn).
#include <cstdio>
#include <iostream>

#include "common.h"
#include "core/error.h"
#include "runtime/chat.h"
#include "text_generation.h"

namespace ingot::cli {

void add_chat(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "Chat interactively (/reset starts over, /quit or end of input leaves)");
  struct Args {
    ModelArgs model;
    TextArgs text;
    int64_t capacity = 0;
  };
  auto a = std::make_shared<Args>();
  a->model.add_to(*cmd);
  a->text.add_to(*cmd);
  cmd->add_option("--capacity", a->capacity, "cache slots for the whole conversation (default: 4096, or the engine's)");
  cmd->callback([a] {
    tok::Tokenizer tk = load_tokenizer(a->model);
    RuntimeOptions rt;
    // An engine file brings its capacity: 0 takes it, a number must fit within it.
    rt.capacity = a->capacity ? a->capacity : (a->model.engine_path.empty() ? 4096 : 0);
    Loaded l = load_model(a->model, rt);
    Session session(*l.model, tk);
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    auto reset = [&] {
      messages = nlohmann::ordered_json::array();
      if (!a->text.system.empty()) messages.push_back({{"role", "system"}, {"content", a->text.system}});
    };
    reset();
    ChatOptions co;
    if (!a->text.thinking.empty()) co.enable_thinking = a->text.thinking == "true";
    std::string line;
    for (;;) {
      std::fprintf(stderr, "> ");
      if (!std::getline(std::cin, line) || line == "/quit") break;
      if (line == "/reset") {
        reset();
        session.reset();
        continue;
      }
      if (line.empty()) continue;
      messages.push_back({{"role", "user"}, {"content", line}});
      TextRequest req;
      req.prompt_ids = chat_ids(tk, messages, co);
      req.max_new_tokens = a->text.max_new;
      req.sampling = a->text.sampling;
      req.eos_ids = tk.eos_ids();
      req.stop_strings = a->text.stop;
      try {
        TextResult r = stream_generation(session, req, a->text.stats);
        messages.push_back({{"role", "assistant"}, {"content", r.text}});
      } catch (const Error& e) {  // a turn that does not fit is reported; the conversation goes on
        std::fprintf(stderr, "error: %s\n", e.what());
        messages.erase(messages.size() - 1);
      }
    }
  });
}

}  // namespace ingot::cli
