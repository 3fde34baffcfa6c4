// How much host memory is free: what the CPU backend reports as its available memory and what memory
// plans are checked against before a build or a run takes host memory.
#pragma once
#include <cstddef>
#include <optional>

namespace ingot {

// Host memory the kernel could hand out now without swapping (MemAvailable of /proc/meminfo);
// unknown where the file is absent.
std::optional<size_t> host_available_bytes();

}  // namespace ingot
