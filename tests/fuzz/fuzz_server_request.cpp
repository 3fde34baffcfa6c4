// libFuzzer target for what `ingot serve` does with a request body before any model work: the OpenAI
// request parser (server/request.h) and the reply splitter (server/output.h, reasoning and tool calls).
// Input shapes, chosen by the first byte:
//   0: the rest is a /v1/chat/completions body;
//   1: the rest is a /v1/completions body;
//   2: a valid chat body with one field replaced: the next byte picks the field, the rest is its new
//      value (JSON, else a string), so the fuzzer spends its time in the field checks;
//   3: the rest is generated text fed to the splitter in pieces cut at the bytes' values; the pieces
//      must add up to what one push of the whole text gives. With tools on, the splitter has tool
//      schemas of every type, and the text is also put inside a well-formed XML-form call
//      (<tool_call><function=f><parameter=TEXT</parameter>...) so the fuzzer spends its time in the
//      parameter name and value rules; a call parsed from it must have a JSON object as arguments.
// Any exception other than ApiError from the parser, any exception from the splitter, any crash or
// sanitizer report is a bug.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/output.h"
#include "server/request.h"

namespace {

using nlohmann::json;
using ingot::server::Endpoint;

const json& base_chat() {
  static const json j = json::parse(R"({
    "model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
    "max_tokens": 8, "stop": ["x"], "temperature": 0.5, "top_p": 0.9, "top_k": 4, "min_p": 0.1, "seed": 1,
    "repetition_penalty": 1.1, "n": 2, "stream": true, "stream_options": {"include_usage": true},
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "auto",
    "chat_template_kwargs": {"enable_thinking": true}, "frequency_penalty": 0, "logprobs": false})");
  return j;
}

void parse(Endpoint e, const std::string& body) {
  try {
    const ingot::server::ApiRequest r = ingot::server::parse_request(e, body);
    // What the parser promises about an accepted request.
    if (r.n < 1 || r.n > 16) std::abort();
    if (r.max_tokens && *r.max_tokens < 1) std::abort();
    if (e == Endpoint::Chat && (!r.messages.is_array() || r.messages.empty())) std::abort();
    if (e == Endpoint::Completion && r.prompt_text.empty() && r.prompt_ids.empty()) std::abort();
    (void)r.messages.dump(-1, ' ', false, json::error_handler_t::replace);
  } catch (const ingot::server::ApiError& err) {
    if (err.status != 400 && err.status != 404) std::abort();
    (void)ingot::server::dump_json(err.body());
  }
}

// A tool with a parameter of every schema type the XML form's value rule tells apart.
const nlohmann::ordered_json& tool_schemas() {
  static const nlohmann::ordered_json j = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
    "name": "f", "parameters": {"type": "object", "properties": {"s": {"type": "string"}, "i": {"type": "integer"},
    "n": {"type": "number"}, "b": {"type": "boolean"}, "o": {"type": "object"}, "a": {"type": "array"},
    "u": {"type": ["integer", "null"]}, "x": {}}}}}])");
  return j;
}

void xml_value(const std::string& text) {
  std::vector<ingot::server::ToolCall> calls;
  const std::string call = "<tool_call>\n<function=f>\n<parameter=" + text + "\n</parameter>\n</function>\n</tool_call>";
  if (!ingot::server::parse_tool_calls(call, tool_schemas(), calls)) return;
  if (calls.empty() || calls[0].name != "f") std::abort();
  const json args = json::parse(calls[0].arguments, nullptr, false);
  if (!args.is_object()) std::abort();
}

void split(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  xml_value(text);
  const nlohmann::ordered_json none;
  for (int flags = 0; flags < 8; ++flags) {
    const bool reasoning = flags & 1, starts = flags & 2, tools = flags & 4;
    const nlohmann::ordered_json& defs = tools ? tool_schemas() : none;
    ingot::server::OutputParser whole(reasoning, starts, defs);
    ingot::server::TextDelta w = whole.push(text), wf = whole.finish();
    ingot::server::OutputParser pieces(reasoning, starts, defs);
    std::string reasoning_text, content;
    for (size_t at = 0; at < text.size();) {
      const size_t n = 1 + size_t(uint8_t(text[at])) % 7;
      ingot::server::TextDelta d = pieces.push(text.substr(at, n));
      reasoning_text += d.reasoning;
      content += d.content;
      at += n;
    }
    ingot::server::TextDelta f = pieces.finish();
    reasoning_text += f.reasoning;
    content += f.content;
    if (reasoning_text != w.reasoning + wf.reasoning || content != w.content + wf.content) std::abort();
    if (pieces.tool_calls().size() != whole.tool_calls().size()) std::abort();
    for (size_t k = 0; k < whole.tool_calls().size(); ++k)
      if (pieces.tool_calls()[k].name != whole.tool_calls()[k].name ||
          pieces.tool_calls()[k].arguments != whole.tool_calls()[k].arguments)
        std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 4) {
    case 0: parse(Endpoint::Chat, rest); break;
    case 1: parse(Endpoint::Completion, rest); break;
    case 2: {
      json body = base_chat();
      auto it = body.begin();
      std::advance(it, data[1] % body.size());
      const std::string value = rest.substr(1);
      json v = json::parse(value, nullptr, false);
      *it = v.is_discarded() ? json(value) : v;
      parse(Endpoint::Chat, body.dump(-1, ' ', false, json::error_handler_t::replace));
      break;
    }
    default: split(data + 1, size - 1); break;
  }
  return 0;
}
