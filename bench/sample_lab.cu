// Sample-op design lab (issue 16, "sampling at the speed of greedy"): the library's sample op
// (src/backend/cuda/sample.cu, through launch_sample) timed per call at the decode shapes that matter
// (rows 1 and 64, Qwen3's vocabulary of 151,936, bf16 and f32 logits: the LM head writes the
// activation dtype), on flat logits (a random-weight model: top-p 0.9 keeps most of the row) and
// peaked ones (a trained model: a few tokens far above the bulk), for the settings the issue measures.
// The argmax op is timed beside it as the floor. Every pick of every timed row is checked against the
// CPU reference (sampling::sample_row, argmax_row); a mismatch fails the run. Hand-written: it drives
// the library's own launcher and its variants, which no benchmark library knows about.
//
//   cmake --build build-gpu/tree --target sample_lab && build-gpu/tree/sample_lab [VARIANT...]
//   (or BINS="sample_lab test_cuda_ops" scripts/gpu-build here, then on the GPU machine
//   LD_LIBRARY_PATH=build-gpu/bin/lib build-gpu/bin/sample_lab)
//
// The variants of sample.cu are environment knobs read once per process (docs/cuda-backend.md, "The
// sample lab": INGOT_CUDA_SAMPLE_SCATTER, _RANKS, _CACHE), so the lab re-runs itself (--child) once per
// knob set (all of main's list, or the ones named) and prints to stdout, compactly (lines < 160
// characters): first the phase profile, a line per variant and case (mean µs per phase of a row's
// rank-0 block, from SampleArgs::phase_ns: the top pass, top-k, the first weighted histogram with
// min-p, top-p, the draw, the rest to the kernel's end, and their sum; a phase a setting skips shows
// ~0), then one table of µs per call, variants side by side. A pick that differs from the CPU's stops
// the run with MISMATCH (on stderr).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/sampling.h"
#include "lab_util.h"

