#include "runtime/generator.h"

#include <algorithm>
#include <optional>

#include "backend/logprobs.h"
#include "backend/sampling.h"
#include "dist/in_process.h"  // GroupStopped

namespace ingot {

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Releases streamed text while holding back any tail that could still become a stop string.
class StopFilter {
 public:
  explicit StopFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
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
  std::vector<std::string> stops_;
  std::string pending_;
};

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// A token's log-probability and the first `want` of its alternatives (ids < 0: fewer exist).
TokenLogprob token_logprob(float chosen, const int32_t* ids, const float* vals, int want) {
  TokenLogprob lp;
  lp.logprob = chosen;
  for (int k = 0; k < want; ++k)
    if (ids[k] >= 0) lp.top.emplace_back(ids[k], vals[k]);
  return lp;
}

}  // namespace

std::string position_limit_warning(int64_t max_position, int64_t prompt_len, int64_t max_new_tokens) {
  const int64_t positions = State::slots_needed(prompt_len, max_new_tokens);  // the last token is never fed back
  if (positions <= max_position) return "";
  return "the prompt (" + std::to_string(prompt_len) + " tokens) and up to " + std::to_string(max_new_tokens) +
         " new tokens use " + std::to_string(positions) + " positions, more than the model's max_position_embeddings (" +
         std::to_string(max_position) + "): text past position " + std::to_string(max_position) + " may degrade";
}

Error non_finite_logits(int index) {
  return Error("non-finite logits (NaN or infinity) at decode step " + std::to_string(index) +
               ": the model's activations overflow or its weights are broken, so no token can be picked; "
               "generation stopped");
}

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::Eos: return "eos";
    case StopReason::StopString: return "stop_string";
    case StopReason::Length: return "length";
    case StopReason::Capacity: return "capacity";
    case StopReason::Cancelled: return "cancelled";
    case StopReason::Error: return "error";
  }
  return "?";
}

struct Generator::Active {
  Active(RequestId id, Request r) : req(std::move(r)), stop(req.stop) { out.id = id; }
  Request req;
  Completion out;
  StopFilter stop;
  Clock::time_point t_submit = Clock::now(), t_first;
  int max_new = 0;      // max_new_tokens, or what the cache holds under fit_capacity
  bool capped = false;  // max_new was cut to the cache: reaching it stops with Capacity
  size_t prefilled = 0;  // prompt tokens whose K/V are in the slot
  int32_t pending = -1;  // the last generated token, fed by the next decode step (-1: still prefilling)
  // (overlap) the last launched step will pick this request's next token; the host has not read it.
  bool awaiting = false;
  bool done = false;
  bool cancelled() const { return req.cancel && req.cancel->load(std::memory_order_relaxed); }
};

Generator::Generator(Model& m, GeneratorOptions o) : m_(m), opt_(o), slots_(size_t(m.state().max_batch())) {
  if (opt_.prefill_budget < 0) throw Error("generator: the prefill budget must be >= 0");
  overlap_ = opt_.overlap == GeneratorOptions::Overlap::On ||
             (opt_.overlap == GeneratorOptions::Overlap::Auto && !m_.backend().host_memory());
}

Generator::~Generator() {
  // A step still outstanding is waited for, so the model is left with none.
  while (m_.outstanding() > 0) {
    try {
      m_.finish_launch();
    } catch (const std::exception&) {
    }
  }
}

