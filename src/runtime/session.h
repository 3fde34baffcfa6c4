// A text session on one cache row: prompt ids in, streamed text out, with sampling, eos ids and stop
// strings. The row's cache is kept between calls, so a chat turn only prefills what differs from the
// tokens already cached (the longest common prefix is reused).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/model.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace ingot {

struct TextRequest {
  std::vector<int32_t> prompt_ids;
  int max_new_tokens = 256;
  SamplingParams sampling;
  std::vector<int32_t> eos_ids;
  std::vector<std::string> stop_strings;
};

struct TextResult {
  std::string text;            // generated text, cut before a stop string
  std::vector<int32_t> ids;    // generated ids
  int64_t prompt_tokens = 0;
  int64_t prefilled_tokens = 0;  // prompt tokens actually computed (the rest came from the cache)
  double ttft_s = 0;           // request start to first token
  double decode_s = 0;         // first token to last
  std::string stop_reason;     // eos | stop_string | length
  double decode_tok_s() const { return ids.size() > 1 && decode_s > 0 ? double(ids.size() - 1) / decode_s : 0; }
};

// The one-line warning for a request whose prompt and generated tokens run past the positions the model
// was trained for (max_position_embeddings), or "" when they stay within. Such a request still runs
// when the cache holds it, but its output may degrade: the command line warns, a server refuses it
// (400) with this text.
std::string position_limit_warning(int64_t max_position, int64_t prompt_len, int64_t max_new_tokens);

class Session {
 public:
  Session(Model& model, const tok::Tokenizer& tokenizer, int row = 0) : m_(model), tok_(tokenizer), row_(row) {}
  // Throws Error before any compute when the request cannot fit the cache. on_token, when set, gets
  // each generated id right after on_text got the text that id released.
  TextResult generate(const TextRequest& req, const std::function<void(std::string_view)>& on_text = {},
                      const std::function<void(int32_t)>& on_token = {});
  void reset() { cached_.clear(); }

 private:
  Model& m_;
  const tok::Tokenizer& tok_;
  int row_;
  std::vector<int32_t> cached_;  // ids whose K/V are in the row, in slot order
};

}  // namespace ingot
