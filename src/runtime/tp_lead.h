// Ranks as processes driven by rank 0 (Model::lead_ranks, runtime/model.h): for commands whose input
// reaches rank 0 alone (`serve`'s HTTP requests, `chat`'s terminal), rank 0 sends each Model call that
// the ranks must run together to the other processes before running it; they run the same call on
// their slices. These are the calls' wire form: [rank 0's previous call failed: u8][Call: u8][fields],
// fields as host-order bytes (the processes are one build on one host). Nothing here is a file format.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/model.h"
#include "runtime/sampler.h"

namespace ingot::tp_call {

enum class Call : uint8_t {
  End = 1,
  SetSampling,
  Forward,
  ForwardRanks,
  LaunchDecode,
  LaunchForward,
  FinishLaunch,
  DecodeLogprobs,
  Last = DecodeLogprobs
};

// The messages rank 0 sends (byte 0, whether its previous call failed, is filled in when sent).
std::vector<uint8_t> bare(Call c);  // End, FinishLaunch
std::vector<uint8_t> set_sampling(int row, const SamplingParams& p, std::span<const int32_t> history, uint32_t draws,
                                  std::span<const int32_t> generated);
std::vector<uint8_t> forward(Call c, const Batch& batch);  // Forward, ForwardRanks
std::vector<uint8_t> launch_decode(const std::vector<int>& rows, const std::vector<int32_t>& tokens,
                                   const std::vector<int64_t>& write_index, const std::vector<int32_t>& feed);
std::vector<uint8_t> launch_forward(const Batch& batch, const std::vector<int32_t>& feed);
std::vector<uint8_t> decode_logprobs(int top_n);

// A message that does not read as one (a bug, not a user's input): fatal to the rank that reads it.
struct WireError : Error {
  using Error::Error;
};

// A received message, read field by field in the order written; a message shorter than its fields or
// with bytes left over is refused (an Error naming the call), never read past.
class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& msg) : msg_(msg) {}
  bool leader_failed();  // byte 0
  Call call();           // byte 1
  int32_t i32();
  uint32_t u32();
  int64_t i64();
  SamplingParams sampling();
  std::vector<int32_t> ints();
  std::vector<int64_t> longs();
  Batch batch();
  void end() const;  // every byte was read

 private:
  void take(void* out, size_t n);
  template <typename T>
  std::vector<T> values();  // a count, then that many values
  const std::vector<uint8_t>& msg_;
  size_t at_ = 0;
};

// rank 0's msg to every rank of `host` (a collective: rank 0 passes its message, the others anything),
// returned on every rank: one all-gather for a call of up to 1016 bytes, two for a longer one.
std::vector<uint8_t> broadcast(Communicator& host, const std::vector<uint8_t>& msg);

}  // namespace ingot::tp_call
