#include "io/engine_tokenizer.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace ingot {

namespace fs = std::filesystem;

// The tokenizer loader reads a folder (tokenizer.json plus the config, template and generation
// config that set bos/eos and the chat template), so the embedded texts are laid out in a private
// temporary folder for it, removed again at once; nothing else ever reads that folder.
std::optional<tok::Tokenizer> tokenizer_from_engine(const EngineFileInfo& f) {
  if (!f.tokenizer_json) return std::nullopt;
  std::string tmpl = (fs::temp_directory_path() / "ingot-tokenizer-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw Error(f.path + ": cannot create a temporary folder for the tokenizer");
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{tmpl};
  auto put = [&](const char* name, const std::string& text) {
    std::ofstream out(cleanup.p / name, std::ios::binary);
    out.write(text.data(), std::streamsize(text.size()));
    if (!out) throw Error(f.path + ": cannot write the embedded " + std::string(name) + " to " + cleanup.p.string());
  };
  put("tokenizer.json", *f.tokenizer_json);
  if (f.tokenizer_config_json) put("tokenizer_config.json", *f.tokenizer_config_json);
  if (f.chat_template) put("chat_template.jinja", *f.chat_template);
  if (!f.generation_defaults.empty()) put("generation_config.json", f.generation_defaults.dump());
  return tok::Tokenizer::from_folder(cleanup.p.string());
}

}  // namespace ingot
