// One exception type for every user-facing failure. The message names the problem (file, tensor,
// field, limit) so the command line can print it as is and exit non-zero.
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

namespace ingot {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string message) : std::runtime_error(std::move(message)) {}
};

// Throws Error(msg) when cond is false; for checks on user input, never for internal invariants.
inline void require(bool cond, const std::string& msg) {
  if (!cond) throw Error(msg);
}

}  // namespace ingot
