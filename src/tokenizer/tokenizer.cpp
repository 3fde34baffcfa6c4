// Tokenizer: loads tokenizer.json (and the folder's config files), runs the encode pipeline
// (added tokens -> normalizer -> added tokens on normalized text -> pre-tokenizer -> BPE ->
// post-processor) and decode, and implements the streaming decoder.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "core/files.h"
#include "tokenizer/components.h"

namespace ingot::tok {

using detail::json;

namespace {

// Byte trie over the added tokens, searched leftmost-longest like the reference's Aho-Corasick.
class TokenTrie {
 public:
  void insert(std::string_view s, int32_t value) {
    if (s.empty()) return;
    int32_t node = 0;
    for (unsigned char c : s) {
      int32_t next = child(node, c);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[node].kids.emplace_back(c, next);
        nodes_.emplace_back();
      }
      node = next;
    }
    nodes_[node].value = value;
    const unsigned char f = static_cast<unsigned char>(s[0]);
    if (!first_[f]) {
      first_[f] = true;
      ++distinct_first_;
      only_first_ = f;
    }
  }
  bool empty() const { return distinct_first_ == 0; }

  // Leftmost match at or after `from`, the longest one there.
  bool find(std::string_view s, size_t from, size_t& begin, size_t& end, int32_t& value) const {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const size_t n = s.size();
    for (size_t i = from; i < n; ++i) {
      if (distinct_first_ == 1) {
        const void* hit = std::memchr(p + i, only_first_, n - i);
        if (!hit) return false;
        i = static_cast<size_t>(static_cast<const unsigned char*>(hit) - p);
      } else if (!first_[p[i]]) {
        continue;
      }
      int32_t node = 0, best = -1;
      size_t best_end = 0;
      for (size_t j = i; j < n; ++j) {
        node = child(node, p[j]);
        if (node < 0) break;
        if (nodes_[node].value >= 0) {
          best = nodes_[node].value;
          best_end = j + 1;
        }
      }
      if (best >= 0) {
        begin = i;
        end = best_end;
        value = best;
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> kids;
    int32_t value = -1;
  };
  int32_t child(int32_t node, unsigned char c) const {
    for (const auto& [k, v] : nodes_[node].kids)
      if (k == c) return v;
    return -1;
  }
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
  int distinct_first_ = 0;
  unsigned char only_first_ = 0;
};

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

json parse_json(std::string_view text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(path + ": invalid JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  }
}

}  // namespace

struct Tokenizer::Impl {
  std::string path;
  std::unique_ptr<detail::Normalizer> normalizer;
  detail::PreTokenizerChain pre;
  std::unique_ptr<detail::BpeModel> model;
  std::unique_ptr<detail::PostProcessor> post;
  std::unique_ptr<detail::Decoder> decoder;
  detail::DecoderInfo decoder_info;

  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;
  detail::StringIdMap added_by_content;
  TokenTrie plain_trie, normalized_trie;  // tokens matched on raw / on normalized text
  std::vector<uint8_t> special;           // per id: decode(skip_special_tokens) drops it
  int32_t vocab_size = 0;

  std::optional<int32_t> bos;
  std::vector<int32_t> eos;
  std::string chat_template;

  const std::string* piece(int32_t id) const {
    if (auto it = added_by_id.find(id); it != added_by_id.end()) return &added[it->second].content;
    return model->id_to_token(id);
  }
  bool is_special(int32_t id) const { return id >= 0 && id < static_cast<int32_t>(special.size()) && special[id]; }
  std::optional<int32_t> lookup(std::string_view piece) const {
    if (auto it = added_by_content.find(piece); it != added_by_content.end()) return it->second;
    return model->token_to_id(piece);
  }

  // Cuts s into pieces and added tokens, applying the tokens' flags as the reference does.
  // emit(piece, added_index or -1, offset of the piece in s).
  void split_added(std::string_view s, const TokenTrie& trie,
                   const detail::FnRef<void(std::string_view, int32_t, size_t)>& emit) const;
  void encode_into(std::string_view text, std::vector<int32_t>& ids) const;
  bool tail_incomplete(std::span<const int32_t> ids, bool skip_special) const;

  void load_tokenizer_json(const std::string& text, const std::string& file);
  // The optional texts of a folder; `dir` names them in messages.
  void load_config(const std::string& dir, std::optional<std::string_view> tokenizer_config_json,
                   std::optional<std::string_view> chat_template_jinja,
                   std::optional<std::string_view> generation_config_json);
};

// ---------------------------------------------------------------------------------------------
// Loading

void Tokenizer::Impl::load_tokenizer_json(const std::string& text, const std::string& file) {
  path = file;
  const json root = parse_json(text, file);
  if (!root.is_object()) throw Error(file + ": expected a JSON object at the top level");
  const std::string w = file + ": ";
  if (auto it = root.find("version"); it != root.end() && !(it->is_string() && *it == "1.0"))
    throw Error(w + "version: only tokenizer.json version \"1.0\" is supported");
  for (const char* key : {"truncation", "padding"}) {
    if (auto it = root.find(key); it != root.end() && !it->is_null())
      throw Error(w + key + ": is set; encoding with " + key +
                  " is not supported (set it to null, the tokenizer then returns all ids)");
  }
  model = std::make_unique<detail::BpeModel>(detail::require_field(root, "model", file), w + "model");
  auto section = [&](const char* key) -> const json& {
    static const json null_json;
    auto it = root.find(key);
    return it == root.end() ? null_json : *it;
  };
  normalizer = detail::make_normalizer(section("normalizer"), w + "normalizer");
  pre = detail::make_pre_tokenizer(section("pre_tokenizer"), w + "pre_tokenizer");
  post = detail::make_post_processor(section("post_processor"), w + "post_processor");
  decoder = detail::make_decoder(section("decoder"), w + "decoder", decoder_info);

  // Added tokens get their ids as the reference assigns them (the model's id for a token it
  // already has, else the next free id); a file whose ids disagree is refused.
  const json& list = section("added_tokens");
  if (!list.is_null() && !list.is_array()) throw Error(w + "added_tokens: expected an array");
  const int32_t model_entries = static_cast<int32_t>(model->vocab().size());
  int32_t max_added = -1;
  for (size_t i = 0; list.is_array() && i < list.size(); ++i) {
    const std::string at = w + "added_tokens[" + std::to_string(i) + "]";
    const json& t = list[i];
    AddedToken tok;
    tok.content = detail::require_string(t, "content", at);
    const json& id = detail::require_field(t, "id", at);
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= INT32_MAX)
      throw Error(at + ".id: expected a non-negative integer");
    tok.id = static_cast<int32_t>(id.get<int64_t>());
    tok.special = detail::get_bool(t, "special", false, at);
    tok.single_word = detail::get_bool(t, "single_word", false, at);
    tok.lstrip = detail::get_bool(t, "lstrip", false, at);
    tok.rstrip = detail::get_bool(t, "rstrip", false, at);
    tok.normalized = detail::get_bool(t, "normalized", !tok.special, at);
    if (tok.content.empty()) continue;  // the reference ignores empty tokens
    if (!detail::utf8_is_valid(tok.content)) throw Error(at + ".content: not valid UTF-8");
    int32_t assigned;
    if (auto it = added_by_content.find(tok.content); it != added_by_content.end()) {
      assigned = it->second;
    } else if (auto mid = model->token_to_id(tok.content)) {
      assigned = *mid;
    } else if (max_added < 0) {
      assigned = model_entries;
    } else {
      assigned = (max_added >= model_entries || model_entries == 0) ? max_added + 1 : model_entries;
    }
    if (assigned != tok.id)
      throw Error(at + ": token \"" + tok.content + "\" has id " + std::to_string(tok.id) +
                  " but the tokenizers library would give it id " + std::to_string(assigned) +
                  "; the file is inconsistent");
    max_added = std::max(max_added, assigned);
    if (auto it = added_by_content.find(tok.content); it != added_by_content.end()) {
      added[added_by_id.at(it->second)] = tok;  // a later entry updates the flags
      continue;
    }
    added_by_content.emplace(tok.content, tok.id);
    added_by_id.emplace(tok.id, added.size());
    added.push_back(std::move(tok));
  }

  vocab_size = model->id_limit();
  for (const auto& t : added) vocab_size = std::max(vocab_size, t.id + 1);
  special.assign(static_cast<size_t>(vocab_size), 0);
  detail::StringIdMap special_contents;
  for (const auto& t : added) {
    if (!t.special) continue;
    special[t.id] = 1;
    special_contents.emplace(t.content, t.id);
  }
  // decode() skips by content, so a model token spelled like a special token is skipped too.
  for (const auto& [content, id] : special_contents)
    if (auto mid = model->token_to_id(content)) special[*mid] = 1;

  if (post) post->check_ids([&](int32_t id) { return piece(id) != nullptr; });

  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i];
    if (!t.normalized) {
      plain_trie.insert(t.content, static_cast<int32_t>(i));
    } else {
      std::string n = t.content;
      if (normalizer) normalizer->normalize(n);
      normalized_trie.insert(n, static_cast<int32_t>(i));
    }
  }
}

