// The Generator's text hook over a tokenizer: streamed detokenization of a request's ids.
#pragma once
#include <memory>

#include "runtime/generator.h"
#include "tokenizer/tokenizer.h"

namespace ingot {

class TokenizerText : public TextDecoder {
 public:
  explicit TokenizerText(const tok::Tokenizer& t) : dec_(t, true) {}
  std::string push(int32_t id) override { return dec_.push(id); }
  std::string flush() override { return dec_.flush(); }

 private:
  tok::StreamDecoder dec_;  // skips special tokens, holds back split characters
};

inline std::unique_ptr<TextDecoder> text_decoder(const tok::Tokenizer& t) { return std::make_unique<TokenizerText>(t); }

}  // namespace ingot
