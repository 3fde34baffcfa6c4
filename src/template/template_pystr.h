// Python's str and number semantics the chat template interpreter needs (template_pystr.cpp).
// Strings are UTF-8; every helper counts, cases and splits by code point, as Python does.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "template/template_internal.h"

namespace ingot::tmpl::detail {

// str.strip/lstrip/rstrip; chars none or undefined strips whitespace.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
char32_t to_lower(char32_t c);
char32_t to_upper(char32_t c);
// Applies a per-code-point case mapping (to_lower, to_upper) to a whole string.
std::string map_chars(const std::string& s, char32_t (*f)(char32_t));
std::string py_capitalize(const std::string& s);
std::string py_title(const std::string& s);
// Jinja's |title, whose word boundaries differ from str.title().
std::string jinja_title(const std::string& s);
// str.isupper() (upper) or str.islower().
bool py_is_case(const std::string& s, bool upper);
// str.split/rsplit: sep null or None splits on whitespace runs; maxsplit < 0 means no limit.
std::vector<std::string> py_split(const std::string& s, const Value* sep, std::int64_t maxsplit, bool from_right);
std::vector<std::string> py_splitlines(const std::string& s, bool keepends);
// str.replace; count < 0 replaces all. Throws once the result passes `limit` bytes.
std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, std::int64_t count,
                       std::size_t limit);
std::int64_t cp_index(const std::string& s, std::size_t byte_pos);
// int(text) and float(text) of a string; false where Python raises ValueError.
bool parse_py_int(std::string_view text, std::int64_t* out);
bool parse_py_float(std::string_view text, double* out);
double py_round(double x, std::int64_t ndigits);
void py_float_divmod(double a, double b, double* div, double* mod);
List string_chars(const std::string& s);

}  // namespace ingot::tmpl::detail
