// `ingot check`: replays a transformers reference through every forward path and reports, per case,
// max and mean |Δlogit|, allclose and next-token agreement as separate figures. Non-zero exit on any
// failure. Tolerances default per dtype and device (runtime/reference_check.h); each one used is
// printed with where it came from.
#include <cmath>
#include <cstdio>

#include "common.h"
#include "core/error.h"
#include "runtime/reference_check.h"

namespace ingot::cli {

namespace {
std::string fmt_abs(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3e", v);
  return std::isnan(v) ? "nan" : b;
}

// A tolerance the user gave: finite and >= 0 (a negative one would fail every logit, NaN would pass
// or fail by accident, inf would pass anything).
void check_tolerance(const char* flag, double v) {
  if (std::isfinite(v) && v >= 0) return;
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  throw Error(std::string(flag) + " " + b + ": a tolerance must be a finite number >= 0");
}
}  // namespace

void add_check(CLI::App& app) {
  auto* cmd = app.add_subcommand("check", "Compare against a transformers reference file");
  struct Args {
    ModelArgs model;
    std::string reference;
    double atol = 0, rtol = 0, mean_atol = 0;
    std::string layout;
  };
  auto a = std::make_shared<Args>();
  a->model.add_to(*cmd);
  a->model.add_tp_option(*cmd);
  cmd->add_option("--reference", a->reference, "reference.safetensors (docs/reference-format.md)")->required();
  auto* atol = cmd->add_option("--atol", a->atol,
                               "absolute tolerance per logit (default: f32 1e-4 on the CPU, 1e-3 on the GPU; "
                               "bf16/fp16 48 (CPU) or 192 (GPU) * unit roundoff * RMS of the reference logits)");
  auto* rtol = cmd->add_option("--rtol", a->rtol, "relative tolerance per logit (default: f32 1e-4; bf16/fp16 0)");
  auto* mean_atol = cmd->add_option("--mean-atol", a->mean_atol,
                                    "bound on the mean |dlogit| of each case (default: f32 none; bf16/fp16 4 (CPU) or "
                                    "24 (GPU) * unit roundoff * RMS of the reference logits)");
  cmd->add_option("--layout", a->layout, "cache layout: heads_first or flattened (default: heads_first, or the engine's)");
  cmd->callback([a, atol, rtol, mean_atol] {
    if (atol->count()) check_tolerance("--atol", a->atol);
    if (rtol->count()) check_tolerance("--rtol", a->rtol);
    if (mean_atol->count()) check_tolerance("--mean-atol", a->mean_atol);
    Reference ref = load_reference(a->reference);
    RuntimeOptions rt;
    rt.max_batch = int(ref.rows());
    rt.capacity = reference_capacity(ref);
    if (!a->layout.empty()) rt.layout = parse_layout(a->layout);
    Loaded l = load_model(a->model, rt, !a->layout.empty());
    const DType wt = l.engine->weight_dtype, act = l.backend->activation_dtype();
    const bool gpu = l.backend->name() != "cpu";
    CheckOptions co;
    co.tol = default_tolerance(wt, act, gpu, l.engine->spec.layers, ref);
    const bool sixteen = co.tol.tie_margin > 0;
    const std::string where = "default for " + std::string(dtype_name(wt)) + " weights, " +
                              std::string(dtype_name(act)) + " activations on " + l.backend->name();
    if (atol->count()) co.tol.atol = a->atol;
    if (rtol->count()) co.tol.rtol = a->rtol;
    if (mean_atol->count()) co.tol.mean_atol = a->mean_atol;
    if (sixteen && (atol->count() || rtol->count())) co.tol.tie_margin = tie_margin_for(co.tol.atol, co.tol.rtol, ref);
    std::vector<CaseResult> res = run_reference_check(*l.model, ref, co);

    auto src = [&](const CLI::Option* o) { return o->count() ? std::string("given") : where; };
    std::printf("model %s  device %s  weights %s  layout %s  atol %g rtol %g\n", a->model.source_name().c_str(),
                l.backend->name().c_str(), std::string(dtype_name(wt)).c_str(), layout_name(l.model->state().layout()).c_str(),
                co.tol.atol, co.tol.rtol);
    if (l.model->tp_world() > 1)
      std::printf("tensor parallel: %d ranks (%s; every rank's logits are bitwise the same)\n", l.model->tp_world(),
                  l.ranks ? "one process per rank" : "in-process");
    std::printf("tolerances: atol %g (%s), rtol %g (%s), mean |dlogit| %s (%s)\n", co.tol.atol, src(atol).c_str(),
                co.tol.rtol, src(rtol).c_str(), std::isinf(co.tol.mean_atol) ? "unbounded" : fmt_abs(co.tol.mean_atol).c_str(),
                src(mean_atol).c_str());
    if (sixteen) {
      const double u = std::max(unit_roundoff(wt), unit_roundoff(act));
      std::printf("16-bit scale: unit roundoff %g x RMS of the reference logits %.4g = %.4g; next-token and greedy "
                  "agreement required where the reference's top-2 margin >= %.4g (the per-logit bound)\n",
                  u, logit_rms(ref), u * logit_rms(ref), co.tol.tie_margin);
    }
    std::printf("%-8s  %12s  %12s  %8s  %6s  %14s  %14s  %s\n", "mode", "max|dlogit|", "mean|dlogit|", "allclose",
                "mean", "agree (all)", "agree (req.)", "result");
    bool ok = true;
    for (const CaseResult& c : res) {
      const bool logits = c.mode != "greedy";
      char all[64], req[64];
      std::snprintf(all, sizeof all, "%lld/%lld", (long long)c.agree, (long long)c.total);
      std::snprintf(req, sizeof req, "%lld/%lld", (long long)c.agree_required, (long long)c.required);
      std::printf("%-8s  %12s  %12s  %8s  %6s  %14s  %14s  %s\n", c.mode.c_str(), logits ? fmt_abs(c.max_abs).c_str() : "-",
                  logits ? fmt_abs(c.mean_abs).c_str() : "-", logits ? (c.allclose ? "pass" : "FAIL") : "-",
                  logits ? (c.mean_ok ? "pass" : "FAIL") : "-", all, req, c.passed() ? "ok" : "FAIL");
      ok = ok && c.passed();
    }
    std::printf("%s\n", ok ? "check passed" : "check FAILED");
    if (!ok) throw CLI::RuntimeError(1);
  });
}

}  // namespace ingot::cli