namespace {
// A token field of tokenizer_config.json: a string, null, or an AddedToken object.
bool config_token(const json& cfg, const char* key, std::string& out, const std::string& file) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return false;
  if (it->is_string()) {
    out = it->get<std::string>();
    return true;
  }
  if (it->is_object()) {
    out = detail::require_string(*it, "content", file + ": " + key);
    return true;
  }
  throw Error(file + ": " + key + ": expected a string, an object with \"content\", or null");
}
}  // namespace

void Tokenizer::Impl::load_config(const std::string& dir, std::optional<std::string_view> tokenizer_config_json,
                                  std::optional<std::string_view> chat_template_jinja,
                                  std::optional<std::string_view> generation_config_json) {
  namespace fs = std::filesystem;
  auto add_eos = [&](int32_t id) {
    if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
  };
  const std::string cfg_path = (fs::path(dir) / "tokenizer_config.json").string();
  if (tokenizer_config_json) {
    const json cfg = parse_json(*tokenizer_config_json, cfg_path);
    if (!cfg.is_object()) throw Error(cfg_path + ": expected a JSON object at the top level");
    std::string name;
    if (config_token(cfg, "bos_token", name, cfg_path)) {
      auto id = lookup(name);
      if (!id) throw Error(cfg_path + ": bos_token \"" + name + "\" is not in the vocabulary");
      bos = *id;
    }
    if (config_token(cfg, "eos_token", name, cfg_path)) {
      auto id = lookup(name);
      if (!id) throw Error(cfg_path + ": eos_token \"" + name + "\" is not in the vocabulary");
      add_eos(*id);
    }
    if (auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
      if (it->is_string()) {
        chat_template = it->get<std::string>();
      } else if (it->is_array()) {
        // Named templates: the one called "default" is what apply_chat_template uses.
        for (size_t i = 0; i < it->size(); ++i) {
          const std::string at = cfg_path + ": chat_template[" + std::to_string(i) + "]";
          if (detail::require_string((*it)[i], "name", at) == "default")
            chat_template = detail::require_string((*it)[i], "template", at);
        }
      } else {
        throw Error(cfg_path + ": chat_template: expected a string or a list of named templates");
      }
    }
  }
  if (chat_template_jinja) chat_template = std::string(*chat_template_jinja);

  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  if (generation_config_json) {
    const json gen = parse_json(*generation_config_json, gen_path);
    if (auto it = gen.find("eos_token_id"); gen.is_object() && it != gen.end() && !it->is_null()) {
      auto take = [&](const json& v) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab_size)
          throw Error(gen_path + ": eos_token_id: expected ids below the vocabulary size " + std::to_string(vocab_size));
        add_eos(static_cast<int32_t>(v.get<int64_t>()));
      };
      if (it->is_array()) {
        for (const json& v : *it) take(v);
      } else {
        take(*it);
      }
    }
  }
}

