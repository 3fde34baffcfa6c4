#include "runtime/tp_split.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "models/family.h"

namespace ingot {

namespace {

// A run of rows (or columns) of a source tensor; rows past the source's end are zeros (padding).
struct Span {
  int64_t first = 0, count = 0;
};

HostTensor take_rows(const HostTensor& t, const std::vector<Span>& spans) {
  const int64_t rows = t.shape()[0];
  const size_t row_bytes = t.nbytes() / size_t(rows);
  Shape shape = t.shape();
  shape[0] = 0;
  for (const Span& s : spans) shape[0] += s.count;
  HostTensor out(t.dtype(), shape);  // zero-filled: the padding stays zero
  auto* dst = static_cast<uint8_t*>(out.data());
  const auto* src = static_cast<const uint8_t*>(t.data());
  for (const Span& s : spans) {
    const int64_t real = std::max<int64_t>(0, std::min(s.count, rows - s.first));
    if (real > 0) std::memcpy(dst, src + size_t(s.first) * row_bytes, size_t(real) * row_bytes);
    dst += size_t(s.count) * row_bytes;
  }
  return out;
}

// Columns [s.first, s.first + s.count) of a [rows, cols] tensor.
HostTensor take_cols(const HostTensor& t, Span s) {
  const int64_t rows = t.shape()[0], cols = t.shape()[1];
  const size_t es = dtype_size(t.dtype());
  HostTensor out(t.dtype(), {rows, s.count});
  auto* dst = static_cast<uint8_t*>(out.data());
  const auto* src = static_cast<const uint8_t*>(t.data());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + size_t(r * s.count) * es, src + size_t(r * cols + s.first) * es, size_t(s.count) * es);
  return out;
}

// The same bytes, borrowed: the engine outlives its slices (Model's contract).
HostTensor borrow(const HostTensor& t) {
  return HostTensor::borrow(t.dtype(), t.shape(), t.data(), std::shared_ptr<const void>(t.data(), [](const void*) {}));
}

// An owned copy: a streaming build frees the whole tensor right after slicing it.
HostTensor copy_of(const HostTensor& t) {
  HostTensor out(t.dtype(), t.shape());
  if (t.nbytes()) std::memcpy(out.data(), t.data(), t.nbytes());
  return out;
}

// The slice must be what the rank spec's table says, weight for weight (with an INT4 engine's packed
// weights and their scales, zeros and perms: engine_tensor_shapes).
void check_slice(const Engine& out, int rank) {
  const auto want = engine_tensor_shapes(out.spec, out.weight_dtype, out.quant ? &*out.quant : nullptr);
  if (want.size() != out.weights.size())
    throw Error("tensor parallel: rank " + std::to_string(rank) + "'s slice holds " + std::to_string(out.weights.size()) +
                " weights; its table lists " + std::to_string(want.size()));
  for (const auto& [name, sd] : want) {
    const HostTensor* t = out.find(name);
    if (!t || t->shape() != sd.first || t->dtype() != sd.second)
      throw Error("tensor parallel: rank " + std::to_string(rank) + "'s slice of '" + name + "' has shape " +
                  (t ? shape_str(t->shape()) : std::string("(missing)")) + "; its table says " + shape_str(sd.first));
  }
}

std::string int4_refusal(int world) {
  return "--tp " + std::to_string(world) + ": a rank's share of INT4 weights cannot be built alone (it would be "
         "quantized or converted apart from the rest); build the whole engine and take the share with shard_engine, "
         "as the loader does (docs/tensor-parallel.md)";
}

}  // namespace

