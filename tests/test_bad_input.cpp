// The bad-input suite: the built `ingot` binary run over the cases in tests/data/bad_input/*.json,
// as a new user would run it. Each case asserts the exit code, the key words of the message, that the
// process ended by itself (no signal, no sanitizer report, within its time limit) and that no input
// changed: every file its setup left in the case's folder is hashed before and after, and only the
// paths the case names under "writes" may differ or appear. The case format is described in
// tests/data/bad_input/README.md.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "test_helpers.h"

namespace ingot::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Case {
  std::string file;  // the case file it came from
  std::string name;
  json spec;
  std::string load_error;  // a case file that cannot be read becomes one failing case
};

// gtest names a failing parameter by this instead of dumping its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.file << ": " << c.name; }

const std::string kSrc = INGOT_SOURCE_DIR;

std::string tokenizer_cache() {
  const char* c = std::getenv("INGOT_CACHE");
  return (c && *c ? std::string(c) : kSrc + "/.cache") + "/tokenizers";
}

std::vector<Case> load_cases() {
  std::vector<Case> out;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kSrc + "/tests/data/bad_input"))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    const std::string stem = f.stem().string();
    try {
      std::ifstream in(f);
      json arr = json::parse(in);
      if (!arr.is_array()) throw std::runtime_error("not a JSON array");
      for (const json& c : arr) {
        const std::string n = c.at("name").get<std::string>();
        for (char ch : n)
          if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_')
            throw std::runtime_error("case name '" + n + "' must be [A-Za-z0-9_]");
        out.push_back({f.filename().string(), stem + "_" + n, c, ""});
      }
    } catch (const std::exception& e) {
      out.push_back({f.filename().string(), stem + "_unreadable", json(), e.what()});
    }
  }
  return out;
}

// Every regular file under dir, by relative path, with its content hash.
std::map<std::string, uint64_t> snapshot(const fs::path& dir) {
  std::map<std::string, uint64_t> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    out[fs::relative(e.path(), dir).string()] = XXH64(bytes.data(), bytes.size(), 0);
  }
  return out;
}

struct Vars {
  std::vector<std::pair<std::string, std::string>> kv;  // longest names first, so $DEMO_TOK wins over $DEMO
  std::string expand(std::string s) const {
    for (const auto& [k, v] : kv)
      for (size_t at = 0; (at = s.find("$" + k, at)) != std::string::npos; at += v.size()) s.replace(at, k.size() + 1, v);
    return s;
  }
};

