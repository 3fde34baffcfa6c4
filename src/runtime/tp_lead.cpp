// Ranks as processes driven by rank 0 (runtime/tp_lead.h): the calls' wire form, their broadcast over
// the process group, and Model::lead_ranks / follow.
#include "runtime/tp_lead.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <type_traits>

#include "core/error.h"
#include "dist/in_process.h"  // GroupStopped
#include "runtime/tp_group.h"

namespace ingot {

namespace tp_call {

namespace {

static_assert(std::is_trivially_copyable_v<SamplingParams>);

const char* call_name(Call c) {
  switch (c) {
    case Call::End: return "end";
    case Call::SetSampling: return "set_sampling";
    case Call::Forward: return "forward";
    case Call::ForwardRanks: return "forward_ranks";
    case Call::LaunchDecode: return "launch_decode";
    case Call::LaunchForward: return "launch_forward";
    case Call::FinishLaunch: return "finish_launch";
    case Call::DecodeLogprobs: return "decode_logprobs";
  }
  return "an unknown call";
}

class Writer {
 public:
  explicit Writer(Call c) { b_ = {0, uint8_t(c)}; }
  template <typename T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put(&v, sizeof v);
  }
  template <typename T>
  void vec(std::span<const T> v) {
    pod(uint64_t(v.size()));
    put(v.data(), v.size_bytes());
  }
  void batch(const Batch& b) {
    pod(uint64_t(b.rows.size()));
    for (const BatchRow& r : b.rows) {
      pod(int32_t(r.row));
      vec<int32_t>(r.tokens);
      pod(r.write_index);
      vec<int64_t>(r.positions);
      pod(uint8_t(r.all_logits));
      pod(uint8_t(r.wants_output));
    }
  }
  std::vector<uint8_t> done() { return std::move(b_); }

 private:
  void put(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = b_.size();
    b_.resize(at + n);
    std::memcpy(b_.data() + at, p, n);
  }
  std::vector<uint8_t> b_;
};

}  // namespace

std::vector<uint8_t> bare(Call c) { return Writer(c).done(); }

std::vector<uint8_t> set_sampling(int row, const SamplingParams& p, std::span<const int32_t> history, uint32_t draws,
                                  std::span<const int32_t> generated) {
  Writer w(Call::SetSampling);
  w.pod(int32_t(row));
  w.pod(p);
  w.vec(history);
  w.pod(draws);
  w.vec(generated);
  return w.done();
}

std::vector<uint8_t> forward(Call c, const Batch& batch) {
  Writer w(c);
  w.batch(batch);
  return w.done();
}

std::vector<uint8_t> launch_decode(const std::vector<int>& rows, const std::vector<int32_t>& tokens,
                                   const std::vector<int64_t>& write_index, const std::vector<int32_t>& feed) {
  static_assert(sizeof(int) == sizeof(int32_t));
  Writer w(Call::LaunchDecode);
  w.vec<int32_t>(std::span<const int32_t>(reinterpret_cast<const int32_t*>(rows.data()), rows.size()));
  w.vec<int32_t>(tokens);
  w.vec<int64_t>(write_index);
  w.vec<int32_t>(feed);
  return w.done();
}

std::vector<uint8_t> launch_forward(const Batch& batch, const std::vector<int32_t>& feed) {
  Writer w(Call::LaunchForward);
  w.batch(batch);
  w.vec<int32_t>(feed);
  return w.done();
}

std::vector<uint8_t> decode_logprobs(int top_n) {
  Writer w(Call::DecodeLogprobs);
  w.pod(int32_t(top_n));
  return w.done();
}

void Reader::take(void* out, size_t n) {
  if (n > msg_.size() - at_)
    throw WireError("tensor parallel: rank 0's " + std::string(call_name(msg_.size() > 1 ? Call(msg_[1]) : Call::End)) +
                " message ends after " + std::to_string(msg_.size()) + " bytes, inside a field");
  std::memcpy(out, msg_.data() + at_, n);
  at_ += n;
}

bool Reader::leader_failed() {
  uint8_t v = 0;
  take(&v, 1);
  return v != 0;
}

Call Reader::call() {
  uint8_t v = 0;
  take(&v, 1);
  if (v < uint8_t(Call::End) || v > uint8_t(Call::Last))
    throw WireError("tensor parallel: rank 0 sent call " + std::to_string(v) + ", which this build does not know");
  return Call(v);
}

int32_t Reader::i32() {
  int32_t v = 0;
  take(&v, sizeof v);
  return v;
}
uint32_t Reader::u32() {
  uint32_t v = 0;
  take(&v, sizeof v);
  return v;
}
int64_t Reader::i64() {
  int64_t v = 0;
  take(&v, sizeof v);
  return v;
}
SamplingParams Reader::sampling() {
  SamplingParams p;
  take(&p, sizeof p);
  return p;
}

template <typename T>
std::vector<T> Reader::values() {
  uint64_t n = 0;
  take(&n, sizeof n);
  if (n > (msg_.size() - at_) / sizeof(T))
    throw WireError("tensor parallel: rank 0's message claims " + std::to_string(n) + " values past its end");
  std::vector<T> v(static_cast<size_t>(n));
  take(v.data(), v.size() * sizeof(T));
  return v;
}

std::vector<int32_t> Reader::ints() { return values<int32_t>(); }
std::vector<int64_t> Reader::longs() { return values<int64_t>(); }

Batch Reader::batch() {
  uint64_t n = 0;
  take(&n, sizeof n);
  if (n > msg_.size() - at_) throw WireError("tensor parallel: rank 0's batch claims " + std::to_string(n) + " rows past its end");
  Batch b;
  b.rows.resize(static_cast<size_t>(n));
  for (BatchRow& r : b.rows) {
    r.row = i32();
    r.tokens = ints();
    r.write_index = i64();
    r.positions = longs();
    uint8_t f = 0;
    take(&f, 1);
    r.all_logits = f != 0;
    take(&f, 1);
    r.wants_output = f != 0;
  }
  return b;
}

void Reader::end() const {
  if (at_ != msg_.size())
    throw WireError("tensor parallel: rank 0's message has " + std::to_string(msg_.size() - at_) + " bytes past its fields");
}

std::vector<uint8_t> broadcast(Communicator& host, const std::vector<uint8_t>& msg) {
  // One all-gather of a fixed slot per rank carries the size and the first bytes, which is the whole of
  // a decode step's calls (a few bytes a row); a longer call (a prompt) sends the rest in a second.
  constexpr size_t kSlot = 1024, kHead = sizeof(uint64_t), kInline = kSlot - kHead;
  const int rank = host.rank(), world = host.world();
  std::vector<uint8_t> slots(kSlot * size_t(world), 0);
  if (rank == 0) {
    const uint64_t n = msg.size();
    std::memcpy(slots.data(), &n, kHead);
    std::memcpy(slots.data() + kHead, msg.data(), std::min<size_t>(msg.size(), kInline));
  }
  host.all_gather(slots.data() + size_t(rank) * kSlot, slots.data(), kSlot);
  uint64_t n = 0;
  std::memcpy(&n, slots.data(), kHead);
  if (n == 0) throw WireError("tensor parallel: rank 0 sent an empty call");
  if (n > (uint64_t(1) << 34)) throw WireError("tensor parallel: rank 0 sent a call of " + std::to_string(n) + " bytes");
  std::vector<uint8_t> out(static_cast<size_t>(n));
  std::memcpy(out.data(), slots.data() + kHead, std::min<size_t>(out.size(), kInline));
  if (out.size() > kInline) {
    const size_t rest = out.size() - kInline;
    std::vector<uint8_t> all(rest * size_t(world), 0);
    if (rank == 0) std::memcpy(all.data(), msg.data() + kInline, rest);
    host.all_gather(all.data() + size_t(rank) * rest, all.data(), rest);
    std::memcpy(out.data() + kInline, all.data(), rest);
  }
  return out;
}

}  // namespace tp_call