RequestId Generator::submit(Request r) {
  if (!broken_.empty()) throw GroupStopped("generate: the model cannot run any more: " + broken_);
  const int64_t len = int64_t(r.prompt.size());
  if (len < 1) throw Error("generate: the prompt is empty");
  if (r.max_new_tokens < 1) throw Error("generate: max_new_tokens must be at least 1");
  for (int32_t id : r.prompt)
    if (id < 0 || id >= m_.spec().vocab)
      throw Error("generate: prompt token id " + std::to_string(id) + " is outside the vocabulary of " +
                  std::to_string(m_.spec().vocab));
  r.sampling.validate();
  if (r.logprobs < -1 || r.logprobs > sampling::kMaxTopLogprobs)
    throw Error("generate: logprobs " + std::to_string(r.logprobs) + " is outside [-1, " +
                std::to_string(sampling::kMaxTopLogprobs) + "] (-1 = none)");
  if (!r.stop.empty() && !r.text) throw Error("generate: stop strings need the request's text (a tokenizer)");
  if (r.slot < -1 || r.slot >= slots())
    throw Error("generate: slot " + std::to_string(r.slot) + " is outside [0, " + std::to_string(slots()) + ")");
  const int64_t room = m_.state().max_new_tokens(len);  // new tokens the cache holds after this prompt
  int max_new = r.max_new_tokens;
  bool capped = false;
  if (r.fit_capacity && max_new > room) {
    max_new = int(std::max<int64_t>(room, 0));
    capped = true;
  } else {
    m_.state().check_request(len, max_new);
  }
  if (r.on_warning && max_new > 0)
    if (std::string w = position_limit_warning(m_.spec().max_position, len, max_new); !w.empty()) r.on_warning(w);
  const RequestId id = next_id_++;
  auto a = std::make_unique<Active>(id, std::move(r));
  a->max_new = max_new;
  a->capped = capped;
  a->out.prompt_tokens = len;
  queue_.push_back(std::move(a));
  return id;
}

void Generator::cancel(RequestId id) {
  auto mark = [&](Active& a) {
    if (!a.req.cancel) a.req.cancel = std::make_shared<std::atomic<bool>>(false);
    a.req.cancel->store(true);
  };
  for (auto& a : queue_)
    if (a->out.id == id) mark(*a);
  for (Slot& s : slots_)
    if (s.req && s.req->out.id == id) mark(*s.req);
}

void Generator::forget(int slot) {
  if (slot < 0 || slot >= slots()) throw Error("generator: slot " + std::to_string(slot) + " does not exist");
  if (slots_[size_t(slot)].req) throw Error("generator: slot " + std::to_string(slot) + " is busy");
  slots_[size_t(slot)].cached.clear();
}

SlotInfo Generator::slot_info(int slot) const {
  const Slot& sl = slots_.at(size_t(slot));
  SlotInfo i;
  i.cached = int64_t(sl.cached.size());
  if (sl.req) {
    i.busy = true;
    i.request = sl.req->out.id;
    i.prompt_tokens = sl.req->out.prompt_tokens;
    i.generated = int64_t(sl.req->out.ids.size());
  }
  return i;
}

void Generator::forget_all() {
  for (int s = 0; s < slots(); ++s) forget(s);
}

size_t Generator::reusable_prefix(const std::vector<int32_t>& cached, const std::vector<int32_t>& prompt) const {
  // At least the last prompt token is recomputed, for its logits.
  const size_t common = std::min(common_prefix(cached, prompt), prompt.size() - 1);
  // A linear-attention state holds the whole cached sequence and cannot be rewound: it is reused only
  // when the prompt extends all of it (a conversation's next turn), else the row restarts.
  if (!m_.state().rewindable() && common != cached.size()) return 0;
  return common;
}

int Generator::choose_slot(const Request& r) const {
  if (r.slot >= 0) return slots_[size_t(r.slot)].req ? -1 : r.slot;
  int best = -1;
  size_t best_keep = 0;
  for (int s = 0; s < slots(); ++s) {
    const Slot& sl = slots_[size_t(s)];
    if (sl.req) continue;
    const size_t keep = reusable_prefix(sl.cached, r.prompt);
    if (best < 0 || keep > best_keep || (keep == best_keep && sl.last_used < slots_[size_t(best)].last_used)) {
      best = s;
      best_keep = keep;
    }
  }
  return best;
}

void Generator::admit() {
  std::vector<std::unique_ptr<Active>> gone;  // told after the loop: their on_done may submit
  for (auto it = queue_.begin(); it != queue_.end();) {
    Active& a = **it;
    if (a.cancelled() || a.max_new == 0) {  // nothing to compute: done without a slot
      finish(a, a.cancelled() ? StopReason::Cancelled : StopReason::Capacity);
      gone.push_back(std::move(*it));
      it = queue_.erase(it);
      continue;
    }
    const int s = choose_slot(a.req);
    if (s < 0) {
      ++it;
      continue;
    }
    Slot& sl = slots_[size_t(s)];
    const size_t keep = reusable_prefix(sl.cached, a.req.prompt);
    sl.cached.resize(keep);
    sl.last_used = ++stamp_;
    a.prefilled = keep;
    a.out.slot = s;
    a.out.computed_prompt_tokens = int64_t(a.req.prompt.size() - keep);
    sl.req = std::move(*it);
    it = queue_.erase(it);
    ++busy_;
  }
  for (auto& a : gone)
    if (a->req.on_done) a->req.on_done(a->out);
}

