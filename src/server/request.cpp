#include "server/request.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include "server/api_error.h"

namespace ingot::server {

namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

std::string bound(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// Nesting deeper than the limit is refused before parsing: the parser is iterative, but the chat
// template walks what it gets recursively.
void check_depth(std::string_view body, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > max_depth)
        throw ApiError(400, "the request body nests JSON deeper than " + std::to_string(max_depth) + " levels", "",
                       "invalid_json");
    } else if (c == '}' || c == ']') --depth;
  }
}

double number(const json& v, const std::string& field) {
  if (!v.is_number()) throw bad_field(field, "must be a number (got " + shown(v) + ")", "invalid_type");
  return v.get<double>();
}

double number_in(const json& v, const std::string& field, double lo, double hi, bool lo_open = false) {
  const double x = number(v, field);
  if (!std::isfinite(x) || x > hi || x < lo || (lo_open && x == lo))
    throw bad_field(field, "must be in " + std::string(lo_open ? "(" : "[") + bound(lo) + ", " + bound(hi) +
                               "] (got " + shown(v) + ")");
  return x;
}

int64_t integer(const json& v, const std::string& field) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) throw bad_field(field, "is too large (got " + shown(v) + ")");
    return int64_t(u);
  }
  // 2.0 is an integer to JavaScript clients.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return int64_t(d);
  }
  throw bad_field(field, "must be an integer (got " + shown(v) + ")", "invalid_type");
}

int64_t integer_in(const json& v, const std::string& field, int64_t lo, int64_t hi) {
  const int64_t x = integer(v, field);
  if (x < lo || x > hi)
    throw bad_field(field, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "] (got " + shown(v) + ")");
  return x;
}

bool boolean(const json& v, const std::string& field) {
  if (!v.is_boolean()) throw bad_field(field, "must be true or false (got " + shown(v) + ")", "invalid_type");
  return v.get<bool>();
}

// Message content: a string, null (an assistant turn with tool calls), or a list of text parts,
// joined into one string since the templates ingot renders take text.
ojson content_of(const json& c, const std::string& field, bool may_be_null) {
  if (c.is_string()) return c;
  if (c.is_null()) {
    if (!may_be_null) throw bad_field(field, "must be a string or a list of text parts (got null)", "invalid_type");
    return c;
  }
  if (!c.is_array()) throw bad_field(field, "must be a string or a list of text parts (got " + shown(c) + ")", "invalid_type");
  std::string text;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string f = field + "[" + std::to_string(i) + "]";
    const json& part = c[i];
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw bad_field(f, "must be an object with a \"type\"", "invalid_type");
    const std::string type = part["type"].get<std::string>();
    if (type != "text") throw unsupported(f + ".type", "'" + type + "' parts: this server takes text only");
    if (!part.contains("text") || !part["text"].is_string()) throw bad_field(f + ".text", "must be a string", "invalid_type");
    text += part["text"].get<std::string>();
  }
  return text;
}

