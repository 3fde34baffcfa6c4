#include "server/completions.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>

#include "runtime/state.h"
#include "runtime/text_decoder.h"
#include "server/api_error.h"
#include "server/logprobs_json.h"
#include "server/output.h"

namespace ingot::server {

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

uint64_t random_u64() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

std::string random_hex(int n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  uint64_t bits = 0;
  for (int i = 0; i < n; ++i) {
    if (i % 16 == 0) bits = random_u64();
    s += kHex[bits & 15];
    bits >>= 4;
  }
  return s;
}

int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The prompt leaves the model inside a reasoning block (a template that forces thinking).
bool opens_think(const std::string& prompt) {
  const size_t open = prompt.rfind("<think>");
  const size_t close = prompt.rfind("</think>");
  return open != std::string::npos && (close == std::string::npos || close < open);
}

const char* finish_reason(StopReason r, bool tool_calls) {
  if (tool_calls) return "tool_calls";
  switch (r) {
    case StopReason::Eos:
    case StopReason::StopString: return "stop";
    case StopReason::Length:
    case StopReason::Capacity: return "length";
    default: return "stop";
  }
}

json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", "call_" + random_hex(24)},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = i;
    out.push_back(std::move(c));
  }
  return out;
}

json usage_json(int64_t prompt, int64_t cached, int64_t completion) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

// The answer for a choice that did not end normally.
ApiError failure(const ChoiceEvent& e) {
  if (e.rejected) return ApiError(400, e.result.error, "", "invalid_value");
  if (e.result.stop == StopReason::Cancelled)
    return ApiError(503, "the request was cancelled: the server is shutting down", "", "cancelled", "server_error");
  return ApiError(500, "generation failed: " + e.result.error, "", "generation_failed", "server_error");
}

// The socket of the connection a request came on, or -1. cpp-httplib 0.11 (Debian's) gives a handler
// neither the socket nor is_connection_closed() (0.16 on), so it is found by its addresses: the one
// socket whose local port and peer address and port are the request's (unique among open
// connections). The open descriptors come from /proc/self/fd (a probe of every possible number costs
// two system calls each, tens of thousands per request); once per non-streaming request.
int connection_socket(const httplib::Request& req) {
  std::vector<int> fds;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const std::string name = e.path().filename().string();
    if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos) fds.push_back(std::stoi(name));
  }
  for (int fd : fds) {
    sockaddr_storage peer{}, local{};
    socklen_t pl = sizeof peer, ll = sizeof local;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    auto port_of = [](const sockaddr_storage& a) {
      if (a.ss_family == AF_INET) return int(ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port));
      if (a.ss_family == AF_INET6) return int(ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port));
      return -1;
    };
    char host[INET6_ADDRSTRLEN] = {};
    if (peer.ss_family == AF_INET)
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(peer).sin_addr, host, sizeof host);
    else if (peer.ss_family == AF_INET6)
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(peer).sin6_addr, host, sizeof host);
    if (port_of(peer) == req.remote_port && port_of(local) == req.local_port && req.remote_addr == host) return fd;
  }
  return -1;
}

// Whether the client closed (or reset) the connection: the socket reads as ended or errs. Bytes
// waiting (a pipelined next request) mean it is still there.
bool connection_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) return true;
  char c;
  return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace

struct Completions::Prepared {
  ApiRequest api;
  std::vector<int32_t> prompt;
  int64_t max_new = 0;
  bool starts_in_reasoning = false;
  std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<Channel> channel;
  std::string id;
  int64_t created = now_s();
};

Completions::Completions(const ServedModel& m, Scheduler& s, const ServerOptions& o)
    : m_(m),
      sched_(s),
      opt_(o),
      capacity_(m.model->state().capacity()),
      max_position_(m.model->spec().max_position),
      vocab_(m.model->spec().vocab),
      thinking_(m.tokenizer.piece_to_id("</think>").has_value()) {}