void Generator::finish(Active& a, StopReason why, const std::string& error) {
  if (a.done) return;
  a.done = true;
  a.out.stop = why;
  a.out.error = error;
  if (!a.out.ids.empty()) a.out.decode_s = secs(a.t_first, Clock::now());
  // Text held back (an unfinished character, a possible stop string) is released, except after a
  // stop string (it was cut) or a failure (the callbacks may be what failed).
  if (a.req.text && why != StopReason::StopString && why != StopReason::Error) {
    bool hit = false;
    std::string rest = a.stop.push(a.req.text->flush(), hit);
    rest += a.stop.flush();
    if (!rest.empty()) {
      a.out.text += rest;
      if (a.req.on_token) a.req.on_token(TokenEvent{-1, rest, int(a.out.ids.size())});
    }
  }
}

void Generator::accept(Active& a, int32_t tok, TokenLogprob* lp) {
  const int index = int(a.out.ids.size());
  if (tok == sampling::kNoToken) return finish(a, StopReason::Error, non_finite_logits(index).what());
  if (index == 0) {
    a.t_first = Clock::now();
    a.out.ttft_s = secs(a.t_submit, a.t_first);
  }
  a.out.ids.push_back(tok);
  const TokenLogprob* shown = nullptr;
  if (lp && a.req.logprobs >= 0) {
    a.out.logprobs.push_back(std::move(*lp));
    shown = &a.out.logprobs.back();
  }
  try {
    if (std::find(a.req.eos_ids.begin(), a.req.eos_ids.end(), tok) != a.req.eos_ids.end()) {
      if (a.req.on_token) a.req.on_token(TokenEvent{tok, {}, index, shown});
      return finish(a, StopReason::Eos);
    }
    bool hit = false;
    std::string piece;
    if (a.req.text) piece = a.stop.push(a.req.text->push(tok), hit);
    a.out.text += piece;
    if (a.req.on_token) a.req.on_token(TokenEvent{tok, piece, index, shown});
    if (hit) return finish(a, StopReason::StopString);
    if (int(a.out.ids.size()) >= a.max_new) return finish(a, a.capped ? StopReason::Capacity : StopReason::Length);
    a.pending = tok;
  } catch (const std::exception& e) {  // a callback or the text layer failed: this request stops
    finish(a, StopReason::Error, e.what());
  }
}

void Generator::fail_all(const std::vector<int>& slots, const std::exception& e) {
  // A stopped group does not come back: what every later call would say, said once.
  if (dynamic_cast<const GroupStopped*>(&e) && broken_.empty()) broken_ = e.what();
  for (int s : slots) finish(*slots_[size_t(s)].req, StopReason::Error, e.what());
}

std::vector<int> Generator::decoding_slots() const {
  std::vector<int> rows;
  for (int s = 0; s < slots(); ++s) {
    const Active* a = slots_[size_t(s)].req.get();
    if (!a || a->done) continue;
    // An awaited pick that is the request's last token is never fed (its K/V would be past the room).
    if (a->pending >= 0 || (a->awaiting && int(a->out.ids.size()) + 1 < a->max_new)) rows.push_back(s);
  }
  return rows;
}

void Generator::decode_calls(const std::vector<int>& rows) {
  // One call, unless the workspace carries fewer tokens than there are rows.
  const size_t per_call = size_t(std::max<int64_t>(1, m_.max_tokens()));
  for (size_t from = 0; from < rows.size(); from += per_call) {
    const std::vector<int> part(rows.begin() + long(from), rows.begin() + long(std::min(rows.size(), from + per_call)));
    launch_step(part, {});
    drain();
  }
}

std::vector<std::pair<int, int64_t>> Generator::plan_prefill(int64_t budget) const {
  std::vector<int> order;  // slots still prefilling, oldest request first
  for (int s = 0; s < slots(); ++s) {
    const Active* a = slots_[size_t(s)].req.get();
    if (a && !a->done && a->prefilled < a->req.prompt.size()) order.push_back(s);
  }
  std::sort(order.begin(), order.end(),
            [&](int x, int y) { return slots_[size_t(x)].req->out.id < slots_[size_t(y)].req->out.id; });
  std::vector<std::pair<int, int64_t>> chunks;  // (slot, tokens)
  for (int s : order) {
    if (budget == 0) break;
    const Active& a = *slots_[size_t(s)].req;
    const int64_t n = std::min<int64_t>(budget, int64_t(a.req.prompt.size() - a.prefilled));
    chunks.emplace_back(s, n);
    budget -= n;
  }
  return chunks;
}

