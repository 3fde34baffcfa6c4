// POST /v1/chat/completions and /v1/completions: a parsed request (server/request.h) becomes a prompt
// (chat template + tokenizer, or token ids), its token budget is fitted to a slot's capacity and the
// model's positions (400 naming the field otherwise), its n choices go to the scheduler as n
// Generator requests sharing one cancel flag, and the answer is either one JSON body or server-sent
// events (`data: {chunk}` per piece, the usage chunk when asked, `data: [DONE]`). A streaming client
// that goes away makes the next write fail; the response's release hook then sets the cancel flag,
// so its slots free within one generator step. A non-streaming client that goes away is noticed by
// polling its socket while the answer is made, with the same effect.
#pragma once
#include <httplib.h>

#include <cstdint>
#include <string>

#include "server/metrics.h"
#include "server/request.h"
#include "server/scheduler.h"
#include "server/server.h"

namespace ingot::server {

class Completions {
 public:
  Completions(const ServedModel& model, Scheduler& scheduler, const ServerOptions& options);
  // Answers the request (throws ApiError for the caller to turn into an error body).
  void handle(Endpoint e, const httplib::Request& req, httplib::Response& res);

  // What a prompt may ask for, from the model's bounds: throws ApiError naming `field` (the prompt's)
  // or max_tokens. Returns the new-token budget (the room left when max_tokens is not given).
  static int64_t fit_tokens(int64_t prompt_len, std::optional<int64_t> max_tokens, int64_t capacity,
                            int64_t max_position, const std::string& field);

 private:
  struct Prepared;
  Prepared prepare(Endpoint e, const httplib::Request& req) const;
  void whole(Prepared& p, const httplib::Request& req, httplib::Response& res);
  void stream(Prepared& p, httplib::Response& res);

  const ServedModel& m_;
  Scheduler& sched_;
  const ServerOptions& opt_;
  int64_t capacity_, max_position_, vocab_;
  bool thinking_;  // the tokenizer knows </think>: split reasoning_content
};

}  // namespace ingot::server