ojson parse_messages(const json& v) {
  if (!v.is_array()) throw bad_field("messages", "must be a list of messages (got " + shown(v) + ")", "invalid_type");
  if (v.empty()) throw bad_field("messages", "must hold at least one message");
  static const std::set<std::string> roles{"system", "developer", "user", "assistant", "tool"};
  ojson out = ojson::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string f = "messages[" + std::to_string(i) + "]";
    const json& m = v[i];
    if (!m.is_object()) throw bad_field(f, "must be an object with a role and content (got " + shown(m) + ")", "invalid_type");
    if (!m.contains("role") || !m["role"].is_string()) throw bad_field(f + ".role", "must be a string", "invalid_type");
    const std::string role = m["role"].get<std::string>();
    if (!roles.count(role))
      throw bad_field(f + ".role", "must be system, developer, user, assistant or tool (got '" + role + "')");
    ojson msg = ojson::object();
    // Templates know "system"; "developer" is OpenAI's newer name for it.
    msg["role"] = role == "developer" ? "system" : role;
    const bool has_calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
    if (!m.contains("content") && !(role == "assistant" && has_calls)) throw bad_field(f + ".content", "is missing");
    msg["content"] = content_of(m.value("content", json()), f + ".content", role == "assistant");
    for (const auto& [k, val] : m.items()) {
      if (k == "role" || k == "content") continue;
      if (k == "name" || k == "tool_call_id") {
        if (!val.is_string()) throw bad_field(f + "." + k, "must be a string", "invalid_type");
        msg[k] = val;
      } else if (k == "tool_calls") {
        if (val.is_null()) continue;
        if (role != "assistant") throw bad_field(f + ".tool_calls", "only assistant messages carry tool calls");
        if (!val.is_array()) throw bad_field(f + ".tool_calls", "must be a list", "invalid_type");
        ojson calls = ojson::array();
        for (size_t j = 0; j < val.size(); ++j) {
          const std::string cf = f + ".tool_calls[" + std::to_string(j) + "]";
          const json& c = val[j];
          if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
            throw bad_field(cf, "must be an object with a \"function\"", "invalid_type");
          const json& fn = c["function"];
          if (!fn.contains("name") || !fn["name"].is_string())
            throw bad_field(cf + ".function.name", "must be a string", "invalid_type");
          // Templates read the arguments as a mapping (Qwen's also take a string): pass an object
          // when the string holds one.
          ojson args = fn.value("arguments", json::object());
          if (args.is_string()) {
            ojson parsed = ojson::parse(args.get<std::string>(), nullptr, false);
            if (!parsed.is_discarded() && parsed.is_object()) args = parsed;
          }
          ojson call = {{"type", "function"}, {"function", {{"name", fn["name"]}, {"arguments", args}}}};
          if (c.contains("id") && c["id"].is_string()) call["id"] = c["id"];
          calls.push_back(call);
        }
        msg["tool_calls"] = calls;
      } else if (k == "reasoning_content") {
        if (!val.is_string() && !val.is_null()) throw bad_field(f + ".reasoning_content", "must be a string", "invalid_type");
        if (val.is_string()) msg[k] = val;
      } else if (k == "refusal" || k == "audio") {
        // Fields the SDKs echo back from an earlier response: carry no text a template reads.
      } else {
        throw bad_field(f + "." + k, "is not a message field ingot knows", "unknown_parameter");
      }
    }
    out.push_back(msg);
  }
  return out;
}

ojson parse_tools(const json& v) {
  if (v.is_null()) return ojson();
  if (!v.is_array()) throw bad_field("tools", "must be a list of tool definitions (got " + shown(v) + ")", "invalid_type");
  ojson out = ojson::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string f = "tools[" + std::to_string(i) + "]";
    const json& t = v[i];
    if (!t.is_object() || t.value("type", json()) != "function" || !t.contains("function") || !t["function"].is_object())
      throw bad_field(f, "must be {\"type\": \"function\", \"function\": {...}}", "invalid_type");
    if (!t["function"].contains("name") || !t["function"]["name"].is_string())
      throw bad_field(f + ".function.name", "must be a string", "invalid_type");
    out.push_back(ojson::parse(t.dump()));
  }
  return out.empty() ? ojson() : out;
}

void parse_prompt(const json& v, ApiRequest& r) {
  if (v.is_string()) {
    r.prompt_text = v.get<std::string>();
    if (r.prompt_text.empty()) throw bad_field("prompt", "is empty");
    return;
  }
  if (!v.is_array() || v.empty())
    throw bad_field("prompt", "must be a string or a non-empty list of token ids (got " + shown(v) + ")", "invalid_type");
  if (v.size() == 1 && v[0].is_string()) return parse_prompt(v[0], r);
  if (v[0].is_string()) throw unsupported("prompt", "a list of several prompts; send one request per prompt");
  if (v[0].is_array()) throw unsupported("prompt", "a list of token id lists; send one request per prompt");
  r.prompt_is_ids = true;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string f = "prompt[" + std::to_string(i) + "]";
    r.prompt_ids.push_back(integer_in(v[i], f, 0, std::numeric_limits<int32_t>::max()));
  }
}

