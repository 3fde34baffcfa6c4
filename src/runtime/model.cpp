#include "runtime/model.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>

#include "backend/logprobs.h"
#include "backend/sampling.h"
#include "core/error.h"
#include "dist/watchdog.h"
#include "models/rope.h"
#include "runtime/tp_group.h"
#include "runtime/tp_lead.h"

namespace ingot {

struct Model::Prepared {
  std::vector<int32_t> ids, row, slot, rope_pos, kv_len, out_idx;
  std::vector<int32_t> out_row;  // [out_idx] the cache row of each output token
  std::vector<int32_t> order;    // [single_rows] TokenMeta::order of the leading one-token rows
  int max_kv_len = 0;
  int rows = 0;
  int single_rows = 0;  // leading rows that carry one token each (decode rows of a mixed call)
};

namespace {
// The plan of a Model over these options, refused (Error with both figures) when the backend's free
// memory cannot hold it: checked while initialising, before the state or anything else is allocated.
MemoryPlan checked_plan(const Engine& engine, Backend& be, const RuntimeOptions& options) {
  if (engine.quant && !be.int4_weights())
    throw Error(be.name() + " backend: int4 weights are not supported (the engine has " +
                std::to_string(engine.quant->tensors.size()) +
                " INT4 linear weights; run it with --device cpu or cuda, docs/quantization.md)");
  if (engine.quant && !be.int4_scales(engine.weight_dtype))
    throw Error(be.name() + " backend: INT4 weights need activations in their scales' dtype: the engine's " +
                std::to_string(engine.quant->tensors.size()) + " INT4 linear weights have " +
                std::string(dtype_name(engine.weight_dtype)) + " scales and this backend computes in " +
                std::string(dtype_name(be.activation_dtype())) + "; INT4 weights need 16-bit activations, drop --activations f32");
  MemoryPlan plan = plan_memory(engine.spec, engine.weight_dtype, be.activation_dtype(), options, be.host_memory(),
                                engine.quant ? &*engine.quant : nullptr, &be);
  check_fits(plan, be.available_memory_bytes(), be.host_memory() ? "host memory" : be.name() + " device memory");
  return plan;
}
}  // namespace

Model::Model(const Engine& engine, Backend& be, const RuntimeOptions& options)
    : Model(TpGroup::make(engine, be, options), nullptr, engine, be, options) {}

Model::Model(const Engine& engine, Backend& be, const RuntimeOptions& options, std::shared_ptr<RankProcess> ranks)
    : Model(TpGroup::make(engine, be, options, std::move(ranks)), nullptr, engine, be, options) {}

Model::Model(const std::vector<Engine>& shards, Backend& be, const RuntimeOptions& options,
             std::shared_ptr<RankProcess> ranks)
    : Model(TpGroup::from_shards(shards, be, options, std::move(ranks)), nullptr, shards.at(0), be, options) {}

Model::Model(const Engine& shard, Backend& be, const RuntimeOptions& options, Communicator& comm)
    : Model(nullptr, &comm, shard, be, options) {}

Model::Model(std::unique_ptr<TpGroup> group, Communicator* comm, const Engine& engine, Backend& be,
             const RuntimeOptions& options)
    : group_(std::move(group)),
      comm_(group_ ? &group_->comm(0) : comm),
      engine_(group_ ? group_->shard(0) : engine),
      be_(be),
      spec_(engine_.spec),
      family_(find_family(engine_.spec.family)),
      plan_(checked_plan(engine_, be, options)),
      state_(be, spec_, plan_.options),
      opt_(plan_.options) {
  const ModelSpec& s = spec_;

  // Weights: in place when the backend reads host memory, otherwise copied over once.
  for (auto& [name, t] : engine_.weights) {
    void* p;
    if (be_.host_memory()) {
      p = const_cast<void*>(t.data());
    } else {
      owned_.emplace_back(be_, t.nbytes());
      p = owned_.back().get();
      be_.upload(p, t.data(), t.nbytes());
    }
    const int64_t rows = t.shape().size() == 2 ? t.shape()[0] : 1;
    w_[name] = DevWeight{mat(p, t.dtype(), rows, t.shape().back())};
    weight_bytes_ += t.nbytes();
  }
  // INT4 weights: the packed bytes [out, in/2] count in logical columns, with their scales attached.
  if (engine_.quant)
    for (const std::string& name : engine_.quant->tensors) {
      Mat& m = w_.at(name).m;
      const Mat& sc = w_.at(name + kInt4ScalesSuffix).m;
      m.cols = m.ld * 2;
      m.int4 = Int4Scales{sc.data, sc.dtype, engine_.quant->group(m.cols)};
      if (!engine_.quant->symmetric) m.int4.zeros = static_cast<const uint8_t*>(w_.at(name + kInt4ZerosSuffix).m.data);
      if (engine_.quant->act_order) m.int4.perm = static_cast<const int32_t*>(w_.at(name + kInt4PermSuffix).m.data);
      if (!be_.host_memory()) be_.relayout_int4(m);  // our copy; host memory holds the engine's own bytes
    }
  weights_ = bind_weights(s, family_.weights(s), w_);

  const WorkspacePlan& w = plan_.ws;
  auto ws = [&](Buffer& b, size_t bytes) {
    b = Buffer(be_, bytes);
    workspace_bytes_ += bytes;
  };
  // The backend holds the linear products' scratch (shared by every Model on it); planned here.
  if (w.linear_scratch) {
    be_.reserve_linear_scratch(w.linear_scratch);
    workspace_bytes_ += w.linear_scratch;
  }
  ws(x_, w.hidden);
  ws(h_, w.hidden);
  ws(delta_, w.hidden);
  ws(qkv_, w.qkv);
  ws(attn_, w.attn);
  ws(gate_up_, w.gate_up);
  ws(act_, w.act);
  if (w.conv) ws(conv_, w.conv);
  for (Buffer* b : {&ids_, &row_, &slot_, &rope_pos_, &kv_len_, &out_idx_, &order_}) ws(*b, w.token_meta);
  ws(gathered_, w.gathered);
  ws(logits_, w.logits);
  ws(next_tokens_, w.next_tokens);
  for (auto& r : readbacks_) r = be_.make_readback(size_t(opt_.max_batch) * sizeof(int32_t));
  ws(sample_params_, w.sample_params);
  ws(sample_step_, w.sample_step);
  ws(sample_seen_, w.sample_seen);
  ws(sample_counts_, w.sample_counts);
  ws(logprobs_out_, w.logprobs);
  row_sampling_.assign(size_t(opt_.max_batch), SamplingParams{});
  const std::vector<SampleParams> greedy(size_t(opt_.max_batch), SamplingParams{}.to_backend());
  be_.upload(sample_params_.get(), greedy.data(), greedy.size() * sizeof(SampleParams));
  be_.fill_zero(sample_step_.get(), sample_step_.size());
  be_.fill_zero(sample_seen_.get(), sample_seen_.size());
  be_.fill_zero(sample_counts_.get(), sample_counts_.size());
  std::vector<float> inv = rope_inv_freq(s);
  ws(inv_freq_, w.inv_freq);
  be_.upload(inv_freq_.get(), inv.data(), inv.size() * sizeof(float));
  rope_scale_ = rope_attention_scale(s);
  if (s.tp.world > 1) {
    ws(tp_logits_, w.tp_logits);
    ws(tp_index_, w.tp_index);
    std::vector<int32_t> iota(size_t(opt_.max_logit_rows));
    for (size_t i = 0; i < iota.size(); ++i) iota[i] = int32_t(i);
    be_.upload(tp_index_.get(), iota.data(), iota.size() * sizeof(int32_t));
    ws(tp_parts_, w.tp_parts);
    ws(tp_cands_, w.tp_cands);
    // A rank whose vocabulary rows are all padding (a vocabulary of about world^2 entries or fewer) has
    // no part to compute: it sends "no finite logit" (and no candidate) from the slot past the ranks'
    // (head_pick), which no gather writes.
    if (vocab_cols(s.tp.rank) <= 0) {
      const std::vector<ArgmaxPart> none(size_t(opt_.max_logit_rows));
      be_.upload(tp_parts_.as<ArgmaxPart>() + size_t(s.tp.world) * none.size(), none.data(),
                 none.size() * sizeof(ArgmaxPart));
      std::vector<SampleCandidate> no_cands(size_t(opt_.max_logit_rows) * kSampleCandidates);
      for (size_t r = 0; r < size_t(opt_.max_logit_rows); ++r) no_cands[r * kSampleCandidates].flag = kPartNoFinite;
      be_.upload(tp_cands_.as<SampleCandidate>() + size_t(s.tp.world) * no_cands.size(), no_cands.data(),
                 no_cands.size() * sizeof(SampleCandidate));
    }
  }
  if (group_) group_->start_peers(options);
}

Model::~Model() { end_lead(); }

Model::Prepared Model::prepare(const Batch& b) const {
  if (b.rows.empty()) throw Error("forward: the batch has no rows");
  if (int64_t(b.rows.size()) > opt_.max_batch)
    throw Error("forward: " + std::to_string(b.rows.size()) + " rows exceed the max batch of " +
                std::to_string(opt_.max_batch));
  Prepared p;
  std::set<int> seen;
  int64_t total = 0;
  for (size_t r = 0; r < b.rows.size(); ++r) {
    const BatchRow& br = b.rows[r];
    const std::string who = "forward: row " + std::to_string(r) + " (cache row " + std::to_string(br.row) + ")";
    if (br.row < 0 || br.row >= opt_.max_batch)
      throw Error(who + ": cache row is outside [0, " + std::to_string(opt_.max_batch) + ")");
    if (!seen.insert(br.row).second) throw Error(who + ": the same cache row appears twice in one call");
    const int64_t len = int64_t(br.tokens.size());
    if (len == 0) throw Error(who + ": empty token chunk");
    if (br.write_index < 0) throw Error(who + ": negative write index");
    state_.check_chunk(who, br.write_index, len);
    state_.check_continuation(who, br.row, br.write_index);
    if (!br.positions.empty() && int64_t(br.positions.size()) != len)
      throw Error(who + ": " + std::to_string(br.positions.size()) + " positions for " + std::to_string(len) + " tokens");
    total += len;
  }
  if (total > opt_.max_tokens)
    throw Error("forward: the call carries " + std::to_string(total) + " tokens but the workspace holds " +
                std::to_string(opt_.max_tokens) + "; split the prefill into chunks");
  p.rows = int(b.rows.size());
  while (p.single_rows < p.rows && b.rows[size_t(p.single_rows)].tokens.size() == 1) ++p.single_rows;
  for (const BatchRow& br : b.rows) {
    const int64_t len = int64_t(br.tokens.size());
    const int32_t kv_len = int32_t(br.write_index + len);
    p.max_kv_len = std::max(p.max_kv_len, int(kv_len));
    for (int64_t i = 0; i < len; ++i) {
      const int32_t id = br.tokens[size_t(i)];
      if (id < 0 || id >= spec_.vocab)
        throw Error("forward: token id " + std::to_string(id) + " is outside the vocabulary of " +
                    std::to_string(spec_.vocab));
      if (br.wants_output && (br.all_logits || i == len - 1)) {
        p.out_idx.push_back(int32_t(p.ids.size()));
        p.out_row.push_back(br.row);
      }
      p.ids.push_back(id);
      p.row.push_back(br.row);
      p.slot.push_back(int32_t(br.write_index + i));
      p.rope_pos.push_back(int32_t(br.positions.empty() ? br.write_index + i : br.positions[size_t(i)]));
      p.kv_len.push_back(kv_len);
    }
  }
  // The leading rows of one token each are the decode attention's rows: ranked for it (TokenMeta::order).
  p.order = longest_first_order(std::vector<int32_t>(p.kv_len.begin(), p.kv_len.begin() + p.single_rows));
  return p;
}

void Model::run_decoder(int64_t T, int max_kv_len, int rows, int single_rows) {
  const ModelSpec& s = spec_;
  const DType adt = be_.activation_dtype();
  ForwardContext c{be_, s, state_.view()};
  c.T = T;
  c.x = mat(x_.get(), adt, T, s.hidden);
  c.h = mat(h_.get(), adt, T, s.hidden);
  c.delta = mat(delta_.get(), adt, T, s.hidden);
  c.qkv = mat(qkv_.get(), adt, T, s.qkv_width());
  c.attn = mat(attn_.get(), adt, T, s.q_dim());
  if (s.has_linear_layers()) {
    c.lin_in = mat(qkv_.get(), adt, T, s.linear.in_width());
    c.lin_out = mat(attn_.get(), adt, T, s.linear.value_width());
    c.lin_conv = mat(conv_.get(), adt, T, s.linear.conv_channels());
  }
  c.gate_up = mat(gate_up_.get(), adt, T, 2 * s.intermediate);
  c.act = mat(act_.get(), adt, T, s.intermediate);
  c.meta = {row_.as<int32_t>(), slot_.as<int32_t>(), rope_pos_.as<int32_t>(), kv_len_.as<int32_t>(),
            order_.as<int32_t>()};
  c.inv_freq = inv_freq_.as<float>();
  c.rope_scale = rope_scale_;
  c.max_kv_len = max_kv_len;
  c.rows = rows;
  c.single_rows = single_rows;
  c.comm = comm_;
  decoder_forward(c, family_, weights_, ids_.as<int32_t>());
}

void Model::advance_lengths(const Batch& b) {
  for (const BatchRow& r : b.rows) state_.set_length(r.row, r.write_index + int64_t(r.tokens.size()));
}

void Model::upload_meta(const Prepared& p) {
  auto up = [&](Buffer& dst, const std::vector<int32_t>& v) {
    if (!v.empty()) be_.upload(dst.get(), v.data(), v.size() * sizeof(int32_t));  // an empty vector's data() may be null
  };
  up(ids_, p.ids);
  up(row_, p.row);
  up(slot_, p.slot);
  up(rope_pos_, p.rope_pos);
  up(kv_len_, p.kv_len);
  up(out_idx_, p.out_idx);
  up(order_, p.order);
}

void Model::on_ranks(const std::function<void(Model& m, int rank)>& fn) {
  if (!group_) return fn(*this, 0);
  group_->run([&](int r) { fn(r == 0 ? *this : group_->peer(r), r); });
}

void Model::set_sampling(int row, const SamplingParams& p, std::span<const int32_t> history, uint32_t draws,
                         std::span<const int32_t> generated) {
  if (leading_) send_call(tp_call::set_sampling(row, p, history, draws, generated));
  const Lead lead{*this};
  if (!group_) return set_sampling_local(row, p, history, draws, generated);
  on_ranks([&](Model& m, int) { m.set_sampling_local(row, p, history, draws, generated); });
}

void Model::set_sampling_local(int row, const SamplingParams& p, std::span<const int32_t> history, uint32_t draws,
                               std::span<const int32_t> generated) {
  if (row < 0 || row >= state_.max_batch())
    throw Error("set_sampling: cache row " + std::to_string(row) + " is outside [0, " + std::to_string(state_.max_batch()) + ")");
  p.validate();
  // The argmax reads neither the counter nor the history; the history only matters with a penalty.
  std::vector<uint8_t> seen;
  if (p.repetition_penalty != 1.0f) {
    seen.assign(size_t(spec_.vocab), 0);
    for (int32_t t : history) {
      if (t < 0 || t >= spec_.vocab)
        throw Error("set_sampling: history token id " + std::to_string(t) + " is outside the vocabulary of " +
                    std::to_string(spec_.vocab));
      seen[size_t(t)] = 1;
    }
  }
  std::vector<int32_t> counts;
  if (p.counts_tokens()) {
    counts.assign(size_t(spec_.vocab), 0);
    for (int32_t t : generated) {
      if (t < 0 || t >= spec_.vocab)
        throw Error("set_sampling: generated token id " + std::to_string(t) + " is outside the vocabulary of " +
                    std::to_string(spec_.vocab));
      ++counts[size_t(t)];
    }
  }
  if (p != row_sampling_[size_t(row)]) {
    const SampleParams sp = p.to_backend();
    be_.upload(sample_params_.as<SampleParams>() + row, &sp, sizeof sp);
    row_sampling_[size_t(row)] = p;
  }
  if (p.greedy()) return;
  be_.upload(sample_step_.as<uint32_t>() + row, &draws, sizeof draws);
  if (!seen.empty())
    be_.upload(sample_seen_.as<uint8_t>() + size_t(row) * size_t(spec_.vocab), seen.data(), seen.size());
  if (!counts.empty())
    be_.upload(sample_counts_.as<int32_t>() + size_t(row) * size_t(spec_.vocab), counts.data(),
               counts.size() * sizeof(int32_t));
}

Model::StepLogprobs Model::decode_logprobs(int top_n) {
  if (leading_) send_call(tp_call::decode_logprobs(top_n));
  const Lead lead{*this};
  return rank0_result([&](Model& m) { return m.decode_logprobs_local(top_n); });
}

Model::StepLogprobs Model::decode_logprobs_local(int top_n) {
  if (top_n < 0 || top_n > sampling::kMaxTopLogprobs)
    throw Error("decode_logprobs: top_n " + std::to_string(top_n) + " is outside [0, " +
                std::to_string(sampling::kMaxTopLogprobs) + "]");
  const int64_t n = last_decode_rows_;
  if (n < 1) throw Error("decode_logprobs: no decode step ran since the logits workspace was last written");
  if (!launched_.empty()) throw Error("decode_logprobs: a launched step is not finished (its logits are not this step's)");
  const int64_t L = opt_.max_logit_rows;
  const Watchdog::Wait wait(wait_watchdog());
  // A split pick left the logits on the ranks: gather them now, from the head's input the step left
  // (the picks stay as they were: the same products give the same logits).
  if (!logits_gathered_) {
    head(mat(head_input_->get(), be_.activation_dtype(), n, spec_.hidden), n);
    logits_gathered_ = true;
  }
  float* chosen = logprobs_out_.as<float>();
  int32_t* ids = logprobs_out_.as<int32_t>() + L;
  float* top = logprobs_out_.as<float>() + L + L * sampling::kMaxTopLogprobs;
  be_.logprobs(mat(logits_.get(), be_.activation_dtype(), n, spec_.vocab), next_tokens_.as<int32_t>(), top_n, chosen,
               ids, top);
  StepLogprobs out;
  out.top_n = top_n;
  out.chosen.resize(size_t(n));
  out.top_ids.resize(size_t(n * top_n));
  out.top.resize(size_t(n * top_n));
  be_.download(out.chosen.data(), chosen, out.chosen.size() * sizeof(float));
  if (top_n > 0) {
    be_.download(out.top_ids.data(), ids, out.top_ids.size() * sizeof(int32_t));
    be_.download(out.top.data(), top, out.top.size() * sizeof(float));
  }
  return out;
}

void Model::head(const Mat& g, int64_t n) {
  const DType adt = be_.activation_dtype();
  const Mat logits = mat(logits_.get(), adt, n, spec_.vocab);
  if (!comm_) return lm_head(be_, weights_, g, logits);
  // This rank's vocabulary rows into its place among every rank's, gathered in place; then each
  // rank's block of columns copied beside the others' (the last block is cut at the vocabulary).
  const int64_t rows = spec_.tp.vocab_rows, world = spec_.tp.world;
  const size_t es = dtype_size(adt), part = size_t(n * rows) * es;
  auto* all = static_cast<uint8_t*>(tp_logits_.get());  // [world, n, rows] for this call
  lm_head(be_, weights_, g, mat(all + size_t(spec_.tp.rank) * part, adt, n, rows));
  comm_->all_gather(all + size_t(spec_.tp.rank) * part, all, part);
  for (int64_t r = 0; r < world; ++r) {
    const int64_t cols = vocab_cols(r);
    if (cols <= 0) break;
    be_.gather_rows(Mat{all + size_t(r) * part, adt, n, cols, rows}, tp_index_.as<int32_t>(),
                    Mat{static_cast<uint8_t*>(logits_.get()) + size_t(r * rows) * es, adt, n, cols, spec_.vocab});
  }
}

void Model::head_pick(const Mat& g, int64_t n, const int32_t* rows, Pick how) {
  if (!split(how)) {
    head(g, n);
    return pick(n, rows, how == Pick::Draw);
  }
  const DType adt = be_.activation_dtype();
  const int64_t vrows = spec_.tp.vocab_rows, rank = spec_.tp.rank, cols = vocab_cols(rank);
  const int world = int(spec_.tp.world);
  const Mat mine = mat(tp_logits_.get(), adt, n, vrows);  // [n, vocab_rows] this rank's LM-head rows
  if (cols > 0) lm_head(be_, weights_, g, mine);
  // A rank without vocabulary rows sends the constant parts of slot `world` (the constructor's): its
  // own slot of [world, n] may hold another rank's parts from a call of another n.
  const int64_t L = opt_.max_logit_rows;
  if (how == Pick::SplitArgmax) {
    ArgmaxPart* parts = tp_parts_.as<ArgmaxPart>();  // [world, n] for this call
    if (cols > 0) be_.argmax_part(Mat{mine.data, adt, n, cols, vrows}, rank * vrows, parts + rank * n);
    comm_->all_gather(cols > 0 ? parts + rank * n : parts + world * L, parts, size_t(n) * sizeof(ArgmaxPart));
    be_.argmax_merge(parts, n, world, next_tokens_.as<int32_t>());
    return;
  }
  const SampleState st = sample_state(rows);
  SampleCandidate* parts = tp_cands_.as<SampleCandidate>();  // [world, n, kSampleCandidates] for this call
  const int64_t per_rank = n * kSampleCandidates;
  if (cols > 0) be_.sample_part(Mat{mine.data, adt, n, cols, vrows}, rank * vrows, st, parts + rank * per_rank);
  comm_->all_gather(cols > 0 ? parts + rank * per_rank : parts + world * L * kSampleCandidates, parts,
                    size_t(per_rank) * sizeof(SampleCandidate));
  be_.sample_merge(parts, n, world, st, next_tokens_.as<int32_t>());
}

SampleState Model::sample_state(const int32_t* rows) {
  SampleState st;
  st.row = rows;
  st.params = sample_params_.as<SampleParams>();
  st.step = sample_step_.as<uint32_t>();
  st.seen = sample_seen_.as<uint8_t>();
  st.seen_ld = spec_.vocab;
  st.counts = sample_counts_.as<int32_t>();
  st.counts_ld = spec_.vocab;
  return st;
}

void Model::pick(int64_t n, const int32_t* rows, bool drawn) {
  Mat lg = mat(logits_.get(), be_.activation_dtype(), n, spec_.vocab);
  if (!drawn) {
    be_.argmax(lg, next_tokens_.as<int32_t>());
    return;
  }
  be_.sample(lg, sample_state(rows), next_tokens_.as<int32_t>());
}

bool Model::any_sampled(const std::vector<int>& rows) const {
  return std::any_of(rows.begin(), rows.end(), [&](int r) { return !row_sampling_[size_t(r)].greedy(); });
}

Model::Pick Model::pick_for(const std::vector<int>& rows) const {
  const bool drawn = any_sampled(rows);
  if (!comm_) return drawn ? Pick::Draw : Pick::Argmax;
  if (!drawn) return Pick::SplitArgmax;
  const bool suits = be_.sample_split() && std::all_of(rows.begin(), rows.end(), [&](int r) {
                       return sampling::split_draw_suits(row_sampling_[size_t(r)].to_backend());
                     });
  return suits ? Pick::SplitDraw : Pick::Draw;
}

void Model::decode_body(int64_t n, Pick how) {
  const DType adt = be_.activation_dtype();
  // Grid sizes may not depend on this step's lengths: bound attention by the capacity.
  run_decoder(n, int(state_.capacity()), int(n));
  // one token per row: the token's cache row is the state row
  head_pick(mat(h_.get(), adt, n, spec_.hidden), n, row_.as<int32_t>(), how);
}

void Model::feed_tokens(const Batch& batch, const std::vector<int32_t>& feed) {
  if (feed.empty()) return;
  if (feed.size() != batch.rows.size()) throw Error("launch: need one feed index per row, or none");
  std::vector<int32_t> from;  // [up to the last fed token] the pick each token of the call takes, or -1
  size_t token = 0;           // the row's first token in the call (token-major)
  for (size_t r = 0; r < feed.size(); token += batch.rows[r].tokens.size(), ++r) {
    if (feed[r] < 0) continue;
    if (feed[r] >= picks_rows_)
      throw Error("launch: feed index " + std::to_string(feed[r]) + " is outside the previous step's " +
                  std::to_string(picks_rows_) + " picks");
    if (batch.rows[r].tokens.size() != 1) throw Error("launch: a fed row carries one token");
    if (token >= size_t(opt_.max_batch))
      throw Error("launch: a fed row's token sits at " + std::to_string(token) + " in the call, past the first " +
                  std::to_string(opt_.max_batch) + " (put the fed rows first)");
    from.resize(token + 1, -1);
    from[token] = feed[r];
  }
  if (from.empty()) return;
  int32_t* dev = next_tokens_.as<int32_t>() + 2 * opt_.max_batch;  // [max_batch]
  be_.upload(dev, from.data(), from.size() * sizeof(int32_t));
  be_.feed_picks(next_tokens_.as<int32_t>(), dev, int64_t(from.size()), ids_.as<int32_t>());
}

void Model::launch_readback(int64_t n) {
  last_decode_rows_ = n;
  picks_rows_ = n;
  Readback* rb = readbacks_[next_readback_].get();
  next_readback_ ^= 1;
  rb->start(next_tokens_.get(), size_t(n) * sizeof(int32_t));
  launched_.emplace_back(rb, n);
}

std::vector<int32_t> Model::finish_launch() {
  if (leading_) send_call(tp_call::bare(tp_call::Call::FinishLaunch));
  const Lead lead{*this};
  return rank0_result([](Model& m) { return m.finish_launch_local(); });
}

std::vector<int32_t> Model::finish_launch_local() {
  if (launched_.empty()) throw Error("finish_launch: no launched step");
  auto [rb, n] = launched_.front();
  launched_.pop_front();
  const Watchdog::Wait wait(wait_watchdog());  // a peer alive but absent ends it
  const int32_t* p = static_cast<const int32_t*>(rb->wait());
  if (comm_) comm_->check_usable();  // a peer died while this rank waited: these are no picks
  return std::vector<int32_t>(p, p + n);
}

void Model::launch_forward(const Batch& batch, const std::vector<int32_t>& feed) {
  if (leading_) send_call(tp_call::launch_forward(batch, feed));
  const Lead lead{*this};
  if (!group_) return launch_forward_local(batch, feed);
  on_ranks([&](Model& m, int) { m.launch_forward_local(batch, feed); });
}

void Model::launch_forward_local(const Batch& batch, const std::vector<int32_t>& feed) {
  for (size_t r = 0; r < batch.rows.size(); ++r)
    if (batch.rows[r].all_logits)
      throw Error("launch_forward: row " + std::to_string(r) + " asks for every token's logits; a pick takes only the last");
  if (launched_.size() >= 2) throw Error("launch: two launched steps are not finished yet");
  Prepared p = prepare(batch);
  last_decode_rows_ = 0;  // the logits workspace is about to hold this call's rows
  const int64_t T = int64_t(p.ids.size()), n = int64_t(p.out_idx.size());
  upload_meta(p);
  feed_tokens(batch, feed);
  if (n > 0) be_.upload(next_tokens_.as<int32_t>() + opt_.max_batch, p.out_row.data(), p.out_row.size() * sizeof(int32_t));
  advance_lengths(batch);
  const Pick how = n > 0 ? pick_for(std::vector<int>(p.out_row.begin(), p.out_row.end())) : Pick::Argmax;
  const int rows = p.rows, single_rows = p.single_rows;
  auto body = [this, T, n, rows, single_rows, how] {
    // Grid sizes may not depend on this call's lengths (the body may be a graph replayed for another
    // call of the same shape): attention is bounded by the capacity, as decode's is.
    run_decoder(T, int(state_.capacity()), rows, single_rows);
    if (n > 0) {
      const DType adt = be_.activation_dtype();
      Mat g = mat(gathered_.get(), adt, n, spec_.hidden);  // n <= max_batch <= max_logit_rows: one pass
      be_.gather_rows(mat(h_.get(), adt, T, spec_.hidden), out_idx_.as<int32_t>(), g);
      head_pick(g, n, next_tokens_.as<int32_t>() + opt_.max_batch, how);
    }
  };
  logits_gathered_ = !split(how);
  head_input_ = &gathered_;
  run_forward_graph(ForwardShape{T, rows, single_rows, n, how}, body);
  launch_readback(n);
}

namespace {
// INGOT_FORWARD_GRAPHS=0 runs every launch_forward directly (for A/B measurements, as
// INGOT_CUDA_PDL=0 is for the dependent launches).
bool forward_graphs_on() {
  static const bool on = [] {
    const char* v = std::getenv("INGOT_FORWARD_GRAPHS");
    return !(v && std::string(v) == "0");
  }();
  return on;
}
}  // namespace

// A call's ops depend on the host only through its shape: tokens, rows, lengths and picks live in fixed
// buffers. A shape seen a second time is captured and every later call of it replays the graph, which spares
// the host one launch per op (a 128-token prefill of Qwen3-0.6B shapes is ~260 of them: TTFT(128) 1.55 ->
// 1.43 ms on the H200, docs/performance.md). Not the first time: products choose their algorithm by timing on
// their first call, never inside a capture, and a shape seen once (a prompt length of its own) is not worth a
// capture. Without a communicator only: no graph has been run across GPUs yet.
void Model::run_forward_graph(const ForwardShape& shape, const std::function<void()>& body) {
  if (!opt_.use_graphs || comm_ || !forward_graphs_on()) return body();
  auto it = forward_graphs_.find(shape);
  if (it == forward_graphs_.end()) {
    if (forward_seen_.insert(shape).second) {
      if (forward_seen_.size() > kForwardSeenMax) forward_seen_ = {shape};
      return body();
    }
    if (forward_graphs_.size() >= kForwardGraphsMax) {  // the least recently used goes
      auto old = forward_graphs_.begin();
      for (auto j = forward_graphs_.begin(); j != forward_graphs_.end(); ++j)
        if (j->second.last_use < old->second.last_use) old = j;
      forward_graphs_.erase(old);
    }
    it = forward_graphs_.emplace(shape, ForwardGraph{be_.capture(body), 0}).first;
  }
  it->second.last_use = ++forward_calls_;
  if (it->second.graph) it->second.graph->replay();
  else body();
}

std::vector<int32_t> Model::decode(const std::vector<int>& rows, const std::vector<int32_t>& tokens,
                                   const std::vector<int64_t>& write_index) {
  if (!launched_.empty()) throw Error("decode: a launched step was not finished (finish_launch)");
  launch_decode(rows, tokens, write_index);
  return finish_launch();
}

void Model::launch_decode(const std::vector<int>& rows, const std::vector<int32_t>& tokens,
                          const std::vector<int64_t>& write_index, const std::vector<int32_t>& feed) {
  if (leading_) send_call(tp_call::launch_decode(rows, tokens, write_index, feed));
  const Lead lead{*this};
  if (!group_) return launch_decode_local(rows, tokens, write_index, feed);
  on_ranks([&](Model& m, int) { m.launch_decode_local(rows, tokens, write_index, feed); });
}

void Model::launch_decode_local(const std::vector<int>& rows, const std::vector<int32_t>& tokens,
                                const std::vector<int64_t>& write_index, const std::vector<int32_t>& feed) {
  const int64_t n = int64_t(tokens.size());
  if (n < 1 || int64_t(write_index.size()) != n || int64_t(rows.size()) != n)
    throw Error("decode: need one cache row and one write index per token, and at least one row");
  if (n > opt_.max_logit_rows)
    throw Error("decode: " + std::to_string(n) + " rows exceed the logits workspace of " + std::to_string(opt_.max_logit_rows));
  if (launched_.size() >= 2) throw Error("launch: two launched steps are not finished yet");
  if (!feed.empty() && int64_t(feed.size()) != n) throw Error("launch: need one feed index per row, or none");
  Batch b;
  for (int64_t r = 0; r < n; ++r) {
    // A fed row's token is on the device; 0 stands in for it in the host's checks and upload.
    const int32_t tok = !feed.empty() && feed[size_t(r)] >= 0 ? 0 : tokens[size_t(r)];
    b.rows.push_back(BatchRow{rows[size_t(r)], {tok}, write_index[size_t(r)], {}, false});
  }
  upload_meta(prepare(b));  // validates rows, capacity and vocabulary before any compute
  feed_tokens(b, feed);
  advance_lengths(b);
  const Pick how = pick_for(rows);
  logits_gathered_ = !split(how);
  head_input_ = &h_;
  if (opt_.use_graphs) {
    const std::pair<int64_t, Pick> key{n, how};
    auto it = decode_graphs_.find(key);
    if (it == decode_graphs_.end()) {
      std::unique_ptr<Graph> g = be_.capture([&] { decode_body(n, how); });
      it = decode_graphs_.emplace(key, std::move(g)).first;
    }
    if (it->second) it->second->replay();
    else decode_body(n, how);
  } else {
    decode_body(n, how);
  }
  launch_readback(n);
}

HostTensor Model::forward(const Batch& batch) {
  if (leading_) send_call(tp_call::forward(tp_call::Call::Forward, batch));
  const Lead lead{*this};
  return rank0_result([&](Model& m) { return m.forward_local(batch); });
}

std::vector<HostTensor> Model::forward_ranks(const Batch& batch) {
  if (leading_) send_call(tp_call::forward(tp_call::Call::ForwardRanks, batch));
  const Lead lead{*this};
  std::vector<HostTensor> out(size_t(spec_.tp.world));
  on_ranks([&](Model& m, int r) { out[size_t(r)] = m.forward_local(batch); });
  return out;
}

HostTensor Model::forward_local(const Batch& batch) {
  Prepared p = prepare(batch);
  last_decode_rows_ = 0;  // the logits workspace is about to hold this call's rows
  logits_gathered_ = true;
  const int64_t T = int64_t(p.ids.size());
  const Watchdog::Wait wait(wait_watchdog());  // the downloads below wait
  upload_meta(p);
  advance_lengths(batch);
  run_decoder(T, p.max_kv_len, p.rows, p.single_rows);

  const ModelSpec& s = spec_;
  const DType adt = be_.activation_dtype();
  const int64_t n_out = int64_t(p.out_idx.size());
  HostTensor out(DType::F32, {n_out, s.vocab});
  std::vector<float> host;
  for (int64_t at = 0; at < n_out; at += opt_.max_logit_rows) {
    const int64_t n = std::min(opt_.max_logit_rows, n_out - at);
    Mat g = mat(gathered_.get(), adt, n, s.hidden);
    be_.gather_rows(mat(h_.get(), adt, T, s.hidden), out_idx_.as<int32_t>() + at, g);
    Mat lg = mat(logits_.get(), adt, n, s.vocab);
    head(g, n);
    if (be_.host_memory()) {
      be_.to_f32(lg, out.as<float>() + at * s.vocab);
    } else {
      // Widen on the backend into the front of the logits buffer's own f32 view is not possible in
      // place for 16-bit types, so widen on the host after a raw copy.
      std::vector<uint8_t> raw(size_t(n * s.vocab) * dtype_size(adt));
      be_.download(raw.data(), lg.data, raw.size());
      convert_to_f32(adt, raw.data(), out.as<float>() + at * s.vocab, size_t(n * s.vocab));
    }
  }
  if (comm_) comm_->check_usable();  // a peer died while this rank waited: these are no sums
  return out;
}

}  // namespace ingot
