// `ingot bench`: time to first token, prefill and decode throughput per batch size, on a checkpoint or
// on random weights of a config.json's shapes. A batch of B is B concurrent requests through the
// Generator (the path every command and the server take), so the figures include its scheduling.
// EOS is ignored so every run has the same length. Decode steps take the argmax, or sample on the
// device when sampling flags are given. --prompt-len and --batch take lists: every batch size runs at
// every prompt length. --svg draws the results (bench_svg.h).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bench_svg.h"
#include "common.h"
#include "core/error.h"
#include "core/files.h"
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

// --prompt-len's list: "128" or "128,1024,8192", each at least 1, with messages naming the flag.
std::vector<int> parse_prompt_lens(const std::string& csv) {
  std::vector<int> out;
  std::stringstream ss(csv);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    long long v = 0;
    size_t used = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size())
      throw Error("--prompt-len: '" + item + "' is not an integer (expected lengths separated by commas)");
    if (v < 1) throw Error("--prompt-len: must be at least 1 (got " + item + ")");
    if (v > INT32_MAX) throw Error("--prompt-len: " + item + " is too large");
    out.push_back(int(v));
  }
  if (out.empty()) throw Error("--prompt-len names no length");
  return out;
}

// The source's name for the picture's title: the config's or engine file's stem, the model folder's name.
std::string source_label(const std::string& model_dir, const std::string& engine, const std::string& config) {
  namespace fs = std::filesystem;
  if (!config.empty()) return fs::path(config).stem().string();
  if (!engine.empty()) return fs::path(engine).filename().string();
  fs::path d = fs::path(model_dir).lexically_normal();
  if (d.filename().empty()) d = d.parent_path();
  return d.filename().string();
}

std::string utc_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%d", &tm);
  return b;
}
}  // namespace

