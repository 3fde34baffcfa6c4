// Loads the tokenizer an engine file carries from its embedded texts, exactly as the checkpoint
// folder's files would be loaded; messages name the texts as files inside the engine file.
#include "io/engine_tokenizer.h"

#include <string>
#include <string_view>

namespace ingot {

std::optional<tok::Tokenizer> tokenizer_from_engine(const EngineFileInfo& f) {
  if (!f.tokenizer_json) return std::nullopt;
  auto view = [](const std::optional<std::string>& s) -> std::optional<std::string_view> {
    if (!s) return std::nullopt;
    return std::string_view(*s);
  };
  // The engine stores the generation config as parsed JSON; an empty object means it had none.
  std::optional<std::string> generation;
  if (!f.generation_defaults.empty()) generation = f.generation_defaults.dump();
  return tok::Tokenizer::from_texts(*f.tokenizer_json, view(f.tokenizer_config_json), view(f.chat_template),
                                    view(generation), f.path);
}

}  // namespace ingot
