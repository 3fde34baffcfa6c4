#include "runtime/reference_check.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"
#include "io/safetensors.h"
#include "runtime/generator.h"

namespace ingot {

namespace {

// 16-bit bounds in units of the unit roundoff times the reference logits' RMS (docs/reference-format.md,
// "Tolerances"). Weights rounded, activations in f32 (the CPU): the error does not grow with depth
// (mean |delta| up to 1.9 units and max 20 on the 2-layer fixtures, 1.3 and 8.9 on 28 layers of
// Qwen3-0.6B shapes), so the bound is flat at about twice those. Activations in 16 bits too (the GPU):
// each layer rounds the residual stream again and the errors add as a random walk, so the bound grows
// with sqrt(layers / 2): measured mean 1.8-2.7 and max 12-36 on the 2-layer fixtures (62 on the 4-layer
// demo model) on the H200, 10.0-12.3 and 76-95 on 32-36 layers in the 16-bit study (2.4 x sqrt(18) =
// 10.2, as the walk predicts).
struct Units {
  double mean, max;
  bool grows_with_depth;
};
constexpr Units kWeightsRounded{4, 48, false}, kActivations16{4, 64, true};

HostTensor copy_tensor(const SafetensorsFile& f, const std::string& name, DType dt, size_t rank) {
  const TensorEntry* e = f.find(name);
  if (!e) throw Error(f.path() + ": reference tensor '" + name + "' is missing");
  if (e->dtype != dt)
    throw Error(f.path() + ": reference tensor '" + name + "' has dtype " + std::string(dtype_name(e->dtype)) +
                ", expected " + std::string(dtype_name(dt)));
  if (e->shape.size() != rank)
    throw Error(f.path() + ": reference tensor '" + name + "' has shape " + shape_str(e->shape) + ", expected rank " +
                std::to_string(rank));
  HostTensor t(dt, e->shape);
  std::memcpy(t.data(), e->data, e->nbytes);
  return t;
}

int32_t argmax(const float* v, int64_t n) { return int32_t(std::max_element(v, v + n) - v); }

// Top-1 minus top-2 of a logits row (infinite for a single-entry vocabulary).
double top2_margin(const float* v, int64_t n) {
  double a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    const double x = v[i];
    if (x > a) {
      b = a;
      a = x;
    } else if (x > b) {
      b = x;
    }
  }
  return a - b;
}

// Accumulates one comparison of our logits row against the reference's.
void compare_row(CaseResult& c, const float* ours, const float* ref, int64_t V, const Tolerance& t) {
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) {
    const double d = std::fabs(double(ours[i]) - double(ref[i]));
    if (std::isnan(ours[i]) || std::isnan(d)) {
      c.max_abs = c.mean_abs = NAN;
      c.allclose = c.mean_ok = false;
      continue;
    }
    sum += d;
    if (!std::isnan(c.max_abs)) c.max_abs = std::max(c.max_abs, d);
    if (d > t.atol + t.rtol * std::fabs(double(ref[i]))) c.allclose = false;
  }
  if (!std::isnan(c.mean_abs)) {
    c.mean_abs = (c.mean_abs * double(c.compared) + sum) / double(c.compared + V);
    c.mean_ok = c.mean_abs <= t.mean_atol;
  }
  c.compared += V;
  const bool same = argmax(ours, V) == argmax(ref, V);
  c.total += 1;
  c.agree += same;
  if (top2_margin(ref, V) >= t.tie_margin) {
    c.required += 1;
    c.agree_required += same;
  }
}

std::vector<int32_t> row_tokens(const Reference& r, int64_t n) {
  const int64_t* p = r.input_ids.as<int64_t>() + n * r.seq();
  return std::vector<int32_t>(p, p + r.seq());
}

// Random chunk lengths summing to S.
std::vector<int64_t> random_split(int64_t S, std::mt19937_64& rng) {
  std::vector<int64_t> out;
  for (int64_t at = 0; at < S;) {
    int64_t n = std::uniform_int_distribution<int64_t>(1, std::max<int64_t>(1, S / 3))(rng);
    n = std::min(n, S - at);
    out.push_back(n);
    at += n;
  }
  return out;
}

}  // namespace

