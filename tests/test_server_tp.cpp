// `ingot serve --tp 2` (CPU, the in-process group) against `--tp 1` and against an engine directory
// from `ingot build --tp 2`: the built binary started as a user would, on the qwen3 fixture with the
// byte-level test tokenizer (tests/data/api), greedy completions compared token for token.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "test_helpers.h"

namespace ingot::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A folder of the qwen3 fixture with the test tokenizer and its chat template.
std::string text_model(TempDir& d) {
  const fs::path folder = d.file("model");
  fs::create_directories(folder);
  for (const auto& e : fs::directory_iterator(fixture("qwen3")))
    if (e.path().filename() != "reference.safetensors") fs::copy(e.path(), folder / e.path().filename());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy(std::string(INGOT_SOURCE_DIR) + "/tests/data/api/" + f, folder / f);
  return folder.string();
}

// `ingot serve ARGS --port 0` in a child process, its output in a file; stopped (SIGTERM) when destroyed.
class Serve {
 public:
  // env: "NAME=VALUE" entries set in the server's environment.
  Serve(const std::vector<std::string>& args, const std::string& log, const std::vector<std::string>& env = {})
      : log_(log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      for (const std::string& e : env) {
        const size_t eq = e.find('=');
        ::setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1);
      }
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<std::string> all = {INGOT_BINARY, "serve", "--port", "0", "--device", "cpu", "--threads", "2", "--slots", "1"};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (std::string& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    // The port from the line the server prints once it listens.
    const std::regex re("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    for (int i = 0; i < 1000 && port_ == 0; ++i) {
      std::ifstream in(log);
      std::stringstream ss;
      ss << in.rdbuf();
      std::smatch m;
      const std::string text = ss.str();
      if (std::regex_search(text, m, re)) port_ = std::stoi(m[1]);
      else if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      } else std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~Serve() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // Waits up to `seconds` for the server to end by itself; its exit status, or -1 if it did not.
  int wait_exit(int seconds) {
    for (int i = 0; i < seconds * 50 && pid_ > 0; ++i) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return st;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  std::string log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// The greedy completion of `prompt` and the chat reply to it, as text.
std::pair<std::string, std::string> complete(const Serve& s, const std::string& prompt) {
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(120, 0);
  auto r = c.Post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}}.dump(),
                  "application/json");
  EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer") << s.log();
  auto ch = c.Post("/v1/chat/completions",
                   json{{"messages", {{{"role", "user"}, {"content", prompt}}}}, {"max_tokens", 8}, {"temperature", 0}}.dump(),
                   "application/json");
  EXPECT_TRUE(ch && ch->status == 200) << (ch ? ch->body : "no answer") << s.log();
  if (!r || !ch || r->status != 200 || ch->status != 200) return {};
  return {json::parse(r->body)["choices"][0]["text"], json::parse(ch->body)["choices"][0]["message"]["content"]};
}

TEST(ServerTp, Tp2AndAnEngineDirectoryAnswerAsTp1) {
  TempDir d;
  const std::string model = text_model(d), dir = d.file("e");
  const std::string build = std::string(INGOT_BINARY) + " build --quiet --model " + model + " --tp 2 -o " + dir + " > /dev/null";
  ASSERT_EQ(std::system(build.c_str()), 0) << build;
  std::vector<std::pair<std::string, std::string>> answers;
  const std::vector<std::vector<std::string>> runs = {
      {"--model", model}, {"--model", model, "--tp", "2"}, {"--engine", dir}, {"--engine", dir, "--tp", "2"}};
  for (const auto& args : runs) {
    Serve s(args, d.file("serve" + std::to_string(answers.size()) + ".log"));  // a fresh log: no earlier port
    ASSERT_GT(s.port(), 0) << s.log();
    answers.push_back(complete(s, "Hi there"));
  }
  // Ranks as processes, as on the GPU: only rank 0 serves and leads the other (Model::lead_ranks).
  for (const auto& args : {runs[1], runs[2]}) {
    Serve s(args, d.file("serve" + std::to_string(answers.size()) + ".log"), {"INGOT_TP_PROCESSES=1"});
    ASSERT_GT(s.port(), 0) << s.log();
    answers.push_back(complete(s, "Hi there"));
    answers.push_back(complete(s, "Hi there"));  // the same again: the rows reused, the ranks still in step
  }
  EXPECT_FALSE(answers[0].first.empty());
  for (size_t i = 1; i < answers.size(); ++i) {
    EXPECT_EQ(answers[i].first, answers[0].first) << "run " << i;
    EXPECT_EQ(answers[i].second, answers[0].second) << "run " << i;
  }
}

// Ranks as processes: a worker that dies fails the request in flight with an error naming it, and the
// server, whose model can run no more, stops and exits non-zero saying why (instead of answering
// every later request with the same error).
TEST(ServerTp, ARankThatDiesStopsTheServer) {
  TempDir d;
  const std::string model = text_model(d);
  Serve s({"--model", model, "--tp", "2"}, d.file("serve.log"), {"INGOT_TP_PROCESSES=1"});
  ASSERT_GT(s.port(), 0) << s.log();
  const auto first = complete(s, "Hi there");
  EXPECT_FALSE(first.first.empty()) << s.log();
  // Rank 1: the server's child process.
  pid_t worker = -1;
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::ifstream stat(e.path() / "stat");
    std::string pid, comm, state;
    pid_t ppid = 0;
    if (stat >> pid >> comm >> state >> ppid && ppid == s.pid()) worker = pid_t(std::stoi(pid));
  }
  ASSERT_GT(worker, 0) << "no worker process under the server";
  ASSERT_EQ(::kill(worker, SIGKILL), 0);
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(60, 0);
  auto r = c.Post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 4}, {"temperature", 0}}.dump(),
                  "application/json");
  if (r) {  // the server may already be gone; if it answered, the answer names the rank
    EXPECT_EQ(r->status, 500) << r->body;
    EXPECT_NE(r->body.find("rank 1"), std::string::npos) << r->body;
  }
  const int st = s.wait_exit(30);
  ASSERT_NE(st, -1) << "the server did not stop:\n" << s.log();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << st;
  EXPECT_NE(s.log().find("serve: stopped: tensor parallel: rank 1"), std::string::npos) << s.log();
}

}  // namespace
}  // namespace ingot::test
