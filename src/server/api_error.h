// The OpenAI error shape every refused HTTP request gets: {"error": {"message", "type", "param",
// "code"}} with the HTTP status beside it. Thrown by the request parser and the handlers, caught once
// per request by the HTTP layer, so a bad value anywhere becomes one answer naming its field.
#pragma once
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace ingot::server {

struct ApiError : std::exception {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the request field at fault ("" = none: JSON null)
  std::string code;   // "" = JSON null

  ApiError(int status_, std::string message_, std::string param_ = {}, std::string code_ = {},
           std::string type_ = "invalid_request_error")
      : status(status_), message(std::move(message_)), type(std::move(type_)), param(std::move(param_)),
        code(std::move(code_)) {}
  const char* what() const noexcept override { return message.c_str(); }

  nlohmann::json body() const {
    auto or_null = [](const std::string& s) { return s.empty() ? nlohmann::json() : nlohmann::json(s); };
    return {{"error", {{"message", message}, {"type", type}, {"param", or_null(param)}, {"code", or_null(code)}}}};
  }
};

// JSON text of a body: bytes that are not UTF-8 (a model's odd token, a quoted bad request) become
// U+FFFD instead of throwing.
inline std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// 400 naming the field: "temperature: must be in [0, 2] (got 7)".
inline ApiError bad_field(const std::string& field, const std::string& why, std::string code = "invalid_value") {
  return ApiError(400, field + ": " + why, field, std::move(code));
}

// 400 for an OpenAI parameter ingot does not implement, rather than ignoring it.
inline ApiError unsupported(const std::string& field, const std::string& why) {
  return ApiError(400, field + ": not supported by ingot serve (" + why + ")", field, "unsupported_parameter");
}

}  // namespace ingot::server
