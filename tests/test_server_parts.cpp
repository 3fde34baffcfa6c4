// The parts of `ingot serve` that need no model: the OpenAI request parser (every accepted field read,
// every bad value refused naming its field, malformed bodies), the token budget fitted to a slot and
// the model's positions, and the reasoning / tool-call splitter (the same split whatever pieces the
// text arrives in).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/completions.h"
#include "server/output.h"
#include "server/request.h"

namespace ingot::test {
namespace {

using server::ApiError;
using server::Endpoint;

TEST(ServerRequest, ParsesTheOpenAIFields) {
  const auto r = server::parse_request(Endpoint::Chat, R"({"model": "m", "messages": [{"role": "user", "content":
    [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "max_completion_tokens": 7, "stop": "x",
    "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.1, "seed": 3, "repetition_penalty": 1.1, "n": 2,
    "stream": true, "stream_options": {"include_usage": true}, "frequency_penalty": 0, "presence_penalty": 0,
    "logprobs": false, "user": "u"})");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.messages[0]["content"], "ab");
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_EQ(r.sampling.seed, 3u);
  EXPECT_TRUE(r.seed_given);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream && r.include_usage);
  const auto c = server::parse_request(Endpoint::Completion, R"({"prompt": [1, 2, 3], "max_tokens": 4})");
  EXPECT_TRUE(c.prompt_is_ids);
  EXPECT_EQ(c.prompt_ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_FLOAT_EQ(c.sampling.temperature, 1.0f) << "OpenAI's default temperature";
  EXPECT_EQ(r.logprobs, -1) << "logprobs: false asks for none";
  EXPECT_EQ(c.logprobs, -1);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, 0.0f);

  // The penalties and log-probabilities.
  const auto p = server::parse_request(Endpoint::Chat, R"({"messages": [{"role": "user", "content": "x"}],
    "frequency_penalty": -1.5, "presence_penalty": 2, "logprobs": true, "top_logprobs": 20})");
  EXPECT_FLOAT_EQ(p.sampling.frequency_penalty, -1.5f);
  EXPECT_FLOAT_EQ(p.sampling.presence_penalty, 2.0f);
  EXPECT_EQ(p.logprobs, 20);
  const auto q = server::parse_request(Endpoint::Chat, R"({"messages": [{"role": "user", "content": "x"}],
    "logprobs": true, "top_logprobs": null})");
  EXPECT_EQ(q.logprobs, 0) << "logprobs alone: the picked token's only";
  EXPECT_EQ(server::parse_request(Endpoint::Completion, R"({"prompt": "x", "logprobs": 0})").logprobs, 0);
  EXPECT_EQ(server::parse_request(Endpoint::Completion, R"({"prompt": "x", "logprobs": 5})").logprobs, 5);
  EXPECT_EQ(server::parse_request(Endpoint::Completion, R"({"prompt": "x", "logprobs": null})").logprobs, -1);
}

