// `ingot serve`: the OpenAI-compatible HTTP server (src/server) over a model loaded by the shared
// loader. Everything that can be refused (flags, the tokenizer, the chat template) is checked before
// the weights are read; then the socket is bound, one line says where it listens, and the server runs
// until SIGINT or SIGTERM, which cancel every request (each still gets its answer) and close it.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "common.h"
#include "core/error.h"
#include "options.h"
#include "runtime/chat.h"
#include "server/server.h"
#include "text_generation.h"

namespace ingot::cli {

namespace {

// An integer flag within [lo, hi]: "--port: must be in [0, 65535] (got 70000)".
CLI::Validator int_range(long long lo, long long hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        long long v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return "'" + s + "' is not an integer";
        if (v < lo || v > hi) return "must be in " + range + " (got " + s + ")";
        return {};
      },
      range, "range");
}

// The model's name in the API: the folder's or file's name.
std::string model_id(const std::string& source) {
  std::filesystem::path p(source);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "dir/" names dir
  std::string n = p.filename().string();
  return n.empty() || n == "." ? "ingot" : n;
}

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// SIGINT and SIGTERM, blocked from the start of the command, before any thread exists (OpenMP's,
// the scheduler's, the HTTP pool's inherit the mask), so no thread dies of them and no handler runs
// at an arbitrary point; StopOnSignal takes them with sigwait.
class BlockStopSignals {
 public:
  BlockStopSignals() {
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~BlockStopSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  sigset_t set;

 private:
  sigset_t old_;
};

// A thread that waits for SIGINT or SIGTERM and stops the server. Made after the server and gone
// before it.
class StopOnSignal {
 public:
  StopOnSignal(const BlockStopSignals& b, server::Server& s) : set_(b.set) {
    thread_ = std::thread([this, &s] {
      int sig = 0;
      sigwait(&set_, &sig);
      if (!done_) {
        std::fprintf(stderr, "ingot serve: %s, stopping\n", sig == SIGINT ? "interrupted" : "terminated");
        s.stop();
      }
    });
  }
  ~StopOnSignal() {
    done_ = true;
    pthread_kill(thread_.native_handle(), SIGTERM);  // wakes sigwait when no signal came
    thread_.join();
  }

 private:
  sigset_t set_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace

void add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat, completions, streaming, metrics, chat page)");
  struct Args {
    ModelArgs model;
    std::string host = "127.0.0.1";
    int port = 8080;
    int slots = 4;
    int64_t capacity = 0;
    int queue = 64;
    std::string api_key;
    std::string chat_template;
    int max_body_mb = 8;
  };
  auto a = std::make_shared<Args>();
  a->model.add_to(*cmd);
  a->model.add_tp_option(*cmd);
  cmd->add_option("--host", a->host, "address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)");
  cmd->add_option("--port", a->port, "TCP port (0 = pick a free one; the line printed at start names it)")
      ->check(int_range(0, 65535));
  cmd->add_option("--slots", a->slots, "requests generated at once (cache rows)")->check(int_range(1, 1024));
  cmd->add_option("--capacity", a->capacity,
                  "tokens per slot, prompt and reply (default: min(4096, max_position_embeddings), or the engine's)")
      ->check(at_least(0));
  cmd->add_option("--queue", a->queue, "requests that may wait for a slot before the server answers 503")
      ->check(int_range(0, 100000));
  cmd->add_option("--api-key", a->api_key, "require the header Authorization: Bearer KEY on every endpoint but / and /health");
  cmd->add_option("--chat-template", a->chat_template, "file with a Jinja chat template to use instead of the model's");
  cmd->add_option("--max-body-mb", a->max_body_mb, "largest request body, in MiB")->check(int_range(1, 1024));
  cmd->callback([a] {
    a->model.check_tp();  // the GPUs --tp N needs, before the tokenizer or any weight is read
    BlockStopSignals blocked;
    if (a->host.empty()) throw Error("serve: --host is empty (127.0.0.1 for this machine only)");
    // Text in and out: the tokenizer and the template are read (and refused) before the weights.
    a->model.load_spec();  // exactly one of --model / --engine
    server::ServedModel sm = [&] {
      try {
        return server::ServedModel(load_tokenizer(a->model));
      } catch (const Error& e) {
        throw Error(std::string("serve: the server takes and returns text, so it needs the model's tokenizer: ") + e.what());
      }
    }();
    if (!a->chat_template.empty()) sm.chat = ChatFormat::from_file(a->chat_template);
    else if (!sm.tokenizer.chat_template().empty()) sm.chat = ChatFormat::from_tokenizer(sm.tokenizer, a->model.source_name());

    RuntimeOptions rt;
    rt.max_batch = a->slots;
    rt.capacity = a->capacity;
    Loaded loaded = load_model(a->model, rt);
    // Ranks as processes (--tp N on the GPU): only rank 0 serves; the others run its Model calls and
    // end with it.
    if (!loaded.model->lead_ranks()) return;
    sm.model = loaded.model.get();
    sm.device = loaded.device;
    for (int64_t e : loaded.engine->spec.eos_ids) sm.eos_ids.push_back(int32_t(e));
    for (int32_t e : sm.tokenizer.eos_ids())
      if (std::find(sm.eos_ids.begin(), sm.eos_ids.end(), e) == sm.eos_ids.end()) sm.eos_ids.push_back(e);
    sm.id = model_id(a->model.source_name());
    const bool has_chat = sm.chat.has_value();
    const std::string id = sm.id, device = sm.device;

    server::ServerOptions so;
    so.host = a->host;
    so.port = a->port;
    so.api_key = a->api_key;
    so.max_queue = size_t(a->queue);
    so.max_body_bytes = size_t(a->max_body_mb) << 20;
    server::Server srv(std::move(sm), so);
    const int port = srv.bind();
    StopOnSignal on_signal(blocked, srv);
    const std::string host = a->host.find(':') != std::string::npos ? "[" + a->host + "]" : a->host;
    std::printf("ingot serve: listening on http://%s:%d (model %s, %d slots x %lld tokens, %s)\n", host.c_str(), port,
                id.c_str(), a->slots, (long long)loaded.model->state().capacity(), device.c_str());
    std::fflush(stdout);
    if (!has_chat)
      std::fprintf(stderr, "warning: %s has no chat template: /v1/chat/completions answers 400 (restart with "
                   "--chat-template FILE); /v1/completions works\n", a->model.source_name().c_str());
    if (loaded.model->state().capacity() > loaded.model->spec().max_position)
      std::fprintf(stderr, "warning: --capacity %lld is more than the model's max_position_embeddings (%lld): no request "
                   "goes past position %lld, so the rest of each slot stays unused\n",
                   (long long)loaded.model->state().capacity(), (long long)loaded.model->spec().max_position,
                   (long long)loaded.model->spec().max_position);
    if (!is_loopback(a->host) && a->api_key.empty())
      std::fprintf(stderr, "warning: listening on %s without --api-key: anyone who reaches this address can use it\n",
                   a->host.c_str());
    srv.run();
    const std::string fatal = srv.fatal_error();
    if (!fatal.empty()) throw Error("serve: stopped: " + fatal);
  });
}

}  // namespace ingot::cli
