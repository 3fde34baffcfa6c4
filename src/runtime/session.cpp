#include "runtime/session.h"

#include <algorithm>
#include <chrono>

#include "backend/sampling.h"
#include "core/error.h"
#include "runtime/generate.h"

namespace ingot {

namespace {

// Releases streamed text while holding back any tail that could still become a stop string.
class StopFilter {
 public:
  explicit StopFilter(const std::vector<std::string>& stops) : stops_(stops) {}
  // Returns the text safe to emit; sets hit when a stop string completed (text before it is emitted).
  std::string push(const std::string& piece, bool& hit) {
    pending_ += piece;
    size_t cut = std::string::npos;
    for (const std::string& s : stops_) {
      if (s.empty()) continue;
      size_t at = pending_.find(s);
      if (at != std::string::npos) cut = std::min(cut, at);
    }
    if (cut != std::string::npos) {
      hit = true;
      std::string out = pending_.substr(0, cut);
      pending_.clear();
      return out;
    }
    size_t hold = 0;  // longest suffix of pending_ that is a proper prefix of a stop string
    for (const std::string& s : stops_)
      for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), pending_.size()); k > hold; --k)
        if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
    std::string out = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return out;
  }
  std::string flush() { return std::exchange(pending_, {}); }

 private:
  const std::vector<std::string>& stops_;
  std::string pending_;
};

}  // namespace

std::string position_limit_warning(int64_t max_position, int64_t prompt_len, int64_t max_new_tokens) {
  const int64_t positions = State::slots_needed(prompt_len, max_new_tokens);  // the last token is never fed back
  if (positions <= max_position) return "";
  return "the prompt (" + std::to_string(prompt_len) + " tokens) and up to " + std::to_string(max_new_tokens) +
         " new tokens use " + std::to_string(positions) + " positions, more than the model's max_position_embeddings (" +
         std::to_string(max_position) + "): text past position " + std::to_string(max_position) + " may degrade";
}

TextResult Session::generate(const TextRequest& req, const std::function<void(std::string_view)>& on_text,
                             const std::function<void(int32_t)>& on_token) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  check_fits(m_, int64_t(req.prompt_ids.size()), req.max_new_tokens);
  req.sampling.validate();

  // Reuse the cached prefix; at least the last prompt token is recomputed to get its logits.
  size_t keep = 0;
  while (keep < cached_.size() && keep + 1 < req.prompt_ids.size() && cached_[keep] == req.prompt_ids[keep]) ++keep;
  cached_.resize(keep);

  TextResult res;
  res.prompt_tokens = int64_t(req.prompt_ids.size());
  res.prefilled_tokens = int64_t(req.prompt_ids.size() - keep);
  // The first token comes from the prefill's logits on the host; the device continues the same
  // random stream from there, with the prompt and that token as the penalty's history.
  Sampler sampler(req.sampling);
  std::vector<int32_t> history = req.prompt_ids;
  HostTensor logits = prefill_row(m_, row_, std::span<const int32_t>(req.prompt_ids).subspan(keep), int64_t(keep));
  cached_ = req.prompt_ids;
  int32_t tok = sampler.pick(logits.as<float>(), m_.spec().vocab, history);
  if (tok == sampling::kNoToken) throw non_finite_logits(0);
  history.push_back(tok);
  m_.set_sampling(row_, req.sampling, history, sampler.draws());
  res.ttft_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto t1 = Clock::now();

  tok::StreamDecoder dec(tok_, true);
  StopFilter stop(req.stop_strings);
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    res.text += s;
    if (on_text) on_text(s);
  };
  res.stop_reason = "length";
  for (;;) {
    res.ids.push_back(tok);
    if (std::find(req.eos_ids.begin(), req.eos_ids.end(), tok) != req.eos_ids.end()) {
      res.stop_reason = "eos";
      if (on_token) on_token(tok);
      break;
    }
    bool hit = false;
    emit(stop.push(dec.push(tok), hit));
    if (on_token) on_token(tok);
    if (hit) {
      res.stop_reason = "stop_string";
      break;
    }
    if (int(res.ids.size()) >= req.max_new_tokens) break;
    const int64_t slot = int64_t(cached_.size());
    tok = m_.decode({row_}, {tok}, {slot})[0];  // one graph replay; only the token comes back
    cached_.push_back(res.ids.back());
    if (tok == sampling::kNoToken) throw non_finite_logits(int(res.ids.size()));
  }
  if (res.stop_reason != "stop_string") {
    bool hit = false;
    emit(stop.push(dec.flush(), hit));
    emit(stop.flush());
  }
  res.decode_s = std::chrono::duration<double>(Clock::now() - t1).count();
  return res;
}

}  // namespace ingot
