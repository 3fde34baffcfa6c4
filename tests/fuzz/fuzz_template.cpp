// libFuzzer target for the chat template engine: parses and renders arbitrary template text
// against a fixed chat context. Any input must end in a rendered string or an ingot::Error;
// crashes, sanitizer reports and hangs are bugs. Tight sandbox limits keep each run short, the
// same limits that guarantee termination in production.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "template/chat_template.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Hi <tool_response>\n\u00e9\ud83d\ude00"},
      {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello", "reasoning_content": null,
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, null, true]}}},
                      {"function": {"name": "g", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "content": "42"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "number"}}}}}}],
    "documents": null,
    "add_generation_prompt": true,
    "enable_thinking": false,
    "bos_token": "<s>",
    "eos_token": "</s>"
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ingot::tmpl::Limits limits;
  limits.max_output_bytes = 1 << 16;
  limits.max_loop_iterations = 2000;
  limits.max_steps = 20000;
  limits.max_call_depth = 16;
  limits.max_nesting = 40;
  limits.max_source_bytes = 1 << 16;
  try {
    ingot::tmpl::ChatTemplate tmpl(std::string(reinterpret_cast<const char*>(data), size), limits);
    std::string out = tmpl.render(context());
    if (out.size() > limits.max_output_bytes) __builtin_trap();
  } catch (const ingot::Error&) {
    // Rejected input: the expected outcome for most fuzz inputs.
  }
  return 0;
}
