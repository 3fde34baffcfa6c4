// `ingot bench`: time to first token, prefill and decode throughput per batch size, on a checkpoint or
// on random weights of a config.json's shapes. A batch of B is B concurrent requests through the
// Generator (the path every command and the server take), so the figures include its scheduling.
// EOS is ignored so every run has the same length. Decode steps take the argmax, or sample on the
// device when sampling flags are given.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common.h"
#include "core/error.h"
#include "options.h"
#include "progress.h"
#include "runtime/generator.h"

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
  a->model.add_tp_option(*cmd);
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
  cmd->add_option("--frequency-penalty", a->sampling.frequency_penalty, "frequency penalty ([-2, 2], 0 = off)");
  cmd->add_option("--presence-penalty", a->sampling.presence_penalty, "presence penalty ([-2, 2], 0 = off)");
  cmd->add_option("--seed", a->sampling.seed, "seed of the sampled decode steps");
  cmd->callback([a] {
    const int sources = int(!a->model.model_dir.empty()) + int(!a->model.engine_path.empty()) + int(!a->config.empty());
    if (sources != 1) throw Error("bench: give exactly one of --model, --engine or --config");
    a->sampling.validate();
    a->model.check_tp();
    // Everything a run will ask for is checked before the engine is built, generated or verified.
    LoadSpec ls;
    ls.model_dir = a->model.model_dir;
    ls.engine_path = a->model.engine_path;
    ls.config_path = a->config;
    ls.random_seed = a->seed;
    ls.device = a->model.device;
    ls.dtype = a->model.dtype;
    ls.threads = a->model.threads;
    ls.batch_invariant = a->model.batch_invariant;
    ls.verify = !a->model.no_verify;
    ls.int4_group_size = int4_group_option(a->model.quantize, a->model.group_size);
    ls.calibration_text = a->model.calibration;
    ls.calibration_ids = a->model.calibration_ids;
    ls.quantize_lm_head = a->model.quantize_lm_head;
    ProgressBar bar("verifying", a->model.quiet);
    ls.progress = bar.fn();
    LoadPlan plan(ls);
    const int64_t slots = State::slots_needed(a->prompt_len, a->new_tokens);
    if (slots > plan.spec().max_position)
      throw Error("bench: --prompt-len " + std::to_string(a->prompt_len) + " + --max-new-tokens " +
                  std::to_string(a->new_tokens) + " need " + std::to_string(slots) +
                  " positions, beyond the model's max_position_embeddings of " + std::to_string(plan.spec().max_position));
    const std::vector<int> batches = parse_int_list(a->batches);
    if (batches.empty()) throw Error("bench: --batch names no batch size");
    std::vector<RuntimeOptions> runs;
    for (int B : batches) {
      if (B < 1) throw Error("bench: batch sizes must be positive");
      RuntimeOptions rt;
      rt.max_batch = B;
      rt.capacity = slots;
      rt.tp = a->model.tp;
      // Prefill goes in chunks of at most 8192 tokens; a decode step carries one token per row.
      rt.max_tokens = std::max<int64_t>(B, std::min<int64_t>(int64_t(B) * a->prompt_len, 8192));
      runs.push_back(plan.fit(rt));
    }

    Loaded l = Loaded::weights(std::move(plan));  // engine file: map + verify; otherwise the build
    const Engine* engine = l.engine.get();
    Backend* backend = l.backend.get();
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
      Generator gen(m);
      auto random_prompts = [&] {
        std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B));
        for (auto& p : prompts)
          for (int i = 0; i < a->prompt_len; ++i) p.push_back(int32_t(rng() % uint32_t(s.vocab)));
        return prompts;
      };
      // B concurrent requests through the Generator, all submitted at once. The prefill phase lasts
      // until every request has its first token (one forward when the prompts fit the workspace); the
      // decode phase is the rest, whose tokens all come from decode steps then.
      struct Timing {
        double prefill_s = 0, decode_s = 0;
        int64_t decode_tokens = 0;
      };
      auto run = [&](int new_tokens, bool show) {
        gen.forget_all();  // nothing of an earlier run is reused
        int firsts = 0;
        int64_t tokens = 0;
        std::string failure;
        for (const std::vector<int32_t>& p : random_prompts()) {
          Request q;
          q.prompt = p;
          q.max_new_tokens = new_tokens;
          q.sampling = a->sampling;
          q.on_token = [&](const TokenEvent& e) {
            firsts += e.index == 0;
            ++tokens;
          };
          // A request without a pick (non-finite logits) stops the run, naming the step.
          q.on_done = [&](const Completion& c) {
            if (c.stop == StopReason::Error && failure.empty()) failure = c.error;
          };
          gen.submit(std::move(q));
        }
        Timing t;
        const auto t0 = Clock::now();
        Clock::time_point t1;
        int64_t tokens_at_t1 = 0;
        for (int step = 0; gen.step(); ++step) {
          if (!failure.empty()) break;
          if (firsts == B && tokens_at_t1 == 0) {
            // No synchronize: with overlapped steps the next step is already queued behind the one
            // whose picks were just read, and waiting for it would count its tokens in the prefill.
            t1 = Clock::now();
            tokens_at_t1 = tokens;
          }
          if (show && tokens_at_t1) progress("decode", int((tokens - tokens_at_t1) / B), new_tokens - 1);
        }
        if (!failure.empty()) {
          while (gen.step()) {  // the other requests finish; their slots are freed
          }
          throw Error(failure);
        }
        backend->synchronize();
        const auto t2 = Clock::now();
        if (tokens_at_t1 == 0) {  // one new token: the run ended with the prefill
          t1 = t2;
          tokens_at_t1 = tokens;
        }
        if (show) progress("decode", new_tokens - 1, new_tokens - 1);
        t.prefill_s = secs(t0, t1);
        t.decode_s = secs(t1, t2);
        t.decode_tokens = tokens - tokens_at_t1;
        return t;
      };
      // Warm-up outside the timings: first launches load kernels, matmul plans are chosen and the
      // decode graphs are captured.
      run(std::min(3, a->new_tokens), false);
      const Timing t = run(a->new_tokens, true);
      const int steps = a->new_tokens - 1;
      const double decode_tok_s = t.decode_s > 0 ? double(t.decode_tokens) / t.decode_s : 0.0;
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
                          {"ttft_ms", t.prefill_s * 1e3},
                          {"prefill_tok_s", double(B) * a->prompt_len / t.prefill_s},
                          {"decode_tok_s_per_seq", decode_tok_s / B},
                          {"decode_tok_s", decode_tok_s},
                          {"weight_bytes", m.weight_bytes()},
                          {"cache_bytes", m.state().bytes()},
                          {"workspace_bytes", m.workspace_bytes()},
                          {"peak_memory_bytes", backend->peak_memory_bytes()},
                          {"load_s", l.load_s},
                          {"model_init_s", model_init_s}};
      // Bytes a decode step must read at least: every weight but the embedding table (one row of it is
      // gathered; when tied it is read in full as the LM head) plus each row's valid KV cache, taken
      // at the mean length over the run. Against the copy bandwidth this gives the floor's share.
      const double es = double(dtype_size(engine->weight_dtype));
      const double embed = s.tie_embeddings ? 0.0 : double(s.vocab) * double(s.hidden) * es;
      const double mean_ctx = a->prompt_len + (steps - 1) / 2.0;
      // Only attention layers keep K/V; each linear-attention layer reads and writes its rows' f32
      // conv and recurrent state once per step.
      const int64_t attention_layers = s.layers_of(LayerKind::Attention);
      const double kv = double(B) * mean_ctx * double(attention_layers) * 2.0 * double(s.kv_dim()) *
                        double(dtype_size(backend->activation_dtype()));
      const LinearStateShape ls = linear_state_shape(s, B);
      const double state = double(s.layers_of(LayerKind::Linear)) * double(numel(ls.conv) + numel(ls.recurrent)) * 4.0;
      const double step_bytes = double(m.weight_bytes()) - embed + kv + 2.0 * state;
      r["decode_bytes_per_step"] = step_bytes;
      r["decode_kv_bytes_per_step"] = kv;
      r["decode_state_bytes_per_step"] = 2.0 * state;  // read and written
      r["decode_gbs"] = t.decode_tokens > 0 ? step_bytes * (double(t.decode_tokens) / B) / t.decode_s / 1e9 : 0.0;
      if (copy_gbs > 0) {
        r["copy_bandwidth_gbs"] = copy_gbs;
        r["bandwidth_pct"] = r["decode_gbs"].get<double>() / copy_gbs * 100.0;
      }
      // With --tp the weight, cache and workspace figures (and the bytes per step built on them) are
      // rank 0's share.
      r["tp"] = rt.tp;
      results.push_back(r);
      if (!a->json && rt.tp > 1)
        std::printf("tp %d: the memory figures below are rank 0's share (docs/tensor-parallel.md)\n", rt.tp);
      if (!a->json)
        std::printf("batch %3d  ttft %9.2f ms  prefill %10.1f tok/s  decode %9.2f tok/s/seq  %10.2f tok/s total  "
                    "(weights %.1f MB, cache %.1f MB, workspace %.1f MB)\n",
                    B, r["ttft_ms"].get<double>(), r["prefill_tok_s"].get<double>(),
                    r["decode_tok_s_per_seq"].get<double>(), r["decode_tok_s"].get<double>(), m.weight_bytes() / 1e6,
                    m.state().bytes() / 1e6, m.workspace_bytes() / 1e6);
      if (!a->json) std::printf("           load %.3f s, then the model ready in %.3f s\n", l.load_s, model_init_s);
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
