// Generator: the one scheduler over the static cache's rows ("slots") that every generation path
// drives: `ingot generate`, `chat` and `bench`, the C++ API and, later, the server. Requests (prompt
// ids, sampling, limits, stop conditions, a streaming callback, a cancellation flag) enter a queue,
// each takes a free slot, is prefilled in chunks under a per-step token budget while the other slots
// decode, streams its tokens out and gives its slot back the moment it stops.
//
// One step() = one model call (more only when a forward carries fewer tokens than there are decoding
// slots), and the device picks every token, so only token ids come back:
//  - with prompt chunks to compute (up to `prefill_budget` tokens over all slots still prefilling, in
//    arrival order), one Model::launch_forward carries them and every slot past its prompt (its last
//    token): a server's steady state mixes a newly arrived prompt into the decode step, and the
//    weights are read once for both. A chunk that ends its prompt gets its first token picked there,
//    from the row's sampling state set to the request's settings;
//  - without them, the decode rows go through Model::decode, the fixed-shape step that is
//    graph-captured on CUDA.
// With GeneratorOptions::overlap each step is launched before the host reads the step before it (its
// decode rows fed that step's picks on the device), and the host then streams those picks while the
// device runs: the device does not wait for detokenizing, stop strings and callbacks between steps.
// Both entries run the same ops over per-row metadata, so a request's tokens do not depend on which
// call carried them (tested on the CPU, bit for bit; on the GPU with --batch-invariant).
//
// On the CPU a request's output does not depend on what else runs: rows never read each other's
// cache, the backend reduces each row in a fixed order, and sampling is a counter-based stream per
// request. On the GPU that needs the batch-invariant kernels (make_cuda_backend, --batch-invariant).
//
// Threading: one thread calls submit/step/run; any thread may set a request's cancel flag.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "runtime/model.h"
#include "runtime/sampler.h"

