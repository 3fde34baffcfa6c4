#include "runtime/generate.h"

#include <algorithm>

#include "backend/sampling.h"

namespace ingot {

Error non_finite_logits(int step) {
  return Error("non-finite logits (NaN or infinity) at decode step " + std::to_string(step) +
               ": the model's activations overflow or its weights are broken, so no token can be picked; "
               "generation stopped");
}

void check_fits(const Model& m, int64_t prompt_len, int max_new_tokens) {
  if (prompt_len < 1) throw Error("generate: the prompt is empty");
  if (max_new_tokens < 1) throw Error("generate: max_new_tokens must be at least 1");
  m.state().check_request(prompt_len, max_new_tokens);
}

HostTensor prefill_row(Model& m, int row, std::span<const int32_t> tokens, int64_t start, int64_t chunk) {
  if (tokens.empty()) throw Error("prefill: no tokens");
  chunk = chunk > 0 ? std::min(chunk, m.max_tokens()) : m.max_tokens();
  HostTensor logits;
  for (size_t at = 0; at < tokens.size(); at += size_t(chunk)) {
    const size_t n = std::min(size_t(chunk), tokens.size() - at);
    logits = m.forward(Batch{{BatchRow{row, std::vector<int32_t>(tokens.begin() + long(at), tokens.begin() + long(at + n)),
                                       start + int64_t(at), {}, false}}});
  }
  return logits;
}

std::vector<int32_t> generate_ids(Model& m, const std::vector<int32_t>& prompt, const GenerateOptions& o,
                                  const TokenCallback& on_token) {
  check_fits(m, int64_t(prompt.size()), o.max_new_tokens);
  Sampler sampler(o.sampling);
  const HostTensor logits = prefill_row(m, o.row, prompt, 0, o.prefill_chunk);
  std::vector<int32_t> history = prompt;
  int32_t tok = o.sampling.greedy() ? sampling::argmax_row(logits.as<float>(), m.spec().vocab)
                                    : sampler.pick(logits.as<float>(), m.spec().vocab, history);
  // Set even when greedy: the row may have been left sampling by an earlier request.
  if (tok != sampling::kNoToken) history.push_back(tok);
  m.set_sampling(o.row, o.sampling, history, sampler.draws());
  std::vector<int32_t> out;
  int64_t pos = int64_t(prompt.size());
  for (int step = 0;; ++step) {
    if (tok == sampling::kNoToken) throw non_finite_logits(step);
    out.push_back(tok);
    if (on_token) on_token(step, step == 0, tok);
    if (int(out.size()) >= o.max_new_tokens) break;
    if (std::find(o.eos_ids.begin(), o.eos_ids.end(), int64_t(tok)) != o.eos_ids.end()) break;
    tok = m.decode({o.row}, {tok}, {pos++})[0];  // fixed-shape step, graph-captured where possible
  }
  return out;
}

}  // namespace ingot