namespace {

// How a weight is split: kept whole, rows (output features) by spans, columns (input features) by one
// span, or kept by rank 0 only (zeros elsewhere: a row-parallel bias, added once by the all-reduce).
// `tied_head`: the whole embedding also gives the rank's LM-head rows (a tied model).
struct Cut {
  enum Kind { Keep, Rows, Cols, RankZero } kind = Keep;
  std::vector<Span> spans;
  bool tied_head = false;
};

Cut split_rule(const ModelSpec& f, const WeightSpec& w, int world, int rank) {
  const ModelSpec s = rank_spec(f, world, rank);
  const int64_t D = f.head_dim, Q = f.q_dim(), KV = f.kv_dim(), I = f.intermediate;
  const RankHeads a = rank_heads(f.heads, f.kv_heads, world, rank);
  const Span q{a.q.first * D, a.q.count * D}, kv{a.kv.first * D, a.kv.count * D};
  const Span inter{rank * s.intermediate, s.intermediate};
  const LinearAttnSpec& la = f.linear;
  RankHeads l{};
  if (f.has_linear_layers()) l = rank_heads(la.v_heads, la.k_heads, world, rank);
  const int64_t LK = la.key_width(), LV = la.value_width(), LC = la.conv_channels(), LH = la.v_heads;
  const Span lk{l.kv.first * la.k_dim, l.kv.count * la.k_dim}, lv{l.q.first * la.v_dim, l.q.count * la.v_dim};
  const std::vector<Span> lin_qkv = {lk, {LK + lk.first, lk.count}, {2 * LK + lv.first, lv.count}};
  const Span vocab{rank * s.tp.vocab_rows, s.tp.vocab_rows};
  const auto rows = [](std::vector<Span> v) { return Cut{Cut::Rows, std::move(v)}; };
  const auto cols = [](Span c) { return Cut{Cut::Cols, {c}}; };

  if (w.model_field == &ModelWeights::lm_head) return rows({vocab});
  if (w.model_field) {  // the embedding and the final norm
    Cut c;
    // Tied embeddings: the embedding stays whole, and each rank's LM head is its rows of it.
    if (w.name == "tok_embeddings" && f.tie_embeddings) {
      c.tied_head = true;
      c.spans = {vocab};
    }
    return c;
  }
  const auto field = w.layer_field;
  if (field == &LayerWeights::attn_norm || field == &LayerWeights::mlp_norm || field == &LayerWeights::q_norm ||
      field == &LayerWeights::k_norm || field == &LayerWeights::lin_norm)
    return {};  // per hidden unit or per head dim: the same on every rank
  if (field == &LayerWeights::wqkv || field == &LayerWeights::bqkv) {
    // [q | k | v (| gate)] rows: this rank's query heads, the KV heads they read, their gates.
    std::vector<Span> spans = {q, {Q + kv.first, kv.count}, {Q + KV + kv.first, kv.count}};
    if (f.attn_gate) spans.push_back({Q + 2 * KV + q.first, q.count});
    return rows(spans);
  }
  if (field == &LayerWeights::wo) return cols(q);
  if (field == &LayerWeights::bo) return Cut{Cut::RankZero, {}};
  if (field == &LayerWeights::w_gate_up) return rows({inter, {I + inter.first, inter.count}});
  if (field == &LayerWeights::w_down) return cols(inter);
  if (field == &LayerWeights::lin_in) {
    // [q | k | v | z | b | a] rows: this rank's value heads, the key heads they read.
    std::vector<Span> spans = lin_qkv;
    spans.push_back({LC + lv.first, lv.count});
    spans.push_back({LC + LV + l.q.first, l.q.count});
    spans.push_back({LC + LV + LH + l.q.first, l.q.count});
    return rows(spans);
  }
  if (field == &LayerWeights::lin_conv) return rows(lin_qkv);  // one conv filter per channel of q | k | v
  if (field == &LayerWeights::lin_a_log || field == &LayerWeights::lin_dt_bias) return rows({{l.q.first, l.q.count}});
  if (field == &LayerWeights::lin_out) return cols(lv);
  throw Error("tensor parallel: no split rule for weight '" + w.name + "'");
}

// An INT4 weight's share (quant/int4.h's tensors): the packed rows and their scales and zeros take the
// same rows; a column cut takes whole groups (the packed bytes of its columns, the scales and zeros of
// its groups), so each rank's values are the whole weight's, bit for bit. Refused, naming the weight,
// the rank's columns and the group size: a column cut that is not whole groups, and one of an
// act-order weight (its stored columns scatter over the input, so a rank's input range is no run of
// them).
// The refusals of add_rank_int4's column cut (c: the rank's input columns of weight `name`, `in` of them).
void check_int4_cut(const QuantConfig& qc, const std::string& name, int64_t in, Span c, bool act_order, int world,
                    int rank) {
  const std::string what = "--tp " + std::to_string(world) + ": INT4 weight '" + name + "' (rank " + std::to_string(rank) +
                           "'s input columns " + std::to_string(c.first) + ".." + std::to_string(c.first + c.count - 1) + ")";
  if (act_order)
    throw Error(what + " is act-order (desc_act: its stored columns are a permutation of the input), which cannot be "
                       "split by input columns; run it without --tp");
  const int64_t group = qc.group(in);
  if (qc.group_size >= 0 && (c.first % group != 0 || c.count % group != 0))
    throw Error(what + " would cut its groups of " + std::to_string(group) + " columns; every rank's share of the " +
                std::to_string(in) + " columns must be whole groups (a smaller --group-size, or fewer ranks)");
}

void add_rank_int4(const Engine& e, const WeightSpec& w, const Cut& cut, int world, int rank, Engine& out) {
  const QuantConfig& qc = *e.quant;
  const HostTensor& packed = e.get(w.name);
  const HostTensor& scales = e.get(w.name + kInt4ScalesSuffix);
  const HostTensor* zeros = e.find(w.name + kInt4ZerosSuffix);
  const HostTensor* perm = e.find(w.name + kInt4PermSuffix);
  const int64_t in = w.shape.at(1), group = qc.group(in);
  HostTensor p, sc, z, pm;
  if (cut.kind == Cut::Rows) {
    p = take_rows(packed, cut.spans);
    sc = take_rows(scales, cut.spans);  // padded rows: scale 0, so their values are exact zeros
    if (zeros) z = take_rows(*zeros, cut.spans);
    if (perm) pm = borrow(*perm);
  } else if (cut.kind == Cut::Cols) {
    const Span c = cut.spans.at(0);
    check_int4_cut(qc, w.name, in, c, perm != nullptr, world, rank);
    p = take_cols(packed, {c.first / 2, c.count / 2});
    // One group a row (a whole-row group) stays as it is: the rank's columns share that scale.
    const Span g = qc.group_size < 0 ? Span{0, 1} : Span{c.first / group, c.count / group};
    sc = take_cols(scales, g);
    if (zeros) z = take_cols(*zeros, g);
  } else {
    throw Error("tensor parallel: INT4 weight '" + w.name + "' has no split rule for INT4");
  }
  out.weights.emplace(w.name, std::move(p));
  out.weights.emplace(w.name + kInt4ScalesSuffix, std::move(sc));
  if (zeros) out.weights.emplace(w.name + kInt4ZerosSuffix, std::move(z));
  if (perm) out.weights.emplace(w.name + kInt4PermSuffix, std::move(pm));
}

}  // namespace