TEST(ServerRequest, RefusesBadValuesNamingTheField) {
  struct Row {
    Endpoint e;
    std::string body, param, fragment;
  };
  const std::vector<Row> rows = {
      {Endpoint::Chat, R"({"messages": []})", "messages", "at least one"},
      {Endpoint::Chat, R"({"messages": "hi"})", "messages", "list of messages"},
      {Endpoint::Chat, R"({"messages": [{"role": "robot", "content": "x"}]})", "messages[0].role", "robot"},
      {Endpoint::Chat, R"({"messages": [{"role": "user"}]})", "messages[0].content", "missing"},
      {Endpoint::Chat, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0].type", "not supported"},
      {Endpoint::Chat, R"({"model": "m"})", "messages", "missing"},
      {Endpoint::Completion, R"({"prompt": ""})", "prompt", "empty"},
      {Endpoint::Completion, R"({"prompt": [1, -2]})", "prompt[1]", "[0, 2147483647]"},
      {Endpoint::Completion, R"({"prompt": ["a", "b"]})", "prompt", "several prompts"},
      {Endpoint::Completion, R"({"prompt": "x", "max_tokens": 0})", "max_tokens", "[1, "},
      {Endpoint::Completion, R"({"prompt": "x", "max_tokens": "9"})", "max_tokens", "integer"},
      {Endpoint::Completion, R"({"prompt": "x", "temperature": 7})", "temperature", "[0, 2]"},
      {Endpoint::Completion, R"({"prompt": "x", "top_p": 0})", "top_p", "(0, 1]"},
      {Endpoint::Completion, R"({"prompt": "x", "top_k": -5})", "top_k", "[-1, "},
      {Endpoint::Completion, R"({"prompt": "x", "min_p": 1})", "min_p", "[0, 1)"},
      {Endpoint::Completion, R"({"prompt": "x", "repetition_penalty": 0})", "repetition_penalty", "(0, 10]"},
      {Endpoint::Completion, R"({"prompt": "x", "frequency_penalty": 2.5})", "frequency_penalty", "[-2, 2]"},
      {Endpoint::Completion, R"({"prompt": "x", "frequency_penalty": "1"})", "frequency_penalty", "number"},
      {Endpoint::Completion, R"({"prompt": "x", "presence_penalty": -2.5})", "presence_penalty", "[-2, 2]"},
      {Endpoint::Completion, R"({"prompt": "x", "presence_penalty": 3})", "presence_penalty", "[-2, 2]"},
      {Endpoint::Chat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})", "logprobs", "true or false"},
      {Endpoint::Chat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs",
       "needs logprobs: true"},
      {Endpoint::Chat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": false, "top_logprobs": 0})",
       "top_logprobs", "needs logprobs: true"},
      {Endpoint::Chat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})",
       "top_logprobs", "[0, 20]"},
      {Endpoint::Chat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 1.5})",
       "top_logprobs", "integer"},
      {Endpoint::Completion, R"({"prompt": "x", "logprobs": 6})", "logprobs", "[0, 5]"},
      {Endpoint::Completion, R"({"prompt": "x", "logprobs": true})", "logprobs", "integer"},
      {Endpoint::Completion, R"({"prompt": "x", "top_logprobs": 2})", "top_logprobs", "unrecognized"},
      {Endpoint::Completion, R"({"prompt": "x", "n": 0})", "n", "[1, 16]"},
      {Endpoint::Completion, R"({"prompt": "x", "n": 17})", "n", "[1, 16]"},
      {Endpoint::Completion, R"({"prompt": "x", "stop": ""})", "stop", "empty"},
      {Endpoint::Completion, R"({"prompt": "x", "stop": ["a", 3]})", "stop[1]", "string"},
      {Endpoint::Completion, R"({"prompt": "x", "stream": "yes"})", "stream", "true or false"},
      {Endpoint::Completion, R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options", "stream: true"},
      {Endpoint::Completion, R"({"prompt": "x", "logit_bias": {"5": 1}})", "logit_bias", "not supported"},
      {Endpoint::Completion, R"({"prompt": "x", "temprature": 1})", "temprature", "unrecognized"},
      {Endpoint::Completion, R"({"prompt": "x", "seed": 1.5})", "seed", "integer"},
      {Endpoint::Chat, R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", "tool_choice", "not supported"},
      {Endpoint::Chat, R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})",
       "response_format", "not supported"},
      {Endpoint::Chat, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "max_completion_tokens": 4})",
       "max_completion_tokens", "differs"},
  };
  for (const Row& row : rows) {
    try {
      server::parse_request(row.e, row.body);
      ADD_FAILURE() << "accepted: " << row.body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << row.body;
      EXPECT_EQ(e.param, row.param) << row.body << " -> " << e.message;
      EXPECT_NE(e.message.find(row.fragment), std::string::npos) << row.body << " -> " << e.message;
      EXPECT_EQ(e.body()["error"]["param"], row.param);
    }
  }
}

TEST(ServerRequest, MalformedBodies) {
  for (const std::string body : std::vector<std::string>{"", "{", "[1, 2]", "null", "{\"prompt\": \"x\",}", std::string(200, '[')}) {
    try {
      server::parse_request(Endpoint::Completion, body);
      ADD_FAILURE() << "accepted: " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.code, "invalid_json") << body << " -> " << e.message;
    }
  }
}

TEST(ServerCapacity, PromptAndMaxTokensFitTheSlot) {
  using server::Completions;
  EXPECT_EQ(Completions::fit_tokens(10, std::nullopt, 256, 512, "prompt"), 247);
  EXPECT_EQ(Completions::fit_tokens(10, std::nullopt, 1024, 512, "prompt"), 503);
  EXPECT_EQ(Completions::fit_tokens(10, 247, 256, 512, "prompt"), 247);
  try {
    Completions::fit_tokens(10, 248, 256, 512, "prompt");
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "max_tokens");
    EXPECT_NE(e.message.find("at most 247 new tokens fit"), std::string::npos) << e.message;
  }
  try {
    Completions::fit_tokens(300, std::nullopt, 256, 512, "messages");
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "messages");
    EXPECT_EQ(e.code, "context_length_exceeded");
  }
}