Reference load_reference(const std::string& path) {
  SafetensorsFile f(path);
  Reference r;
  r.input_ids = copy_tensor(f, "input_ids", DType::I64, 2);
  r.logits = copy_tensor(f, "logits", DType::F32, 3);
  HostTensor p = copy_tensor(f, "greedy_prompt_len", DType::I64, 1);
  r.greedy_ids = copy_tensor(f, "greedy_ids", DType::I64, 2);
  r.greedy_prompt_len = p.as<int64_t>()[0];
  if (f.find("greedy_margin")) r.greedy_margin = copy_tensor(f, "greedy_margin", DType::F32, 2);
  if (r.logits.shape()[0] != r.rows() || r.logits.shape()[1] != r.seq())
    throw Error(path + ": 'logits' shape " + shape_str(r.logits.shape()) + " does not match input_ids " +
                shape_str(r.input_ids.shape()));
  if (r.greedy_ids.shape()[0] != r.rows() || r.greedy_prompt_len < 1 || r.greedy_prompt_len > r.seq() ||
      r.greedy_new() < 1)
    throw Error(path + ": greedy_ids / greedy_prompt_len are inconsistent with input_ids");
  const float* lg = r.logits.as<float>();
  for (int64_t i = 0; i < r.logits.numel(); ++i)
    if (!std::isfinite(lg[i]))
      throw Error(path + ": reference 'logits' is not finite at row " + std::to_string(i / (r.seq() * r.vocab())) +
                  ", position " + std::to_string(i / r.vocab() % r.seq()) + ", token " + std::to_string(i % r.vocab()));
  if (!r.greedy_margin.shape().empty() && r.greedy_margin.shape() != Shape{r.rows(), r.greedy_new()})
    throw Error(path + ": 'greedy_margin' shape " + shape_str(r.greedy_margin.shape()) + " does not match greedy_ids " +
                shape_str(r.greedy_ids.shape()) + " with greedy_prompt_len " + std::to_string(r.greedy_prompt_len));
  return r;
}

double unit_roundoff(DType t) {
  switch (t) {
    case DType::BF16: return std::ldexp(1.0, -8);
    case DType::F16: return std::ldexp(1.0, -11);
    case DType::F32: return std::ldexp(1.0, -24);
    default: throw Error("unit_roundoff: " + std::string(dtype_name(t)) + " is not a floating dtype");
  }
}

double logit_rms(const Reference& ref) {
  const float* p = ref.logits.as<float>();
  double sum = 0;
  for (int64_t i = 0; i < ref.logits.numel(); ++i) sum += double(p[i]) * double(p[i]);
  return std::sqrt(sum / double(std::max<int64_t>(1, ref.logits.numel())));
}

double tie_margin_for(double atol, double rtol, const Reference& ref) {
  const float* p = ref.logits.as<float>();
  double top = 0;
  for (int64_t i = 0; i < ref.logits.numel(); ++i) top = std::max(top, std::fabs(double(p[i])));
  return atol + rtol * top;
}

Tolerance default_tolerance(DType weights, DType activations, bool gpu, int64_t layers, const Reference& ref) {
  Tolerance t;
  const double u = std::max(unit_roundoff(weights), unit_roundoff(activations));
  if (u == unit_roundoff(DType::F32)) {
    t.atol = gpu ? 1e-3 : 1e-4;
    return t;
  }
  // f32 activations over 16-bit weights on the GPU still round the inputs of multi-token products to
  // 16 bits (cuBLASLt takes one input dtype; docs/cuda-backend.md), once per layer as 16-bit
  // activations do, so prefill keeps the 16-bit bound there.
  const Units k = activations == DType::F32 && !gpu ? kWeightsRounded : kActivations16;
  const double depth = k.grows_with_depth ? std::sqrt(std::max(1.0, double(layers) / 2.0)) : 1.0;
  const double scale = u * logit_rms(ref) * depth;
  t.atol = k.max * scale;
  t.rtol = 0;  // rounding error follows the logits' overall scale, not each logit's size
  t.mean_atol = k.mean * scale;
  t.tie_margin = tie_margin_for(t.atol, t.rtol, ref);
  return t;
}

int64_t reference_capacity(const Reference& r) {
  return std::max(r.seq(), State::slots_needed(r.greedy_prompt_len, r.greedy_new()));
}

