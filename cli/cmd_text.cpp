// Text inspection for debugging prompts: `ingot tokenize` and `ingot template`. Both need only a
// folder with the tokenizer files, or an engine file that carries them.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "common.h"
#include "core/error.h"
#include "core/files.h"
#include "runtime/chat.h"
#include "text_generation.h"

namespace ingot::cli {

namespace {
nlohmann::ordered_json read_json_file(const std::string& path) {
  const std::string text = read_file(path);
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
}

// --model DIR (the tokenizer files) or --engine FILE (the tokenizer it carries), as the commands that
// run a model take them.
void add_tokenizer_source(CLI::App& cmd, ModelArgs& m) {
  auto* dir = cmd.add_option("--model", m.model_dir, "folder with tokenizer.json (and tokenizer_config.json)");
  cmd.add_option("--engine", m.engine_path, "engine file from `ingot build` (its tokenizer)")->excludes(dir);
}

tok::Tokenizer open_tokenizer(const std::string& command, const ModelArgs& m) {
  if (m.model_dir.empty() && m.engine_path.empty())
    throw Error(command + ": give --model DIR (a folder with tokenizer.json) or --engine FILE");
  return load_tokenizer(m);
}
}  // namespace

void add_text_commands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("tokenize", "Print the token ids (and pieces) of a text");
    struct Args {
      ModelArgs source;
      std::string text, file;
      bool special = false, json = false;
    };
    auto a = std::make_shared<Args>();
    add_tokenizer_source(*cmd, a->source);
    auto* t = cmd->add_option("--text", a->text, "text to tokenize");
    cmd->add_option("--file", a->file, "file to tokenize")->excludes(t);
    cmd->add_flag("--add-special-tokens", a->special, "apply the post-processor (e.g. BOS)");
    cmd->add_flag("--json", a->json, "print JSON {ids, pieces}");
    cmd->callback([a, cmd] {
      tok::Tokenizer tk = open_tokenizer("tokenize", a->source);
      std::string text = !a->file.empty()              ? read_file(a->file)
                         : cmd->count("--text") != 0u ? a->text
                                                       : std::string(std::istreambuf_iterator<char>(std::cin), {});
      std::vector<int32_t> ids = tk.encode(text, a->special);
      if (a->json) {
        nlohmann::json j = {{"ids", ids}, {"pieces", nlohmann::json::array()}};
        for (int32_t id : ids) j["pieces"].push_back(tk.id_to_piece(id));
        std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      } else {
        for (int32_t id : ids) std::printf("%d\t%s\n", id, tk.id_to_piece(id).c_str());
        std::printf("%zu tokens\n", ids.size());
      }
    });
  }
  {
    auto* cmd = app.add_subcommand("template", "Render the chat template over messages, exactly");
    struct Args {
      ModelArgs source;
      std::string messages, tools, thinking, chat_template;
      bool no_gen = false;
    };
    auto a = std::make_shared<Args>();
    add_tokenizer_source(*cmd, a->source);
    cmd->add_option("--messages", a->messages, "JSON file: a list of {role, content, ...}")->required();
    cmd->add_option("--tools", a->tools, "JSON file: a list of tool definitions");
    cmd->add_flag("--no-generation-prompt", a->no_gen, "do not open an assistant turn");
    cmd->add_option("--chat-template", a->chat_template, "file with a Jinja chat template to use instead of the model's");
    cmd->add_option("--enable-thinking", a->thinking, "true or false")->check(CLI::IsMember({"true", "false"}));
    cmd->callback([a] {
      tok::Tokenizer tk = open_tokenizer("template", a->source);
      ChatOptions o;
      o.add_generation_prompt = !a->no_gen;
      if (!a->thinking.empty()) o.enable_thinking = a->thinking == "true";
      if (!a->tools.empty()) o.tools = read_json_file(a->tools);
      const ChatFormat f = a->chat_template.empty() ? ChatFormat::from_tokenizer(tk, a->source.source_name())
                                                    : ChatFormat::from_file(a->chat_template);
      std::string out = f.render(tk, read_json_file(a->messages), o);
      std::fwrite(out.data(), 1, out.size(), stdout);  // exactly the rendered prompt, nothing added
    });
  }
}

}  // namespace ingot::cli
