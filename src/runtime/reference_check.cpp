#include "runtime/reference_check.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"
#include "io/safetensors.h"
#include "runtime/generate.h"

namespace ingot {

namespace {

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

// Accumulates one comparison of our logits row against the reference's.
void compare_row(CaseResult& c, const float* ours, const float* ref, int64_t V, double atol, double rtol) {
  for (int64_t i = 0; i < V; ++i) {
    const double d = std::fabs(double(ours[i]) - double(ref[i]));
    if (std::isnan(ours[i]) || std::isnan(d)) {
      c.max_abs = NAN;
      c.allclose = false;
      continue;
    }
    if (!std::isnan(c.max_abs)) c.max_abs = std::max(c.max_abs, d);
    if (d > atol + rtol * std::fabs(double(ref[i]))) c.allclose = false;
  }
  c.total += 1;
  c.agree += argmax(ours, V) == argmax(ref, V);
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
  if (r.logits.shape()[0] != r.rows() || r.logits.shape()[1] != r.seq())
    throw Error(path + ": 'logits' shape " + shape_str(r.logits.shape()) + " does not match input_ids " +
                shape_str(r.input_ids.shape()));
  if (r.greedy_ids.shape()[0] != r.rows() || r.greedy_prompt_len < 1 || r.greedy_prompt_len > r.seq() ||
      r.greedy_new() < 1)
    throw Error(path + ": greedy_ids / greedy_prompt_len are inconsistent with input_ids");
  return r;
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
        compare_row(c, lg.as<float>() + i * V, R + (n * S + at + i) * V, V, o.atol, o.rtol);
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
        compare_row(batched, lg.as<float>() + k * V, R + (n * S + pos[size_t(n)] + j) * V, V, o.atol, o.rtol);
      pos[size_t(n)] += len;
      next[size_t(n)]++;
    }
  }
  out.push_back(batched);

  CaseResult greedy{"greedy"};
  const int64_t P = ref.greedy_prompt_len, G = ref.greedy_new();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t* g = ref.greedy_ids.as<int64_t>() + n * (P + G);
    std::vector<int32_t> prompt(g, g + P);
    GenerateOptions go;
    go.max_new_tokens = int(G);
    go.row = int(n);
    std::vector<int32_t> ids = generate_greedy(m, prompt, go);
    for (int64_t i = 0; i < G; ++i) {
      greedy.total += 1;
      greedy.agree += i < int64_t(ids.size()) && ids[size_t(i)] == g[P + i];
    }
  }
  out.push_back(greedy);
  return out;
}

}  // namespace ingot
