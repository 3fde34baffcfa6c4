// The HTTP side of `ingot serve`: routes, authentication, the body limit, and the one place where any
// failure of a handler becomes an OpenAI-shaped error answer (see server.h).
#include "server/server.h"

#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "core/error.h"
#include "runtime/generator.h"
#include "server/api_error.h"
#include "server/completions.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "server/web_page.h"

namespace ingot::server {

namespace {

using json = nlohmann::json;

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump_json(e.body()), "application/json");
}

// Compares in time independent of where the strings differ, so the key cannot be guessed byte by byte.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= uint8_t(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

bool is_api_path(const std::string& path) { return path.rfind("/v1/", 0) == 0; }

}  // namespace

struct Server::Impl {
  ServedModel m;
  ServerOptions o;
  Metrics metrics;
  Generator gen;
  // Why the server stopped itself (the model's ranks stopped), for the command to report; empty otherwise.
  std::mutex fatal_mu;
  std::string fatal;
  Scheduler sched;
  Completions completions;
  httplib::Server http;
  int port = -1;
  int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch()).count();

  Impl(ServedModel model, ServerOptions opt)
      : m(std::move(model)),
        o(std::move(opt)),
        gen(*m.model, GeneratorOptions{o.prefill_budget}),
        sched(gen, metrics, o.max_queue, m.model->state().capacity(),
              [this](const std::string& why) {
                // A model that can run no more cannot serve: every request in flight has its error;
                // the server stops taking more, and the command ends with the reason.
                {
                  std::lock_guard<std::mutex> l(fatal_mu);
                  fatal = why;
                }
                stop();
              }),
        completions(m, sched, o) {
    routes();
  }

  // Requests first, so every waiting handler gets its answer; then the listener.
  void stop() {
    sched.close();
    http.stop();
  }

  // Runs a handler; whatever it throws becomes the error answer.
  template <typename Fn>
  void guarded(httplib::Response& res, Fn&& fn) {
    try {
      fn();
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::bad_alloc&) {
      send_error(res, ApiError(500, "out of host memory while answering the request", "", "out_of_memory", "server_error"));
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, std::string("internal error: ") + e.what(), "", "internal_error", "server_error"));
    }
  }

  json model_json() const {
    return {{"id", m.id},
            {"object", "model"},
            {"created", created},
            {"owned_by", "ingot"},
            {"meta", {{"slots", gen.slots()}, {"capacity", m.model->state().capacity()}, {"device", m.device},
                      {"vocab", m.model->spec().vocab}, {"max_position_embeddings", m.model->spec().max_position},
                      {"chat_template", m.chat.has_value()}}}};
  }

  void routes() {
    // Enough threads that every request the queue admits has one while it waits or streams, plus
    // some for /health, /metrics and /slots; at most 1024 (beyond, connections wait in httplib's
    // own queue for a thread).
    const size_t threads = std::min<size_t>(size_t(gen.slots()) + o.max_queue + 8, 1024);
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http.set_payload_max_length(o.max_body_bytes);
    http.set_read_timeout(30, 0);
    http.set_write_timeout(30, 0);

    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (o.api_key.empty() || req.path == "/" || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
      const std::string h = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      if (h.rfind(prefix, 0) == 0 && same_secret(h.substr(prefix.size()), o.api_key))
        return httplib::Server::HandlerResponse::Unhandled;
      res.set_header("WWW-Authenticate", "Bearer");
      send_error(res, ApiError(401,
                               h.empty() ? "missing API key: send the header Authorization: Bearer KEY"
                                         : "invalid API key in the Authorization header",
                               "", "invalid_api_key", "authentication_error"));
      return httplib::Server::HandlerResponse::Handled;
    });

    // Answers httplib makes itself (no route, body over the limit, a request it cannot read) get the
    // OpenAI shape too.
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 404)
        send_error(res, ApiError(404, "no endpoint " + req.method + " " + req.path, "", "unknown_endpoint"));
      else if (res.status == 413)
        send_error(res, ApiError(413, "the request body is larger than the limit of " + std::to_string(o.max_body_bytes) +
                                          " bytes", "", "request_too_large"));
      else if (res.status == 405)
        send_error(res, ApiError(405, "method " + req.method + " is not allowed on " + req.path, "", "method_not_allowed"));
      else
        send_error(res, ApiError(res.status, "the HTTP request could not be read (status " + std::to_string(res.status) + ")",
                                 "", "bad_request"));
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown exception";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, ApiError(500, "internal error: " + what, "", "internal_error", "server_error"));
    });
    // Counted before the answer is written (the post-routing hook runs then, the logger only after the
    // client has it), so a client that reads /metrics right after an answer sees it counted.
    http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (is_api_path(req.path)) metrics.count_status(res.status);
    });

    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(kIndexHtml.data(), kIndexHtml.size(), "text/html; charset=utf-8");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(dump_json({{"status", "ok"}, {"slots_idle", gen.slots() - sched.gauges().slots_busy}}),
                      "application/json");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(dump_json({{"object", "list"}, {"data", json::array({model_json()})}}), "application/json");
    });
    http.Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] {
        if (req.matches[1] != m.id)
          throw ApiError(404, "model: '" + std::string(req.matches[1]) + "' does not exist; this server runs '" + m.id + "'",
                         "model", "model_not_found");
        res.set_content(dump_json(model_json()), "application/json");
      });
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] { completions.handle(Endpoint::Chat, req, res); });
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] { completions.handle(Endpoint::Completion, req, res); });
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics.render(sched.gauges()), "text/plain; version=0.0.4; charset=utf-8");
    });
    http.Get("/slots", [this](const httplib::Request&, httplib::Response& res) {
      json out = json::array();
      for (const SlotView& s : sched.slots()) {
        json j = {{"id", s.slot}, {"busy", s.info.busy}, {"cached_tokens", s.info.cached}};
        if (s.info.busy) {
          j["request"] = s.info.request;
          j["prompt_tokens"] = s.info.prompt_tokens;
          j["generated_tokens"] = s.info.generated;
        }
        out.push_back(std::move(j));
      }
      res.set_content(dump_json(out), "application/json");
    });
  }
};

Server::Server(ServedModel model, ServerOptions options) {
  if (!model.model) throw Error("serve: no model");
  // A client that closes its connection mid-answer makes the next write raise SIGPIPE, whose default
  // action would end the whole server; the failed write is handled instead.
  ::signal(SIGPIPE, SIG_IGN);
  impl_ = std::make_unique<Impl>(std::move(model), std::move(options));
}

Server::~Server() {
  if (impl_) stop();
}

int Server::bind() {
  Impl& im = *impl_;
  if (im.o.port < 0 || im.o.port > 65535)
    throw Error("serve: --port " + std::to_string(im.o.port) + " is outside [0, 65535]");
  if (im.o.port == 0) {
    im.port = im.http.bind_to_any_port(im.o.host);
  } else {
    im.port = im.http.bind_to_port(im.o.host, im.o.port) ? im.o.port : -1;
  }
  if (im.port < 0)
    throw Error("serve: cannot listen on " + im.o.host + ":" + std::to_string(im.o.port) +
                " (the address is not local, or the port is in use or needs privileges)");
  return im.port;
}

void Server::run() {
  if (impl_->port < 0) throw Error("serve: run() before bind()");
  impl_->http.listen_after_bind();
}

void Server::stop() { impl_->stop(); }

bool Server::running() const { return impl_->http.is_running(); }

std::string Server::fatal_error() const {
  std::lock_guard<std::mutex> l(impl_->fatal_mu);
  return impl_->fatal;
}

}  // namespace ingot::server