int64_t Completions::fit_tokens(int64_t len, std::optional<int64_t> max_tokens, int64_t capacity, int64_t max_position,
                                const std::string& field) {
  if (len > capacity)
    throw ApiError(400,
                   field + ": the prompt is " + std::to_string(len) + " tokens, more than a slot holds (" +
                       std::to_string(capacity) + " tokens, ingot serve --capacity)",
                   field, "context_length_exceeded");
  if (len > max_position)
    throw ApiError(400,
                   field + ": the prompt is " + std::to_string(len) + " tokens, more than the model's " +
                       "max_position_embeddings (" + std::to_string(max_position) + ")",
                   field, "context_length_exceeded");
  // Both limits count the positions the request writes: the prompt and every new token but the last.
  const int64_t room = std::min(capacity, max_position) - len + 1;
  if (!max_tokens) return room;
  const int64_t need = State::slots_needed(len, *max_tokens);
  if (need > capacity)
    throw ApiError(400,
                   "max_tokens: the prompt's " + std::to_string(len) + " tokens and max_tokens " +
                       std::to_string(*max_tokens) + " need " + std::to_string(need) + " cache positions, more than a slot holds (" +
                       std::to_string(capacity) + "); at most " + std::to_string(capacity - len + 1) + " new tokens fit",
                   "max_tokens", "context_length_exceeded");
  if (std::string w = position_limit_warning(max_position, len, *max_tokens); !w.empty())
    throw ApiError(400, "max_tokens: " + w, "max_tokens", "context_length_exceeded");
  return *max_tokens;
}

