// Activation-aware INT4: calibration activations from a CPU forward, the per-weight scale search, and
// the exact folds (runtime/awq.h says what goes where).
#include "runtime/awq.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>

#include "backend/forwarding_backend.h"
#include "backend/int4_row.h"
#include "core/error.h"
#include "core/files.h"
#include "models/family.h"
#include "runtime/model.h"
#include "tokenizer/tokenizer.h"

namespace ingot {

namespace {

// A CPU backend that also records the input rows of the linear ops whose weight is one of `watch`
// (by the weight's data pointer: the CPU backend uses the engine's tensors in place). The fused
// linear+SwiGLU op is left to its default (not fused), so w_gate_up's input passes through linear().
class RecordingBackend final : public ForwardingBackend {
 public:
  RecordingBackend(std::unique_ptr<Backend> inner, std::map<const void*, AwqActivations*> watch, int64_t stride)
      : ForwardingBackend(std::move(inner)), watch_(std::move(watch)), stride_(stride) {}
  void linear(const Mat& x, const Mat& w, const void* bias, const Mat& y) override {
    auto it = watch_.find(w.data);
    if (it != watch_.end()) record(x, *it->second);
    in_->linear(x, w, bias, y);
  }
  bool linear_swiglu(const Mat&, const Mat&, const Mat&) override { return false; }  // w_gate_up through linear()

  // The token index (over the whole calibration stream) of the next forward's first row.
  void set_first_token(int64_t t) { first_ = t; }

 private:
  void record(const Mat& x, AwqActivations& a) {
    std::vector<float> row(size_t(x.cols));  // [in]
    for (int64_t r = 0; r < x.rows; ++r) {
      in_->to_f32(Mat{static_cast<uint8_t*>(x.data) + size_t(r * x.ld) * dtype_size(x.dtype), x.dtype, 1, x.cols, x.ld},
                  row.data());
      for (int64_t c = 0; c < x.cols; ++c) a.mean_abs[size_t(c)] += std::fabs(row[size_t(c)]);
      if ((first_ + r) % stride_ == 0 && a.kept < kAwqKeptRows) {
        std::copy(row.begin(), row.end(), a.rows.begin() + a.kept * a.in);
        ++a.kept;
      }
    }
  }
  std::map<const void*, AwqActivations*> watch_;
  int64_t stride_ = 1, first_ = 0;
};

std::vector<float> f32_of(const HostTensor& t) {
  std::vector<float> v(size_t(t.numel()));
  convert_to_f32(t.dtype(), t.data(), v.data(), v.size());
  return v;
}
void store_f32(HostTensor& t, const std::vector<float>& v) { convert_from_f32(t.dtype(), v.data(), t.data(), v.size()); }

// Output error sum over kept rows of ||D x||^2, D = Q(W s) s^-1 - W [out, in].
double output_error(const std::vector<float>& d, int64_t out, int64_t in, const AwqActivations& act) {
  double total = 0.0;
#pragma omp parallel for reduction(+ : total) schedule(static)
  for (int64_t o = 0; o < out; ++o) {
    const float* dr = d.data() + o * in;
    for (int64_t n = 0; n < act.kept; ++n) {
      const float* x = act.rows.data() + n * in;
      double y = 0.0;
      for (int64_t c = 0; c < in; ++c) y += double(dr[c]) * double(x[c]);
      total += y * y;
    }
  }
  return total;
}

// Q(w) [out, in]: the build's RTN (quantize_int4, with clip ratios or none), read back as every reader
// dequantizes it (dequantize_int4_row).
std::vector<float> rtn_values(const float* w, int64_t out, int64_t in, int64_t group, DType sdt, const float* clip) {
  const int64_t groups = in / group;
  const size_t srow = size_t(groups) * dtype_size(sdt);
  std::vector<uint8_t> packed(size_t(out * in / 2)), scales(size_t(out) * srow);  // [out, in/2], [out, in/group]
  quantize_int4(w, out, in, group, sdt, packed.data(), scales.data(), clip);
  std::vector<float> q(size_t(out * in));
  for (int64_t o = 0; o < out; ++o)
    dequantize_int4_row(packed.data() + o * (in / 2), scales.data() + size_t(o) * srow, sdt, in, group, q.data() + o * in);
  return q;
}

// Q(W diag(s)) diag(s)^-1 - W, with Q the build's RTN (same scale dtype, same rounding).
std::vector<float> quant_delta(const float* w, int64_t out, int64_t in, const std::vector<float>& s, int64_t group,
                               DType sdt) {
  std::vector<float> ws(size_t(out * in));  // [out, in]
  for (int64_t o = 0; o < out; ++o)
    for (int64_t c = 0; c < in; ++c) ws[size_t(o * in + c)] = w[o * in + c] * s[size_t(c)];
  const std::vector<float> q = rtn_values(ws.data(), out, in, group, sdt, nullptr);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t c = 0; c < in; ++c)
      ws[size_t(o * in + c)] = q[size_t(o * in + c)] / s[size_t(c)] - w[o * in + c];
  return ws;
}

void check_supported(const Engine& eng, const std::string& flag) {
  if (eng.quant) throw Error(flag + ": the engine is already quantized");
  const ModelSpec& s = eng.spec;
  if (s.has_linear_layers() || s.attn_gate)
    throw Error(flag + ": activation-aware quantization supports attention-only models without gated attention "
                "(llama, qwen2, qwen3); the " + s.family + " model has " +
                (s.has_linear_layers() ? "linear-attention layers" : "gated attention") +
                "; quantize it without a calibration file (round to nearest)");
  if (s.heads % s.kv_heads != 0) throw Error(flag + ": query heads are not a multiple of the kv heads");
}

std::string layer_name(int64_t l, const char* field) { return "layers." + std::to_string(l) + "." + field; }

}  // namespace

