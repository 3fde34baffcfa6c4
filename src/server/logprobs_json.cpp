#include "server/logprobs_json.h"

#include <cmath>

namespace ingot::server {

namespace {

using json = nlohmann::json;

std::string token_text(const tok::Tokenizer& tk, int32_t id) {
  const int32_t one[1] = {id};
  return tk.decode(one, false);
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// -inf (a token of probability 0) and NaN have no JSON number.
json value(float lp) { return std::isfinite(lp) ? json(lp) : json(); }

}  // namespace

json chat_logprobs(const tok::Tokenizer& tk, std::span<const int32_t> ids, std::span<const TokenLogprob> lps) {
  json content = json::array();
  for (size_t i = 0; i < ids.size() && i < lps.size(); ++i) {
    const std::string t = token_text(tk, ids[i]);
    json top = json::array();
    for (const auto& [id, lp] : lps[i].top) {
      const std::string a = token_text(tk, id);
      top.push_back({{"token", a}, {"logprob", value(lp)}, {"bytes", bytes_of(a)}});
    }
    content.push_back({{"token", t}, {"logprob", value(lps[i].logprob)}, {"bytes", bytes_of(t)}, {"top_logprobs", top}});
  }
  return content;
}

json completion_logprobs(const tok::Tokenizer& tk, std::span<const int32_t> ids, std::span<const TokenLogprob> lps,
                         int64_t& offset) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (size_t i = 0; i < ids.size() && i < lps.size(); ++i) {
    const std::string t = token_text(tk, ids[i]);
    tokens.push_back(t);
    values.push_back(value(lps[i].logprob));
    json top = json::object();
    for (const auto& [id, lp] : lps[i].top) top[token_text(tk, id)] = value(lp);
    if (!top.contains(t)) top[t] = value(lps[i].logprob);
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += int64_t(t.size());
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

}  // namespace ingot::server