namespace ingot {

// The one-line warning for a request whose prompt and generated tokens run past the positions the model
// was trained for (max_position_embeddings), or "" when they stay within. Such a request still runs
// when the cache holds it, but its output may degrade: the command line warns, a server refuses it
// (400) with this text.
std::string position_limit_warning(int64_t max_position, int64_t prompt_len, int64_t max_new_tokens);

// The Error that stops a request when the logits of its token `index` (0 = the token after the
// prompt) have no pick: a NaN or +inf among them, or none finite (sampling::kNoToken).
Error non_finite_logits(int index);

// The text layer's hook: turns a request's generated ids into streamed text (a tokenizer's stream
// decoder, runtime/text_decoder.h), so stop strings can be matched while the runtime stays token-level.
class TextDecoder {
 public:
  virtual ~TextDecoder() = default;
  virtual std::string push(int32_t id) = 0;  // the text this id completed (may be empty)
  virtual std::string flush() = 0;           // what is still held back at the end
};

enum class StopReason { Eos, StopString, Length, Capacity, Cancelled, Error };
// eos | stop_string | length | capacity | cancelled | error
const char* stop_reason_name(StopReason r);

// A generated token's log-probability and the most likely alternatives at its step, from the raw
// logits (log_softmax before penalties and temperature, backend/logprobs.h).
struct TokenLogprob {
  float logprob = 0.0f;                          // of the token picked
  std::vector<std::pair<int32_t, float>> top;  // Request::logprobs most likely (id, logprob), descending
};

// One streamed token: its id and the text it released (empty while a character or a possible stop
// string is pending). At the end, text still held back comes in one event with id -1.
struct TokenEvent {
  int32_t id = -1;
  std::string_view text;
  int index = 0;  // 0 = the first generated token (picked from the prefill's logits)
  const TokenLogprob* logprob = nullptr;  // when the request asked for log-probabilities (id >= 0)
};

using RequestId = uint64_t;

struct Completion {
  RequestId id = 0;
  int slot = -1;
  std::vector<int32_t> ids;  // generated ids (an eos id included)
  std::vector<TokenLogprob> logprobs;  // one per id when the request asked for them, else empty
  std::string text;          // generated text, cut before a stop string (with a TextDecoder)
  int64_t prompt_tokens = 0;
  int64_t computed_prompt_tokens = 0;  // prompt tokens computed; the rest came from the slot's cache
  StopReason stop = StopReason::Length;
  std::string error;  // why, when stop == Error
  double ttft_s = 0;  // submit to first token (queueing included)
  double decode_s = 0;  // first token to last
  double decode_tokens_per_s() const { return ids.size() > 1 && decode_s > 0 ? double(ids.size() - 1) / decode_s : 0; }
};

struct Request {
  std::vector<int32_t> prompt;  // [len] ids, len >= 1
  int max_new_tokens = 16;
  SamplingParams sampling;         // greedy unless set
  // Log-probabilities of each generated token and of this many alternatives (0..20), or -1: none.
  // Computed only for requests that ask (one extra op after a decode step that carries one).
  int logprobs = -1;
  std::vector<int32_t> eos_ids;    // stop after emitting one of these
  std::vector<std::string> stop;   // stop strings, matched on the text (needs `text`)
  std::unique_ptr<TextDecoder> text;  // null: tokens only
  // Stop where the cache ends (StopReason::Capacity) instead of refusing a request whose
  // max_new_tokens runs past it; a prompt that leaves no room gives no tokens and computes nothing.
  bool fit_capacity = false;
  // The slot to run in (a conversation's slot, whose cached prefix is reused), or -1: any free slot,
  // the one whose cached ids share the longest prefix with the prompt (then the least recently used).
  int slot = -1;
  std::shared_ptr<std::atomic<bool>> cancel;  // set from any thread: stops within one step
  std::function<void(const TokenEvent&)> on_token;
  std::function<void(const Completion&)> on_done;       // once, when the request stops (slot freed)
  std::function<void(const std::string&)> on_warning;  // at submit: position_limit_warning
};

struct GeneratorOptions {
  // Prompt tokens computed per step over all prefilling slots; 0 = as many as one forward carries.
  int64_t prefill_budget = 0;
  // Each step is launched before the host reads the last step's picks: its decode rows are fed those
  // picks on the device (Model::launch_decode / launch_forward), and the host streams, detokenizes and
  // checks stops for the last step while this one runs, so the device never waits for the host.
  // Tokens then reach the callbacks one step later; a row that stopped costs one discarded row-step.
  // A step with a row that asks for log-probabilities is read at once (it reads the logits the next
  // step would overwrite). Auto: on where the backend runs ops asynchronously (not on the CPU
  // backend, whose launch computes the step, so overlap would only delay each token by one step).
  enum class Overlap { Auto, On, Off };
  Overlap overlap = Overlap::Auto;
};

// What a slot holds now (for a server's /slots page and metrics).
struct SlotInfo {
  bool busy = false;
  RequestId request = 0;      // the request running in it (busy only)
  int64_t cached = 0;         // token positions whose K/V the row holds (kept for prefix reuse when free)
  int64_t prompt_tokens = 0;  // the running request's prompt
  int64_t generated = 0;      // tokens it generated so far
};

// What the last step did (for tests, metrics and bench).
struct StepStats {
  int decode_rows = 0;
  int prefill_rows = 0;
  int64_t prefill_tokens = 0;
  int model_calls = 0;  // forwards and decode steps run
  int overlapped_rows = 0;  // decode rows launched before the host read their tokens (overlap)
  // Host time inside the model's launch calls (validating, uploading, queueing; on a backend that
  // computes in the caller, the compute too) and waiting for launched steps' picks.
  double launch_s = 0, wait_s = 0;
};

class Generator {
 public:
  // The model must outlive the generator; its cache rows are the slots.
  explicit Generator(Model& model, GeneratorOptions options = {});
  ~Generator();

