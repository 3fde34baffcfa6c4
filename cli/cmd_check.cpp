// `ingot check`: replays a transformers reference through every forward path and reports, per case,
// max |Δlogit|, allclose and next-token agreement as separate figures. Non-zero exit on any failure.
#include <cmath>
#include <cstdio>

#include "common.h"
#include "runtime/reference_check.h"

namespace ingot::cli {

namespace {
std::string fmt_abs(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3e", v);
  return std::isnan(v) ? "nan" : b;
}
}  // namespace

void add_check(CLI::App& app) {
  auto* cmd = app.add_subcommand("check", "Compare against a transformers reference file");
  struct Args {
    ModelArgs model;
    std::string reference;
    double atol = -1, rtol = -1;
    std::string layout;
  };
  auto a = std::make_shared<Args>();
  a->model.add_to(*cmd);
  cmd->add_option("--reference", a->reference, "reference.safetensors (docs/reference-format.md)")->required();
  cmd->add_option("--atol", a->atol, "absolute tolerance (default 1e-4 on the CPU, 1e-3 on the GPU)");
  cmd->add_option("--rtol", a->rtol, "relative tolerance (default 1e-4)");
  cmd->add_option("--layout", a->layout, "cache layout: heads_first or flattened (default: heads_first, or the engine's)");
  cmd->callback([a] {
    Reference ref = load_reference(a->reference);
    RuntimeOptions rt;
    rt.max_batch = int(ref.rows());
    rt.capacity = reference_capacity(ref);
    if (!a->layout.empty()) rt.layout = parse_layout(a->layout);
    Loaded l = load_model(a->model, rt, !a->layout.empty());
    CheckOptions co;
    const bool gpu = l.backend->name() != "cpu";
    co.atol = a->atol >= 0 ? a->atol : (gpu ? 1e-3 : 1e-4);
    co.rtol = a->rtol >= 0 ? a->rtol : 1e-4;
    std::vector<CaseResult> res = run_reference_check(*l.model, ref, co);
    std::printf("model %s  device %s  weights %s  layout %s  atol %g rtol %g\n", a->model.source_name().c_str(),
                l.backend->name().c_str(), std::string(dtype_name(l.engine->weight_dtype)).c_str(),
                layout_name(l.model->state().layout()).c_str(), co.atol, co.rtol);
    std::printf("%-8s  %14s  %8s  %16s  %s\n", "mode", "max|dlogit|", "allclose", "next-token agree", "result");
    bool ok = true;
    for (const CaseResult& c : res) {
      const bool logits = c.mode != "greedy";
      char agree[64];
      std::snprintf(agree, sizeof agree, "%lld/%lld", (long long)c.agree, (long long)c.total);
      std::printf("%-8s  %14s  %8s  %16s  %s\n", c.mode.c_str(),
                  logits ? fmt_abs(c.max_abs).c_str() : "-",
                  logits ? (c.allclose ? "pass" : "FAIL") : "-", agree, c.passed() ? "ok" : "FAIL");
      ok = ok && c.passed();
    }
    std::printf("%s\n", ok ? "check passed" : "check FAILED");
    if (!ok) throw CLI::RuntimeError(1);
  });
}

}  // namespace ingot::cli