Completions::Prepared Completions::prepare(Endpoint e, const httplib::Request& req) const {
  Prepared p;
  p.api = parse_request(e, req.body, opt_.limits);
  const ApiRequest& a = p.api;
  if (!a.model.empty() && a.model != m_.id)
    throw ApiError(404, "model: '" + a.model + "' does not exist; this server runs '" + m_.id + "' (GET /v1/models)",
                   "model", "model_not_found");
  std::string field = "prompt";
  if (e == Endpoint::Chat) {
    field = "messages";
    if (!m_.chat)
      throw ApiError(400, "messages: this model has no chat template; restart ingot serve with --chat-template FILE, "
                          "or send a prompt to /v1/completions", "messages", "no_chat_template");
    ChatOptions co;
    co.enable_thinking = a.enable_thinking;
    co.tools = a.tools;
    std::string text;
    try {
      text = m_.chat->render(m_.tokenizer, a.messages, co);
    } catch (const std::exception& ex) {
      throw ApiError(400, std::string("messages: the chat template refused them: ") + ex.what(), "messages",
                     "template_error");
    }
    p.prompt = m_.tokenizer.encode(text, false);
    p.starts_in_reasoning = thinking_ && opens_think(text);
  } else if (a.prompt_is_ids) {
    for (size_t i = 0; i < a.prompt_ids.size(); ++i) {
      if (a.prompt_ids[i] >= vocab_)
        throw bad_field("prompt[" + std::to_string(i) + "]", "token id " + std::to_string(a.prompt_ids[i]) +
                                                                 " is outside the vocabulary of " + std::to_string(vocab_));
      p.prompt.push_back(int32_t(a.prompt_ids[i]));
    }
  } else {
    p.prompt = m_.tokenizer.encode(a.prompt_text, true);
  }
  if (p.prompt.empty()) throw bad_field(field, "becomes no tokens");
  p.max_new = fit_tokens(int64_t(p.prompt.size()), a.max_tokens, capacity_, max_position_, field);
  p.id = (e == Endpoint::Chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
  return p;
}

void Completions::handle(Endpoint e, const httplib::Request& req, httplib::Response& res) {
  Prepared p = prepare(e, req);
  const ApiRequest& a = p.api;
  // Each choice is its own request (its own slot); sampled ones draw from seed, seed + 1, ...
  const uint64_t seed = a.seed_given ? a.sampling.seed : random_u64();
  std::vector<Request> choices;
  for (int i = 0; i < a.n; ++i) {
    Request q;
    q.prompt = p.prompt;
    q.max_new_tokens = int(p.max_new);
    q.sampling = a.sampling;
    q.sampling.seed = seed + uint64_t(i);
    q.logprobs = a.logprobs;
    if (!a.ignore_eos) q.eos_ids = m_.eos_ids;
    q.stop = a.stop;
    q.text = text_decoder(m_.tokenizer);
    q.cancel = p.cancel;
    choices.push_back(std::move(q));
  }
  p.channel = sched_.submit(std::move(choices));
  if (!p.channel) {
    res.set_header("Retry-After", "1");
    throw ApiError(503,
                   "the server is busy: no room in the queue for " + std::to_string(a.n) + " more request(s) (the limit is " +
                       std::to_string(opt_.max_queue) + " waiting, ingot serve --queue); retry later",
                   "", "server_busy", "server_error");
  }
  if (a.stream) stream(p, res);
  else whole(p, req, res);
}

void Completions::whole(Prepared& p, const httplib::Request& req, httplib::Response& res) {
  const ApiRequest& a = p.api;
  std::vector<ChoiceEvent> done(size_t(a.n));
  int left = a.n;
  // Every generated token wakes this loop (the channel gets its text), so a client that leaves is
  // noticed within a step of the generator; the short timeout covers a request still queued.
  const int fd = connection_socket(req);
  bool gone = false;
  while (left > 0) {
    for (ChoiceEvent& e : p.channel->take(100ms))
      if (e.done) {
        done[size_t(e.choice)] = std::move(e);
        --left;
      }
    if (!gone && connection_closed(fd)) {
      gone = true;
      p.cancel->store(true);  // the generator frees the slots at its next step; the loop waits for that
    }
  }
  if (gone)
    throw ApiError(499, "the client closed the connection before the answer was ready", "", "client_closed",
                   "server_error");
  for (const ChoiceEvent& e : done)
    if (e.rejected || e.result.stop == StopReason::Error || e.result.stop == StopReason::Cancelled) throw failure(e);
  const bool chat = a.endpoint == Endpoint::Chat;
  json choices = json::array();
  int64_t completion = 0;
  for (int i = 0; i < a.n; ++i) {
    const Completion& c = done[size_t(i)].result;
    completion += int64_t(c.ids.size());
    json logprobs;  // null unless asked
    if (a.logprobs >= 0 && !chat) {
      int64_t offset = 0;
      logprobs = completion_logprobs(m_.tokenizer, c.ids, c.logprobs, offset);
    } else if (a.logprobs >= 0) {
      logprobs = {{"content", chat_logprobs(m_.tokenizer, c.ids, c.logprobs)}, {"refusal", nullptr}};
    }
    if (!chat) {
      choices.push_back({{"index", i}, {"text", c.text}, {"logprobs", logprobs}, {"finish_reason", finish_reason(c.stop, false)}});
      continue;
    }
    OutputParser parser(thinking_, p.starts_in_reasoning, a.tools);
    TextDelta d = parser.push(c.text);
    TextDelta rest = parser.finish();
    d.reasoning += rest.reasoning;
    d.content += rest.content;
    const bool tools = !parser.tool_calls().empty();
    json msg = {{"role", "assistant"}, {"content", tools && d.content.empty() ? json() : json(d.content)}};
    if (!d.reasoning.empty()) msg["reasoning_content"] = d.reasoning;
    if (tools) msg["tool_calls"] = tool_calls_json(parser.tool_calls(), false);
    choices.push_back({{"index", i}, {"message", msg}, {"logprobs", logprobs}, {"finish_reason", finish_reason(c.stop, tools)}});
  }
  const Completion& first = done[0].result;
  json body = {{"id", p.id},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", p.created},
               {"model", m_.id},
               {"choices", choices},
               {"usage", usage_json(first.prompt_tokens, first.prompt_tokens - first.computed_prompt_tokens, completion)}};
  res.status = 200;
  res.set_content(dump_json(body), "application/json");
}

namespace {

// What one streaming response has sent so far; shared by the content provider's calls.
struct StreamState {
  const tok::Tokenizer* tokenizer = nullptr;
  bool logprobs = false;  // the request asked for log-probabilities
  std::shared_ptr<Channel> channel;
  std::shared_ptr<std::atomic<bool>> cancel;
  bool chat = true, include_usage = false;
  std::string id, model;
  int64_t created = 0;
  int n = 1;
  std::vector<OutputParser> parsers;
  std::vector<bool> started;  // the role chunk went out
  // Per choice: tokens whose log-probabilities have not gone out yet (they ride on the next chunk of
  // that choice, so text held back by a stop string or a character split over tokens delays them
  // too), and the completions' text_offset so far.
  std::vector<std::vector<int32_t>> pending_ids;
  std::vector<std::vector<TokenLogprob>> pending_lps;
  std::vector<int64_t> offsets;
  int left = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();

  json chunk(json choice) const {
    json c = {{"id", id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({std::move(choice)})}};
    if (include_usage) c["usage"] = nullptr;
    return c;
  }
  // The pending log-probabilities of choice i in its endpoint's shape (null when not asked), and
  // nothing pending afterwards.
  json take_logprobs(int i) {
    if (!logprobs) return nullptr;
    auto& ids = pending_ids[size_t(i)];
    auto& lps = pending_lps[size_t(i)];
    json out = chat ? json{{"content", chat_logprobs(*tokenizer, ids, lps)}, {"refusal", nullptr}}
                    : completion_logprobs(*tokenizer, ids, lps, offsets[size_t(i)]);
    ids.clear();
    lps.clear();
    return out;
  }
  json delta_choice(int i, json delta, const char* finish, json logprobs = nullptr) const {
    if (!chat) return {{"index", i}, {"text", delta.value("content", "")}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish ? json(finish) : json()}};
    return {{"index", i}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish ? json(finish) : json()}};
  }
  // The SSE lines of one event.
  std::string lines(ChoiceEvent& e) {
    std::string out;
    auto send = [&](const json& j) { out += "data: " + dump_json(j) + "\n\n"; };
    const int i = e.choice;
    OutputParser& parser = parsers[size_t(i)];
    auto send_delta = [&](const TextDelta& d) {
      if (chat && !started[size_t(i)]) {
        started[size_t(i)] = true;
        send(chunk(delta_choice(i, {{"role", "assistant"}, {"content", ""}}, nullptr)));
      }
      if (!d.reasoning.empty()) send(chunk(delta_choice(i, {{"reasoning_content", d.reasoning}}, nullptr, take_logprobs(i))));
      if (!d.content.empty()) send(chunk(delta_choice(i, {{"content", d.content}}, nullptr, take_logprobs(i))));
    };
    if (!e.done) {
      if (logprobs && e.token >= 0) {
        pending_ids[size_t(i)].push_back(e.token);
        pending_lps[size_t(i)].push_back(std::move(e.logprob));
      }
      send_delta(parser.push(e.text));
      return out;
    }
    --left;
    const Completion& c = e.result;
    if (e.rejected || c.stop == StopReason::Error || c.stop == StopReason::Cancelled) {
      send(failure(e).body());
      return out;
    }
    send_delta(parser.finish());
    if (chat && !started[size_t(i)]) send_delta(TextDelta{});  // the role chunk, even for an empty reply
    const bool tools = !parser.tool_calls().empty();
    if (tools) send(chunk(delta_choice(i, {{"tool_calls", tool_calls_json(parser.tool_calls(), true)}}, nullptr)));
    // What is still pending (an eos token, text cut by a stop string) goes with the last chunk.
    const bool any = logprobs && !pending_ids[size_t(i)].empty();
    send(chunk(delta_choice(i, json::object(), finish_reason(c.stop, tools), any ? take_logprobs(i) : json())));
    prompt_tokens = c.prompt_tokens;
    cached_tokens = c.prompt_tokens - c.computed_prompt_tokens;
    completion_tokens += int64_t(c.ids.size());
    return out;
  }
};

}  // namespace

