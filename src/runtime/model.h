// Model: an Engine's weights placed on a backend, the static State (the KV cache), a workspace sized
// once, and the one forward that every path (prefill, chunked prefill, decode, mixed batches) goes
// through. What the forward computes is the model code's (models/layers.h, the family); the Model
// places, sizes and schedules.
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "dist/communicator.h"
#include "io/engine.h"
#include "models/family.h"
#include "models/layers.h"
#include "runtime/memory_plan.h"
#include "runtime/sampler.h"
#include "runtime/state.h"

namespace ingot {

// One row of a forward call: a chunk of tokens for one cache row.
struct BatchRow {
  int row = 0;                     // cache row
  std::vector<int32_t> tokens;     // [len], len >= 1
  int64_t write_index = 0;         // slots already filled in this row; the chunk goes to write_index..+len-1
  std::vector<int64_t> positions;  // [len] explicit RoPE positions, or empty for the slot indices
  bool all_logits = false;         // logits for every token, or only for the last
  // false: no logits (or pick) for this row at all: a prompt chunk that does not end its prompt.
  bool wants_output = true;
};

struct Batch {
  std::vector<BatchRow> rows;
};

class TpGroup;
class RankProcess;

class Model {
 public:
  // The engine must outlive the model (backends that share host memory use its weights in place).
  // Buffers are sized by plan_memory(options); the plan is checked against the backend's free memory
  // before anything is allocated (Error with both figures when it does not fit).
  // options.tp > 1: the model is split over that many ranks (runtime/tp_split.h), this Model being rank
  // 0 on `backend` and owning the others (runtime/tp_group.h: threads of this process, a CPU backend
  // each). Every call below then runs on every rank, and returns rank 0's result, which every rank
  // shares bit for bit; each rank's memory plan and cache cover its own heads.
  // With ranks as processes (runtime/tp_group.h: always on the GPU, one process per GPU; on the CPU
  // with INGOT_TP_PROCESSES=1) this Model is this process's rank, and every process runs the same calls.
  Model(const Engine& engine, Backend& backend, const RuntimeOptions& options);
  // The same over a RankProcess made beforehand (options.tp of its ranks), shared by every Model of
  // this process (the loader's, runtime/loader.h), so that bench's Models, one per run, pair up across
  // the processes in order; `ranks` must have been started over `backend`.
  Model(const Engine& engine, Backend& backend, const RuntimeOptions& options, std::shared_ptr<RankProcess> ranks);
  // Rank 0 of a group over slices made beforehand (per-rank engine files, runtime/tp_engine_dir.h):
  // shards[r] is rank r's, options.tp their number; they must outlive the Model. With `ranks` (ranks as
  // processes) shards holds only this process's rank's slice, made by this process alone (its rank
  // file, or runtime/tp_split.h's build_rank_engine), and this Model is that rank.
  Model(const std::vector<Engine>& shards, Backend& backend, const RuntimeOptions& options,
        std::shared_ptr<RankProcess> ranks = nullptr);
  ~Model();

  // Runs the rows through the cache. Returns f32 logits on the host, [n_out, vocab], rows in call
  // order, each row's tokens in order (all, or only its last). Throws Error before any compute when a
  // row is malformed or does not fit (capacity, batch, workspace).
  HostTensor forward(const Batch& batch);
  // forward() with every rank's logits, in rank order (one entry without tensor parallelism): what
  // the tests hold bitwise equal across ranks.
  std::vector<HostTensor> forward_ranks(const Batch& batch);

  // The fixed-shape decode step: n distinct cache rows each take one token (tokens[i]) at slot
  // write_index[i]; returns each row's next token, picked on the device by the row's sampling state
  // (set_sampling; greedy until set). Rows, tokens and indices go into fixed buffers, and the sampling
  // state lives in fixed buffers too, so a graph captured once per (n, whether any row samples) serves
  // every step; only the n tokens come back. Greedy rows give forward()'s argmax; sampling rows give
  // what a Sampler in the same state picks from forward()'s logits. A row whose logits have a NaN or
  // +inf, or none finite, gets -1 (sampling::kNoToken), which callers must not feed back.
  std::vector<int32_t> decode(const std::vector<int>& rows, const std::vector<int32_t>& tokens,
                              const std::vector<int64_t>& write_index);

