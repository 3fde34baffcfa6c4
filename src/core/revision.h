// The source revision this build was configured from (`git describe --always --dirty`, or "unknown"
// outside a git checkout), defined in a source CMake generates at configure time.
#pragma once

namespace ingot {
const char* git_revision();
}  // namespace ingot