bool Model::lead_ranks() {
  if (!group_ || !group_->processes()) return true;
  if (group_->process_rank() == 0) {
    leading_ = true;
    return true;
  }
  follow();
  return false;
}

void Model::send_call(std::vector<uint8_t> msg) {
  msg[0] = lead_failed_ ? 1 : 0;
  lead_failed_ = false;
  tp_call::broadcast(*group_->host_comm(), msg);
}

void Model::end_lead() noexcept {
  if (!leading_) return;
  leading_ = false;
  try {
    std::vector<uint8_t> end = tp_call::bare(tp_call::Call::End);
    end[0] = lead_failed_ ? 1 : 0;
    tp_call::broadcast(*group_->host_comm(), end);
  } catch (...) {
    // The group is gone (a rank failed, or this process is unwinding from that): the others have been
    // told by the group itself, and a destructor has nobody to report to.
  }
}

void Model::follow() {
  using tp_call::Call;
  Communicator& host = *group_->host_comm();
  const std::string me = "tensor parallel rank " + std::to_string(group_->process_rank());
  // A call that failed here is fine only where it failed on rank 0 as well (the checks of a call are
  // the same on every rank: a malformed request refused by the server); rank 0's next message says.
  std::string failed;
  for (;;) {
    const std::vector<uint8_t> msg = tp_call::broadcast(host, {});
    tp_call::Reader r(msg);
    const bool leader_failed = r.leader_failed();
    if (!failed.empty() && !leader_failed)
      throw Error(me + ": a call failed here and not on rank 0: " + failed);
    if (failed.empty() && leader_failed)
      throw Error(me + ": a call failed on rank 0 and not here (the ranks' states may differ now)");
    failed.clear();
    const Call c = r.call();
    if (c == Call::End) return r.end();
    try {
      switch (c) {
        case Call::SetSampling: {
          const int row = r.i32();
          const SamplingParams p = r.sampling();
          const std::vector<int32_t> history = r.ints();
          const uint32_t draws = r.u32();
          const std::vector<int32_t> generated = r.ints();
          r.end();
          set_sampling(row, p, history, draws, generated);
          break;
        }
        case Call::Forward:
        case Call::ForwardRanks: {
          const Batch b = r.batch();
          r.end();
          if (c == Call::Forward) forward(b);
          else forward_ranks(b);
          break;
        }
        case Call::LaunchDecode: {
          const std::vector<int32_t> rows = r.ints(), tokens = r.ints();
          const std::vector<int64_t> at = r.longs();
          const std::vector<int32_t> feed = r.ints();
          r.end();
          launch_decode(std::vector<int>(rows.begin(), rows.end()), tokens, at, feed);
          break;
        }
        case Call::LaunchForward: {
          const Batch b = r.batch();
          const std::vector<int32_t> feed = r.ints();
          r.end();
          launch_forward(b, feed);
          break;
        }
        case Call::FinishLaunch:
          r.end();
          finish_launch();
          break;
        case Call::DecodeLogprobs: {
          const int top_n = r.i32();
          r.end();
          decode_logprobs(top_n);  // its collective, if any (the gather of a split pick's logits)
          break;
        }
        case Call::End: break;
      }
    } catch (const GroupStopped&) {
      throw;
    } catch (const tp_call::WireError&) {
      throw;
    } catch (const Error& e) {
      failed = e.what();
    }
  }
}

}  // namespace ingot