void Completions::stream(Prepared& p, httplib::Response& res) {
  auto st = std::make_shared<StreamState>();
  st->channel = p.channel;
  st->cancel = p.cancel;
  st->chat = p.api.endpoint == Endpoint::Chat;
  st->include_usage = p.api.include_usage;
  st->id = p.id;
  st->model = m_.id;
  st->created = p.created;
  st->n = st->left = p.api.n;
  for (int i = 0; i < p.api.n; ++i) st->parsers.emplace_back(thinking_, p.starts_in_reasoning, p.api.tools);
  st->started.assign(size_t(p.api.n), false);
  st->tokenizer = &m_.tokenizer;
  st->logprobs = p.api.logprobs >= 0;
  st->pending_ids.resize(size_t(p.api.n));
  st->pending_lps.resize(size_t(p.api.n));
  st->offsets.assign(size_t(p.api.n), 0);
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) {
        std::string out;
        for (ChoiceEvent& e : st->channel->take(250ms)) out += st->lines(e);
        const auto now = std::chrono::steady_clock::now();
        // A comment line now and then: a client that left is noticed while the request still waits.
        if (out.empty() && now - st->last_write > 2s) out = ": waiting\n\n";
        if (st->left == 0) {
          if (st->include_usage) {
            json u = st->chunk(json());
            u["choices"] = json::array();
            u["usage"] = usage_json(st->prompt_tokens, st->cached_tokens, st->completion_tokens);
            out += "data: " + dump_json(u) + "\n\n";
          }
          out += "data: [DONE]\n\n";
        }
        if (!out.empty()) {
          if (!sink.write(out.data(), out.size())) return false;  // the client left: the releaser cancels
          st->last_write = now;
        }
        if (st->left == 0) sink.done();
        return true;
      },
      // Runs when the response ends, whether or not it was all written: a request still running
      // belongs to a client that is gone.
      [st](bool) { st->cancel->store(true); });
}

}  // namespace ingot::server
