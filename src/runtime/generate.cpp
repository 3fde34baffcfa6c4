#include "runtime/generate.h"

#include <algorithm>

#include "core/error.h"

namespace ingot {

namespace {
int32_t argmax_row(const HostTensor& logits, int64_t r) {
  const float* l = logits.as<float>() + r * logits.shape()[1];
  return int32_t(std::max_element(l, l + logits.shape()[1]) - l);
}
}  // namespace

std::vector<int32_t> generate_greedy(Model& m, const std::vector<int32_t>& prompt, const GenerateOptions& o,
                                     const TokenCallback& on_token) {
  if (prompt.empty()) throw Error("generate: the prompt is empty");
  if (o.max_new_tokens < 1) throw Error("generate: max_new_tokens must be at least 1");
  const int64_t need = slots_needed(int64_t(prompt.size()), o.max_new_tokens);
  if (need > m.capacity())
    throw Error("generate: the request needs " + std::to_string(need) + " cache slots (prompt " +
                std::to_string(prompt.size()) + " + max_new_tokens " + std::to_string(o.max_new_tokens) +
                " - 1) but the capacity is " + std::to_string(m.capacity()));
  const int64_t chunk = o.prefill_chunk > 0 ? std::min(o.prefill_chunk, m.max_tokens()) : m.max_tokens();
  HostTensor logits;  // [1, vocab] of the last prefill chunk
  for (int64_t at = 0; at < int64_t(prompt.size()); at += chunk) {
    const int64_t n = std::min<int64_t>(chunk, int64_t(prompt.size()) - at);
    BatchRow r;
    r.row = o.row;
    r.tokens.assign(prompt.begin() + at, prompt.begin() + at + n);
    r.write_index = at;
    logits = m.forward(Batch{{r}});
  }
  std::vector<int32_t> out;
  int64_t pos = int64_t(prompt.size());
  int32_t tok = argmax_row(logits, 0);
  for (int step = 0;; ++step) {
    out.push_back(tok);
    if (on_token) on_token(step, step == 0, tok);
    if (int(out.size()) >= o.max_new_tokens) break;
    if (std::find(o.eos_ids.begin(), o.eos_ids.end(), int64_t(tok)) != o.eos_ids.end()) break;
    tok = m.decode_greedy({o.row}, {tok}, {pos++})[0];  // fixed-shape step, graph-captured where possible
  }
  return out;
}

}  // namespace ingot