std::map<std::string, AwqActivations> collect_awq_activations(const Engine& eng, const std::vector<int32_t>& ids) {
  const WeightTable table = weight_table(eng.spec);
  std::map<std::string, AwqActivations> acts;
  std::map<const void*, AwqActivations*> watch;
  for (const WeightSpec& w : table.entries()) {
    if (!int4_quantizable(w)) continue;
    AwqActivations& a = acts[w.name];
    a.in = w.shape[1];
    a.mean_abs.assign(size_t(a.in), 0.0);
    a.rows.assign(size_t(kAwqKeptRows * a.in), 0.0f);
    watch[eng.get(w.name).data()] = &a;
  }
  const int64_t n = int64_t(ids.size());
  const int64_t stride = std::max<int64_t>(1, n / kAwqKeptRows);
  auto be = std::make_unique<RecordingBackend>(make_cpu_backend(), std::move(watch), stride);
  RecordingBackend& rec = *be;
  RuntimeOptions rt;
  rt.max_batch = 1;
  rt.capacity = std::min<int64_t>(kAwqChunk, eng.spec.max_position);
  Model model(eng, rec, rt);
  for (int64_t t0 = 0; t0 < n; t0 += rt.capacity) {
    BatchRow row;
    row.tokens.assign(ids.begin() + t0, ids.begin() + std::min(n, t0 + rt.capacity));
    rec.set_first_token(t0);
    model.forward(Batch{{row}});
  }
  for (auto& [name, a] : acts)
    for (double& m : a.mean_abs) m /= double(n);
  return acts;
}