void Generator::launch_step(const std::vector<int>& decode, const std::vector<std::pair<int, int64_t>>& chunks) {
  Batch b;
  std::vector<int> rows;       // every row of the call
  std::vector<int32_t> feed;   // [rows] index into the last launched step's picks, or -1
  Launched l;                  // the rows that get a pick, in pick order
  Launched* last = launched_.empty() ? nullptr : &launched_.back();
  for (int s : decode) {
    const Slot& sl = slots_[size_t(s)];
    const Active& a = *sl.req;
    int32_t from = -1;
    if (a.awaiting) {
      for (size_t i = 0; last && i < last->slots.size(); ++i)
        if (last->slots[i] == s && last->ids[i] == a.out.id) from = int32_t(i);
      if (from < 0) throw Error("generator: slot " + std::to_string(s) + " awaits a pick no launched step holds");
    }
    // `cached` ends with the token the last step wrote; this one goes right after it.
    b.rows.push_back(BatchRow{s, {from >= 0 ? 0 : a.pending}, int64_t(sl.cached.size()), {}, false});
    feed.push_back(from);
    rows.push_back(s);
    l.slots.push_back(s);
    l.ids.push_back(a.out.id);
  }
  for (auto [s, n] : chunks) {
    Active& a = *slots_[size_t(s)].req;
    const auto at = a.req.prompt.begin() + long(a.prefilled);
    const bool ends = a.prefilled + size_t(n) == a.req.prompt.size();
    b.rows.push_back(BatchRow{s, std::vector<int32_t>(at, at + long(n)), int64_t(a.prefilled), {}, false, ends});
    feed.push_back(-1);
    rows.push_back(s);
    if (!ends) continue;
    l.slots.push_back(s);
    l.ids.push_back(a.out.id);
    // The first token is picked on the device like every later one: the row starts the request's
    // random stream with the prompt as the penalty's history (set even when greedy: the row may have
    // been left sampling by an earlier request).
    try {
      m_.set_sampling(s, a.req.sampling, a.req.prompt);
    } catch (const std::exception& e) {
      return fail_all(rows, e);
    }
  }
  l.consumed.assign(l.slots.size(), 0);
  const auto t_launch = Clock::now();
  try {
    if (chunks.empty()) {
      std::vector<int32_t> tokens;
      std::vector<int64_t> at;
      for (const BatchRow& r : b.rows) {
        tokens.push_back(r.tokens[0]);
        at.push_back(r.write_index);
      }
      m_.launch_decode(rows, tokens, at, feed);
    } else {
      m_.launch_forward(b, feed);
    }
  } catch (const std::exception& e) {
    return fail_all(rows, e);
  }
  stats_.launch_s += secs(t_launch, Clock::now());
  ++stats_.model_calls;
  stats_.decode_rows += int(decode.size());
  stats_.prefill_rows += int(chunks.size());
  for (size_t r = 0; r < b.rows.size(); ++r) {
    Slot& sl = slots_[size_t(b.rows[r].row)];
    Active& a = *sl.req;
    if (feed[r] >= 0) {
      ++stats_.overlapped_rows;
      last->consumed[size_t(feed[r])] = 1;  // its pick joins `cached` when the host reads it
    } else {
      sl.cached.insert(sl.cached.end(), b.rows[r].tokens.begin(), b.rows[r].tokens.end());
    }
    if (r < decode.size()) {
      a.pending = -1;
      a.awaiting = true;
    } else {
      a.prefilled += b.rows[r].tokens.size();
      stats_.prefill_tokens += int64_t(b.rows[r].tokens.size());
      if (b.rows[r].wants_output) a.awaiting = true;
    }
  }
  bool logprobs = false;  // they read the logits this step leaves: nothing may launch before they are read
  for (int s : l.slots) logprobs = logprobs || slots_[size_t(s)].req->req.logprobs >= 0;
  launched_.push_back(std::move(l));
  if (!overlap_ || logprobs) drain();
  else if (launched_.size() > 1) finish_launched();  // the last step's picks, while this one runs
}

