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
  std::string render(const LoadGauges& g) const;
  uint64_t status_count(int http_status) const;  // for tests

 private:
  mutable std::mutex mu_;
  std::map<int, uint64_t> by_status_;
  std::map<std::string, uint64_t> finished_;
  uint64_t prompt_tokens_ = 0, computed_prompt_tokens_ = 0, generated_tokens_ = 0;
  Histogram ttft_, tpot_;
};

}  // namespace ingot::server