std::vector<float> search_awq_scales(const float* w, int64_t out, int64_t in, const AwqActivations& act,
                                     std::vector<double> mean_abs, int64_t group, DType sdt, AwqChoice& choice) {
  std::vector<float> best(static_cast<size_t>(in), 1.0f), s(static_cast<size_t>(in));
  for (double& m : mean_abs) m = std::max(m, 1e-8);
  for (int i = 0; i < kAwqGrid; ++i) {
    const double alpha = double(i) / kAwqGrid;
    double lo = INFINITY, hi = 0.0;
    std::vector<double> raw(static_cast<size_t>(in));
    for (int64_t c = 0; c < in; ++c) {
      raw[size_t(c)] = std::pow(mean_abs[size_t(c)], alpha);
      lo = std::min(lo, raw[size_t(c)]), hi = std::max(hi, raw[size_t(c)]);
    }
    const double norm = std::sqrt(lo * hi);
    // Powers of two, so W*s and the folded s^-1 are exact in any weight dtype; clamped to 2^±16.
    for (int64_t c = 0; c < in; ++c)
      s[size_t(c)] = float(std::exp2(std::clamp(std::round(std::log2(raw[size_t(c)] / norm)), -16.0, 16.0)));
    const double err = output_error(quant_delta(w, out, in, s, group, sdt), out, in, act);
    if (i == 0) choice.err_rtn = choice.err_awq = err;
    if (err < choice.err_awq) {
      choice.err_awq = err;
      choice.alpha = float(alpha);
      best = s;
    }
  }
  choice.s = best;
  return best;
}

void search_awq_clip(const float* w, int64_t out, int64_t in, const AwqActivations& act, int64_t group,
                     DType sdt, AwqChoice& choice) {
  const int64_t groups = in / group, kept = act.kept;
  // The folded weight's input: the kept rows divided by the weight's input scales.
  std::vector<double> xs(size_t(kept * in));  // [kept, in]
  for (int64_t n = 0; n < kept; ++n)
    for (int64_t c = 0; c < in; ++c)
      xs[size_t(n * in + c)] = double(act.rows[size_t(n * in + c)]) / double(choice.s.empty() ? 1.0f : choice.s[size_t(c)]);
  choice.clip.assign(size_t(out * groups), 1.0f);
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t o = 0; o < out; ++o) {
    std::vector<uint8_t> packed(size_t(group / 2)), scale(dtype_size(sdt));
    std::vector<float> qg(static_cast<size_t>(group));
    std::vector<double> delta(static_cast<size_t>(group));
    for (int64_t k = 0; k < groups; ++k) {
      const float* wg = w + o * in + k * group;
      double best = INFINITY;
      for (int i = 0; i < kAwqClipGrid; ++i) {
        const float r = 1.0f - 0.05f * float(i);
        quantize_int4(wg, 1, group, group, sdt, packed.data(), scale.data(), &r);  // the build's own rounding
        dequantize_int4_row(packed.data(), scale.data(), sdt, group, group, qg.data());
        for (int64_t j = 0; j < group; ++j) delta[size_t(j)] = double(qg[size_t(j)]) - double(wg[j]);
        double err = 0.0;
        for (int64_t n = 0; n < kept; ++n) {
          const double* x = xs.data() + n * in + k * group;
          double y = 0.0;
          for (int64_t j = 0; j < group; ++j) y += delta[size_t(j)] * x[j];
          err += y * y;
        }
        if (err < best) {  // ratio 1 first: a tie keeps plain RTN
          best = err;
          choice.clip[size_t(o * groups + k)] = r;
        }
      }
    }
  }
  // The weight's whole output error with the chosen ratios (the cross terms between groups included).
  std::vector<float> d = rtn_values(w, out, in, group, sdt, choice.clip.data());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t c = 0; c < in; ++c) {
      const float s = choice.s.empty() ? 1.0f : choice.s[size_t(c)];
      d[size_t(o * in + c)] = (d[size_t(o * in + c)] - w[o * in + c]) / s;
    }
  choice.err_clip = output_error(d, out, in, act);
}

