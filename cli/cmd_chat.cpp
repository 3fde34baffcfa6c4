// `ingot chat`: an interactive conversation, through the public API. The conversation stays in the
// static cache; each turn prefills only the tokens that differ from what is cached (the new turn).
#include <cstdio>
#include <iostream>
#include <utility>

#include "common.h"
#include "core/error.h"
#include "dist/in_process.h"  // GroupStopped
#include "text_generation.h"

namespace ingot::cli {

namespace {

// What a full cache means for the conversation and how to go on, one line.
std::string full_cache_note(int64_t capacity, bool dropped, bool engine) {
  return std::string("[the cache is full (") + std::to_string(capacity) + " slots): " +
         (dropped ? "this message does not fit and was dropped" : "the reply is cut") +
         "; /reset starts a new conversation, or restart with a larger --capacity" +
         (engine ? " (an engine holds at most the capacity it was built with: rebuild it with `ingot build "
                   "--capacity N` for more)]"
                 : "]");
}

}  // namespace

void add_chat(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "Chat interactively (/reset starts over, /quit or end of input leaves)");
  struct Args {
    ModelArgs model;
    TextArgs text;
    int64_t capacity = 0;
  };
  auto a = std::make_shared<Args>();
  a->model.add_to(*cmd);
  a->model.add_tp_option(*cmd);
  a->text.add_to(*cmd);
  a->text.add_chat_template(*cmd);
  cmd->add_option("--capacity", a->capacity, "cache slots for the whole conversation (default: 4096, or the engine's)");
  cmd->callback([a] {
    // An engine file brings its capacity: 0 takes it, a number must fit within it.
    api::Model model =
        load_text_model(a->model, a->text, a->capacity ? a->capacity : (a->model.engine_path.empty() ? 4096 : 0), true);
    // Ranks as processes (--tp N on the GPU): only rank 0 reads the terminal; the others run its Model
    // calls and end with it.
    if (!model.lead_ranks()) return;
    api::GenerateConfig gc = generate_config(a->text, false);
    // A conversation grows until the cache is full: the turn that reaches the end stops there.
    gc.fit_capacity = true;
    bool warned = false;  // the max_position warning, once per conversation
    const auto warn = gc.on_warning;
    gc.on_warning = [&](const std::string& w) {
      if (!std::exchange(warned, true)) warn(w);
    };
    const api::ChatConfig cc = chat_config(a->text);
    std::vector<api::Message> messages;
    auto reset = [&] {
      messages.clear();
      if (!a->text.system.empty()) messages.push_back({"system", a->text.system});
      model.reset();
      warned = false;
    };
    reset();
    std::string line;
    for (;;) {
      std::fprintf(stderr, "> ");
      if (!std::getline(std::cin, line) || line == "/quit") break;
      if (line == "/reset") {
        reset();
        std::fprintf(stderr, "[conversation reset]\n");
        continue;
      }
      if (line.empty()) continue;
      messages.push_back({"user", line});
      try {
        api::Result r = stream_generation(
            [&](const api::OnToken& on_token) { return model.chat(messages, gc, on_token, cc); }, a->text.stats);
        if (r.stop_reason == "capacity")
          std::fprintf(stderr, "%s\n",
                       full_cache_note(model.capacity(), r.token_ids.empty(), !a->model.engine_path.empty()).c_str());
        if (r.token_ids.empty())
          messages.pop_back();
        else
          messages.push_back({"assistant", r.text});
      } catch (const GroupStopped&) {  // a tensor-parallel rank ended: the model cannot answer again
        throw;
      } catch (const Error& e) {  // a failed turn is reported and forgotten; the conversation goes on
        std::fprintf(stderr, "error: %s\n", e.what());
        messages.pop_back();
      }
    }
  });
}

}  // namespace ingot::cli
