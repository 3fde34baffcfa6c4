// `ingot bench`: time to first token, prefill and decode throughput per batch size, on a checkpoint or
// on random weights of a config.json's shapes. EOS is ignored so every run has the same length. Decode
// steps take the argmax, or sample on the device when sampling flags are given.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/sampling.h"
#include "common.h"
#include "core/error.h"
#include "options.h"
#include "runtime/generate.h"

namespace ingot::cli {

namespace {
using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

void progress(const char* what, int done, int total) {
  if (!isatty(STDERR_FILENO)) return;
  std::fflush(stdout);  // results printed so far come before the bar, in a shared terminal or pipe
  const int width = 30, fill = total ? done * width / total : width;
  std::fprintf(stderr, "\r%-18s [%.*s%*s] %d/%d", what, fill, "##############################", width - fill, "", done,
               total);
  if (done == total) std::fprintf(stderr, "\r%*s\r", 70, "");
}
}  // namespace

void add_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Benchmark prefill and decode");
  struct Args {
    ModelArgs model;
    std::string config;
    int prompt_len = 128, new_tokens = 256;
    std::string batches = "1";
    bool json = false;
    uint64_t seed = 0;
    SamplingParams sampling;  // greedy unless set: the decode steps then sample on the device
  };
  auto a = std::make_shared<Args>();
  a->model.add_to(*cmd);
  cmd->add_option("--config", a->config, "config.json: benchmark its shapes with random weights (no checkpoint)");
  cmd->add_option("--prompt-len", a->prompt_len, "prompt tokens")->check(at_least(1));
  cmd->add_option("--max-new-tokens,--new-tokens", a->new_tokens, "generated tokens (--new-tokens: the older spelling)")
      ->check(at_least(1));
  cmd->add_option("--batch", a->batches, "comma-separated batch sizes");
  cmd->add_flag("--json", a->json, "print JSON");
  cmd->add_option("--temperature", a->sampling.temperature, "sample the decode steps at this temperature (0 = greedy)");
  cmd->add_option("--top-k", a->sampling.top_k, "top-k of the sampled decode steps (0 = off)");
  cmd->add_option("--top-p", a->sampling.top_p, "top-p of the sampled decode steps (1 = off)");
  cmd->add_option("--min-p", a->sampling.min_p, "min-p of the sampled decode steps (0 = off)");
  cmd->add_option("--repetition-penalty", a->sampling.repetition_penalty, "repetition penalty (1 = off)");
  cmd->add_option("--seed", a->sampling.seed, "seed of the sampled decode steps");
  cmd->callback([a] {
    const int sources = int(!a->model.model_dir.empty()) + int(!a->model.engine_path.empty()) + int(!a->config.empty());
    if (sources != 1) throw Error("bench: give exactly one of --model, --engine or --config");
    a->sampling.validate();
    // Everything a run will ask for is checked before the engine is built, generated or verified.
    ModelSpec spec;
    DType dt;
    std::optional<EngineFileInfo> info;
    if (!a->config.empty()) {
      spec = load_config_file(a->config);
      dt = a->model.dtype.empty() ? DType::BF16 : parse_dtype(a->model.dtype);
    } else if (!a->model.engine_path.empty()) {
      info = inspect_engine(a->model.engine_path);
      spec = info->spec;
      dt = info->weight_dtype;
    } else {
      spec = load_model_spec(a->model.model_dir);
      dt = build_dtype(a->model.model_dir, spec,
                               a->model.dtype.empty() ? std::nullopt : std::optional<DType>(parse_dtype(a->model.dtype)));
    }
    const int64_t slots = State::slots_needed(a->prompt_len, a->new_tokens);
    if (slots > spec.max_position)
      throw Error("bench: --prompt-len " + std::to_string(a->prompt_len) + " + --max-new-tokens " +
                  std::to_string(a->new_tokens) + " need " + std::to_string(slots) +
                  " positions, beyond the model's max_position_embeddings of " + std::to_string(spec.max_position));
    const std::string dev = resolve_device(a->model.device);
    // The CPU backend does not depend on the weights' dtype: made first, its figures join the check.
    std::unique_ptr<Backend> backend = dev == "cpu" ? make_cpu_backend(a->model.threads) : nullptr;
    const std::vector<int> batches = parse_int_list(a->batches);
    if (batches.empty()) throw Error("bench: --batch names no batch size");
    std::vector<RuntimeOptions> runs;
    for (int B : batches) {
      if (B < 1) throw Error("bench: batch sizes must be positive");
      RuntimeOptions rt;
      rt.max_batch = B;
      rt.capacity = slots;
      // Prefill goes in chunks of at most 8192 tokens; a decode step carries one token per row.
      rt.max_tokens = std::max<int64_t>(B, std::min<int64_t>(int64_t(B) * a->prompt_len, 8192));
      if (info) rt = fit_engine_bounds(*info, rt, false);
      check_host_memory(spec, dt, rt, !info, backend.get());
      runs.push_back(rt);
    }

    EngineSource src;
    const auto t_load = Clock::now();
    if (!a->config.empty()) {
      src.engine = std::make_unique<Engine>(random_engine(spec, dt, a->seed));
    } else {
      src = open_engine(a->model);
    }
    const Engine* engine = src.engine.get();
    const double load_s = secs(t_load, Clock::now());  // engine file: map + verify; otherwise the build
    check_device(src, dev);
    if (!backend) backend = make_backend(dev, engine->weight_dtype, a->model.threads);
    const ModelSpec& s = engine->spec;
    nlohmann::json results = nlohmann::json::array();
    const double copy_gbs = backend->copy_bandwidth_gbs();
    std::mt19937 rng(1234);
    for (const RuntimeOptions& rt : runs) {
      const int B = rt.max_batch;
      const auto t_model = Clock::now();
      Model m(*engine, *backend, rt);
      backend->synchronize();
      const double model_init_s = secs(t_model, Clock::now());  // weights onto the device, cache allocated
      std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B));
      for (auto& p : prompts)
        for (int i = 0; i < a->prompt_len; ++i) p.push_back(int32_t(rng() % uint32_t(s.vocab)));

      // Prefill: all rows, as few calls as the workspace allows.
      std::vector<int32_t> next(static_cast<size_t>(B));
      auto prefill_all = [&] {
        for (int r0 = 0; r0 < B;) {
          Batch b;
          int64_t tokens = 0;
          for (; r0 < B && tokens + a->prompt_len <= m.max_tokens(); ++r0, tokens += a->prompt_len)
            b.rows.push_back(BatchRow{r0, prompts[size_t(r0)], 0, {}, false});
          if (b.rows.empty()) {  // a prompt longer than the workspace: its row alone, in chunks
            HostTensor lg = prefill_row(m, r0, prompts[size_t(r0)], 0);
            next[size_t(r0)] = sampling::argmax_row(lg.as<float>(), s.vocab);
            ++r0;
            continue;
          }
          HostTensor lg = m.forward(b);
          for (size_t i = 0; i < b.rows.size(); ++i) {
            const float* l = lg.as<float>() + int64_t(i) * s.vocab;
            next[size_t(b.rows[i].row)] = sampling::argmax_row(l, s.vocab);
          }
        }
      };
      std::vector<int> rows(static_cast<size_t>(B));
      for (int r = 0; r < B; ++r) {
        rows[size_t(r)] = r;
        m.set_sampling(r, a->sampling, prompts[size_t(r)]);
      }
      // A row without a pick (non-finite logits: sampling::kNoToken) stops the run with the step named,
      // instead of feeding -1 back as a token.
      auto step_to = [&](int step) {
        for (int32_t t : next)
          if (t == sampling::kNoToken) throw non_finite_logits(step);
        next = m.decode(rows, next, std::vector<int64_t>(static_cast<size_t>(B), a->prompt_len + step));
      };
      // Warm-up outside the timings: first launches load kernels, matmul plans are chosen and the
      // decode graph is captured. The timed prefill then rewrites the same slots.
      prefill_all();
      for (int step = 0; step < std::min(2, a->new_tokens - 1); ++step) step_to(step);
      backend->synchronize();

      auto t0 = Clock::now();
      prefill_all();
      backend->synchronize();
      const double t_prefill = secs(t0, Clock::now());

      auto t1 = Clock::now();
      const int steps = a->new_tokens - 1;
      for (int step = 0; step < steps; ++step) {
        step_to(step);
        progress("decode", step + 1, steps);
      }
      backend->synchronize();
      const double t_decode = secs(t1, Clock::now());
      nlohmann::json r = {{"batch", B},
                          {"device", backend->name()},
                          {"dtype", std::string(dtype_name(engine->weight_dtype))},
                          {"prompt_len", a->prompt_len},
                          {"new_tokens", a->new_tokens},
                          {"sampling", {{"temperature", a->sampling.temperature},
                                        {"top_k", a->sampling.top_k},
                                        {"top_p", a->sampling.top_p},
                                        {"min_p", a->sampling.min_p},
                                        {"repetition_penalty", a->sampling.repetition_penalty}}},
                          {"ttft_ms", t_prefill * 1e3},
                          {"prefill_tok_s", double(B) * a->prompt_len / t_prefill},
                          {"decode_tok_s_per_seq", steps / t_decode},
                          {"decode_tok_s", double(B) * steps / t_decode},
                          {"weight_bytes", m.weight_bytes()},
                          {"cache_bytes", m.state().bytes()},
                          {"workspace_bytes", m.workspace_bytes()},
                          {"peak_memory_bytes", backend->peak_memory_bytes()},
                          {"load_s", load_s},
                          {"model_init_s", model_init_s}};
      // Bytes a decode step must read at least: every weight but the embedding table (one row of it is
      // gathered; when tied it is read in full as the LM head) plus each row's valid KV cache, taken
      // at the mean length over the run. Against the copy bandwidth this gives the floor's share.
      const double es = double(dtype_size(engine->weight_dtype));
      const double embed = s.tie_embeddings ? 0.0 : double(s.vocab) * double(s.hidden) * es;
      const double mean_ctx = a->prompt_len + (steps - 1) / 2.0;
      const double kv = double(B) * mean_ctx * double(s.layers) * 2.0 * double(s.kv_dim()) *
                        double(dtype_size(backend->activation_dtype()));
      const double step_bytes = double(m.weight_bytes()) - embed + kv;
      r["decode_bytes_per_step"] = step_bytes;
      r["decode_gbs"] = steps > 0 ? step_bytes * steps / t_decode / 1e9 : 0.0;
      if (copy_gbs > 0) {
        r["copy_bandwidth_gbs"] = copy_gbs;
        r["bandwidth_pct"] = r["decode_gbs"].get<double>() / copy_gbs * 100.0;
      }
      results.push_back(r);
      if (!a->json)
        std::printf("batch %3d  ttft %9.2f ms  prefill %10.1f tok/s  decode %9.2f tok/s/seq  %10.2f tok/s total  "
                    "(weights %.1f MB, cache %.1f MB, workspace %.1f MB)\n",
                    B, r["ttft_ms"].get<double>(), r["prefill_tok_s"].get<double>(),
                    r["decode_tok_s_per_seq"].get<double>(), r["decode_tok_s"].get<double>(), m.weight_bytes() / 1e6,
                    m.state().bytes() / 1e6, m.workspace_bytes() / 1e6);
      if (!a->json) std::printf("           load %.3f s, then the model ready in %.3f s\n", load_s, model_init_s);
      if (!a->json && !a->sampling.greedy())
        std::printf("           decode sampled on the device (temperature %g, top-k %d, top-p %g, min-p %g, "
                    "repetition penalty %g)\n",
                    double(a->sampling.temperature), a->sampling.top_k, double(a->sampling.top_p),
                    double(a->sampling.min_p), double(a->sampling.repetition_penalty));
      // An error in a later batch goes to stderr: the results before it must already be out.
      std::fflush(stdout);
    }
    if (a->json) std::printf("%s\n", results.dump(2).c_str());
  });
}

}  // namespace ingot::cli