std::vector<CaseResult> run_reference_check(Model& m, const Reference& ref, const CheckOptions& o) {
  const int64_t N = ref.rows(), S = ref.seq(), V = ref.vocab();
  if (V != m.spec().vocab)
    throw Error("reference vocabulary " + std::to_string(V) + " differs from the model's " + std::to_string(m.spec().vocab));
  if (m.state().capacity() < reference_capacity(ref) || m.state().max_batch() < N)
    throw Error("the model's cache is too small for the reference (needs batch " + std::to_string(N) + ", capacity " +
                std::to_string(reference_capacity(ref)) + ")");
  const float* R = ref.logits.as<float>();
  std::vector<CaseResult> out;
  std::mt19937_64 rng(o.seed);

  // Runs one row through the given chunk lengths, comparing every token's logits.
  auto run_chunks = [&](CaseResult& c, int64_t n, const std::vector<int64_t>& chunks) {
    std::vector<int32_t> toks = row_tokens(ref, n);
    int64_t at = 0;
    for (int64_t len : chunks) {
      BatchRow r;
      r.row = int(n);
      r.tokens.assign(toks.begin() + at, toks.begin() + at + len);
      r.write_index = at;
      r.all_logits = true;
      HostTensor lg = m.forward(Batch{{r}});
      for (int64_t i = 0; i < len; ++i)
        compare_row(c, lg.as<float>() + i * V, R + (n * S + at + i) * V, V, o.tol);
      at += len;
    }
  };

  CaseResult prefill{"prefill"}, decode{"decode"}, chunked{"chunked"};
  for (int64_t n = 0; n < N; ++n) {
    run_chunks(prefill, n, {S});
    run_chunks(decode, n, std::vector<int64_t>(size_t(S), 1));
    run_chunks(chunked, n, random_split(S, rng));
  }
  out.push_back(prefill);
  out.push_back(decode);
  out.push_back(chunked);

  // Every row in one call per step, each at its own write index with its own chunk length.
  CaseResult batched{"batched"};
  std::vector<std::vector<int64_t>> splits;
  std::vector<size_t> next(size_t(N), 0);
  std::vector<int64_t> pos(size_t(N), 0);
  for (int64_t n = 0; n < N; ++n) splits.push_back(random_split(S, rng));
  for (bool any = true; any;) {
    Batch b;
    std::vector<int64_t> who;
    for (int64_t n = 0; n < N; ++n) {
      if (next[size_t(n)] >= splits[size_t(n)].size()) continue;
      const int64_t len = splits[size_t(n)][next[size_t(n)]];
      std::vector<int32_t> toks = row_tokens(ref, n);
      BatchRow r;
      r.row = int(N - 1 - n);  // cache rows in reverse order of reference rows
      r.tokens.assign(toks.begin() + pos[size_t(n)], toks.begin() + pos[size_t(n)] + len);
      r.write_index = pos[size_t(n)];
      r.all_logits = true;
      b.rows.push_back(r);
      who.push_back(n);
    }
    any = !b.rows.empty();
    if (!any) break;
    HostTensor lg = m.forward(b);
    int64_t k = 0;
    for (size_t i = 0; i < who.size(); ++i) {
      const int64_t n = who[i], len = int64_t(b.rows[i].tokens.size());
      for (int64_t j = 0; j < len; ++j, ++k)
        compare_row(batched, lg.as<float>() + k * V, R + (n * S + pos[size_t(n)] + j) * V, V, o.tol);
      pos[size_t(n)] += len;
      next[size_t(n)]++;
    }
  }
  out.push_back(batched);

  // Up to a row's first differing token both runs saw the same tokens, so every step is comparable; the
  // first difference is excused, with the rest of the row, only at a fragile step: one whose top-2
  // margin is below tie_margin, where the reference itself could have gone either way within the
  // tolerance. Without the reference's margins our own at that step stand in (a difference the
  // tolerance allows leaves both below tie_margin).
  CaseResult greedy{"greedy"};
  const int64_t P = ref.greedy_prompt_len, G = ref.greedy_new();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t* g = ref.greedy_ids.as<int64_t>() + n * (P + G);
    std::vector<int32_t> prompt(g, g + P);
    Request q;
    q.prompt = prompt;
    q.max_new_tokens = int(G);
    q.slot = int(n);
    // A generator per case: the margins below rewrite the row behind its back.
    std::vector<int32_t> ids = Generator(m).generate(std::move(q)).ids;
    std::vector<double> margin(size_t(G), INFINITY);
    if (o.tol.tie_margin > 0 && !ref.greedy_margin.shape().empty()) {
      for (int64_t i = 0; i < G; ++i) margin[size_t(i)] = ref.greedy_margin.as<float>()[n * G + i];
    } else if (o.tol.tie_margin > 0 && int64_t(ids.size()) == G) {
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), ids.begin(), ids.end() - 1);
      for (int64_t at = 0; at < int64_t(seq.size()); at += m.max_tokens()) {
        BatchRow r;
        r.row = int(n);
        r.tokens.assign(seq.begin() + at, seq.begin() + std::min<int64_t>(at + m.max_tokens(), int64_t(seq.size())));
        r.write_index = at;
        r.all_logits = true;
        HostTensor lg = m.forward(Batch{{r}});
        for (int64_t j = 0; j < int64_t(r.tokens.size()); ++j)
          if (at + j >= P - 1) margin[size_t(at + j - (P - 1))] = top2_margin(lg.as<float>() + j * V, V);
      }
    }
    bool excused = false;
    for (int64_t i = 0; i < G; ++i) {
      const bool same = i < int64_t(ids.size()) && ids[size_t(i)] == g[P + i];
      greedy.total += 1;
      greedy.agree += same;
      excused = excused || (!same && margin[size_t(i)] < o.tol.tie_margin);
      if (!excused) {
        greedy.required += 1;
        greedy.agree_required += same;
      }
    }
  }
  out.push_back(greedy);
  return out;
}

}  // namespace ingot