struct ProcessResult {
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
  double seconds = 0;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Runs argv in `cwd` with stdin from `stdin_text`, stdout/stderr to files beside (not inside) cwd.
ProcessResult run_process(const std::vector<std::string>& argv, const fs::path& cwd, const fs::path& io_dir,
                const std::string& stdin_text, double timeout_s, const std::vector<std::string>& env) {
  const fs::path in_p = io_dir / "stdin", out_p = io_dir / "stdout", err_p = io_dir / "stderr";
  std::ofstream(in_p, std::ios::binary) << stdin_text;
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    if (chdir(cwd.c_str()) != 0) _exit(126);
    int fi = open(in_p.c_str(), O_RDONLY), fo = open(out_p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644),
        fe = open(err_p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fi, 0);
    dup2(fo, 1);
    dup2(fe, 2);
    for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> a;
    for (const std::string& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  ProcessResult r;
  int status = 0;
  for (;;) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      r.timed_out = true;
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = slurp(out_p);
  r.err = slurp(err_p);
  return r;
}

class BadInput : public ::testing::TestWithParam<Case> {
 protected:
  // One runnable text model shared by the cases: the demo model with the Llama 2 tokenizer, as
  // `make demo` lays it out. Made once per process, never handed to a case to write into.
  static std::string demo_tok() {
    static TempDir dir;
    static const bool ready = [] {
      for (const auto& e : fs::directory_iterator(kSrc + "/models/demo")) fs::copy(e.path(), dir.file(e.path().filename()));
      for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
        if (fs::exists(tokenizer_cache() + "/llama2/" + f)) fs::copy(tokenizer_cache() + "/llama2/" + f, dir.file(f));
      return true;
    }();
    (void)ready;
    return dir.str();
  }
};

TEST_P(BadInput, Case) {
  const Case& c = GetParam();
  ASSERT_TRUE(c.load_error.empty()) << c.file << ": " << c.load_error;
  const json& s = c.spec;
  const std::string all = s.dump();
  if ((all.find("$TOK") != std::string::npos || all.find("$DEMO_TOK") != std::string::npos) &&
      !fs::exists(tokenizer_cache() + "/llama2/tokenizer.json"))
    GTEST_SKIP() << "tokenizer files not fetched (scripts/fetch-tokenizers)";

  TempDir io;  // stdin/stdout/stderr of the run, outside the case's folder
  TempDir tmp;
  Vars v;
  v.kv = {{"DEMO_TOK", all.find("$DEMO_TOK") != std::string::npos ? demo_tok() : ""},
          {"INGOT", INGOT_BINARY},
          {"DEMO", kSrc + "/models/demo"},
          {"FIX", kSrc + "/tests/data/models"},
          {"SRC", kSrc},
          {"TMP", tmp.str()},
          {"TOK", tokenizer_cache()}};
  std::vector<std::string> env;
  for (const auto& [k, val] : v.kv) env.push_back(k + "=" + val);

  if (s.contains("setup")) {
    ProcessResult setup = run_process({"/bin/bash", "-c", s["setup"].get<std::string>()}, tmp.str(), io.str(), "", 60, env);
    ASSERT_EQ(setup.exit_code, 0) << "setup failed: " << setup.err << setup.out;
  }
  std::vector<std::string> argv{INGOT_BINARY};
  for (const json& a : s.at("args")) argv.push_back(v.expand(a.get<std::string>()));
  std::set<std::string> writes;
  for (const json& w : s.value("writes", json::array()))
    writes.insert(fs::relative(fs::path(v.expand(w.get<std::string>())), tmp.str()).string());

  const auto before = snapshot(tmp.str());
  // Sanitizer builds run several times slower; their CI pass scales every limit.
  const char* scale = std::getenv("INGOT_TEST_TIMEOUT_SCALE");
  const double timeout = s.value("timeout", 30.0) * (scale && std::atof(scale) > 0 ? std::atof(scale) : 1.0);
  ProcessResult r = run_process(argv, tmp.str(), io.str(), v.expand(s.value("stdin", std::string())), timeout, {});
  const std::string output = r.out + r.err;
  std::ostringstream cmd;
  for (const std::string& a : argv) cmd << a << ' ';
  SCOPED_TRACE(c.file + ": " + cmd.str() + "\n--- output ---\n" + output.substr(0, 4000));

  ASSERT_FALSE(r.timed_out) << "did not finish within " << timeout << " s";
  ASSERT_EQ(r.signal, 0) << "killed by signal " << r.signal;
  EXPECT_EQ(r.exit_code, s.value("exit", 1)) << "after " << r.seconds << " s";
  for (const json& f : s.value("expect", json::array()))
    EXPECT_NE(output.find(v.expand(f.get<std::string>())), std::string::npos) << "output lacks '" << f.get<std::string>() << "'";
  std::vector<std::string> reject{"terminate called", "Aborted", "AddressSanitizer", "runtime error:", "Segmentation fault"};
  for (const json& f : s.value("reject", json::array())) reject.push_back(v.expand(f.get<std::string>()));
  for (const std::string& f : reject) EXPECT_EQ(output.find(f), std::string::npos) << "output contains '" << f << "'";

  const auto after = snapshot(tmp.str());
  for (const auto& [path, hash] : before) {
    if (writes.count(path)) continue;
    auto it = after.find(path);
    if (it == after.end()) ADD_FAILURE() << "input " << path << " was removed";
    else EXPECT_EQ(it->second, hash) << "input " << path << " was changed";
  }
  for (const auto& [path, hash] : after)
    if (!before.count(path) && !writes.count(path)) ADD_FAILURE() << "unexpected file " << path << " was left behind";
}

INSTANTIATE_TEST_SUITE_P(Suite, BadInput, ::testing::ValuesIn(load_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace ingot::test
