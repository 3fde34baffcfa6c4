// The server's counters and histograms, rendered as Prometheus text at /metrics. Written by the HTTP
// threads (answers by status) and the scheduler thread (finished requests, tokens, latencies), read by
// /metrics: one mutex, since every update is a few additions.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ingot::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Prometheus text lines of `name` (cumulative buckets, sum, count).
  std::string render(const std::string& name, const std::string& help) const;
  // The same lines without the HELP and TYPE header, each series carrying `labels` (`kind="decode"`).
  std::string series(const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, the last one +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// What the scheduler reports about the generator after each step.
struct LoadGauges {
  int64_t queued = 0;           // requests waiting for a slot
  int64_t slots_busy = 0;
  int64_t slots_total = 0;
  int64_t kv_positions_used = 0;   // token positions the cache rows hold (busy or kept for reuse)
  int64_t kv_positions_total = 0;  // slots x capacity
};

class Metrics {
 public:
  Metrics();
  void count_status(int http_status);          // every answer of the /v1 endpoints
  // A finished generation (one choice): why it stopped, its tokens and latencies.
  void count_finished(const std::string& reason, int64_t prompt_tokens, int64_t computed_prompt_tokens,
                      int64_t generated, double ttft_s, double decode_s);
  // One generator step: its kind (what the one forward carried: "decode" rows only, "mixed" decode
  // rows and prompt chunks, "prefill" prompt chunks only), wall time (host work included), decode rows
  // and prompt tokens. How a server's time splits between steps that mix prompts in and those that do
  // not is what its throughput against `ingot bench` comes down to.
  // One generator step of this kind (decode | mixed | prefill): its wall time, of which launch_s in
  // the model's launch calls and wait_s waiting for the device (StepStats).
  void count_step(const std::string& kind, double seconds, int64_t decode_rows, int64_t prompt_tokens,
                  double launch_s = 0, double wait_s = 0);
  // Time the scheduler thread spent between steps (taking requests in, publishing the gauges).
  void count_scheduler_overhead(double seconds);
  std::string render(const LoadGauges& g) const;
  uint64_t status_count(int http_status) const;  // for tests

 private:
  mutable std::mutex mu_;
  std::map<int, uint64_t> by_status_;
  std::map<std::string, uint64_t> finished_;
  uint64_t prompt_tokens_ = 0, computed_prompt_tokens_ = 0, generated_tokens_ = 0;
  Histogram ttft_, tpot_;
  struct StepKind {
    Histogram seconds;
    uint64_t decode_rows = 0, prompt_tokens = 0;
    double launch_s = 0, wait_s = 0;
  };
  std::map<std::string, StepKind> steps_;
  double scheduler_overhead_s_ = 0;
};

}  // namespace ingot::server