  // decode() in two halves, and forward() that picks instead of returning logits, so the host can work
  // while a step runs on the device. launch_decode / launch_forward validate and queue the step and the
  // read-back of its picks, and return at once; finish_launch returns the picks of the oldest launched
  // step not yet finished, waiting for that step only.
  // launch_forward: the last token of each row that wants output gets its next token picked on the
  // device by the row's sampling state, as decode() picks (set_sampling first for a row whose prompt
  // ends here); picks come in call order and no logits leave the backend. One call carries decode rows
  // (one token each) and prompt chunks together, so a step that has both reads the weights once. Not
  // graph-captured (its shape changes every step); rows may not ask for all_logits.
  // A row with feed[i] >= 0 (one token; for launch_forward among the call's first max_batch tokens)
  // takes as its token the pick at that index of the previous launched step, which the host has not
  // seen: tokens[i] is then ignored, and a pick that is not a token (sampling::kNoToken) is fed as
  // token 0 (the caller drops that row's result). At most two steps are outstanding; decode_logprobs
  // (which reads the last finished step's logits) needs none. decode() is a launch and its finish.
  void launch_decode(const std::vector<int>& rows, const std::vector<int32_t>& tokens,
                     const std::vector<int64_t>& write_index, const std::vector<int32_t>& feed = {});
  void launch_forward(const Batch& batch, const std::vector<int32_t>& feed = {});
  std::vector<int32_t> finish_launch();
  int outstanding() const { return int(launched_.size()); }

  // How decode() picks cache row `row`'s next tokens from now on: the settings, the tokens the
  // repetition penalty applies to (the prompt and what was generated so far), the draws already
  // taken from the seed's stream (a host Sampler's draws(), when it picked the first token) and the
  // tokens generated so far (what the frequency and presence penalties count). The settings are
  // uploaded only when they change, the history only when the repetition penalty is on and the
  // counts only when a frequency or presence penalty is (the whole row, so whatever an earlier
  // request left in a reused row is overwritten); each decode() then marks and counts the pick and
  // advances the draw counter on the device.
  void set_sampling(int row, const SamplingParams& p, std::span<const int32_t> history = {}, uint32_t draws = 0,
                    std::span<const int32_t> generated = {});

  // The log-probabilities of the last decode()'s picks (log_softmax of the raw logits, before any
  // penalty or temperature; backend/logprobs.h) and each row's top_n (0..20) most likely tokens,
  // computed by the backend's logprobs op over the logits that step left in the workspace. Call it
  // right after decode(), only when a request asks: decode() itself never pays for it. Tensor parallel
  // steps may pick without gathering the logits (Pick, below); this gathers them first, so the ranks
  // run it together, as they run decode.
  struct StepLogprobs {
    int top_n = 0;
    std::vector<float> chosen;    // [rows]
    std::vector<int32_t> top_ids;  // [rows, top_n]
    std::vector<float> top;       // [rows, top_n]
  };
  StepLogprobs decode_logprobs(int top_n);

  // Ranks as processes for a command that only rank 0 drives (`serve` takes requests, `chat` reads the
  // terminal, on rank 0 alone): on rank 0 it returns true, and from then on every call above that the
  // ranks run together (set_sampling, forward, forward_ranks, launch_decode, launch_forward,
  // finish_launch, decode_logprobs; decode through launch_decode and finish_launch) is sent to the
  // other processes before it runs here (runtime/tp_lead.h), until this Model goes. On another rank it
  // runs the calls rank 0 sends, in order, and returns false once rank 0's Model is gone (the caller
  // then ends the command); it throws where a call fails on one side only, or the group stops.
  // Without ranks as processes: true, nothing changes.
  // Batch commands (generate, check, bench) need none of this: every process runs the same calls.
  bool lead_ranks();