std::vector<AwqChoice> apply_awq_scales(Engine& eng, const std::vector<int32_t>& ids, int64_t group,
                                        const std::string& flag) {
  check_supported(eng, flag);
  plan_int4(weight_table(eng.spec), group, "--group-size");
  const std::map<std::string, AwqActivations> acts = collect_awq_activations(eng, ids);
  const ModelSpec& sp = eng.spec;
  const int64_t hd = sp.head_dim, per_kv = sp.heads / sp.kv_heads, I = sp.intermediate;
  std::vector<AwqChoice> choices;
  // Every layer's four searches read the original weights and activations; the folds that follow only
  // scale rows of weights searched here, which RTN follows exactly (power-of-two factors).
  for (int64_t l = 0; l < sp.layers; ++l) {
    auto search = [&](const char* field, std::vector<double> mean_abs) {
      const std::string name = layer_name(l, field);
      const HostTensor& t = eng.get(name);
      const std::vector<float> w = f32_of(t);
      AwqChoice& c = choices.emplace_back();
      c.name = name;
      return search_awq_scales(w.data(), t.shape()[0], t.shape()[1], acts.at(name), std::move(mean_abs), group,
                               eng.weight_dtype, c);
    };
    const std::vector<float> s_qkv = search("wqkv", acts.at(layer_name(l, "wqkv")).mean_abs);
    // wo's input channel h*hd+d comes from kv head h/per_kv: one scale per kv channel, shared by the
    // query heads that read it (the mean of their statistics), so it can fold into that v row.
    std::vector<double> m_o = acts.at(layer_name(l, "wo")).mean_abs;
    for (int64_t g = 0; g < sp.kv_heads; ++g)
      for (int64_t d = 0; d < hd; ++d) {
        double sum = 0.0;
        for (int64_t h = g * per_kv; h < (g + 1) * per_kv; ++h) sum += m_o[size_t(h * hd + d)];
        for (int64_t h = g * per_kv; h < (g + 1) * per_kv; ++h) m_o[size_t(h * hd + d)] = sum / double(per_kv);
      }
    const std::vector<float> s_o = search("wo", std::move(m_o));
    const std::vector<float> s_gu = search("w_gate_up", acts.at(layer_name(l, "w_gate_up")).mean_abs);
    const std::vector<float> s_down = search("w_down", acts.at(layer_name(l, "w_down")).mean_abs);

    // Columns of each weight times s; the producer of its input divided by s.
    auto scale_cols = [&](const char* field, const std::vector<float>& s) {
      HostTensor& t = eng.weights.at(layer_name(l, field));
      std::vector<float> v = f32_of(t);
      const int64_t in = t.shape()[1];
      for (size_t i = 0; i < v.size(); ++i) v[i] *= s[i % size_t(in)];
      store_f32(t, v);
    };
    // Rows [first, first + n) of a weight (or the entries of a vector) divided by s[row - first].
    auto divide_rows = [&](const std::string& name, int64_t first, const std::vector<float>& s, int64_t n) {
      HostTensor& t = eng.weights.at(name);
      std::vector<float> v = f32_of(t);
      const int64_t cols = t.shape().size() == 2 ? t.shape()[1] : 1;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < cols; ++c) v[size_t((first + r) * cols + c)] /= s[size_t(r)];
      store_f32(t, v);
    };
    scale_cols("wqkv", s_qkv);
    divide_rows(layer_name(l, "attn_norm"), 0, s_qkv, sp.hidden);
    scale_cols("wo", s_o);
    std::vector<float> s_v(size_t(sp.kv_dim()));  // [kv_heads * head_dim]: the tied wo scale of each v row
    for (int64_t g = 0; g < sp.kv_heads; ++g)
      for (int64_t d = 0; d < hd; ++d) s_v[size_t(g * hd + d)] = s_o[size_t(g * per_kv * hd + d)];
    divide_rows(layer_name(l, "wqkv"), sp.q_dim() + sp.kv_dim(), s_v, sp.kv_dim());
    if (eng.find(layer_name(l, "bqkv"))) divide_rows(layer_name(l, "bqkv"), sp.q_dim() + sp.kv_dim(), s_v, sp.kv_dim());
    scale_cols("w_gate_up", s_gu);
    divide_rows(layer_name(l, "mlp_norm"), 0, s_gu, sp.hidden);
    scale_cols("w_down", s_down);
    divide_rows(layer_name(l, "w_gate_up"), I, s_down, I);
    // The layer's four weights are final now: the clip search on each (its input is x / s).
    for (size_t c = choices.size() - 4; c < choices.size(); ++c) {
      const HostTensor& t = eng.get(choices[c].name);
      const std::vector<float> w = f32_of(t);
      search_awq_clip(w.data(), t.shape()[0], t.shape()[1], acts.at(choices[c].name), group, eng.weight_dtype,
                      choices[c]);
    }
  }
  return choices;
}

