#include "core/host_memory.h"

#include <fstream>
#include <sstream>
#include <string>

namespace ingot {

std::optional<size_t> host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    unsigned long long kb = 0;
    std::string unit;
    if (in >> kb >> unit && unit == "kB") return size_t(kb) * 1024;
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace ingot