// Every split of a reply into pieces gives the same reasoning, content and tool calls.
TEST(ServerOutput, ReasoningAndToolCallsSplitTheSameAnyWayTheTextArrives) {
  const std::string text =
      "<think>weigh it</think>\n\nThe answer.<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    server::OutputParser p(true, false, true);
    server::TextDelta a = p.push(text.substr(0, cut)), b = p.push(text.substr(cut)), c = p.finish();
    EXPECT_EQ(a.reasoning + b.reasoning + c.reasoning, "weigh it") << cut;
    EXPECT_EQ(a.content + b.content + c.content, "The answer.") << cut;
    ASSERT_EQ(p.tool_calls().size(), 1u) << cut;
    EXPECT_EQ(p.tool_calls()[0].name, "f");
    EXPECT_EQ(p.tool_calls()[0].arguments, "{\"x\":1}");
  }
  server::OutputParser forced(true, true, false);  // the prompt opened <think>
  server::TextDelta d = forced.push("plan</think>go");
  EXPECT_EQ(d.reasoning, "plan");
  EXPECT_EQ(d.content, "go");
  server::OutputParser broken(false, false, true);  // markup that is not a call stays content
  server::TextDelta e = broken.push("x <tool_call>{oops</tool_call>");
  server::TextDelta f = broken.finish();
  EXPECT_EQ(e.content + f.content, "x <tool_call>{oops</tool_call>");
  EXPECT_TRUE(broken.tool_calls().empty());
  server::OutputParser plain(false, false, false);  // a model that does not think keeps its tags
  EXPECT_EQ(plain.push("<think>a</think>").content + plain.finish().content, "<think>a</think>");
}

// Qwen3.5's tool list: one tool with a parameter of each schema type the value rule distinguishes.
const nlohmann::ordered_json kTools = nlohmann::ordered_json::parse(R"([
  {"type": "function", "function": {"name": "book", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "nights": {"type": "integer"}, "price": {"type": "number"},
    "breakfast": {"type": "boolean"}, "extras": {"type": "object"}, "guests": {"type": "array"},
    "note": {"type": ["string", "null"]}, "floor": {"type": ["integer", "null"]}, "free": {}}}}}])");

// The XML form as the Qwen3.5 template writes it, split every way, typed by the tool's schema.
TEST(ServerOutput, XmlToolCallsSplitTheSameAnyWayTheTextArrives) {
  const std::string text =
      "<think>\nwhich hotel\n</think>\n\nBooking now.\n\n<tool_call>\n<function=book>\n"
      "<parameter=city>\n42\n</parameter>\n<parameter=nights>\n3\n</parameter>\n"
      "<parameter=extras>\n{\"late\": true, \"b\": [1, 2]}\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=book>\n<parameter=city>\nSão Paulo\n\n  two lines\n</parameter>\n</function>\n</tool_call>";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    server::OutputParser p(true, false, kTools);
    server::TextDelta a = p.push(text.substr(0, cut)), b = p.push(text.substr(cut)), c = p.finish();
    EXPECT_EQ(a.reasoning + b.reasoning + c.reasoning, "\nwhich hotel\n") << cut;
    EXPECT_EQ(a.content + b.content + c.content, "Booking now.\n\n") << cut;
    ASSERT_EQ(p.tool_calls().size(), 2u) << cut;
    EXPECT_EQ(p.tool_calls()[0].name, "book");
    // city is a string: "42" stays text; the object is decoded, its keys kept in the model's order.
    EXPECT_EQ(p.tool_calls()[0].arguments, R"({"city":"42","nights":3,"extras":{"late":true,"b":[1,2]}})");
    // Only the newline after the opening tag and the one before the closing tag are markup.
    EXPECT_EQ(p.tool_calls()[1].arguments, R"({"city":"São Paulo\n\n  two lines"})");
  }
}

// Qwen3.5's generation prompt opens <think> itself (enable_thinking unset or true).
TEST(ServerOutput, Qwen3_5PromptOpensThinkingAndTheReplyEndsInACall) {
  server::OutputParser p(true, true, kTools);
  server::TextDelta d = p.push("Need a hotel.\n</think>\n\n<tool_call>\n<function=book>\n<parameter=nights>\n2\n");
  EXPECT_EQ(d.reasoning, "Need a hotel.\n");
  EXPECT_EQ(d.content, "");
  d = p.push("</parameter>\n</function>\n</tool_call>");
  EXPECT_TRUE(d.empty());
  EXPECT_TRUE(p.finish().empty());
  ASSERT_EQ(p.tool_calls().size(), 1u);
  EXPECT_EQ(p.tool_calls()[0].arguments, R"({"nights":2})");
}