std::vector<AwqChoice> quantize_engine_awq(Engine& eng, const std::vector<int32_t>& ids, int64_t group,
                                           const std::string& flag, bool lm_head) {
  if (lm_head) plan_int4(weight_table(eng.spec), group, "--group-size", true);  // a tied head refused first
  std::vector<AwqChoice> choices = apply_awq_scales(eng, ids, group, flag);
  std::map<std::string, std::vector<float>> clip;
  for (const AwqChoice& c : choices) clip[c.name] = c.clip;
  quantize_engine_int4(eng, group, "--group-size", lm_head, &clip);
  nlohmann::json alphas = nlohmann::json::object();
  for (const AwqChoice& c : choices) alphas[c.name] = c.alpha;
  eng.provenance["activation_aware"] = {
      {"calibration_tokens", ids.size()}, {"grid", kAwqGrid}, {"clip_grid", kAwqClipGrid}, {"alpha", alphas}};
  return choices;
}

std::vector<int32_t> read_calibration(const std::string& text_file, const std::string& ids_file,
                                      const std::string& model_dir, int64_t vocab) {
  if (!text_file.empty() && !ids_file.empty())
    throw Error("give one of --calibration FILE (text) or --calibration-ids FILE (token ids), not both");
  const bool text = !text_file.empty();
  const std::string flag = text ? "--calibration" : "--calibration-ids";
  const std::string& path = text ? text_file : ids_file;
  constexpr uintmax_t kMaxBytes = uintmax_t(64) << 20;
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxBytes)
    throw Error(flag + " " + path + ": " + std::to_string(size) + " bytes, more than the 64 MiB a calibration file may hold");
  std::string content;
  try {
    content = read_file(path);
  } catch (const Error& e) {
    throw Error(flag + " " + e.what());
  }
  std::vector<int32_t> ids;
  if (text) {
    if (model_dir.empty())
      throw Error(flag + " " + path + ": text needs the model's tokenizer; with random weights give token ids with "
                  "--calibration-ids FILE");
    if (!std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json"))
      throw Error(flag + " " + path + ": " + model_dir + " has no tokenizer.json to tokenize it with; give token ids "
                  "with --calibration-ids FILE");
    ids = tok::Tokenizer::from_folder(model_dir).encode(content, false);
  } else {
    size_t i = 0;
    while (i < content.size()) {
      if (std::isspace(static_cast<unsigned char>(content[i]))) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < content.size() && !std::isspace(static_cast<unsigned char>(content[j]))) ++j;
      const std::string item = content.substr(i, j - i);
      const bool digits = item.size() <= 10 && item.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || std::stoll(item) >= vocab)
        throw Error(flag + " " + path + ": '" + item.substr(0, 40) + "' (token " + std::to_string(ids.size()) +
                    ") is not a token id of this model (whitespace-separated integers in [0, " + std::to_string(vocab) +
                    "))");
      ids.push_back(int32_t(std::stoll(item)));
      if (int64_t(ids.size()) > kAwqMaxTokens) break;
      i = j;
    }
  }
  for (size_t k = 0; k < ids.size(); ++k)
    if (ids[k] < 0 || ids[k] >= vocab)
      throw Error(flag + " " + path + ": token " + std::to_string(k) + " is id " + std::to_string(ids[k]) +
                  ", outside the model's vocabulary of " + std::to_string(vocab));
  if (int64_t(ids.size()) < kAwqMinTokens)
    throw Error(flag + " " + path + ": " + std::to_string(ids.size()) + " tokens; activation-aware scales need at least " +
                std::to_string(kAwqMinTokens));
  if (int64_t(ids.size()) > kAwqMaxTokens)
    throw Error(flag + " " + path + ": more than " + std::to_string(kAwqMaxTokens) + " tokens; use a shorter calibration file");
  return ids;
}

}  // namespace ingot
