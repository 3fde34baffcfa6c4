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

// The slice must be what the rank spec's table says, weight for weight.
void check_slice(const Engine& out, int rank) {
  const ModelSpec& s = out.spec;
  const WeightTable rank_table = find_family(s.family).weights(s);
  if (rank_table.entries().size() != out.weights.size())
    throw Error("tensor parallel: rank " + std::to_string(rank) + "'s slice holds " + std::to_string(out.weights.size()) +
                " weights; its table lists " + std::to_string(rank_table.entries().size()));
  for (const WeightSpec& w : rank_table.entries()) {
    const HostTensor* t = out.find(w.name);
    if (!t || t->shape() != w.shape)
      throw Error("tensor parallel: rank " + std::to_string(rank) + "'s slice of '" + w.name + "' has shape " +
                  (t ? shape_str(t->shape()) : std::string("(missing)")) + "; its table says " + shape_str(w.shape));
  }
}

std::string int4_refusal(int world) {
  return "--tp " + std::to_string(world) + ": INT4 engines cannot be split over ranks yet (docs/tensor-parallel.md)";
}

}  // namespace

void add_rank_weight(const ModelSpec& f, const WeightSpec& w, const HostTensor& t, int world, int rank, bool own,
                     Engine& out) {
  const auto keep = [&](const HostTensor& whole) { return own ? copy_of(whole) : borrow(whole); };
  if (world == 1) {
    out.weights.emplace(w.name, keep(t));
    return;
  }
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

  HostTensor part;
  if (w.model_field == &ModelWeights::lm_head) {
    part = take_rows(t, {vocab});
  } else if (w.model_field) {  // the embedding and the final norm
    part = keep(t);
    // Tied embeddings: the embedding stays whole, and each rank's LM head is its rows of it.
    if (w.name == "tok_embeddings" && f.tie_embeddings)
      out.weights.emplace("lm_head", take_rows(t, {vocab}));
  } else {
    const auto field = w.layer_field;
    if (field == &LayerWeights::attn_norm || field == &LayerWeights::mlp_norm || field == &LayerWeights::q_norm ||
        field == &LayerWeights::k_norm || field == &LayerWeights::lin_norm) {
      part = keep(t);  // per hidden unit or per head dim: the same on every rank
    } else if (field == &LayerWeights::wqkv || field == &LayerWeights::bqkv) {
      // [q | k | v (| gate)] rows: this rank's query heads, the KV heads they read, their gates.
      std::vector<Span> spans = {q, {Q + kv.first, kv.count}, {Q + KV + kv.first, kv.count}};
      if (f.attn_gate) spans.push_back({Q + 2 * KV + q.first, q.count});
      part = take_rows(t, spans);
    } else if (field == &LayerWeights::wo) {
      part = take_cols(t, q);
    } else if (field == &LayerWeights::bo) {
      part = rank == 0 ? keep(t) : HostTensor(t.dtype(), t.shape());
    } else if (field == &LayerWeights::w_gate_up) {
      part = take_rows(t, {inter, {I + inter.first, inter.count}});
    } else if (field == &LayerWeights::w_down) {
      part = take_cols(t, inter);
    } else if (field == &LayerWeights::lin_in) {
      // [q | k | v | z | b | a] rows: this rank's value heads, the key heads they read.
      std::vector<Span> spans = lin_qkv;
      spans.push_back({LC + lv.first, lv.count});
      spans.push_back({LC + LV + l.q.first, l.q.count});
      spans.push_back({LC + LV + LH + l.q.first, l.q.count});
      part = take_rows(t, spans);
    } else if (field == &LayerWeights::lin_conv) {
      part = take_rows(t, lin_qkv);  // one conv filter per channel of q | k | v
    } else if (field == &LayerWeights::lin_a_log || field == &LayerWeights::lin_dt_bias) {
      part = take_rows(t, {{l.q.first, l.q.count}});
    } else if (field == &LayerWeights::lin_out) {
      part = take_cols(t, lv);
    } else {
      throw Error("tensor parallel: no split rule for weight '" + w.name + "'");
    }
  }
  out.weights.emplace(w.name, std::move(part));
}

Engine borrowed_engine(const Engine& engine) {
  Engine out;
  out.spec = engine.spec;
  out.weight_dtype = engine.weight_dtype;
  out.provenance = engine.provenance;
  for (const auto& [name, t] : engine.weights) out.weights.emplace(name, borrow(t));
  return out;
}

Engine shard_engine(const Engine& engine, int world, int rank) {
  if (engine.quant) throw Error(int4_refusal(world));
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
  const WeightTable table = find_family(f.family).weights(f);
  for (const WeightSpec& w : table.entries()) add_rank_weight(f, w, engine.get(w.name), world, rank, false, out);
  check_slice(out, rank);
  return out;
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
