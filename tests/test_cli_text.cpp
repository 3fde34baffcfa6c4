// The text commands as a user sees them with stdout and stderr on one pipe (`ingot generate ... 2>&1 |
// cat`, or a terminal): the generated text ends its own line and the statistics line, written to stderr
// after stdout is flushed, starts a line of its own. Runs the built binary on the demo model with the
// Llama 2 tokenizer, as `make demo` lays it out.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "test_helpers.h"

namespace ingot {
namespace {
namespace fs = std::filesystem;

std::string tokenizer_dir() {
  const char* c = std::getenv("INGOT_CACHE");
  return (c && *c ? std::string(c) : std::string(INGOT_SOURCE_DIR) + "/.cache") + "/tokenizers/llama2";
}

// stdout and stderr of `ingot <args>` through one pipe, as `2>&1 | cat` gives them.
std::string run_piped(const std::string& args) {
  const std::string cmd = std::string("'") + INGOT_BINARY + "' " + args + " 2>&1 </dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "popen failed";
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  ::pclose(p);
  return out;
}

TEST(CliText, StatisticsLineStartsItsOwnLineInAPipe) {
  if (!fs::exists(tokenizer_dir() + "/tokenizer.json"))
    GTEST_SKIP() << "Llama 2 tokenizer not fetched (run scripts/fetch-tokenizers; make test does)";
  test::TempDir dir;
  const fs::path m = dir.file("m");
  fs::copy(std::string(INGOT_SOURCE_DIR) + "/models/demo", m);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy(tokenizer_dir() + "/" + f, m / f);
  const std::string args = "generate --model '" + m.string() + "' --prompt 'Once upon a time,' --device cpu ";
  for (const char* n : {"5", "40"}) {  // 40 tokens run into the text's own newlines
    const std::string out = run_piped(args + "--max-new-tokens " + n);
    const size_t at = out.find("[prompt ");
    ASSERT_NE(at, std::string::npos) << out;
    EXPECT_GT(at, 0u) << out;                   // the text came first
    EXPECT_EQ(out[at - 1], '\n') << out;        // the line starts a line
    EXPECT_EQ(out.find("\n\n[prompt "), std::string::npos) << out;  // and no blank line was added before it
    EXPECT_EQ(out.back(), '\n') << out;
  }
}

}  // namespace
}  // namespace ingot