namespace {

using ingot::DType;
using ingot::Mat;
using ingot::SampleParams;
using ingot::SampleState;
namespace sp = ingot::sampling;

constexpr int64_t kVocab = 151936;
constexpr int kMaxRows = 64;
// sample.cu's Phase slots: start, top, top-k, first histogram, top-p, draw, end.
constexpr int kPhases = ingot::cuda::kSamplePhases;
const char* const kPhaseNames[] = {"top", "top-k", "hist1", "top-p", "draw", "end"};

using ingot::lab::ck;

struct Setting {
  const char* name;
  SampleParams p;  // temperature < 0: the argmax op
};

const std::vector<Setting>& settings() {
  static const std::vector<Setting> v = {
      {"argmax", {-1.0f, 0, 1.0f, 0.0f, 1.0f, 0}},
      {"t0.7 p0.9", {0.7f, 0, 0.9f, 0.0f, 1.0f, 0}},
      {"t0.7 k50 p0.9 minp.05 rep1.1", {0.7f, 50, 0.9f, 0.05f, 1.1f, 0}},
      {"t1.0", {1.0f, 0, 1.0f, 0.0f, 1.0f, 0}},
      {"t0.7 k50", {0.7f, 50, 1.0f, 0.0f, 1.0f, 0}},
  };
  return v;
}

// Rows of logits: flat = normal, std 1.5 (random weights); peaked = a normal bulk (std 1.5) with a few
// tokens 10 to 20 above it, as a trained model's next-token distribution has.
std::vector<float> make_logits(bool peaked, std::mt19937_64& rng) {
  std::vector<float> l(size_t(kMaxRows) * kVocab);
  std::normal_distribution<float> bulk(0.0f, 1.5f);
  for (float& x : l) x = bulk(rng);
  if (peaked) {
    std::uniform_real_distribution<float> lift(10.0f, 20.0f);
    for (int r = 0; r < kMaxRows; ++r)
      for (int i = 0; i < 5; ++i) l[size_t(r) * kVocab + rng() % kVocab] += lift(rng);
  }
  return l;
}

struct Result {
  double us;                      // per call
  double phase_ns[kPhases - 2];  // mean per phase (sample op only)
};

// One (dtype, kind, rows, setting): checks, times and profiles. Exits on a mismatch.
Result run_case(const Mat& lg, const std::vector<float>& host, int rows, const Setting& set, cudaStream_t s,
                const ingot::cuda::Scratch& ws, const char* label, std::mt19937_64& rng) {
  const bool argmax = set.p.temperature < 0.0f;
  std::vector<SampleParams> params(size_t(rows), set.p);
  std::vector<uint32_t> step(static_cast<size_t>(rows));
  std::vector<uint8_t> seen(size_t(rows) * kVocab, 0);
  for (int r = 0; r < rows; ++r) {
    params[size_t(r)].seed = 7000 + uint64_t(r);
    step[size_t(r)] = uint32_t(rng());
    for (int i = 0; i < 300; ++i) seen[size_t(r) * kVocab + rng() % kVocab] = 1;  // a prompt and some output
  }
  SampleParams* d_params;
  uint32_t* d_step;
  uint8_t* d_seen;
  int32_t* d_out;
  unsigned long long* d_phase;
  ck(cudaMalloc(&d_params, params.size() * sizeof(SampleParams)), "malloc");
  ck(cudaMalloc(&d_step, step.size() * 4), "malloc");
  ck(cudaMalloc(&d_seen, seen.size()), "malloc");
  ck(cudaMalloc(&d_out, size_t(rows) * 4), "malloc");
  ck(cudaMalloc(&d_phase, size_t(rows) * kPhases * 8), "malloc");
  ck(cudaMemcpy(d_params, params.data(), params.size() * sizeof(SampleParams), cudaMemcpyHostToDevice), "copy");
  ck(cudaMemcpy(d_step, step.data(), step.size() * 4, cudaMemcpyHostToDevice), "copy");
  ck(cudaMemcpy(d_seen, seen.data(), seen.size(), cudaMemcpyHostToDevice), "copy");
  SampleState st{nullptr, d_params, d_step, d_seen, kVocab, nullptr, 0};
  Mat m = lg;
  m.rows = rows;
  auto launch = [&](unsigned long long* phase) {
    if (argmax) ingot::cuda::launch_argmax(m, d_out, ws, s);
    else ingot::cuda::launch_sample(m, st, d_out, s, phase);
  };

  // The picks of one call against the reference, on the state the call saw.
  launch(nullptr);
  std::vector<int32_t> got(static_cast<size_t>(rows)), want(static_cast<size_t>(rows));
  ck(cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost), "copy out");
  // The reference sorts up to the whole row (~10 ms): the rows on all the host's cores.
  {
    const int nt = std::max(1, std::min(rows, int(std::thread::hardware_concurrency())));
    std::vector<std::thread> pool;
    for (int t = 0; t < nt; ++t)
      pool.emplace_back([&, t] {
        for (int r = t; r < rows; r += nt) {
          const float* row = host.data() + size_t(r) * kVocab;
          want[size_t(r)] = argmax ? sp::argmax_row(row, kVocab)
                                   : sp::sample_row(row, kVocab, params[size_t(r)], seen.data() + size_t(r) * kVocab,
                                                    nullptr, step[size_t(r)]);
        }
      });
    for (std::thread& th : pool) th.join();
  }
  for (int r = 0; r < rows; ++r) {
    if (got[size_t(r)] != want[size_t(r)]) {
      std::fprintf(stderr, "MISMATCH %s rows %d setting '%s' row %d: gpu %d, cpu %d\n", label, rows, set.name, r,
                   got[size_t(r)], want[size_t(r)]);
      std::exit(2);
    }
  }

