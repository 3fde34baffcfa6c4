#include "runtime/memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "backend/backend.h"
#include "backend/logprobs.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "io/engine_file.h"
#include "models/family.h"
#include "models/rope.h"
#include "quant/int4.h"
#include "runtime/state.h"

namespace ingot {

namespace {

// Products and sums of sizes that remember whether any step left the 64-bit range, so an absurd
// request is refused by name instead of wrapping into a small allocation.
struct Sizes {
  bool overflow = false;
  size_t mul(std::initializer_list<int64_t> factors) {
    size_t r = 1;
    for (int64_t f : factors) {
      if (f < 0 || __builtin_mul_overflow(r, size_t(f), &r)) {
        overflow = true;
        return 0;
      }
    }
    return r;
  }
  size_t add(size_t a, size_t b) {
    size_t r;
    if (__builtin_add_overflow(a, b, &r)) overflow = true;
    return r;
  }
};

// Whether `w` is the weight of a linear product (Backend::linear): the layers' projections (those INT4
// may take, and Qwen3.5's linear-attention in/out projections, which it does not) and the LM head,
// which is the embedding table when the spec ties them.
bool linear_weight(const ModelSpec& s, const WeightSpec& w) {
  if (w.layer < 0)
    return w.model_field == &ModelWeights::lm_head || (s.tie_embeddings && w.model_field == &ModelWeights::embed);
  return int4_quantizable(w) || w.layer_field == &LayerWeights::lin_in || w.layer_field == &LayerWeights::lin_out;
}

}  // namespace

size_t WorkspacePlan::total() const {
  return 3 * hidden + qkv + attn + gate_up + act + conv + 7 * token_meta + gathered + logits + next_tokens + sample_params +
         sample_step + sample_seen + sample_counts + logprobs + inv_freq + linear_scratch + tp_logits + tp_index + tp_parts +
         tp_cands;
}

std::string format_bytes(double bytes) {
  char buf[64];
  if (bytes >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6) std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f bytes", bytes);
  return buf;
}

std::string MemoryPlan::describe() const {
  return format_bytes(double(allocated())) + " (weights " +
         (weights_in_place ? "used in place" : format_bytes(double(weights))) + ", KV cache " +
         format_bytes(double(cache)) + " for max batch " + std::to_string(options.max_batch) + " x capacity " +
         std::to_string(options.capacity) + ", workspace " + format_bytes(double(workspace)) + ")";
}

size_t engine_weight_bytes(const ModelSpec& spec, DType dtype, int64_t int4_group_size) {
  Sizes z;
  size_t total = 0;
  const WeightTable table = weight_table(spec);
  for (const WeightSpec& w : table.entries()) {
    size_t n = 0;
    if (int4_group_size > 0 && int4_quantizable(w) && w.shape.size() == 2) {
      // [out, in/2] packed bytes + [out, in/group] scales (plan_int4 checked that the group divides in)
      n = z.add(z.mul({w.shape[0], w.shape[1] / 2}),
                z.mul({w.shape[0], w.shape[1] / int4_group_size, int64_t(dtype_size(w.dtype(dtype)))}));
    } else {
      n = dtype_size(w.dtype(dtype));
      for (int64_t d : w.shape) n = z.mul({int64_t(n), d});
    }
    total = z.add(total, n);
  }
  if (z.overflow) throw Error("the weights of this model exceed 2^64 bytes (check its config's dimensions)");
  return total;
}

MemoryPlan plan_memory(const ModelSpec& s, DType weight_dtype, DType adt, const RuntimeOptions& options,
                       bool weights_in_place, const QuantConfig* quant, const Backend* be) {
  MemoryPlan p;
  RuntimeOptions& o = p.options;
  o = options;
  static_cast<CacheBounds&>(o) = State::resolve(s, o);
  if (o.max_tokens < 0 || o.max_tokens > kMaxCapacity)
    throw Error("max tokens per forward must lie in [1, 2^30] (0 = default), got " + std::to_string(o.max_tokens));
  if (o.max_logit_rows < 0 || o.max_logit_rows > kMaxBatch)
    throw Error("logits rows per pass must lie in [1, " + std::to_string(kMaxBatch) + "] (0 = default), got " +
                std::to_string(o.max_logit_rows));
  if (o.max_tokens == 0) o.max_tokens = std::min<int64_t>(int64_t(o.max_batch) * o.capacity, 4096);
  if (o.max_logit_rows == 0) o.max_logit_rows = std::max<int64_t>(o.max_batch, 64);
  p.activation_dtype = adt;
  p.weights = engine_weight_bytes(s, weight_dtype, quant ? quant->group_size : 0);
  p.weights_in_place = weights_in_place;

  Sizes z;
  const int64_t as = int64_t(dtype_size(adt)), T = o.max_tokens, L = o.max_logit_rows, B = o.max_batch;
  const std::optional<size_t> cache = State::bytes(s, o, adt);
  if (!cache) z.overflow = true;
  p.cache = cache.value_or(0);
  WorkspacePlan& w = p.ws;
  w.hidden = z.mul({T, s.hidden, as});
  // The qkv buffer also holds a linear layer's input projection, attn its delta-rule output.
  const bool lin = s.has_linear_layers();
  const LinearAttnSpec& la = s.linear;
  w.qkv = z.mul({T, std::max(s.qkv_width(), lin ? la.in_width() : 0), as});
  w.attn = z.mul({T, std::max(s.q_dim(), lin ? la.value_width() : 0), as});
  w.conv = lin ? z.mul({T, la.conv_channels(), as}) : 0;
  w.gate_up = z.mul({T, 2 * s.intermediate, as});
  w.act = z.mul({T, s.intermediate, as});
  w.token_meta = z.mul({T, int64_t(sizeof(int32_t))});
  w.gathered = z.mul({L, s.hidden, as});
  w.logits = z.mul({L, s.vocab, as});
  w.next_tokens = z.mul({3, B, int64_t(sizeof(int32_t))});  // picks, their cache rows, the launches' feed
  w.sample_params = z.mul({B, int64_t(sizeof(SampleParams))});
  w.sample_step = z.mul({B, int64_t(sizeof(uint32_t))});
  w.sample_seen = z.mul({B, s.vocab});
  w.sample_counts = z.mul({B, s.vocab, int64_t(sizeof(int32_t))});
  w.logprobs = z.mul({L, 1 + 2 * sampling::kMaxTopLogprobs, 4});
  w.inv_freq = std::max<size_t>(rope_inv_freq(s).size(), 1) * sizeof(float);
  if (be) {
    const WeightTable table = weight_table(s);
    for (const WeightSpec& ws : table.entries()) {
      if (!linear_weight(s, ws) || ws.shape.size() != 2) continue;
      // As the engine holds it: its INT4 weights are the ones QuantConfig names (the layers' linear
      // weights, and the LM head with --quantize-lm-head), each with its act-order permutation if any.
      const bool int4 = quant && std::find(quant->tensors.begin(), quant->tensors.end(), ws.name) != quant->tensors.end();
      // The LM head reads the gathered rows of one pass, never more than the forward's tokens.
      const int64_t tokens = ws.layer < 0 ? std::min(T, L) : T;
      w.linear_scratch = std::max(w.linear_scratch, be->linear_scratch_bytes(int4 ? DType::U8 : ws.dtype(weight_dtype),
                                                                             ws.shape[0], ws.shape[1], tokens, int4 && quant->act_order));
    }
  }
  if (s.tp.world > 1) {
    w.tp_logits = z.mul({s.tp.world, L, s.tp.vocab_rows, as});
    w.tp_index = z.mul({L, int64_t(sizeof(int32_t))});
    // One slot past the ranks' [world, L]: the constant parts a rank without vocabulary rows sends.
    w.tp_parts = z.mul({s.tp.world + 1, L, int64_t(sizeof(ArgmaxPart))});
    w.tp_cands = z.mul({s.tp.world + 1, L, kSampleCandidates, int64_t(sizeof(SampleCandidate))});
  }
  size_t ws = 0;
  for (size_t b : {w.hidden, w.hidden, w.hidden, w.qkv, w.attn, w.gate_up, w.act, w.conv, w.token_meta, w.token_meta,
                   w.token_meta, w.token_meta, w.token_meta, w.token_meta, w.token_meta, w.gathered, w.logits, w.next_tokens,
                   w.sample_params, w.sample_step, w.sample_seen, w.sample_counts, w.logprobs, w.inv_freq,
                   w.linear_scratch, w.tp_logits, w.tp_index, w.tp_parts, w.tp_cands})
    ws = z.add(ws, b);
  p.workspace = ws;
  z.add(z.add(p.weights, p.cache), p.workspace);
  if (z.overflow)
    throw Error("the memory for max batch " + std::to_string(B) + " x capacity " + std::to_string(o.capacity) +
                " of this model exceeds 2^64 bytes");
  return p;
}

void check_fits(size_t needed, const std::string& what, std::optional<size_t> available, const std::string& where) {
  if (!available || needed <= *available) return;
  throw Error("not enough memory: " + what + " needs " + format_bytes(double(needed)) + " but " + where + " has " +
              format_bytes(double(*available)) + " available");
}

void check_fits(const MemoryPlan& plan, std::optional<size_t> available, const std::string& where) {
  if (!available || plan.allocated() <= *available) return;
  const bool weights_alone = !plan.weights_in_place && plan.weights > *available;
  throw Error("not enough memory: this run needs " + plan.describe() + " but " + where + " has " +
              format_bytes(double(*available)) + " available; " +
              (weights_alone ? "the weights alone do not fit (a 16-bit dtype halves f32 weights)"
                             : "lower the capacity or the batch"));
}

void check_host_memory(const ModelSpec& spec, DType weight_dtype, const RuntimeOptions& rt, bool weights_built,
                       const Backend* host_backend) {
  // Weights built here count at the engine dtype even when they are quantized next: random weights are
  // all built before they are quantized, so that is the peak.
  const std::optional<size_t> avail = host_available_bytes();
  if (host_backend) {
    check_fits(plan_memory(spec, weight_dtype, host_backend->activation_dtype(), rt, !weights_built), avail,
               "host memory");
  } else if (weights_built) {
    check_fits(engine_weight_bytes(spec, weight_dtype),
               "building the engine's " + std::string(dtype_name(weight_dtype)) + " weights", avail, "host memory");
  }
}

RuntimeOptions fit_engine_bounds(const EngineFileInfo& f, RuntimeOptions rt, bool layout_given) {
  const CacheBounds& b = f.bounds;
  if (rt.max_batch > b.max_batch)
    throw Error(f.path + ": this run needs max batch " + std::to_string(rt.max_batch) +
                " but the engine was built for at most " + std::to_string(b.max_batch) +
                " (rebuild with `ingot build --max-batch N`)");
  if (rt.capacity > b.capacity)
    throw Error(f.path + ": this run needs capacity " + std::to_string(rt.capacity) +
                " cache slots but the engine was built for at most " + std::to_string(b.capacity) +
                " (rebuild with `ingot build --capacity N`)");
  if (layout_given && rt.layout != b.layout)
    throw Error(f.path + ": the engine was built for the " + layout_name(b.layout) + " cache layout, not " +
                layout_name(rt.layout) + " (rebuild with `ingot build --layout " + layout_name(rt.layout) + "`)");
  if (rt.capacity == 0) rt.capacity = std::min(default_capacity(f.spec), b.capacity);
  rt.layout = b.layout;
  return rt;
}

}  // namespace ingot
