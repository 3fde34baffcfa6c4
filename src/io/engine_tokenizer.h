// The tokenizer an engine file carries: its embedded tokenizer.json, tokenizer_config.json, chat
// template and generation defaults, loaded exactly as the checkpoint folder's files would be.
#pragma once
#include <optional>

#include "io/engine_file.h"
#include "tokenizer/tokenizer.h"

namespace ingot {

// std::nullopt when the engine was built from a folder without tokenizer.json.
std::optional<tok::Tokenizer> tokenizer_from_engine(const EngineFileInfo& info);

}  // namespace ingot
