// Decoders (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence) and
// post-processors (TemplateProcessing, ByteLevel, Bert, Roberta, Sequence) of tokenizer.json.
// Each decoder rewrites the list of token strings the way the reference's decode_chain does.
#include "tokenizer/components.h"

namespace ingot::tok::detail {

int parse_byte_token(std::string_view t) {
  // The reference accepts what Rust's u8::from_str_radix(.., 16) accepts for the two bytes after
  // "<0x": two hex digits, or a '+' sign and one hex digit.
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t.back() != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int h = hex(t[3]), l = hex(t[4]);
  if (t[3] == '+' && l >= 0) return l;
  if (h < 0 || l < 0) return -1;
  return h * 16 + l;
}

namespace {

std::string single_char(const json& j, const char* key, const std::string& where) {
  const std::string s = require_string(j, key, where);
  size_t i = 0;
  if (s.empty() || !utf8_is_valid(s) || (utf8_next(s, i), i != s.size()))
    throw Error(where + "." + key + ": expected exactly one character");
  return s;
}

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      // A token with a character outside the byte alphabet (an added token such as "<|im_end|>"
      // written with spaces, say) is taken as its own UTF-8 bytes.
      const size_t mark = bytes.size();
      bool mapped = true;
      for (size_t i = 0; i < t.size();) {
        const int b = char_to_byte(utf8_next(t, i));
        if (b < 0) {
          mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!mapped) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, utf8_is_valid(bytes) ? std::move(bytes) : utf8_replace_invalid(bytes));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(const json& j, const std::string& where) {
    replacement_ = single_char(j, "replacement", where);
    std::string scheme;
    if (get_optional_string(j, "prepend_scheme", scheme, where)) {
      if (scheme != "always" && scheme != "first" && scheme != "never")
        throw Error(where + ".prepend_scheme: unknown value '" + scheme + "' (expected always, first or never)");
      drop_in_first_ = scheme != "never";
    } else {
      drop_in_first_ = get_bool(j, "add_prefix_space", true, where);
    }
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t p = 0; p < t.size();) {
        if (t.compare(p, replacement_.size(), replacement_) == 0) {
          // The reference drops every replacement character of the first token.
          if (!(i == 0 && drop_in_first_)) out += ' ';
          p += replacement_.size();
        } else {
          out += t[p++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool drop_in_first_ = true;
};

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0) return;
      if (utf8_is_valid(pending)) {
        out.push_back(pending);
      } else {
        // Invalid bytes become one U+FFFD per byte token, as in the reference.
        for (size_t k = 0; k < pending_count; ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
      pending_count = 0;
    };
    for (std::string& t : tokens) {
      const int b = parse_byte_token(t);
      if (b >= 0) {
        pending.push_back(static_cast<char>(b));
        ++pending_count;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(const json& j, const std::string& where) {
    content_ = single_char(j, "content", where);
    const json& start = require_field(j, "start", where);
    const json& stop = require_field(j, "stop", where);
    if (!start.is_number_unsigned() || !stop.is_number_unsigned())
      throw Error(where + ": start and stop must be non-negative integers");
    start_ = start.get<size_t>();
    stop_ = stop.get<size_t>();
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    const size_t w = content_.size();
    for (std::string& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start_ && b + w <= e && t.compare(b, w, content_) == 0; ++k) b += w;
      for (size_t k = 0; k < stop_ && e >= b + w && t.compare(e - w, w, content_) == 0; ++k) e -= w;
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_ = 0, stop_ = 0;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(const json& j, const std::string& where) {
    const json& pat = require_field(j, "pattern", where);
    content_ = require_string(j, "content", where);
    if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      literal_ = pat["String"].get<std::string>();
    } else if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      regex_.emplace(pat["Regex"].get<std::string>(), where + ".pattern.Regex");
    } else {
      throw Error(where + ".pattern: expected {\"String\": string} or {\"Regex\": string}");
    }
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::string out;
      size_t pos = 0;
      if (regex_) {
        size_t from = 0, b, e;
        while (from <= t.size() && regex_->find(t, from, b, e)) {
          if (e == b) {
            if (b >= t.size()) break;
            size_t next = b;
            utf8_next(t, next);
            from = next;
            continue;
          }
          out.append(t, pos, b - pos);
          out += content_;
          pos = from = e;
        }
      } else if (!literal_.empty()) {
        for (size_t f; (f = t.find(literal_, pos)) != std::string::npos; pos = f + literal_.size()) {
          out.append(t, pos, f - pos);
          out += content_;
        }
      }
      out.append(t, pos, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  std::string literal_, content_;
  std::optional<Regex> regex_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// ---------------------------------------------------------------------------------------------

class TemplateProcessing final : public PostProcessor {
 public:
  TemplateProcessing(const json& j, const std::string& where) {
    const json& single = require_field(j, "single", where);
    if (!single.is_array()) throw Error(where + ".single: expected an array");
    const json& specials = require_field(j, "special_tokens", where);
    if (!specials.is_object()) throw Error(where + ".special_tokens: expected an object");
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string at = where + ".single[" + std::to_string(i) + "]";
      const json& item = single[i];
      if (item.is_object() && item.contains("SpecialToken")) {
        const std::string name = require_string(item["SpecialToken"], "id", at + ".SpecialToken");
        auto it = specials.find(name);
        if (it == specials.end())
          throw Error(at + ": special token \"" + name + "\" is not listed in " + where + ".special_tokens");
        const json& ids = require_field(*it, "ids", where + ".special_tokens[\"" + name + "\"]");
        if (!ids.is_array()) throw Error(where + ".special_tokens[\"" + name + "\"].ids: expected an array");
        std::vector<int32_t> v;
        for (const json& id : ids) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
            throw Error(where + ".special_tokens[\"" + name + "\"].ids: expected non-negative integer ids");
          v.push_back(static_cast<int32_t>(id.get<int64_t>()));
        }
        items_.push_back({false, std::move(v), where + ".special_tokens[\"" + name + "\"].ids"});
      } else if (item.is_object() && item.contains("Sequence")) {
        const std::string seq = require_string(item["Sequence"], "id", at + ".Sequence");
        if (seq != "A") throw Error(at + ": the single-sequence template may only use sequence A, found " + seq);
        items_.push_back({true, {}, {}});
      } else {
        throw Error(at + ": expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
    }
  }
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& it : items_) {
      if (it.is_sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), it.ids.begin(), it.ids.end());
      }
    }
    ids.swap(out);
  }

  void check_ids(const FnRef<bool(int32_t)>& known) const override {
    for (const auto& it : items_)
      for (int32_t id : it.ids)
        if (!known(id)) throw Error(it.where + ": id " + std::to_string(id) + " is not in the vocabulary");
  }

 private:
  struct Item {
    bool is_sequence;
    std::vector<int32_t> ids;
    std::string where;
  };
  std::vector<Item> items_;
};

// Bert and Roberta put one token before and one after a single sequence.
class Surround final : public PostProcessor {
 public:
  Surround(const json& j, const std::string& where) : where_(where) {
    cls_ = read(j, "cls", where);
    sep_ = read(j, "sep", where);
  }
  void check_ids(const FnRef<bool(int32_t)>& known) const override {
    for (int32_t id : {cls_, sep_})
      if (!known(id)) throw Error(where_ + ": id " + std::to_string(id) + " is not in the vocabulary");
  }
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    ids.insert(ids.begin(), cls_);
    ids.push_back(sep_);
  }

 private:
  static int32_t read(const json& j, const char* key, const std::string& where) {
    const json& v = require_field(j, key, where);
    if (!v.is_array() || v.size() != 2 || !v[0].is_string() || !v[1].is_number_integer())
      throw Error(where + "." + key + ": expected [token, id]");
    const int64_t id = v[1].get<int64_t>();
    if (id < 0 || id > INT32_MAX) throw Error(where + "." + key + ": id out of range");
    return static_cast<int32_t>(id);
  }
  std::string where_;
  int32_t cls_ = 0, sep_ = 0;
};

class NoOpProcessor final : public PostProcessor {
 public:
  // ByteLevel post-processing only trims offsets, which we do not report.
  void process(std::vector<int32_t>&, bool) const override {}
  void check_ids(const FnRef<bool(int32_t)>&) const override {}
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    for (const auto& p : parts_) p->process(ids, add_special_tokens);
  }
  void check_ids(const FnRef<bool(int32_t)>& known) const override {
    for (const auto& p : parts_) p->check_ids(known);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where, DecoderInfo& info, int depth) {
  if (j.is_null()) return nullptr;
  if (depth > kMaxNesting) throw Error(where + ": Sequence nested more than " + std::to_string(kMaxNesting) + " deep");
  const std::string type = require_string(j, "type", where);
  if (type == "ByteLevel") {
    info.byte_level = true;
    return std::make_unique<ByteLevelDecoder>();
  }
  if (type == "Metaspace") return std::make_unique<MetaspaceDecoder>(j, where);
  if (type == "ByteFallback") {
    info.byte_fallback = true;
    return std::make_unique<ByteFallbackDecoder>();
  }
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") return std::make_unique<StripDecoder>(j, where);
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(j, where);
  if (type == "Sequence") {
    const json& list = require_field(j, "decoders", where);
    if (!list.is_array()) throw Error(where + ".decoders: expected an array");
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto d = make_decoder(list[i], where + ".decoders[" + std::to_string(i) + "]", info, depth + 1);
      if (d) parts.push_back(std::move(d));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  throw Error(where + ".type: decoder '" + type +
              "' is not supported (supported: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence)");
}

std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& where, int depth) {
  if (j.is_null()) return nullptr;
  if (depth > kMaxNesting) throw Error(where + ": Sequence nested more than " + std::to_string(kMaxNesting) + " deep");
  const std::string type = require_string(j, "type", where);
  if (type == "TemplateProcessing") return std::make_unique<TemplateProcessing>(j, where);
  if (type == "ByteLevel") return std::make_unique<NoOpProcessor>();
  if (type == "BertProcessing" || type == "RobertaProcessing") return std::make_unique<Surround>(j, where);
  if (type == "Sequence") {
    const json& list = require_field(j, "processors", where);
    if (!list.is_array()) throw Error(where + ".processors: expected an array");
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = make_post_processor(list[i], where + ".processors[" + std::to_string(i) + "]", depth + 1);
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<SequenceProcessor>(std::move(parts));
  }
  throw Error(where + ".type: post-processor '" + type +
              "' is not supported (supported: TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing, Sequence)");
}

}  // namespace ingot::tok::detail