void add_rank_weight(const ModelSpec& f, const WeightSpec& w, const HostTensor& t, int world, int rank, bool own,
                     Engine& out) {
  const auto keep = [&](const HostTensor& whole) { return own ? copy_of(whole) : borrow(whole); };
  if (world == 1) {
    out.weights.emplace(w.name, keep(t));
    return;
  }
  const Cut cut = split_rule(f, w, world, rank);
  HostTensor part;
  switch (cut.kind) {
    case Cut::Keep:
      part = keep(t);
      if (cut.tied_head) out.weights.emplace("lm_head", take_rows(t, cut.spans));
      break;
    case Cut::Rows: part = take_rows(t, cut.spans); break;
    case Cut::Cols: part = take_cols(t, cut.spans.at(0)); break;
    case Cut::RankZero: part = rank == 0 ? keep(t) : HostTensor(t.dtype(), t.shape()); break;
  }
  out.weights.emplace(w.name, std::move(part));
}

Engine borrowed_engine(const Engine& engine) {
  Engine out;
  out.spec = engine.spec;
  out.weight_dtype = engine.weight_dtype;
  out.provenance = engine.provenance;
  out.quant = engine.quant;
  for (const auto& [name, t] : engine.weights) out.weights.emplace(name, borrow(t));
  return out;
}