  // Timing: a graph of kLaunches calls (as a decode step replays it), replayed kReplays times.
  constexpr int kLaunches = 32, kReplays = 5;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  ck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < kLaunches; ++i) launch(nullptr);
  ck(cudaStreamEndCapture(s, &g), "capture end");
  ck(cudaGraphInstantiate(&ge, g, 0), "instantiate");
  ck(cudaGraphLaunch(ge, s), "replay");  // warm
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "event");
  ck(cudaEventCreate(&e1), "event");
  ck(cudaEventRecord(e0, s), "record");
  for (int i = 0; i < kReplays; ++i) ck(cudaGraphLaunch(ge, s), "replay");
  ck(cudaEventRecord(e1, s), "record");
  ck(cudaEventSynchronize(e1), "sync");
  float ms = 0;
  ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
  Result res{};
  res.us = double(ms) * 1000.0 / (kLaunches * kReplays);

  // The phase profile: calls one at a time, each row's rank-0 block stamping its phase ends. A phase
  // the row skipped (no top-k, the argmax) keeps 0 and counts as ending with the one before it.
  if (!argmax) {
    constexpr int kProfiled = 16;
    std::vector<unsigned long long> t(size_t(rows) * kPhases);
    for (int i = 0; i < kProfiled; ++i) {
      ck(cudaMemsetAsync(d_phase, 0, t.size() * 8, s), "memset");
      launch(d_phase);
      ck(cudaMemcpyAsync(t.data(), d_phase, t.size() * 8, cudaMemcpyDeviceToHost, s), "copy phases");
      ck(cudaStreamSynchronize(s), "sync");
      for (int r = 0; r < rows; ++r) {
        const unsigned long long* p = t.data() + size_t(r) * kPhases;
        unsigned long long prev = p[0];
        for (int ph = 1; ph < kPhases - 1; ++ph) {
          const unsigned long long now = p[ph] != 0 ? p[ph] : prev;
          res.phase_ns[ph - 1] += double(now - prev) / (double(kProfiled) * rows);
          prev = now;
        }
      }
    }
  }
  ck(cudaGraphExecDestroy(ge), "destroy");
  ck(cudaGraphDestroy(g), "destroy");
  ck(cudaEventDestroy(e0), "event");
  ck(cudaEventDestroy(e1), "event");
  for (void* p : {(void*)d_params, (void*)d_step, (void*)d_seen, (void*)d_out, (void*)d_phase}) ck(cudaFree(p), "free");
  return res;
}

// One variant (the knobs in this process's environment): prints "R <dtype> <kind> <rows> <setting>|<us>"
// lines for the parent and the phase profile's lines (under the parent's header) for the reader.
int child(const char* variant) {
  cudaStream_t s;
  ck(cudaStreamCreate(&s), "stream");
  ingot::cuda::Scratch ws;
  ws.n_floats = size_t(1) << 20;
  ws.n_counters = 1024;
  ck(cudaMalloc(&ws.floats, ws.n_floats * 4), "malloc");
  ck(cudaMalloc(&ws.counters, ws.n_counters * 4), "malloc");
  ck(cudaMemset(ws.counters, 0, ws.n_counters * 4), "memset");
  std::mt19937_64 rng(16);
  for (const DType dt : {DType::BF16, DType::F32}) {
    const char* dname = dt == DType::BF16 ? "bf16" : "f32";
    for (const bool peaked : {false, true}) {
      const char* kind = peaked ? "peaked" : "flat";
      std::vector<float> host = make_logits(peaked, rng);
      void* d = nullptr;
      if (dt == DType::BF16) {
        std::vector<__nv_bfloat16> b(host.size());
        for (size_t i = 0; i < host.size(); ++i) {
          b[i] = __float2bfloat16(host[i]);
          host[i] = __bfloat162float(b[i]);  // the reference sees the values the GPU sees
        }
        ck(cudaMalloc(&d, b.size() * 2), "malloc");
        ck(cudaMemcpy(d, b.data(), b.size() * 2, cudaMemcpyHostToDevice), "copy");
      } else {
        ck(cudaMalloc(&d, host.size() * 4), "malloc");
        ck(cudaMemcpy(d, host.data(), host.size() * 4, cudaMemcpyHostToDevice), "copy");
      }
      const Mat lg = ingot::mat(d, dt, kMaxRows, kVocab);
      for (const int rows : {1, kMaxRows}) {
        for (const Setting& set : settings()) {
          const std::string label = std::string(variant) + " " + dname + " " + kind;
          const Result r = run_case(lg, host, rows, set, s, ws, label.c_str(), rng);
          if (set.p.temperature >= 0.0f) {
            std::printf("%-10s %-4s %-6s %4d %-28s", variant, dname, kind, rows, set.name);
            double sum = 0;
            for (const double ns : r.phase_ns) {
              std::printf(" %6.1f", ns / 1000.0);
              sum += ns;
            }
            std::printf(" %6.1f\n", sum / 1000.0);
            std::fflush(stdout);
          }
          std::printf("R %s %s %d %s|%.2f\n", dname, kind, rows, set.name, r.us);
        }
      }
      ck(cudaFree(d), "free");
    }
  }
  std::fflush(stdout);
  return 0;
}