Tokenizer Tokenizer::from_file(const std::string& tokenizer_json_path) {
  auto impl = std::make_shared<Impl>();
  impl->load_tokenizer_json(read_file(tokenizer_json_path), tokenizer_json_path);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, const std::string& source_name) {
  auto impl = std::make_shared<Impl>();
  impl->load_tokenizer_json(std::string(tokenizer_json), source_name);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_folder(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(dir + ": not a directory");
  const std::string tokenizer_json = read_file((fs::path(dir) / "tokenizer.json").string());
  auto optional_file = [&](const char* name) -> std::optional<std::string> {
    const std::string path = (fs::path(dir) / name).string();
    if (!fs::exists(path, ec)) return std::nullopt;
    return read_file(path);
  };
  const auto config = optional_file("tokenizer_config.json");
  const auto jinja = optional_file("chat_template.jinja");
  const auto generation = optional_file("generation_config.json");
  auto view = [](const std::optional<std::string>& s) -> std::optional<std::string_view> {
    if (!s) return std::nullopt;
    return std::string_view(*s);
  };
  return from_texts(tokenizer_json, view(config), view(jinja), view(generation), dir);
}

Tokenizer Tokenizer::from_texts(std::string_view tokenizer_json, std::optional<std::string_view> tokenizer_config_json,
                                std::optional<std::string_view> chat_template_jinja,
                                std::optional<std::string_view> generation_config_json,
                                const std::string& source_name) {
  namespace fs = std::filesystem;
  auto impl = std::make_shared<Impl>();
  impl->load_tokenizer_json(std::string(tokenizer_json), (fs::path(source_name) / "tokenizer.json").string());
  impl->load_config(source_name, tokenizer_config_json, chat_template_jinja, generation_config_json);
  return Tokenizer(std::move(impl));
}

// ---------------------------------------------------------------------------------------------
// Encoding

void Tokenizer::Impl::split_added(std::string_view s, const TokenTrie& trie,
                                  const detail::FnRef<void(std::string_view, int32_t, size_t)>& emit) const {
  if (s.empty()) return;
  if (trie.empty()) {
    emit(s, -1, 0);
    return;
  }
  auto ends_with_word = [&](size_t end) {
    if (end == 0) return false;
    size_t b = end - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    return detail::is_word_char(detail::utf8_next(s, b));
  };
  auto starts_with_word = [&](size_t begin) {
    if (begin >= s.size()) return false;
    return detail::is_word_char(detail::utf8_next(s, begin));
  };
  size_t start_offset = 0, from = 0, mb, me;
  int32_t idx;
  while (trie.find(s, from, mb, me, idx)) {
    from = me;
    const AddedToken& t = added[idx];
    size_t start = mb, stop = me;
    if (t.single_word && (ends_with_word(start) || starts_with_word(stop))) continue;
    if (t.lstrip) {
      // Whitespace just before the token joins it, but never what an earlier token took.
      size_t b = start;
      while (b > 0) {
        size_t c = b - 1;
        while (c > 0 && (static_cast<unsigned char>(s[c]) & 0xC0) == 0x80) --c;
        size_t k = c;
        if (!detail::is_white_space(detail::utf8_next(s, k))) break;
        b = c;
      }
      start = std::max(b, start_offset);
    }
    if (t.rstrip) {
      while (stop < s.size()) {
        size_t k = stop;
        if (!detail::is_white_space(detail::utf8_next(s, k))) break;
        stop = k;
      }
    }
    if (start_offset < start) emit(s.substr(start_offset, start - start_offset), -1, start_offset);
    emit(s.substr(start, stop - start), idx, start);
    start_offset = stop;
  }
  if (start_offset < s.size()) emit(s.substr(start_offset), -1, start_offset);
}

void Tokenizer::Impl::encode_into(std::string_view text, std::vector<int32_t>& ids) const {
  const bool byte_level = pre.byte_level;
  auto words = [&](std::string_view piece, bool at_start) {
    pre.run(piece, at_start, [&](std::string_view word, bool) { model->tokenize(word, byte_level, ids); });
  };
  split_added(text, plain_trie, [&](std::string_view piece, int32_t idx, size_t offset) {
    if (idx >= 0) {
      ids.push_back(added[idx].id);
      return;
    }
    std::string normalized;
    std::string_view n = piece;
    if (normalizer && !normalizer->is_noop_for(piece)) {
      normalized.assign(piece);
      normalizer->normalize(normalized);
      n = normalized;
    }
    if (normalized_trie.empty()) {
      if (!n.empty()) words(n, offset == 0);
      return;
    }
    split_added(n, normalized_trie, [&](std::string_view q, int32_t idx2, size_t offset2) {
      if (idx2 >= 0) {
        ids.push_back(added[idx2].id);
      } else {
        words(q, offset == 0 && offset2 == 0);
      }
    });
  });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::string cleaned;
  if (!detail::utf8_is_valid(text)) {
    cleaned = detail::utf8_replace_invalid(text);
    text = cleaned;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode_into(text, ids);
  if (impl_->post) impl_->post->process(ids, add_special_tokens);
  return ids;
}

// ---------------------------------------------------------------------------------------------
// Decoding and lookups

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& I = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* p = I.piece(id);
    if (!p || (skip_special_tokens && I.is_special(id))) continue;
    tokens.push_back(*p);
  }
  std::string out;
  if (!I.decoder) {
    // Without a decoder the reference joins the tokens with spaces.
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  I.decoder->decode_chain(tokens);
  for (const auto& t : tokens) out += t;
  return out;
}

std::string Tokenizer::id_to_piece(int32_t id) const {
  const std::string* p = impl_->piece(id);
  if (!p)
    throw Error("token id " + std::to_string(id) + " is not in the vocabulary of " + impl_->path +
                " (vocabulary size " + std::to_string(impl_->vocab_size) + ")");
  return *p;
}

std::optional<int32_t> Tokenizer::piece_to_id(std::string_view piece) const { return impl_->lookup(piece); }
int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::vector<int32_t> Tokenizer::eos_ids() const { return impl_->eos; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
bool Tokenizer::is_special(int32_t id) const { return impl_->is_special(id); }

// ---------------------------------------------------------------------------------------------
// Streaming

bool Tokenizer::Impl::tail_incomplete(std::span<const int32_t> ids, bool skip_special) const {
  if (!decoder_info.byte_level && !decoder_info.byte_fallback) return false;
  // The raw bytes of the last tokens, as the byte-producing decoders will join them.
  std::string tail;
  for (size_t i = ids.size(); i-- > 0 && tail.size() < 4;) {
    const std::string* p = piece(ids[i]);
    if (!p || (skip_special && is_special(ids[i]))) continue;
    std::string raw;
    bool mapped = decoder_info.byte_level;
    if (mapped) {
      for (size_t k = 0; k < p->size();) {
        const int b = detail::char_to_byte(detail::utf8_next(*p, k));
        if (b < 0) {
          mapped = false;
          break;
        }
        raw.push_back(static_cast<char>(b));
      }
    }
    if (!mapped) {
      const int b = decoder_info.byte_fallback ? detail::parse_byte_token(*p) : -1;
      raw = b >= 0 ? std::string(1, static_cast<char>(b)) : *p;
    }
    tail.insert(0, raw);
  }
  return detail::utf8_incomplete_tail(tail) > 0;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tok_(tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  if (tok_.impl_->tail_incomplete(ids_, skip_special_)) return {};
  // Decoding with the previous chunk as context keeps what depends on neighbours (a stripped
  // leading space, say) the same as in a full decode.
  const std::string text = tok_.decode(ids_, skip_special_);
  std::string out;
  if (text.compare(0, context_text_.size(), context_text_) == 0) {
    out = text.substr(context_text_.size());
  } else {
    // Only a byte-fallback run that turns invalid can rewrite text already emitted; the new ids
    // are then decoded on their own.
    out = tok_.decode(std::span<const int32_t>(ids_).subspan(context_), skip_special_);
  }
  // The new ids become the context, unless none of them shows in the text (skipped special
  // tokens): a context of nothing would let the next token lose its leading space.
  const Tokenizer::Impl& I = *tok_.impl_;
  const bool visible = std::any_of(ids_.begin() + static_cast<std::ptrdiff_t>(context_), ids_.end(), [&](int32_t i) {
    return I.piece(i) && !(skip_special_ && I.is_special(i));
  });
  if (visible) {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(context_));
    context_text_ = tok_.decode(ids_, skip_special_);
  } else {
    context_text_ = text;
  }
  context_ = ids_.size();
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  if (ids_.size() > context_) {
    const std::string text = tok_.decode(ids_, skip_special_);
    if (text.compare(0, context_text_.size(), context_text_) == 0) {
      out = text.substr(context_text_.size());
    } else {
      out = tok_.decode(std::span<const int32_t>(ids_).subspan(context_), skip_special_);
    }
  }
  ids_.clear();
  context_ = 0;
  context_text_.clear();
  return out;
}

}  // namespace ingot::tok
