// `ingot chat`: an interactive conversation, through the public API. The conversation stays in the
// static cache; each turn prefills only the tokens that differ from what is cached (the new turn).
#include <cstdio>
#include <iostream>

#include "common.h"
#include "core/error.h"
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
    // An engine file brings its capacity: 0 takes it, a number must fit within it.
    api::Model model = load_text_model(a->model, a->capacity ? a->capacity : (a->model.engine_path.empty() ? 4096 : 0));
    const api::GenerateConfig gc = generate_config(a->text, false);
    const api::ChatConfig cc = chat_config(a->text);
    std::vector<api::Message> messages;
    auto reset = [&] {
      messages.clear();
      if (!a->text.system.empty()) messages.push_back({"system", a->text.system});
      model.reset();
    };
    reset();
    std::string line;
    for (;;) {
      std::fprintf(stderr, "> ");
      if (!std::getline(std::cin, line) || line == "/quit") break;
      if (line == "/reset") {
        reset();
        continue;
      }
      if (line.empty()) continue;
      messages.push_back({"user", line});
      try {
        api::Result r = stream_generation(
            [&](const api::OnToken& on_token) { return model.chat(messages, gc, on_token, cc); }, a->text.stats);
        messages.push_back({"assistant", r.text});
      } catch (const Error& e) {  // a turn that does not fit is reported; the conversation goes on
        std::fprintf(stderr, "error: %s\n", e.what());
        messages.pop_back();
      }
    }
  });
}

}  // namespace ingot::cli
