#include "dist/in_process.h"

#include <cstring>

#include "core/error.h"
#include "dist/reduce.h"

namespace ingot {

class InProcessGroup::Rank final : public Communicator {
 public:
  Rank(InProcessGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return g_.world_; }
  std::string describe() const override { return "threads of one process (rank-order sums)"; }

  void all_reduce_sum(void* buf, int64_t count, DType dtype) override {
    check_reduce_dtype(dtype);
    publish(buf);
    // Every rank sums all contributions itself, in rank order (dist/reduce.h), into its own scratch:
    // the others' buffers are only read until the second barrier, after which each rank overwrites its
    // own with the rounded sum.
    result_.resize(size_t(count) * dtype_size(dtype));
    sum_in_rank_order(g_.published_.data(), g_.world_, count, dtype, result_.data(), sum_, widened_);
    g_.arrive_and_wait();
    if (count > 0) std::memcpy(buf, result_.data(), result_.size());
  }

  void all_gather(const void* send, void* recv, size_t bytes) override {
    publish(send);
    auto* out = static_cast<uint8_t*>(recv);
    for (int r = 0; r < g_.world_; ++r) {
      const void* src = g_.published_[size_t(r)];
      if (src != out + size_t(r) * bytes) std::memcpy(out + size_t(r) * bytes, src, bytes);
    }
    g_.arrive_and_wait();  // the others' send buffers were read; they may change them now
  }

  void barrier() override { g_.arrive_and_wait(); }

 private:
  // Makes `p` this rank's entry of the table and waits until every rank has published its own.
  void publish(const void* p) {
    {
      std::lock_guard<std::mutex> lock(g_.mu_);
      g_.published_[size_t(rank_)] = p;
    }
    g_.arrive_and_wait();
  }
  InProcessGroup& g_;
  int rank_;
  std::vector<float> sum_, widened_;  // scratch of sum_in_rank_order
  std::vector<uint8_t> result_;      // [count] of the dtype: this rank's copy of the rounded sum
};

InProcessGroup::InProcessGroup(int world) : world_(world) {
  if (world < 1 || world > kMaxTensorParallel)
    throw Error("tensor parallel: a group of " + std::to_string(world) + " ranks is outside [1, " +
                std::to_string(kMaxTensorParallel) + "]");
  published_.assign(size_t(world), nullptr);
  for (int r = 0; r < world; ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
}

InProcessGroup::~InProcessGroup() = default;

Communicator& InProcessGroup::comm(int rank) {
  if (rank < 0 || rank >= world_)
    throw Error("tensor parallel: rank " + std::to_string(rank) + " is outside [0, " + std::to_string(world_) + ")");
  return *ranks_[size_t(rank)];
}

void InProcessGroup::arrive_and_wait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) throw GroupStopped(abort_reason_);
  const uint64_t gen = generation_;
  if (++arrived_ == world_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  if (generation_ == gen) throw GroupStopped(abort_reason_);
}

void InProcessGroup::abort(int rank, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return;
  aborted_ = true;
  abort_reason_ = "tensor parallel: rank " + std::to_string(rank) + " failed, so the group stopped: " + why;
  cv_.notify_all();
}

void InProcessGroup::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = false;
  abort_reason_.clear();
  arrived_ = 0;
  std::fill(published_.begin(), published_.end(), nullptr);
}

}  // namespace ingot