  // Queues a request. Throws Error, before any compute and without queueing it, on a request that can
  // never run: empty prompt, ids outside the vocabulary, max_new_tokens < 1, bad sampling settings,
  // stop strings without a TextDecoder, a slot out of range, or (without fit_capacity) more cache
  // slots than the capacity.
  RequestId submit(Request r);
  void cancel(RequestId id);  // as setting the request's cancel flag (from the stepping thread)
  // One scheduler step (see the file comment). Returns whether work remains.
  bool step();
  void run();  // steps until idle
  // submit + step until this request stops; throws Error with its message when it failed.
  Completion generate(Request r);

  bool idle() const { return queue_.empty() && busy_ == 0; }
  int slots() const { return int(slots_.size()); }
  int busy_slots() const { return busy_; }
  size_t queued() const { return queue_.size(); }
  const StepStats& last_step() const { return stats_; }
  SlotInfo slot_info(int slot) const;  // slot in [0, slots())
  // Forget what a slot (or every slot) caches: its cache row was written outside the generator.
  void forget(int slot);
  void forget_all();
  // Why the model can run no more (its tensor-parallel group stopped: a rank ended), or empty. The
  // requests in flight then have failed with it, and submit refuses every later one.
  const std::string& broken() const { return broken_; }

 private:
  struct Active;
  struct Slot {
    std::unique_ptr<Active> req;   // null when free
    std::vector<int32_t> cached;   // ids whose K/V the row holds, in slot order
    uint64_t last_used = 0;        // admission stamp, for least-recently-used choice
  };
  void admit();
  // Tokens of a slot's cached sequence that a request of `prompt` can keep.
  size_t reusable_prefix(const std::vector<int32_t>& cached, const std::vector<int32_t>& prompt) const;
  int choose_slot(const Request& r) const;
  std::vector<int> decoding_slots() const;  // slots past their prompt, each with a token to feed
  // Prompt chunks for this step, oldest request first, at most `budget` tokens in all: (slot, tokens).
  std::vector<std::pair<int, int64_t>> plan_prefill(int64_t budget) const;
  // These decode rows in calls of the most tokens a forward carries, each read back at once.
  void decode_calls(const std::vector<int>& rows);
  // One call over these decode rows and prompt chunks (Model::launch_decode without chunks, else
  // launch_forward). A decode row that awaits the last launched step's pick is fed it on the device.
  // Then, with overlap, the host reads the step launched before this one while this one runs;
  // without it (or when a row asks for log-probabilities) every launched step is read now.
  void launch_step(const std::vector<int>& decode, const std::vector<std::pair<int, int64_t>>& chunks);
  // Reads the oldest launched step's picks (and log-probabilities, when its rows ask) and hands them to
  // the requests still in their slots.
  void finish_launched();
  void drain();  // finish_launched until no step is outstanding
  // A generated token for a's request; stops it when due. index = how many came before.
  void accept(Active& a, int32_t tok, TokenLogprob* lp = nullptr);
  void finish(Active& a, StopReason why, const std::string& error = {});
  void fail_all(const std::vector<int>& slots, const std::exception& e);

  // A step launched and not yet read: the slot and request of each row that gets a pick, in pick
  // order, and whether the step launched after it took the pick as its token (its K/V is then cached).
  struct Launched {
    std::vector<int> slots;
    std::vector<RequestId> ids;
    std::vector<char> consumed;
  };
  Model& m_;
  GeneratorOptions opt_;
  bool overlap_ = false;  // opt_.overlap resolved for the model's backend
  std::deque<Launched> launched_;  // oldest first, at most two
  std::vector<Slot> slots_;
  std::deque<std::unique_ptr<Active>> queue_;
  int busy_ = 0;
  RequestId next_id_ = 1;
  uint64_t stamp_ = 0;
  StepStats stats_;
  std::string broken_;
};

}  // namespace ingot
