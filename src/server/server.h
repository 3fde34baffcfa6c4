// `ingot serve`: the OpenAI-compatible HTTP server over one loaded model. The HTTP layer is cpp-httplib
// (a thread per connection from its pool); generation is the Generator, owned by the Scheduler's one
// thread (server/scheduler.h). Endpoints: POST /v1/chat/completions and /v1/completions (streamed as
// server-sent events or whole), GET /v1/models, /health, /metrics (Prometheus text), /slots, and the
// chat page at /. docs/serve.md describes the parameters and the threading.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/chat.h"
#include "runtime/model.h"
#include "server/request.h"
#include "tokenizer/tokenizer.h"

namespace ingot::server {

// What the server runs: the model (its cache rows are the slots), how text becomes tokens and back.
struct ServedModel {
  explicit ServedModel(tok::Tokenizer t) : tokenizer(std::move(t)) {}
  Model* model = nullptr;  // outlives the server
  tok::Tokenizer tokenizer;
  std::optional<ChatFormat> chat;  // none: /v1/chat/completions answers 400 naming --chat-template
  std::vector<int32_t> eos_ids;    // the checkpoint's and the tokenizer's
  std::string id;                  // the model's name in the API ("model" field, /v1/models)
  std::string device;              // cpu | cuda, shown by /v1/models and the chat page
};

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int port = 8080;                 // 0 = any free port (bind() returns it)
  std::string api_key;             // "" = no authentication
  size_t max_queue = 64;           // choices waiting for a slot before answers are 503
  size_t max_body_bytes = size_t(8) << 20;
  RequestLimits limits;
  int64_t prefill_budget = 0;      // the Generator's prompt tokens per step (0 = a forward's worth)
};

class Server {
 public:
  Server(ServedModel model, ServerOptions options);
  ~Server();  // stop() and the scheduler's thread joined; run() must have returned
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; returns the port (the one picked when options.port is 0). Throws
  // Error naming host and port when it cannot.
  int bind();
  // Serves until stop() (from another thread or a signal handler's thread). Call after bind().
  void run();
  // Cancels every request (each gets its answer), then closes the listener; run() returns.
  void stop();
  bool running() const;
  // After run() returned: why the server stopped itself (its model can run no more: a tensor-parallel
  // rank ended), or empty when stop() was asked.
  std::string fatal_error() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ingot::server
