// Tokens of the chat template engine: what the lexer (template_lex.cpp) hands the parser
// (template_parse.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "template/template_internal.h"

namespace ingot::tmpl::detail {

enum class Tok : std::uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  int line;
  std::string text;  // data, name, decoded string, operator
  std::int64_t ival = 0;
  double fval = 0.0;
};

// The token as a syntax error names it ("'}}'", "string literal", ...).
std::string describe(const Token& t);

// Checks the source against the size limit and for valid UTF-8, normalises newlines as Jinja does
// and splits it into tokens ending with Tok::Eof. Throws ingot::Error naming the line.
std::vector<Token> lex_template(const std::string& source, const Limits& limits);

}  // namespace ingot::tmpl::detail
