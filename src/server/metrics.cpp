#include "server/metrics.h"

#include <cstdio>

namespace ingot::server {

namespace {

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

std::string counter(const std::string& name, const std::string& help, uint64_t v) {
  return "# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " + std::to_string(v) + "\n";
}

std::string gauge(const std::string& name, const std::string& help, int64_t v) {
  return "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " + std::to_string(v) + "\n";
}

}  // namespace

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  return "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n" + series(name, "");
}

std::string Histogram::series(const std::string& name, const std::string& labels) const {
  const std::string sep = labels.empty() ? "" : ",";
  const std::string own = labels.empty() ? "" : "{" + labels + "}";
  std::string out;
  uint64_t running = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    running += counts_[i];
    out += name + "_bucket{" + labels + sep + "le=\"" + num(bounds_[i]) + "\"} " + std::to_string(running) + "\n";
  }
  out += name + "_bucket{" + labels + sep + "le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum" + own + " " + num(sum_) + "\n" + name + "_count" + own + " " + std::to_string(count_) + "\n";
  return out;
}

// Buckets from a fraction of a millisecond (a GPU decode step) to minutes (a long queue).
Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      tpot_({0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1}) {}

void Metrics::count_status(int s) {
  std::lock_guard<std::mutex> l(mu_);
  ++by_status_[s];
}

uint64_t Metrics::status_count(int s) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = by_status_.find(s);
  return it == by_status_.end() ? 0 : it->second;
}

void Metrics::count_finished(const std::string& reason, int64_t prompt, int64_t computed, int64_t generated,
                             double ttft_s, double decode_s) {
  std::lock_guard<std::mutex> l(mu_);
  ++finished_[reason];
  prompt_tokens_ += uint64_t(prompt);
  computed_prompt_tokens_ += uint64_t(computed);
  generated_tokens_ += uint64_t(generated);
  if (generated > 0) ttft_.observe(ttft_s);
  if (generated > 1) tpot_.observe(decode_s / double(generated - 1));
}

void Metrics::count_step(const std::string& kind, double seconds, int64_t decode_rows, int64_t prompt_tokens,
                         double launch_s, double wait_s) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = steps_.find(kind);
  if (it == steps_.end())  // a GPU decode step takes milliseconds, a CPU one or a long prompt's seconds
    it = steps_.emplace(kind, StepKind{Histogram({0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1, 5})})
             .first;
  it->second.seconds.observe(seconds);
  it->second.decode_rows += uint64_t(decode_rows);
  it->second.prompt_tokens += uint64_t(prompt_tokens);
  it->second.launch_s += launch_s;
  it->second.wait_s += wait_s;
}

void Metrics::count_scheduler_overhead(double seconds) {
  std::lock_guard<std::mutex> l(mu_);
  scheduler_overhead_s_ += seconds;
}

std::string Metrics::render(const LoadGauges& g) const {
  std::lock_guard<std::mutex> l(mu_);
  std::string out = "# HELP ingot_requests_total HTTP answers of the /v1 endpoints, by status\n"
                    "# TYPE ingot_requests_total counter\n";
  for (const auto& [s, n] : by_status_) out += "ingot_requests_total{status=\"" + std::to_string(s) + "\"} " + std::to_string(n) + "\n";
  out += "# HELP ingot_generations_total finished generations (one per choice), by stop reason\n"
         "# TYPE ingot_generations_total counter\n";
  for (const auto& [r, n] : finished_) out += "ingot_generations_total{reason=\"" + r + "\"} " + std::to_string(n) + "\n";
  out += counter("ingot_prompt_tokens_total", "prompt tokens of finished generations", prompt_tokens_);
  out += counter("ingot_prompt_tokens_computed_total",
                 "prompt tokens computed (the rest came from a slot's cached prefix)", computed_prompt_tokens_);
  out += counter("ingot_generated_tokens_total", "tokens generated", generated_tokens_);
  out += gauge("ingot_queue_length", "requests waiting for a slot", g.queued);
  out += gauge("ingot_slots_busy", "cache rows running a request", g.slots_busy);
  out += gauge("ingot_slots_total", "cache rows (--slots)", g.slots_total);
  out += gauge("ingot_kv_positions_used", "token positions held in the KV cache (running or kept for prefix reuse)",
               g.kv_positions_used);
  out += gauge("ingot_kv_positions_total", "token positions of the KV cache (slots x capacity)", g.kv_positions_total);
  out += ttft_.render("ingot_time_to_first_token_seconds", "submit to first token, queueing included");
  out += tpot_.render("ingot_time_per_output_token_seconds", "decode time per token after the first, per generation");
  out += "# HELP ingot_step_seconds generator steps by kind (decode: decode rows only; mixed: decode rows and prompt "
         "chunks in one forward; prefill: prompt chunks only), wall time\n# TYPE ingot_step_seconds histogram\n";
  for (const auto& [kind, k] : steps_) out += k.seconds.series("ingot_step_seconds", "kind=\"" + kind + "\"");
  out += "# HELP ingot_step_decode_rows_total decode rows carried by the steps, by kind\n"
         "# TYPE ingot_step_decode_rows_total counter\n";
  for (const auto& [kind, k] : steps_)
    out += "ingot_step_decode_rows_total{kind=\"" + kind + "\"} " + std::to_string(k.decode_rows) + "\n";
  out += "# HELP ingot_step_prompt_tokens_total prompt tokens computed by the steps, by kind\n"
         "# TYPE ingot_step_prompt_tokens_total counter\n";
  for (const auto& [kind, k] : steps_)
    out += "ingot_step_prompt_tokens_total{kind=\"" + kind + "\"} " + std::to_string(k.prompt_tokens) + "\n";
  // Wall time less launch less wait is the host's own work in the step (streaming, stops, bookkeeping):
  // when the wait is near zero the host, not the device, sets the pace.
  out += "# HELP ingot_step_launch_seconds_total step time spent in the model's launch calls, by kind\n"
         "# TYPE ingot_step_launch_seconds_total counter\n";
  for (const auto& [kind, k] : steps_) out += "ingot_step_launch_seconds_total{kind=\"" + kind + "\"} " + num(k.launch_s) + "\n";
  out += "# HELP ingot_step_device_wait_seconds_total step time spent waiting for the device's picks, by kind\n"
         "# TYPE ingot_step_device_wait_seconds_total counter\n";
  for (const auto& [kind, k] : steps_)
    out += "ingot_step_device_wait_seconds_total{kind=\"" + kind + "\"} " + num(k.wait_s) + "\n";
  out += "# HELP ingot_scheduler_overhead_seconds_total scheduler thread time between steps\n"
         "# TYPE ingot_scheduler_overhead_seconds_total counter\n"
         "ingot_scheduler_overhead_seconds_total " + num(scheduler_overhead_s_) + "\n";
  return out;
}

}  // namespace ingot::server
