#include "runtime/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "backend/backend.h"
#include "core/error.h"
#include "io/engine_file.h"
#include "io/safetensors.h"
#include "models/family.h"

namespace ingot {

std::string layout_name(CacheLayout l) { return l == CacheLayout::HeadsFirst ? "heads_first" : "flattened"; }

CacheLayout parse_layout(const std::string& s) {
  if (s == "heads_first") return CacheLayout::HeadsFirst;
  if (s == "flattened") return CacheLayout::Flattened;
  throw Error("unknown cache layout '" + s + "' (expected heads_first or flattened)");
}

int64_t default_capacity(const ModelSpec& spec) { return std::max<int64_t>(1, std::min(spec.max_position, kDefaultCapacity)); }

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

}  // namespace

size_t WorkspacePlan::total() const {
  return 3 * hidden + qkv + attn + gate_up + act + 6 * token_meta + gathered + logits + next_tokens + sample_params +
         sample_step + sample_seen + inv_freq;
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

size_t engine_weight_bytes(const ModelSpec& spec, DType dtype) {
  Sizes z;
  size_t total = 0;
  for (const auto& [name, shape] : runtime_weight_shapes(spec)) {
    size_t n = dtype_size(dtype);
    for (int64_t d : shape) n = z.mul({int64_t(n), d});
    total = z.add(total, n);
  }
  if (z.overflow) throw Error("the weights of this model exceed 2^64 bytes (check its config's dimensions)");
  return total;
}

MemoryPlan plan_memory(const ModelSpec& s, DType weight_dtype, DType adt, const RuntimeOptions& options,
                       bool weights_in_place) {
  MemoryPlan p;
  RuntimeOptions& o = p.options;
  o = options;
  if (o.max_batch < 1) throw Error("max batch must be at least 1, got " + std::to_string(o.max_batch));
  if (o.max_batch > kMaxRuntimeBatch)
    throw Error("max batch " + std::to_string(o.max_batch) + " exceeds the limit of " + std::to_string(kMaxRuntimeBatch) +
                " cache rows");
  if (o.capacity == 0) o.capacity = default_capacity(s);
  if (o.capacity < 1) throw Error("capacity must be at least 1, got " + std::to_string(o.capacity));
  if (o.capacity > kMaxRuntimeCapacity)
    throw Error("capacity " + std::to_string(o.capacity) + " exceeds 2^30 slots");
  if (o.max_tokens < 0 || o.max_tokens > kMaxRuntimeCapacity)
    throw Error("max tokens per forward must lie in [1, 2^30] (0 = default), got " + std::to_string(o.max_tokens));
  if (o.max_logit_rows < 0 || o.max_logit_rows > kMaxRuntimeBatch)
    throw Error("logits rows per pass must lie in [1, " + std::to_string(kMaxRuntimeBatch) + "] (0 = default), got " +
                std::to_string(o.max_logit_rows));
  if (o.max_tokens == 0) o.max_tokens = std::min<int64_t>(int64_t(o.max_batch) * o.capacity, 4096);
  if (o.max_logit_rows == 0) o.max_logit_rows = std::max<int64_t>(o.max_batch, 64);
  p.activation_dtype = adt;
  p.weights = engine_weight_bytes(s, weight_dtype);
  p.weights_in_place = weights_in_place;

  Sizes z;
  const int64_t as = int64_t(dtype_size(adt)), T = o.max_tokens, L = o.max_logit_rows, B = o.max_batch;
  p.cache_per_layer = z.mul({B, s.kv_heads, o.capacity, s.head_dim, as});
  p.cache = z.mul({int64_t(p.cache_per_layer), 2, s.layers});
  WorkspacePlan& w = p.ws;
  w.hidden = z.mul({T, s.hidden, as});
  w.qkv = z.mul({T, s.q_dim() + 2 * s.kv_dim(), as});
  w.attn = z.mul({T, s.q_dim(), as});
  w.gate_up = z.mul({T, 2 * s.intermediate, as});
  w.act = z.mul({T, s.intermediate, as});
  w.token_meta = z.mul({T, int64_t(sizeof(int32_t))});
  w.gathered = z.mul({L, s.hidden, as});
  w.logits = z.mul({L, s.vocab, as});
  w.next_tokens = z.mul({B, int64_t(sizeof(int32_t))});
  w.sample_params = z.mul({B, int64_t(sizeof(SampleParams))});
  w.sample_step = z.mul({B, int64_t(sizeof(uint32_t))});
  w.sample_seen = z.mul({B, s.vocab});
  w.inv_freq = std::max<size_t>(rope_inv_freq(s).size(), 1) * sizeof(float);
  size_t ws = 0;
  for (size_t b : {w.hidden, w.hidden, w.hidden, w.qkv, w.attn, w.gate_up, w.act, w.token_meta, w.token_meta,
                   w.token_meta, w.token_meta, w.token_meta, w.token_meta, w.gathered, w.logits, w.next_tokens,
                   w.sample_params, w.sample_step, w.sample_seen, w.inv_freq})
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

DType planned_build_dtype(const std::string& dir, const ModelSpec& spec, std::optional<DType> requested) {
  if (requested) return *requested;
  if (spec.torch_dtype == "float32") return DType::F32;
  if (spec.torch_dtype == "float16") return DType::F16;
  if (spec.torch_dtype == "bfloat16") return DType::BF16;
  const WeightTable table = find_family(spec.family).weights(spec);
  if (table.decls().empty()) return DType::F32;
  return Checkpoint(dir).get(table.decls().front().hf_name).dtype;
}

void check_host_memory(const ModelSpec& spec, DType weight_dtype, const RuntimeOptions& rt, bool weights_built,
                       const Backend* host_backend) {
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
  if (rt.max_batch > f.max_batch)
    throw Error(f.path + ": this run needs max batch " + std::to_string(rt.max_batch) +
                " but the engine was built for at most " + std::to_string(f.max_batch) +
                " (rebuild with `ingot build --max-batch N`)");
  if (rt.capacity > f.capacity)
    throw Error(f.path + ": this run needs capacity " + std::to_string(rt.capacity) +
                " cache slots but the engine was built for at most " + std::to_string(f.capacity) +
                " (rebuild with `ingot build --capacity N`)");
  if (layout_given && rt.layout != f.layout)
    throw Error(f.path + ": the engine was built for the " + layout_name(f.layout) + " cache layout, not " +
                layout_name(rt.layout) + " (rebuild with `ingot build --layout " + layout_name(rt.layout) + "`)");
  if (rt.capacity == 0) rt.capacity = std::min(default_capacity(f.spec), f.capacity);
  rt.layout = f.layout;
  return rt;
}

std::optional<size_t> host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    unsigned long long kb = 0;
    std::string unit;
    if (in >> kb >> unit && unit == "kB") return size_t(kb) * 1024;
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace ingot