void add_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Benchmark prefill and decode");
  struct Args {
    ModelArgs model;
    std::string config;
    int new_tokens = 256;
    std::string prompt_lens = "128";  // comma-separated, like --batch
    std::string batches = "1";
    bool json = false;
    std::string svg;                 // --svg FILE
    std::vector<std::string> peers;  // --peer FILE, repeatable
    bool force = false;
    uint64_t seed = 0;
    SamplingParams sampling;  // greedy unless set: the decode steps then sample on the device
  };
  auto a = std::make_shared<Args>();
  a->model.add_to(*cmd);
  a->model.add_tp_option(*cmd);
  cmd->add_option("--config", a->config, "config.json: benchmark its shapes with random weights (no checkpoint)");
  cmd->add_option("--prompt-len", a->prompt_lens,
                  "prompt tokens; comma-separated lengths run every batch size at each (a context sweep)")
      ->capture_default_str();
  cmd->add_option("--max-new-tokens,--new-tokens", a->new_tokens, "generated tokens (--new-tokens: the older spelling)")
      ->check(at_least(1));
  cmd->add_option("--batch", a->batches, "comma-separated batch sizes");
  cmd->add_flag("--json", a->json, "print JSON");
  cmd->add_option("--svg", a->svg,
                  "write an SVG of decode tok/s against batch size and against prompt length, with the "
                  "copy-bandwidth ceiling where the backend measures it and the --peer points")
      ->type_name("FILE");
  cmd->add_option("--peer", a->peers,
                  "JSON of another engine's points for --svg (repeatable): an array of objects "
                  "{\"name\": \"transformers\", \"batch\": 1, \"prompt_len\": 128, \"decode_tok_s\": 133.6}, "
                  "or one such object per line (bench/peer_hf.py's output, its \"engine\" and \"mode\" as the name)")
      ->type_name("FILE");
  cmd->add_flag("--force", a->force, "replace the --svg file if it exists (never an input)");
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
    const std::vector<int> prompt_lens = parse_prompt_lens(a->prompt_lens);
    if (!a->peers.empty() && a->svg.empty()) throw Error("bench: --peer draws into the picture; give --svg FILE too");
    // The picture's file and the peers' points are checked before anything is loaded or run: a bad
    // path found after minutes of benchmarking would lose the run.
    std::vector<PeerPoint> peer_points;
    if (!a->svg.empty()) {
      std::vector<std::string> inputs = model_inputs(a->model);
      for (const std::string* in : {&a->config, &a->model.calibration, &a->model.calibration_ids})
        if (!in->empty()) inputs.push_back(*in);
      inputs.insert(inputs.end(), a->peers.begin(), a->peers.end());
      check_output_path(a->svg, "--svg", a->force, inputs);
      for (const std::string& p : a->peers) {
        const std::vector<PeerPoint> pts = parse_peers(read_file(p), p);
        peer_points.insert(peer_points.end(), pts.begin(), pts.end());
      }
    }
    // Everything a run will ask for is checked before the engine is built, generated or verified.
    LoadSpec ls = a->model.load_spec(a->config, a->seed);
    ProgressBar bar("verifying", a->model.quiet);
    ls.progress = bar.fn();
    LoadPlan plan(ls);
    for (int prompt_len : prompt_lens) {
      const int64_t slots = State::slots_needed(prompt_len, a->new_tokens);
      if (slots > plan.spec().max_position)
        throw Error("bench: --prompt-len " + std::to_string(prompt_len) + " + --max-new-tokens " +
                    std::to_string(a->new_tokens) + " need " + std::to_string(slots) +
                    " positions, beyond the model's max_position_embeddings of " +
                    std::to_string(plan.spec().max_position));
    }
    const std::vector<int> batches = parse_int_list(a->batches);
    if (batches.empty()) throw Error("bench: --batch names no batch size");
    // Every batch size at every prompt length, batch-major (one prompt length: the runs as before).
    struct Run {
      RuntimeOptions rt;
      int prompt_len;
    };
    std::vector<Run> runs;
    for (int B : batches) {
      if (B < 1) throw Error("bench: batch sizes must be positive");
      for (int prompt_len : prompt_lens) {
        RuntimeOptions rt;
        rt.max_batch = B;
        rt.capacity = State::slots_needed(prompt_len, a->new_tokens);
        rt.tp = a->model.tp;
        // Prefill goes in chunks of at most 8192 tokens; a decode step carries one token per row.
        rt.max_tokens = std::max<int64_t>(B, std::min<int64_t>(int64_t(B) * prompt_len, 8192));
        runs.push_back({plan.fit(rt), prompt_len});
      }
    }

    Loaded l = Loaded::weights(std::move(plan));  // engine file: map + verify; otherwise the build
    const Engine* engine = l.engine.get();
    Backend* backend = l.backend.get();
    const ModelSpec& s = engine->spec;
    nlohmann::json results = nlohmann::json::array();
    const double copy_gbs = backend->copy_bandwidth_gbs();
    std::mt19937 rng(1234);
    for (const Run& run_spec : runs) {
      const RuntimeOptions& rt = run_spec.rt;
      const int prompt_len = run_spec.prompt_len;
      const int B = rt.max_batch;
      const auto t_model = Clock::now();
      const std::unique_ptr<Model> model = l.make_model(rt);  // over an engine directory's slices too
      Model& m = *model;
      backend->synchronize();
      const double model_init_s = secs(t_model, Clock::now());  // weights onto the device, cache allocated
      Generator gen(m);
      auto random_prompts = [&] {
        std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B));
        for (auto& p : prompts)
          for (int i = 0; i < prompt_len; ++i) p.push_back(int32_t(rng() % uint32_t(s.vocab)));
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
      // decode graphs are captured; the second run captures the prefill's graphs (a forward shape is
      // captured the second time it is seen, Model::run_forward_graph), so the timed run measures a
      // prompt length served before. INGOT_FORWARD_GRAPHS=0 measures every prefill run directly.
      run(std::min(3, a->new_tokens), false);
      run(std::min(3, a->new_tokens), false);
      const Timing t = run(a->new_tokens, true);
      const int steps = a->new_tokens - 1;
      const double decode_tok_s = t.decode_s > 0 ? double(t.decode_tokens) / t.decode_s : 0.0;
      nlohmann::json r = {{"batch", B},
                          {"device", backend->name()},
                          {"dtype", std::string(dtype_name(engine->weight_dtype))},
                          {"activations", std::string(dtype_name(backend->activation_dtype()))},
                          {"prompt_len", prompt_len},
                          {"new_tokens", a->new_tokens},
                          {"sampling", {{"temperature", a->sampling.temperature},
                                        {"top_k", a->sampling.top_k},
                                        {"top_p", a->sampling.top_p},
                                        {"min_p", a->sampling.min_p},
                                        {"repetition_penalty", a->sampling.repetition_penalty}}},
                          {"ttft_ms", t.prefill_s * 1e3},
                          {"prefill_tok_s", double(B) * prompt_len / t.prefill_s},
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
      const double mean_ctx = prompt_len + (steps - 1) / 2.0;
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
      r["decode_mean_context"] = mean_ctx;  // tokens per row, the KV length the bytes above are taken at
      if (copy_gbs > 0) {
        r["copy_bandwidth_gbs"] = copy_gbs;
        r["bandwidth_pct"] = r["decode_gbs"].get<double>() / copy_gbs * 100.0;
        // The rate if every step only streamed its bytes at the copy bandwidth: B tokens per
        // step_bytes / (copy_gbs * 1e9) seconds (tok/s, aggregate over the batch).
        const double ceiling = double(B) * copy_gbs * 1e9 / step_bytes;
        r["ceiling_tok_s"] = ceiling;
        r["of_ceiling"] = decode_tok_s / ceiling;
      }
      // With --tp the weight, cache and workspace figures (and the bytes per step built on them) are
      // rank 0's share.
      r["tp"] = rt.tp;
      if (rt.tp > 1) r["tp_collectives"] = m.tp_comm();
      results.push_back(r);
      if (!a->json && rt.tp > 1)
        std::printf("tp %d (%s): the memory figures below are rank 0's share (docs/tensor-parallel.md)\n", rt.tp,
                    m.tp_comm().c_str());
      // A sweep names each line's prompt length; a single length keeps the line as it always was.
      if (!a->json && prompt_lens.size() > 1) std::printf("prompt %6d  ", prompt_len);
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
    if (!a->svg.empty()) {
      const std::string device = results.empty() ? backend->name() : results[0]["device"].get<std::string>();
      const std::string dtype = std::string(dtype_name(engine->weight_dtype)) +
                                (backend->activation_dtype() != engine->weight_dtype && backend->name() != "cpu"
                                     ? " weights, " + std::string(dtype_name(backend->activation_dtype())) + " activations"
                                     : "");
      char shape[160];
      std::snprintf(shape, sizeof shape, "hidden %lld, %lld layers, vocab %lld", (long long)s.hidden,
                    (long long)s.layers, (long long)s.vocab);
      const std::string title = "ingot bench: " +
                                source_label(a->model.model_dir, a->model.engine_path, a->config) + " (" + shape +
                                "), " + dtype + ", " + device + ", " + utc_date();
      std::vector<std::string> notes;
      notes.push_back(std::to_string(a->new_tokens) + " new tokens per request after a random prompt; " +
                      (a->sampling.greedy() ? "greedy" : "sampled") + " decode; EOS ignored" +
                      (a->model.tp > 1 ? "; tp " + std::to_string(a->model.tp) : ""));
      if (copy_gbs > 0) {
        char b[256];
        std::snprintf(b, sizeof b,
                      "dashed: ceiling = batch x %.0f GB/s (measured copy bandwidth) / bytes a decode step reads "
                      "(weights + each row's KV cache at its mean context)",
                      copy_gbs);
        notes.push_back(b);
      } else {
        notes.push_back("no ceiling drawn: the " + device + " backend does not measure its copy bandwidth");
      }
      if (!peer_points.empty()) notes.push_back("diamonds: peers' points from --peer, as given");
      const std::string svg = render_svg(bench_figure(results, peer_points, title, notes));
      OutputFile out(a->svg);
      out.write(svg.data(), svg.size());
      out.commit();
      if (!a->json) std::printf("wrote %s\n", a->svg.c_str());
    }
  });
}

}  // namespace ingot::cli