Engine shard_engine(const Engine& engine, int world, int rank) {
  const ModelSpec& f = engine.spec;
  if (world == 1) {
    Engine out = borrowed_engine(engine);
    out.spec = rank_spec(f, world, rank);
    return out;
  }
  Engine out;
  out.spec = rank_spec(f, world, rank);
  out.weight_dtype = engine.weight_dtype;
  out.provenance = engine.provenance;
  out.quant = engine.quant;  // the same INT4 weights by name, each the rank's share
  const WeightTable table = find_family(f.family).weights(f);
  const QuantConfig* q = engine.quant ? &*engine.quant : nullptr;
  for (const WeightSpec& w : table.entries()) {
    if (q && std::find(q->tensors.begin(), q->tensors.end(), w.name) != q->tensors.end())
      add_rank_int4(engine, w, split_rule(f, w, world, rank), world, rank, out);
    else
      add_rank_weight(f, w, engine.get(w.name), world, rank, false, out);
  }
  check_slice(out, rank);
  return out;
}

std::optional<QuantConfig> int4_split_config(const ModelSpec& whole, std::optional<int64_t> group_size,
                                             std::optional<int64_t> published_group, bool act_order) {
  if (!published_group && !group_size) return std::nullopt;
  QuantConfig q;
  if (published_group) {
    q.group_size = int4_runtime_group(*published_group, int4_quantizable_cols(find_family(whole.family).weights(whole)));
    q.act_order = act_order;
  } else {
    q.group_size = *group_size;
  }
  return q;
}

void check_int4_split(const ModelSpec& f, const QuantConfig& q, int world, const std::string& flag) {
  if (world == 1) return;
  check_tensor_parallel(f, world, flag);
  const WeightTable table = find_family(f.family).weights(f);
  for (const WeightSpec& w : table.entries()) {
    if (!int4_allowed(w)) continue;
    if (!q.tensors.empty() && std::find(q.tensors.begin(), q.tensors.end(), w.name) == q.tensors.end()) continue;
    for (int r = 0; r < world; ++r) {
      const Cut cut = split_rule(f, w, world, r);
      if (cut.kind == Cut::Cols) check_int4_cut(q, w.name, w.shape.at(1), cut.spans.at(0), q.act_order, world, r);
    }
  }
}

namespace {

// The sink of a rank's streaming build: each whole weight sliced into an owned copy, then dropped by
// the caller (build_engine or random_engine) before it makes the next.
WeightSink rank_sink(int world, int rank, RankBuildStats* stats) {
  return [world, rank, stats](Engine& eng, const WeightSpec& w, HostTensor&& whole) {
    add_rank_weight(eng.spec, w, whole, world, rank, true, eng);
    if (stats) {
      // Held at the peak of this step: the slice with this weight's part, and the whole weight (summed
      // afresh: a few hundred tensors).
      stats->largest_whole_bytes = std::max<uint64_t>(stats->largest_whole_bytes, whole.nbytes());
      stats->peak_bytes = std::max<uint64_t>(stats->peak_bytes, eng.weight_bytes() + whole.nbytes());
    }
  };
}

// From the whole engine's spec (what the builds set) to the rank's, checked as shard_engine's is.
Engine finish_slice(Engine eng, int world, int rank) {
  eng.spec = rank_spec(eng.spec, world, rank);
  check_slice(eng, rank);
  return eng;
}

}  // namespace

Engine build_rank_engine(const std::string& dir, const BuildOptions& options, int world, int rank,
                         RankBuildStats* stats) {
  if (options.int4_group_size) throw Error(int4_refusal(world));
  if (options.sink) throw Error("build_rank_engine: the build's weight sink is its own");
  BuildOptions o = options;
  o.sink = rank_sink(world, rank, stats);
  return finish_slice(build_engine(dir, o), world, rank);
}

Engine random_rank_engine(const ModelSpec& spec, DType dtype, uint64_t seed, int world, int rank,
                          RankBuildStats* stats) {
  return finish_slice(random_engine(spec, dtype, seed, rank_sink(world, rank, stats)), world, rank);
}

}  // namespace ingot
