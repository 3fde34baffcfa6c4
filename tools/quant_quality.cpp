// The INT4 quality table (docs/quantization.md): a checkpoint folder built unquantized and INT4 (plain
// round to nearest, and activation-aware on a calibration file) at each group size that divides its
// weights, then every model run teacher-forced on held-out text on the CPU. Per model: next-token
// agreement with the unquantized model (argmax equal at every position) and perplexity.
//
//   ingot_quant_quality --model DIR --calibration FILE --heldout FILE [--groups 32,64,128] [--max-tokens N]
//
// --calibration: text (tokenized with DIR's tokenizer) or, with --ids, whitespace-separated ids.
// --heldout: text, one sequence per line, each tokenized and wrapped in the model's BOS and EOS (as
// tools/train_demo_model.py trains); with --ids, one line of whitespace-separated ids per sequence.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/files.h"
#include "io/engine.h"
#include "runtime/awq.h"
#include "runtime/model.h"
#include "tokenizer/tokenizer.h"

using namespace ingot;

namespace {

struct Scores {
  int64_t agree = 0, positions = 0;
  double nll = 0.0;
};

// Logits [len, vocab] of every position of one sequence.
HostTensor run(const Engine& eng, Backend& be, const std::vector<int32_t>& seq) {
  RuntimeOptions rt;
  rt.max_batch = 1;
  rt.capacity = int64_t(seq.size());
  Model m(eng, be, rt);
  BatchRow row;
  row.tokens = seq;
  row.all_logits = true;
  return m.forward(Batch{{row}});
}

int32_t argmax(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return int32_t(best);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string model, calib, heldout, groups = "32,64,128";
    bool ids = false;
    int64_t max_tokens = 8192;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw Error(a + " needs a value");
        return argv[++i];
      };
      if (a == "--model") model = next();
      else if (a == "--calibration") calib = next();
      else if (a == "--heldout") heldout = next();
      else if (a == "--groups") groups = next();
      else if (a == "--max-tokens") max_tokens = std::stoll(next());
      else if (a == "--ids") ids = true;
      else throw Error("unknown argument " + a);
    }
    if (model.empty() || calib.empty() || heldout.empty())
      throw Error("usage: ingot_quant_quality --model DIR --calibration FILE --heldout FILE [--ids] [--groups 32,64,128]");
    BuildOptions base;
    base.dtype = std::nullopt;
    const Engine ref = build_engine(model, base);
    const std::vector<int32_t> cal =
        read_calibration(ids ? "" : calib, ids ? calib : "", model, ref.spec.vocab);

    // Held-out sequences: one per line.
    std::vector<std::vector<int32_t>> seqs;
    std::istringstream lines(read_file(heldout));
    std::optional<tok::Tokenizer> tk;
    if (!ids) tk = tok::Tokenizer::from_folder(model);
    int64_t total = 0;
    for (std::string line; std::getline(lines, line) && total < max_tokens;) {
      std::vector<int32_t> s;
      if (ids) {
        std::istringstream is(line);
        for (long long v; is >> v;) s.push_back(int32_t(v));
      } else {
        if (ref.spec.bos_id) s.push_back(int32_t(*ref.spec.bos_id));
        for (int32_t t : tk->encode(line, false)) s.push_back(t);
        if (!ref.spec.eos_ids.empty()) s.push_back(int32_t(ref.spec.eos_ids.front()));
      }
      if (s.size() < 2) continue;
      if (int64_t(s.size()) > ref.spec.max_position) s.resize(size_t(ref.spec.max_position));
      total += int64_t(s.size()) - 1;
      seqs.push_back(std::move(s));
    }
    std::printf("model %s: %lld calibration tokens, %zu held-out sequences, %lld predicted positions\n",
                model.c_str(), (long long)cal.size(), seqs.size(), (long long)total);

    auto be = make_cpu_backend();
    const int64_t V = ref.spec.vocab;
    // The unquantized model's argmax and its own perplexity, once.
    std::vector<std::vector<int32_t>> ref_pick(seqs.size());
    Scores base_sc;
    for (size_t k = 0; k < seqs.size(); ++k) {
      const HostTensor lg = run(ref, *be, seqs[k]);
      const float* l = lg.as<float>();
      for (size_t p = 0; p + 1 < seqs[k].size(); ++p) {
        const float* r = l + p * size_t(V);
        ref_pick[k].push_back(argmax(r, V));
        double mx = r[0], z = 0.0;
        for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(r[i]));
        for (int64_t i = 0; i < V; ++i) z += std::exp(double(r[i]) - mx);
        base_sc.nll += mx + std::log(z) - r[seqs[k][p + 1]];
        ++base_sc.positions;
      }
    }
    std::printf("| weights | group | method | agreement with %s | perplexity |\n| --- | --- | --- | --- | --- |\n",
                std::string(dtype_name(ref.weight_dtype)).c_str());
    std::printf("| %s | - | - | 1 | %.4f |\n", std::string(dtype_name(ref.weight_dtype)).c_str(), std::exp(base_sc.nll / double(base_sc.positions)));
    std::istringstream gs(groups);
    for (std::string g; std::getline(gs, g, ',');) {
      const int64_t group = std::stoll(g);
      try {
        plan_int4(weight_table(ref.spec), group, "--group-size");
      } catch (const Error& e) {
        std::printf("(group %lld skipped: %s)\n", (long long)group, e.what());
        continue;
      }
      for (int awq = 0; awq < 2; ++awq) {
        BuildOptions o;
        if (!awq) o.int4_group_size = group;
        Engine q = build_engine(model, o);
        if (awq) quantize_engine_awq(q, cal, group);
        Scores sc;
        for (size_t k = 0; k < seqs.size(); ++k) {
          const HostTensor lg = run(q, *be, seqs[k]);
          const float* l = lg.as<float>();
          for (size_t p = 0; p + 1 < seqs[k].size(); ++p) {
            const float* r = l + p * size_t(V);
            sc.agree += argmax(r, V) == ref_pick[k][p];
            double mx = r[0], z = 0.0;
            for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(r[i]));
            for (int64_t i = 0; i < V; ++i) z += std::exp(double(r[i]) - mx);
            sc.nll += mx + std::log(z) - r[seqs[k][p + 1]];
            ++sc.positions;
          }
        }
        std::printf("| int4 | %lld | %s | %.4f | %.4f |\n", (long long)group, awq ? "activation-aware" : "RTN",
                    double(sc.agree) / double(sc.positions), std::exp(sc.nll / double(sc.positions)));
        std::fflush(stdout);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