  const ModelSpec& spec() const { return spec_; }
  Backend& backend() { return be_; }
  // The cache rows, their capacity and layout, and the capacity rule.
  const State& state() const { return state_; }
  int64_t max_tokens() const { return opt_.max_tokens; }
  size_t weight_bytes() const { return weight_bytes_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  const MemoryPlan& plan() const { return plan_; }
  int tp_world() const { return spec_.tp.world; }
  // What carries this model's collectives (Communicator::describe), empty without tensor parallelism.
  std::string tp_comm() const { return comm_ ? comm_->describe() : std::string(); }
  // launch_forward shapes held as graphs (what the tests check was captured).
  size_t forward_graph_count() const { return forward_graphs_.size(); }

 private:
  friend class TpGroup;
  // The constructor behind both: `group` (null without tensor parallelism) is made before anything
  // else, since this rank's engine is its slice; `comm` is a peer rank's communicator.
  Model(std::unique_ptr<TpGroup> group, Communicator* comm, const Engine& engine, Backend& backend,
        const RuntimeOptions& options);
  // A peer rank of a group (TpGroup::start_peers): over its slice, talking through `comm`.
  Model(const Engine& shard, Backend& backend, const RuntimeOptions& options, Communicator& comm);
  // fn on every rank (this Model being rank 0), or on this one alone without a group.
  void on_ranks(const std::function<void(Model& m, int rank)>& fn);
  // fn(m) on every rank as on_ranks runs it; rank 0's result.
  template <class F>
  auto rank0_result(F&& fn) -> decltype(fn(*this)) {
    decltype(fn(*this)) out;
    on_ranks([&](Model& m, int r) {
      auto mine = fn(m);
      if (r == 0) out = std::move(mine);
    });
    return out;
  }
  // The calls above on this rank alone.
  HostTensor forward_local(const Batch& batch);
  void launch_decode_local(const std::vector<int>& rows, const std::vector<int32_t>& tokens,
                           const std::vector<int64_t>& write_index, const std::vector<int32_t>& feed);
  void launch_forward_local(const Batch& batch, const std::vector<int32_t>& feed);
  std::vector<int32_t> finish_launch_local();
  void set_sampling_local(int row, const SamplingParams& p, std::span<const int32_t> history, uint32_t draws,
                          std::span<const int32_t> generated);
  // logits_ [n, vocab] = the LM head of g [n, hidden]: on a tensor-parallel rank its vocabulary rows,
  // then every rank's gathered and laid out side by side (the padding past the vocabulary dropped).
  void head(const Mat& g, int64_t n);
  // How a step picks its tokens: the argmax, or a draw by each row's settings; on a tensor-parallel
  // model without gathering the logits where it can (split): the argmax always (the ranks exchange one
  // ArgmaxPart a row), a draw where the backend has the split ops and every row's setting suits them
  // (sampling::split_draw_suits: the ranks exchange kSampleCandidates SampleCandidates a row).
  enum class Pick : uint8_t { Argmax, Draw, SplitArgmax, SplitDraw };
  Pick pick_for(const std::vector<int>& rows) const;
  static bool split(Pick p) { return p == Pick::SplitArgmax || p == Pick::SplitDraw; }
  // The vocabulary entries among rank r's LM-head rows (the last ranks' rows past the vocabulary are
  // padding; <= 0 where a vocabulary under world^2 entries leaves a rank none).
  int64_t vocab_cols(int64_t r) const { return std::min(spec_.tp.vocab_rows, spec_.vocab - r * spec_.tp.vocab_rows); }
  // What a wait for this rank's collectives marks (Watchdog::Wait): the communicator's deadline, if any.
  Watchdog* wait_watchdog() const { return comm_ ? comm_->wait_watchdog() : nullptr; }
  // The LM head of g [n, hidden] and the picks: head() then pick(), or for a split pick this rank's
  // rows, its part of each (ArgmaxPart or SampleCandidates), every rank's gathered and merged into
  // next_tokens_.
  void head_pick(const Mat& g, int64_t n, const int32_t* rows, Pick how);
  StepLogprobs decode_logprobs_local(int top_n);
  struct Prepared;
  Prepared prepare(const Batch& batch) const;
  // ids_ [T] -> h_ [T, hidden]; single_rows: leading rows of one token each (ForwardContext)
  void run_decoder(int64_t T, int max_kv_len, int rows, int single_rows = 0);
  void upload_meta(const Prepared& p);
  void advance_lengths(const Batch& batch);  // the State's row lengths after a forward wrote the batch
  // Checks a launch's feed against the batch (fed rows first, one token each) and queues the feed_picks
  // op that writes their tokens into ids_ (uploaded by upload_meta, placeholders for fed rows).
  void feed_tokens(const Batch& batch, const std::vector<int32_t>& feed);
  void launch_readback(int64_t n);  // queues the read-back of this step's n picks
  void decode_body(int64_t n, Pick how);  // the ops of one decode step over n rows, up to the pick
  // What launch_forward's ops depend on besides buffers: tokens, rows, leading one-token rows, picks.
  struct ForwardShape {
    int64_t tokens = 0;
    int rows = 0, single_rows = 0;
    int64_t picks = 0;
    Pick pick = Pick::Argmax;
    auto operator<=>(const ForwardShape&) const = default;
  };
  // Runs a launch_forward body: directly, or as a graph captured for its shape (model.cpp says when).
  void run_forward_graph(const ForwardShape& shape, const std::function<void()>& body);
  // next_tokens_[i] = the pick from logits_ row i (of n) for cache row rows[i] (backend memory)
  void pick(int64_t n, const int32_t* rows, bool drawn);
  SampleState sample_state(const int32_t* rows);  // the sample ops' view of the sampling buffers
  bool any_sampled(const std::vector<int>& rows) const;

  // Ranks as processes led by rank 0 (lead_ranks, runtime/tp_lead.cpp).
  bool leading_ = false;      // rank 0 after lead_ranks(): calls go to the other ranks first
  bool lead_failed_ = false;  // the last call sent threw here (told to the others with the next)
  void send_call(std::vector<uint8_t> msg);  // rank 0: msg (tp_lead.h) to every other rank
  void end_lead() noexcept;                   // rank 0: the End call, once
  void follow();                              // the other ranks: rank 0's calls until its End
  // Rank 0 leading, in a call it sent: marks the call failed when it throws (the others are told with
  // the next message, and a rank where it did not fail stops).
  struct Lead {
    Model& m;
    int unwinding = std::uncaught_exceptions();
    ~Lead() {
      if (m.leading_ && std::uncaught_exceptions() > unwinding) m.lead_failed_ = true;
    }
  };

  std::unique_ptr<TpGroup> group_;  // rank 0 of a tensor-parallel group: the other ranks (first: made first, gone last)
  Communicator* comm_ = nullptr;     // set on every rank of a group
  const Engine& engine_;             // the whole engine, or this rank's slice
  Backend& be_;
  ModelSpec spec_;
  const Family& family_;
  MemoryPlan plan_;      // checked against the backend's free memory before anything is allocated
  State state_;          // sized by the same function as plan_.cache
  RuntimeOptions opt_;   // the plan's resolved options
  size_t weight_bytes_ = 0, workspace_bytes_ = 0;

  std::vector<Buffer> owned_;            // weight and workspace allocations
  std::map<std::string, DevWeight> w_;   // runtime-layout weights on the backend, by runtime name
  ModelWeights weights_;                 // w_ bound by the family's weight table

  // Workspace, sized for max_tokens.
  Buffer x_, h_, delta_, qkv_, attn_, gate_up_, act_, conv_;  // activations, see ForwardContext
  Buffer ids_, row_, slot_, rope_pos_, kv_len_, out_idx_, order_;  // [max_tokens] int32 metadata
  Buffer gathered_;  // [max_logit_rows, hidden]
  Buffer logits_;    // [max_logit_rows, vocab]
  Buffer inv_freq_;  // [rope_dim / 2] f32
  Buffer tp_logits_;  // tensor parallel: [world, max_logit_rows, vocab_rows] every rank's LM-head rows
  Buffer tp_index_;   // tensor parallel: [max_logit_rows] int32 0, 1, 2, ...
  // Tensor parallel, a split pick's parts: [world + 1, max_logit_rows] ArgmaxPart (greedy) and
  // [world + 1, max_logit_rows, kSampleCandidates] SampleCandidate (drawn), the ranks' parts of a call
  // at [world, n] and, in slot `world`, what a rank without vocabulary rows sends.
  Buffer tp_parts_;
  Buffer tp_cands_;
  // [3, max_batch] int32: a step's picks; (launch_forward) their cache rows; (launch_*) the feed
  Buffer next_tokens_;
  // Per cache row sampling state, read by the sample op: settings, draws so far, tokens seen.
  Buffer sample_params_;  // [max_batch] SampleParams
  Buffer sample_step_;    // [max_batch] uint32
  Buffer sample_seen_;    // [max_batch, vocab] uint8
  Buffer sample_counts_;  // [max_batch, vocab] int32
  Buffer logprobs_out_;   // [max_logit_rows] f32 chosen, [max_logit_rows, 20] int32 ids, [max_logit_rows, 20] f32
  int64_t last_decode_rows_ = 0;  // rows of the last decode(), whose logits the workspace still holds
  // Whether that step gathered its logits (a split greedy pick does not), and the LM head's input it
  // read (h_ for decode, gathered_ for launch_forward), from which decode_logprobs gathers them.
  bool logits_gathered_ = true;
  Buffer* head_input_ = nullptr;
  int64_t picks_rows_ = 0;        // picks next_tokens_ holds (or will, once the launched steps run)
  std::vector<SamplingParams> row_sampling_;  // what sample_params_ holds
  std::map<std::pair<int64_t, Pick>, std::unique_ptr<Graph>> decode_graphs_;  // by row count, pick
  // launch_forward's graphs: at most kForwardGraphsMax, the least recently used replaced; a shape is
  // captured the second time it is seen (forward_seen_: shapes seen once, forgotten past kForwardSeenMax).
  struct ForwardGraph {
    std::unique_ptr<Graph> graph;  // null where the backend has no graphs
    uint64_t last_use = 0;
  };
  static constexpr size_t kForwardGraphsMax = 16, kForwardSeenMax = 256;
  std::map<ForwardShape, ForwardGraph> forward_graphs_;
  std::set<ForwardShape> forward_seen_;
  uint64_t forward_calls_ = 0;
  // Launched decode steps whose picks are not yet read: the read-back each uses and its row count.
  std::unique_ptr<Readback> readbacks_[2];
  int next_readback_ = 0;
  std::deque<std::pair<Readback*, int64_t>> launched_;
  float rope_scale_ = 1.0f;
};

}  // namespace ingot
