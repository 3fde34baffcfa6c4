// MemoryPlan: every byte a Model will allocate (weights, KV cache, workspace), computed from the spec
// and the runtime options before anything is allocated. The Model sizes its workspace from the plan and
// the State sizes its cache with the same function the plan asks (State::bytes), so the estimate a
// command checks against free memory is what the run then takes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "models/spec.h"
#include "models/state_layout.h"
#include "quant/int4.h"

namespace ingot {

// The state's bounds (cache rows, slots, layout; resolved and limited by State::resolve) and the
// workspace settings.
struct RuntimeOptions : CacheBounds {
  int64_t max_tokens = 0;     // most tokens one forward may carry; 0 = min(max_batch * capacity, 4096)
  int64_t max_logit_rows = 0; // logits rows computed per LM-head pass; 0 = max(max_batch, 64)
  bool use_graphs = true;     // capture decode steps as graphs where the backend supports it
  // Ranks of tensor parallelism (runtime/tp_group.h): 1 = one Model over the whole model.
  int tp = 1;
};

// The largest memory of one accelerator that ingot could run on: 288 GB (NVIDIA B300 and AMD MI355X
// HBM, the most any single card carries). Engine bounds whose weights + cache exceed it could never
// be run on one device, so the build refuses them.
constexpr double kLargestDeviceBytes = 288e9;

// Bytes of each workspace buffer (see Model).
struct WorkspacePlan {
  size_t hidden = 0;        // each of x, h and delta: [max_tokens, hidden]
  size_t qkv = 0, attn = 0, gate_up = 0, act = 0;
  size_t conv = 0;          // [max_tokens, conv_channels] linear layers' conv output (0 without them)
  size_t token_meta = 0;    // each of the seven int32 [max_tokens] metadata arrays
  size_t gathered = 0, logits = 0;  // [max_logit_rows, hidden] and [max_logit_rows, vocab]
  // [3, max_batch] int32: the picks of a step, then the cache rows they were picked for (a launch_forward's
  // picks are not its token rows), then where a launched step feeds its rows from; the sampling state per cache row.
  size_t next_tokens = 0, sample_params = 0, sample_step = 0, sample_seen = 0;
  size_t sample_counts = 0;  // [max_batch, vocab] int32: generated tokens' counts (frequency/presence penalties)
  size_t logprobs = 0;       // [max_logit_rows, 1 + 2 * kMaxTopLogprobs] 4-byte outputs of the logprobs op
  size_t inv_freq = 0;
  // The largest Backend::linear_scratch_bytes over the linear weights (the layers' at max_tokens, the
  // LM head's at what one pass carries): an INT4 weight dequantized for a wide product, or x rounded
  // to 16 bits for a multi-token product of 16-bit weights under f32 activations (CUDA). Held by the
  // backend (Backend::reserve_linear_scratch), not by the Model. 0 where the backend needs none.
  size_t linear_scratch = 0;
  // A tensor-parallel rank (spec.tp.world > 1): [world, max_logit_rows, vocab_rows] every rank's LM-head
  // rows gathered, and [max_logit_rows] int32 row indices 0, 1, ... that lay them out into the logits;
  // a split pick's parts: [world + 1, max_logit_rows] ArgmaxPart (greedy), [world + 1, max_logit_rows,
  // kSampleCandidates] SampleCandidate (drawn); the last slot is what a rank without vocabulary rows
  // sends.
  size_t tp_logits = 0, tp_index = 0, tp_parts = 0, tp_cands = 0;
  size_t total() const;
};

struct MemoryPlan {
  RuntimeOptions options;   // with every 0 default resolved
  DType activation_dtype = DType::F32;
  size_t weights = 0;       // the engine's weights
  bool weights_in_place = false;  // the backend reads the engine's host copy and allocates none
  size_t cache = 0;         // State::bytes: K and V of every layer
  WorkspacePlan ws;
  size_t workspace = 0;

  // What the backend allocates: weights unless used in place, the cache and the workspace.
  size_t allocated() const { return (weights_in_place ? 0 : weights) + cache + workspace; }
  // "4.69 GB (weights 1.19 GB, KV cache 3.36 GB for max batch 1 x capacity 40960, workspace 0.14 GB)"
  std::string describe() const;
};

// Bytes of the runtime-layout weights (the family's weight table) of `spec` in `dtype`; with
// int4_group_size > 0, the INT4 weights (quant/int4.h: int4_quantizable) at their packed size plus
// their scales ([out, in/2] u8 + [out, in/group] in `dtype`), as a quantized engine stores them.
size_t engine_weight_bytes(const ModelSpec& spec, DType dtype, int64_t int4_group_size = 0);

// Resolves the options' defaults, refuses options no run could use (each limit named) and sums what a
// Model over these will allocate. Throws Error when a figure exceeds the 64-bit address space.
// quant, when given: the engine's INT4 weights (QuantConfig::tensors; the layers' linear weights
// counted packed at its group size); `be`, when given, says how much scratch its linear needs for each
// weight as the engine holds it (WorkspacePlan::linear_scratch: an INT4 LM head, act-order INT4
// weights and 16-bit weights under f32 activations included).
class Backend;
MemoryPlan plan_memory(const ModelSpec& spec, DType weight_dtype, DType activation_dtype, const RuntimeOptions& options,
                       bool weights_in_place = false, const QuantConfig* quant = nullptr, const Backend* be = nullptr);

// Throws Error with both figures (what `plan` needs, broken into weights, cache and workspace, and
// what `where` has free) when it does not fit; does nothing when `available` is unknown.
void check_fits(const MemoryPlan& plan, std::optional<size_t> available, const std::string& where);
// The same for a bare byte count (e.g. an engine's weights about to be built in host memory).
void check_fits(size_t needed, const std::string& what, std::optional<size_t> available, const std::string& where);

struct EngineFileInfo;

// Before an engine exists: refuses (Error with both figures) when the host cannot hold what the run
// will take there: the weights when they are built into host memory (`weights_built`: a checkpoint
// or random weights; an engine file is mapped), and, when `host_backend` is given (a backend working
// in host memory), everything the Model allocates.
void check_host_memory(const ModelSpec& spec, DType weight_dtype, const RuntimeOptions& rt, bool weights_built,
                       const Backend* host_backend);

// A run on an engine file: the request's own capacity and batch, refused with both figures when above
// the stored bounds (or, when layout_given, another layout); capacity 0 takes
// min(default_capacity(spec), the stored capacity). The cache is then sized for the request, never
// for the bounds.
RuntimeOptions fit_engine_bounds(const EngineFileInfo& f, RuntimeOptions request, bool layout_given);

// "1.19 GB" (decimal units, as memory figures are quoted on cards), or MB / bytes below that.
std::string format_bytes(double bytes);

}  // namespace ingot
