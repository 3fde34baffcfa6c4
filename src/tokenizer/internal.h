// Internal pieces shared by the tokenizer's source files: UTF-8 handling, the PCRE2 regex wrapper,
// a non-owning callable reference and JSON field helpers. Not part of the public interface.
//
// The UTF-8 code is hand-written: we need the exact replacement rule of Python's and Rust's lossy
// decoders (one U+FFFD per maximal invalid subpart) and the "is this tail an unfinished character"
// test of the streaming decoder, which no installed library offers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ingot::tok::detail {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// UTF-8

// Result of looking at the byte sequence that starts at p[0].
struct Utf8Step {
  uint32_t len;     // bytes consumed: the whole character, or the maximal invalid subpart (>= 1)
  bool valid;       // len bytes form one well-formed character
  bool truncated;   // invalid only because the input ended inside a possibly valid character
};
Utf8Step utf8_step(const unsigned char* p, size_t n);

bool utf8_is_valid(std::string_view s);
// Replaces each maximal invalid subpart with U+FFFD (the rule of Python's errors="replace" and of
// Rust's String::from_utf8_lossy, so the reference and we agree on what text was meant).
std::string utf8_replace_invalid(std::string_view s);
// Number of trailing bytes of s that begin a character not yet complete (0 when s ends cleanly or
// its tail is already invalid, since more bytes could not make it valid).
size_t utf8_incomplete_tail(std::string_view s);
// Decodes the code point at s[i] of valid UTF-8 and advances i.
char32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, char32_t cp);
// The Unicode White_Space property (what Rust's char::is_whitespace and Oniguruma's \s test).
bool is_white_space(char32_t cp);
// Rust regex's \w: alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t cp);

// ---------------------------------------------------------------------------------------------
// Non-owning reference to a callable, so that per-piece callbacks cost no allocation.
template <class Sig>
class FnRef;
template <class R, class... A>
class FnRef<R(A...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FnRef>)
  FnRef(F&& f)  // NOLINT: implicit on purpose, like std::function
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, A... a) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<A>(a)...);
        }) {}
  R operator()(A... a) const { return call_(obj_, std::forward<A>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, A...);
};

// ---------------------------------------------------------------------------------------------
// Regex: PCRE2 (UTF, UCP, JIT when available) with the pattern rewritten where Oniguruma, the
// engine the reference uses, defines a class differently (\s, \S, \w, \W, \h, \H).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where);
  // Finds the leftmost match at or after `from`. Returns false when there is none.
  // The subject must be valid UTF-8.
  bool find(std::string_view subject, size_t from, size_t& match_begin, size_t& match_end) const;

 private:
  struct Code;
  std::shared_ptr<Code> code_;
};
std::string translate_oniguruma(const std::string& pattern, const std::string& where);

// ---------------------------------------------------------------------------------------------
// JSON field helpers: every failure names the file and the field path.
const json& require_field(const json& obj, const char* key, const std::string& where);
std::string require_string(const json& obj, const char* key, const std::string& where);
bool get_bool(const json& obj, const char* key, bool fallback, const std::string& where);
// A string field that may be absent or null.
bool get_optional_string(const json& obj, const char* key, std::string& out, const std::string& where);
std::string json_type_name(const json& j);

}  // namespace ingot::tok::detail
