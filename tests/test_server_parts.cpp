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

}  // namespace
}  // namespace ingot::test