void parse_stop(const json& v, ApiRequest& r, const RequestLimits& lim) {
  if (v.is_null()) return;
  std::vector<std::string> out;
  auto add = [&](const json& s, const std::string& f) {
    if (!s.is_string()) throw bad_field(f, "must be a string (got " + shown(s) + ")", "invalid_type");
    std::string t = s.get<std::string>();
    if (t.empty()) throw bad_field(f, "is empty (an empty stop string would stop before any text)");
    if (t.size() > lim.max_stop_bytes)
      throw bad_field(f, "is " + std::to_string(t.size()) + " bytes, more than the limit of " + std::to_string(lim.max_stop_bytes));
    out.push_back(std::move(t));
  };
  if (v.is_string()) add(v, "stop");
  else if (v.is_array()) {
    if (v.size() > lim.max_stop)
      throw bad_field("stop", "holds " + std::to_string(v.size()) + " strings, more than the limit of " + std::to_string(lim.max_stop));
    for (size_t i = 0; i < v.size(); ++i) add(v[i], "stop[" + std::to_string(i) + "]");
  } else {
    throw bad_field("stop", "must be a string or a list of strings (got " + shown(v) + ")", "invalid_type");
  }
  r.stop = std::move(out);
}

}  // namespace

ApiRequest parse_request(Endpoint e, std::string_view body, const RequestLimits& lim) {
  check_depth(body, lim.max_depth);
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& ex) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + ex.what(), "", "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object (got " + shown(j) + ")", "", "invalid_json");

  ApiRequest r;
  r.endpoint = e;
  r.sampling.temperature = 1.0f;
  const bool chat = e == Endpoint::Chat;
  std::optional<int64_t> max_tokens, max_completion_tokens;
  bool logprobs = false;               // chat's logprobs
  std::optional<int> top_logprobs;     // chat's top_logprobs
  for (const auto& [k, v] : j.items()) {
    if (k == "model") {
      if (!v.is_string()) throw bad_field("model", "must be a string", "invalid_type");
      r.model = v.get<std::string>();
    } else if (k == "messages" && chat) {
      r.messages = parse_messages(v);
    } else if (k == "prompt" && !chat) {
      parse_prompt(v, r);
    } else if (v.is_null()) {
      continue;  // every optional field below may be null, meaning its default
    } else if (k == "max_tokens") {
      max_tokens = integer_in(v, k, 1, std::numeric_limits<int32_t>::max());
    } else if (k == "max_completion_tokens" && chat) {
      max_completion_tokens = integer_in(v, k, 1, std::numeric_limits<int32_t>::max());
    } else if (k == "stop") {
      parse_stop(v, r, lim);
    } else if (k == "temperature") {
      r.sampling.temperature = float(number_in(v, k, 0, 2));
    } else if (k == "top_p") {
      r.sampling.top_p = float(number_in(v, k, 0, 1, true));
    } else if (k == "top_k") {
      const int64_t t = integer_in(v, k, -1, std::numeric_limits<int32_t>::max());
      r.sampling.top_k = t < 0 ? 0 : int(t);  // -1 = off, as vLLM reads it
    } else if (k == "min_p") {
      const double p = number_in(v, k, 0, 1);
      if (p >= 1) throw bad_field(k, "must be in [0, 1) (got " + shown(v) + ")");
      r.sampling.min_p = float(p);
    } else if (k == "repetition_penalty") {
      const double p = number(v, k);
      if (!std::isfinite(p) || p <= 0 || p > 10) throw bad_field(k, "must be in (0, 10] (got " + shown(v) + ")");
      r.sampling.repetition_penalty = float(p);
    } else if (k == "frequency_penalty") {
      r.sampling.frequency_penalty = float(number_in(v, k, -2, 2));
    } else if (k == "presence_penalty") {
      r.sampling.presence_penalty = float(number_in(v, k, -2, 2));
    } else if (k == "seed") {
      r.sampling.seed = uint64_t(integer(v, k));
      r.seed_given = true;
    } else if (k == "n") {
      r.n = int(integer_in(v, k, 1, lim.max_n));
    } else if (k == "stream") {
      r.stream = boolean(v, k);
    } else if (k == "stream_options") {
      if (!v.is_object()) throw bad_field(k, "must be an object (got " + shown(v) + ")", "invalid_type");
      for (const auto& [sk, sv] : v.items()) {
        if (sk != "include_usage") throw bad_field(k + "." + sk, "is not a stream option ingot knows", "unknown_parameter");
        if (!sv.is_null()) r.include_usage = boolean(sv, k + ".include_usage");
      }
    } else if (k == "logprobs") {
      // chat: a boolean (the alternatives come from top_logprobs); completions: the number of
      // alternatives, at most 5 as OpenAI's legacy API allows.
      if (chat) logprobs = boolean(v, k);
      else r.logprobs = int(integer_in(v, k, 0, 5));
    } else if (k == "top_logprobs" && chat) {
      top_logprobs = int(integer_in(v, k, 0, 20));
    } else if (k == "logit_bias") {
      if (!v.is_object()) throw bad_field(k, "must be an object", "invalid_type");
      if (!v.empty()) throw unsupported(k, "the sampler has no per-token bias");
    } else if (k == "ignore_eos") {
      r.ignore_eos = boolean(v, k);
    } else if (k == "user" || k == "metadata" || k == "store" || k == "service_tier" ||
               (chat && k == "parallel_tool_calls")) {
      // Bookkeeping fields that change nothing about the tokens generated.
    } else if (k == "response_format" && chat) {
      if (!v.is_object() || v.value("type", json()) != "text")
        throw unsupported(k, "only {\"type\": \"text\"}; constrained decoding does not exist in ingot");
    } else if (k == "tools" && chat) {
      r.tools = parse_tools(v);
    } else if (k == "tool_choice" && chat) {
      if (v != "auto" && v != "none")
        throw unsupported(k, "only \"auto\" and \"none\"; forcing a tool needs constrained decoding");
      if (v == "none") r.tools = ojson();  // and stays so, whichever field came first
    } else if (k == "chat_template_kwargs" && chat) {
      if (!v.is_object()) throw bad_field(k, "must be an object", "invalid_type");
      for (const auto& [ck, cv] : v.items()) {
        if (ck != "enable_thinking") throw unsupported(k + "." + ck, "only enable_thinking is passed to the template");
        r.enable_thinking = boolean(cv, k + ".enable_thinking");
      }
    } else if (!chat && k == "echo") {
      if (boolean(v, k)) throw unsupported(k, "the prompt is not echoed");
    } else if (!chat && k == "best_of") {
      if (integer_in(v, k, 1, lim.max_n) > 1) throw unsupported(k, "use n for several choices");
    } else if (!chat && k == "suffix") {
      if (!v.is_string() || !v.get<std::string>().empty()) throw unsupported(k, "insertion needs a fill-in-the-middle model");
    } else {
      throw ApiError(400, "unrecognized request argument: " + k, k, "unknown_parameter");
    }
  }
  if (j.contains("tool_choice") && j["tool_choice"] == "none") r.tools = ojson();
  if (chat && !j.contains("messages")) throw bad_field("messages", "is missing", "missing_required_parameter");
  if (!chat && !j.contains("prompt")) throw bad_field("prompt", "is missing", "missing_required_parameter");
  if (max_tokens && max_completion_tokens && *max_tokens != *max_completion_tokens)
    throw bad_field("max_completion_tokens", "differs from max_tokens (" + std::to_string(*max_tokens) + " and " +
                                                 std::to_string(*max_completion_tokens) + "); give one");
  r.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  if (r.include_usage && !r.stream) throw bad_field("stream_options", "is only allowed with stream: true");
  if (chat) {
    // As OpenAI: top_logprobs means nothing unless logprobs is true.
    if (top_logprobs && !logprobs) throw bad_field("top_logprobs", "needs logprobs: true");
    if (logprobs) r.logprobs = top_logprobs.value_or(0);
  }
  return r;
}

}  // namespace ingot::server