TEST(ServerOutput, XmlParameterValuesAreTypedByTheirSchema) {
  using server::tool_parameter_value;
  const auto& props = kTools[0]["function"]["parameters"]["properties"];
  auto v = [&](const char* name, const char* text) { return tool_parameter_value(text, props[name]).dump(); };
  EXPECT_EQ(v("city", "Paris"), R"("Paris")");
  EXPECT_EQ(v("city", "null"), R"("null")");  // a string parameter keeps what was written
  EXPECT_EQ(v("city", "[1]"), R"("[1]")");
  EXPECT_EQ(v("nights", "3"), "3");
  EXPECT_EQ(v("nights", "3.5"), R"("3.5")");  // not an integer: kept as written, not rounded
  EXPECT_EQ(v("nights", "three"), R"("three")");
  EXPECT_EQ(v("price", "3"), "3");
  EXPECT_EQ(v("price", "2.5e3"), "2500.0");
  EXPECT_EQ(v("breakfast", "true"), "true");
  EXPECT_EQ(v("breakfast", "False"), "false");  // the template writes a history's booleans as str(): False
  EXPECT_EQ(v("breakfast", "yes"), R"("yes")");
  EXPECT_EQ(v("extras", "{\"a\": 1}"), R"({"a":1})");
  EXPECT_EQ(v("extras", "{'a': 1}"), R"("{'a': 1}")");  // not JSON: kept as text
  EXPECT_EQ(v("guests", "[\"x\", 2]"), R"(["x",2])");
  EXPECT_EQ(v("note", "null"), "null");
  EXPECT_EQ(v("note", "None"), "null");
  EXPECT_EQ(v("note", "17"), R"("17")");
  EXPECT_EQ(v("floor", "None"), "null");
  EXPECT_EQ(v("floor", "4"), "4");
  // No type (or no schema at all: a tool or parameter the request did not declare): JSON of any type
  // but a string is decoded, everything else is text.
  EXPECT_EQ(v("free", "7"), "7");
  EXPECT_EQ(v("free", "{\"a\": [true]}"), R"({"a":[true]})");
  EXPECT_EQ(v("free", "\"quoted\""), R"("\"quoted\"")");
  EXPECT_EQ(tool_parameter_value("false", nullptr).dump(), "false");
  EXPECT_EQ(tool_parameter_value("hello world", nullptr).dump(), R"("hello world")");
  EXPECT_EQ(tool_parameter_value("", nullptr).dump(), R"("")");
}

TEST(ServerOutput, XmlCallsOfUndeclaredToolsAndTheJsonFormTogether) {
  std::vector<server::ToolCall> calls;
  ASSERT_TRUE(server::parse_tool_calls(
      "<tool_call><function=ping></function></tool_call> <tool_call>{\"name\": \"f\", \"arguments\": {\"b\": 1, \"a\": 2}}"
      "</tool_call>\n<tool_call>\n<function=other>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>",
      kTools, calls));
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].name, "ping");
  EXPECT_EQ(calls[0].arguments, "{}");
  EXPECT_EQ(calls[1].arguments, R"({"b":1,"a":2})");  // the model's key order is kept
  EXPECT_EQ(calls[2].name, "other");
  EXPECT_EQ(calls[2].arguments, R"({"n":5})");
}

// Every malformed variant stays content, whole, and never throws.
TEST(ServerOutput, MalformedXmlToolCallsStayContent) {
  const std::vector<std::string> bad = {
      "<tool_call>\n<function=book>\n<parameter=city>\nParis\n</function>\n</tool_call>",  // parameter not closed
      "<tool_call>\n<function=book>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",  // function not closed
      "<tool_call>\n<function=>\n</function>\n</tool_call>",                                // no name
      "<tool_call>\n<function=a\nb>\n</function>\n</tool_call>",                            // name across lines
      "<tool_call>\n<function=book\n</function>\n</tool_call>",                             // no '>' on the tag line
      "<tool_call>\n<function=book>\nstray text\n</function>\n</tool_call>",                // text outside parameters
      "<tool_call>\n<function=book>\n<parameter=>\nx\n</parameter>\n</function>\n</tool_call>",
      "<tool_call>\n<function=book>\n</function>\n</tool_call>\nand a suffix",             // text after the call
      "<tool_call>\n<function=book>\n</function>\n",                                        // cut off
      "<tool_call>\n<function=book>\n</function>\n<function=book>\n</function>\n</tool_call>",
      "<tool_call>\n<function=\xff\xfe>\n<parameter=\xc3>\n\xff\n</parameter>\n</function>\n</tool_call>x",
  };
  for (const std::string& text : bad) {
    SCOPED_TRACE(text);
    server::OutputParser p(false, false, kTools);
    std::string content;
    ASSERT_NO_THROW(content = p.push(text).content);
    ASSERT_NO_THROW(content += p.finish().content);
    EXPECT_EQ(content, text);
    EXPECT_TRUE(p.tool_calls().empty());
  }
  // Bytes that are not UTF-8 inside a well-formed call are replaced, never thrown on.
  std::vector<server::ToolCall> calls;
  ASSERT_TRUE(server::parse_tool_calls("<tool_call><function=f><parameter=p>\xff</parameter></function></tool_call>",
                                       nullptr, calls));
  EXPECT_EQ(calls[0].arguments, "{\"p\":\"\xef\xbf\xbd\"}");
}

}  // namespace
}  // namespace ingot::test