struct Variant {
  const char* name;
  std::string env;  // the knobs, as assignments for env(1)
};

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--child") == 0) return child(argv[2]);
  // The library's default (histograms merged by slices from 8 blocks per row on: rows 1 take 16, rows
  // 64 take 4), the slices never and always, the other blocks-per-row plans with and without them,
  // then the passes recomputing keys from the logits (what a vocabulary too big for the key cache
  // gets: the picks of the uncached kernels). Variant names on the command line run just those.
  const std::string s0 = "INGOT_CUDA_SAMPLE_SCATTER=0 ", s1 = "INGOT_CUDA_SAMPLE_SCATTER=1 ",
                    r8 = "INGOT_CUDA_SAMPLE_RANKS=8 ", r16 = "INGOT_CUDA_SAMPLE_RANKS=16 ";
  const std::vector<Variant> variants = {
      {"default", ""},
      {"scatter=0", s0},
      {"scatter=1", s1},
      {"r8,s0", r8 + s0},
      {"r8,s1", r8 + s1},
      {"r16,s0", r16 + s0},
      {"r16,s1", r16 + s1},
      {"nocache", "INGOT_CUDA_SAMPLE_CACHE=0"},
      {"limbs=0", "INGOT_CUDA_SAMPLE_LIMBS=0"},
      {"l0,r8,s1", std::string("INGOT_CUDA_SAMPLE_LIMBS=0 ") + r8 + s1},
  };
  std::vector<Variant> run;
  for (const Variant& v : variants) {
    bool want = argc < 2;
    for (int i = 1; i < argc; ++i) want |= std::strcmp(argv[i], v.name) == 0;
    if (want) run.push_back(v);
  }
  std::vector<std::string> keys;  // case order, from the first variant
  std::map<std::string, std::map<std::string, double>> us;
  std::printf("== phase profile: mean µs per phase of a row's rank-0 block (16 single calls) ==\n");
  std::printf("%-10s %-4s %-6s %4s %-28s", "variant", "type", "logits", "rows", "setting");
  for (const char* n : kPhaseNames) std::printf(" %6s", n);
  std::printf(" %6s\n", "sum");
  std::fflush(stdout);
  for (const Variant& v : run) {
    // The knobs reach the library only through the environment, read once per process.
    const std::string self = "/proc/" + std::to_string(getpid()) + "/exe";
    const std::string cmd = "env " + v.env + " '" + self + "' --child " + v.name;
    FILE* f = popen(cmd.c_str(), "r");
    if (!f) {
      std::perror("popen");
      return 1;
    }
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      if (line[0] == 'R' && line[1] == ' ') {
        std::string l(line + 2);
        while (!l.empty() && l.back() == '\n') l.pop_back();
        const size_t bar = l.rfind('|');
        const std::string key = l.substr(0, bar);
        if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
        us[key][v.name] = std::atof(l.c_str() + bar + 1);
      } else {
        std::fputs(line, stdout);
        std::fflush(stdout);
      }
    }
    const int rc = pclose(f);
    if (rc != 0) {
      std::fprintf(stderr, "variant %s failed (status %d): see above\n", v.name, rc);
      return 1;
    }
  }
  std::printf("\n== µs per call (graph of 32 calls x 5 replays), every pick checked against the CPU ==\n");
  std::printf("%-4s %-6s %4s %-28s", "type", "logits", "rows", "setting");
  for (const Variant& v : run) std::printf(" %9s", v.name);
  std::printf("\n");
  for (const std::string& k : keys) {
    char dt[16], kind[16];
    int rows = 0, used = 0;
    std::sscanf(k.c_str(), "%15s %15s %d %n", dt, kind, &rows, &used);
    std::printf("%-4s %-6s %4d %-28s", dt, kind, rows, k.c_str() + used);
    for (const Variant& v : run) {
      const auto it = us[k].find(v.name);
      if (it == us[k].end()) std::printf(" %9s", "-");
      else std::printf(" %9.1f", it->second);
    }
    std::printf("\n");
  }
  return 0;
}