void Generator::finish_launched() {
  Launched l = std::move(launched_.front());
  launched_.pop_front();
  std::vector<int> live;  // slots still running the request the row was launched for
  int top_n = -1;         // log-probabilities at the largest top-N a live row asks (only a drained step has any)
  for (size_t i = 0; i < l.slots.size(); ++i) {
    const Active* a = slots_[size_t(l.slots[i])].req.get();
    if (!a || a->out.id != l.ids[i]) continue;
    live.push_back(l.slots[i]);
    if (!a->done) top_n = std::max(top_n, a->req.logprobs);
  }
  std::vector<int32_t> next;
  Model::StepLogprobs lps;
  try {
    const auto t_wait = Clock::now();
    next = m_.finish_launch();
    stats_.wait_s += secs(t_wait, Clock::now());
    if (top_n >= 0) lps = m_.decode_logprobs(top_n);
  } catch (const std::exception& e) {
    return fail_all(live, e);
  }
  for (size_t i = 0; i < l.slots.size(); ++i) {
    Slot& sl = slots_[size_t(l.slots[i])];
    Active* a = sl.req.get();
    if (!a || a->out.id != l.ids[i]) continue;  // the request left the slot: its pick is dropped
    if (l.consumed[i]) sl.cached.push_back(std::max(next[i], 0));  // what the later step wrote (kNoToken: 0)
    if (a->done) continue;  // e.g. cancelled while its step ran
    a->awaiting = false;
    TokenLogprob lp;
    const int want = a->req.logprobs;
    if (want >= 0)
      lp = token_logprob(lps.chosen[i], lps.top_ids.data() + i * size_t(top_n), lps.top.data() + i * size_t(top_n),
                         want);
    accept(*a, next[i], want >= 0 ? &lp : nullptr);
    if (l.consumed[i] && !a->done) {  // its token is already fed; the later step picks the next one
      a->pending = -1;
      a->awaiting = true;
    }
  }
}

void Generator::drain() {
  while (!launched_.empty()) finish_launched();
}

bool Generator::step() {
  stats_ = {};
  for (Slot& sl : slots_)
    if (sl.req && sl.req->cancelled()) finish(*sl.req, StopReason::Cancelled);
  auto reap = [&] {  // done requests give their slot back at once
    for (Slot& sl : slots_) {
      if (!sl.req || !sl.req->done) continue;
      std::unique_ptr<Active> a = std::move(sl.req);
      --busy_;
      if (a->req.on_done) a->req.on_done(a->out);
    }
  };
  reap();
  admit();
  // Decode rows and prompt chunks share one call (the weights are read once); decode rows alone take
  // the fixed-shape decode, graph-captured on CUDA. With overlap the call is launched before the
  // host reads the one before it.
  std::vector<int> decode = decoding_slots();
  const int64_t cap = m_.max_tokens();
  if (int64_t(decode.size()) >= cap) {  // the decode rows fill whole calls: prompts go in their own
    drain();
    decode_calls(decoding_slots());
    decode.clear();
  }
  const int64_t budget = opt_.prefill_budget > 0 ? std::min(opt_.prefill_budget, cap) : cap;
  const auto chunks = plan_prefill(std::min(budget, cap - int64_t(decode.size())));
  if (!decode.empty() || !chunks.empty()) launch_step(decode, chunks);
  else drain();
  reap();
  if (busy_ == 0 && !launched_.empty()) {  // nothing runs: what is outstanding is read now
    drain();
    reap();
  }
  return !idle();
}

void Generator::run() {
  while (step()) {
  }
}

Completion Generator::generate(Request r) {
  // Shared with the callback: if a step throws, the request stays queued and may finish later.
  auto got = std::make_shared<std::optional<Completion>>();
  r.on_done = [got, then = std::move(r.on_done)](const Completion& c) {
    *got = c;
    if (then) then(c);
  };
  submit(std::move(r));
  while (!*got)
    if (!step() && !*got) throw Error("generator: went idle before the request finished");
  if ((*got)->stop == StopReason::Error) {
    if (!broken_.empty()) throw GroupStopped((*got)->error);  // the caller cannot go on with this model
    throw Error((*got)->error);
  }
  return std::move(**got);
}

}  // namespace ingot
