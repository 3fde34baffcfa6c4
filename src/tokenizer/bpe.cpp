// The BPE model of tokenizer.json: vocabulary, merges by rank, unknown-token and byte-fallback
// handling, ignore_merges, and a bounded per-word cache.
//
// Merging follows the reference exactly: all adjacent pairs that have a merge go into a priority
// queue ordered by (rank, position); the best is applied, stale entries are skipped, and the new
// pairs with the neighbours are queued. Symbols live in a doubly linked list, so a word of n
// symbols costs O(n log n), never a rescan per merge.
#include <algorithm>

#include "tokenizer/components.h"

namespace ingot::tok::detail {

void PairMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Slot{kEmpty, 0, 0});
  mask_ = cap - 1;
  count_ = 0;
}

void PairMap::insert_or_assign(int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
  if ((count_ + 1) * 2 > slots_.size()) {
    // Grow by rehashing into a table twice the size.
    std::vector<Slot> old;
    old.swap(slots_);
    reserve(std::max<size_t>(count_ + 1, old.size()));
    for (const Slot& s : old)
      if (s.key != kEmpty) insert_or_assign(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key & 0xFFFFFFFF), s.rank, s.new_id);
  }
  const uint64_t key = pack(a, b);
  for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) {
      s.rank = rank;
      s.new_id = new_id;
      return;
    }
    if (s.key == kEmpty) {
      s = Slot{key, rank, new_id};
      ++count_;
      return;
    }
  }
}

namespace {

constexpr std::string_view kMeta = "\xE2\x96\x81";  // U+2581, SentencePiece's space

std::string byte_token_name(unsigned b) {
  static const char* hex = "0123456789ABCDEF";
  std::string s = "<0x";
  s += hex[b >> 4];
  s += hex[b & 15];
  s += '>';
  return s;
}

// The raw bytes a byte-level token stands for; false if a character is outside the alphabet.
bool unmap_byte_level(std::string_view token, std::string& raw) {
  raw.clear();
  if (!utf8_is_valid(token)) return false;
  for (size_t i = 0; i < token.size();) {
    const int b = char_to_byte(utf8_next(token, i));
    if (b < 0) return false;
    raw.push_back(static_cast<char>(b));
  }
  return true;
}

}  // namespace

BpeModel::BpeModel(const json& m, const std::string& where) {
  std::string type;
  if (get_optional_string(m, "type", type, where) && type != "BPE") {
    throw Error(where + ".type: model '" + type + "' is not supported (supported: BPE)");
  }
  if (auto it = m.find("dropout"); it != m.end() && !it->is_null()) {
    if (!it->is_number()) throw Error(where + ".dropout: expected a number or null");
    if (it->get<double>() != 0.0)
      throw Error(where + ".dropout: BPE dropout makes encoding random and is not supported");
  }
  std::string s;
  if (get_optional_string(m, "unk_token", s, where)) unk_token_ = s;
  get_optional_string(m, "continuing_subword_prefix", prefix_, where);
  get_optional_string(m, "end_of_word_suffix", suffix_, where);
  fuse_unk_ = get_bool(m, "fuse_unk", false, where);
  byte_fallback_ = get_bool(m, "byte_fallback", false, where);
  ignore_merges_ = get_bool(m, "ignore_merges", false, where);

  const json& vocab = require_field(m, "vocab", where);
  if (!vocab.is_object()) throw Error(where + ".vocab: expected an object mapping tokens to ids");
  vocab_.reserve(vocab.size());
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX - 1)
      throw Error(where + ".vocab[\"" + it.key() + "\"]: expected a non-negative integer id");
    const int64_t id = it->get<int64_t>();
    max_id = std::max(max_id, id);
    if (!vocab_.emplace(it.key(), static_cast<int32_t>(id)).second)
      throw Error(where + ".vocab: token \"" + it.key() + "\" appears twice");
  }
  vocab_r_.assign(static_cast<size_t>(max_id + 1), std::string());
  present_.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [tok, id] : vocab_) {
    if (present_[id])
      throw Error(where + ".vocab: id " + std::to_string(id) + " is given to both \"" + vocab_r_[id] +
                  "\" and \"" + tok + "\"");
    present_[id] = 1;
    vocab_r_[id] = tok;
  }
  if (unk_token_)
    if (auto it = vocab_.find(*unk_token_); it != vocab_.end()) unk_id_ = it->second;

  const json& merges = require_field(m, "merges", where);
  if (!merges.is_array()) throw Error(where + ".merges: expected an array");
  merges_.reserve(merges.size());
  std::string a, b, merged;
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& e = merges[r];
    const std::string at = where + ".merges[" + std::to_string(r) + "]";
    if (e.is_string()) {
      const std::string& line = e.get_ref<const std::string&>();
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        throw Error(at + ": expected \"left right\" (two tokens separated by one space), found \"" + line + "\"");
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      throw Error(at + ": expected a string \"left right\" or a pair [left, right]");
    }
    auto ia = vocab_.find(a);
    if (ia == vocab_.end()) throw Error(at + ": token \"" + a + "\" is not in the vocabulary");
    auto ib = vocab_.find(b);
    if (ib == vocab_.end()) throw Error(at + ": token \"" + b + "\" is not in the vocabulary");
    if (b.size() < prefix_.size() || b.compare(0, prefix_.size(), prefix_) != 0)
      throw Error(at + ": token \"" + b + "\" lacks the continuing_subword_prefix \"" + prefix_ + "\"");
    merged = a + b.substr(prefix_.size());
    auto im = vocab_.find(merged);
    if (im == vocab_.end()) throw Error(at + ": merged token \"" + merged + "\" is not in the vocabulary");
    // A repeated pair takes its last rank, as in the reference's map construction.
    merges_.insert_or_assign(ia->second, ib->second, static_cast<uint32_t>(r), im->second);
  }

  byte_fallback_ids_.fill(-1);
  if (byte_fallback_) {
    for (unsigned v = 0; v < 256; ++v)
      if (auto it = vocab_.find(byte_token_name(v)); it != vocab_.end()) byte_fallback_ids_[v] = it->second;
  }

  // Byte-level support: look tokens up by the bytes they stand for, and know each byte's id.
  std::string raw;
  for (const auto& [tok, id] : vocab_)
    if (unmap_byte_level(tok, raw)) raw_vocab_.emplace(raw, id);
  byte_fast_path_ = prefix_.empty() && suffix_.empty();
  for (unsigned v = 0; v < 256; ++v) {
    std::string ch;
    utf8_append(ch, byte_to_char(static_cast<uint8_t>(v)));
    auto it = vocab_.find(ch);
    byte_char_ids_[v] = it == vocab_.end() ? -1 : it->second;
    if (it == vocab_.end()) byte_fast_path_ = false;
  }

  split_before_meta_ = prefix_.empty() && suffix_.empty() && vocab_.count(kMeta) > 0;
  for (auto it = vocab_.begin(); split_before_meta_ && it != vocab_.end(); ++it) {
    const std::string& t = it->first;
    for (size_t p = t.find(kMeta, 1); p != std::string::npos; p = t.find(kMeta, p + 1)) {
      if (p < kMeta.size() || t.compare(p - kMeta.size(), kMeta.size(), kMeta) != 0) {
        split_before_meta_ = false;
        break;
      }
    }
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || id >= id_limit() || !present_[id]) return nullptr;
  return &vocab_r_[id];
}

void BpeModel::tokenize(std::string_view word, bool byte_level, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (!byte_level && split_before_meta_) {
    // Cut before every "▁" that follows another character.
    size_t begin = 0;
    for (size_t p = word.find(kMeta, 1); p != std::string_view::npos; p = word.find(kMeta, p + kMeta.size())) {
      if (p >= kMeta.size() && word.compare(p - kMeta.size(), kMeta.size(), kMeta) == 0) continue;
      tokenize_word(word.substr(begin, p - begin), false, out);
      begin = p;
    }
    tokenize_word(word.substr(begin), false, out);
    return;
  }
  tokenize_word(word, byte_level, out);
}

void BpeModel::tokenize_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    const StringIdMap& map = byte_level ? raw_vocab_ : vocab_;
    if (auto it = map.find(word); it != map.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, byte_level, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    // Dropping everything when full keeps the bound simple; the next words refill it.
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
  }
}

void BpeModel::merge_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const {
  thread_local std::vector<int32_t> syms;
  syms.clear();
  if (byte_level && byte_fast_path_) {
    for (unsigned char c : word) syms.push_back(byte_char_ids_[c]);
  } else if (byte_level) {
    std::string mapped;
    for (unsigned char c : word) utf8_append(mapped, byte_to_char(c));
    initial_symbols(mapped, syms);
  } else {
    initial_symbols(word, syms);
  }
  apply_merges(syms);
  out.insert(out.end(), syms.begin(), syms.end());
}

void BpeModel::initial_symbols(std::string_view w, std::vector<int32_t>& syms) const {
  bool unk_pending = false;
  std::string decorated;
  for (size_t i = 0; i < w.size();) {
    const size_t start = i;
    utf8_next(w, i);
    std::string_view s = w.substr(start, i - start);
    const bool is_first = start == 0, is_last = i == w.size();
    if ((!is_first && !prefix_.empty()) || (is_last && !suffix_.empty())) {
      decorated.assign(is_first ? "" : prefix_);
      decorated += s;
      if (is_last) decorated += suffix_;
      s = decorated;
    }
    if (auto it = vocab_.find(s); it != vocab_.end()) {
      if (unk_pending) {
        syms.push_back(*unk_id_);
        unk_pending = false;
      }
      syms.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : s) all = all && byte_fallback_ids_[c] >= 0;
      if (all) {
        // Like the reference, a pending unknown token is not flushed before the bytes.
        for (unsigned char c : s) syms.push_back(byte_fallback_ids_[c]);
        continue;
      }
    }
    if (unk_token_) {
      if (!unk_id_)
        throw Error("tokenizer: model.unk_token \"" + *unk_token_ + "\" is needed but is not in the vocabulary");
      if (unk_pending && !fuse_unk_) syms.push_back(*unk_id_);
      unk_pending = true;
    }
    // Without an unk_token the reference drops the character; so do we.
  }
  if (unk_pending) syms.push_back(*unk_id_);
}

void BpeModel::apply_merges(std::vector<int32_t>& syms) const {
  const int32_t n = static_cast<int32_t>(syms.size());
  if (n < 2) return;
  struct Link {
    int32_t prev, next;
    bool alive;
  };
  struct Cand {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
  };
  // Min-heap on (rank, pos): the lowest rank wins, the leftmost on ties.
  auto worse = [](const Cand& x, const Cand& y) { return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos; };
  thread_local std::vector<Link> links;
  thread_local std::vector<Cand> heap;
  links.resize(static_cast<size_t>(n));
  heap.clear();
  for (int32_t i = 0; i < n; ++i) links[i] = {i - 1, i + 1 < n ? i + 1 : -1, true};
  for (int32_t i = 0; i + 1 < n; ++i)
    if (const PairMap::Slot* m = merges_.find(syms[i], syms[i + 1])) heap.push_back({m->rank, i, m->new_id});
  std::make_heap(heap.begin(), heap.end(), worse);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Cand top = heap.back();
    heap.pop_back();
    Link& cur = links[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    const int32_t right = cur.next;
    // Skip entries made stale by an earlier merge of either symbol.
    const PairMap::Slot* m = merges_.find(syms[top.pos], syms[right]);
    if (!m || m->new_id != top.new_id) continue;
    syms[top.pos] = top.new_id;
    links[right].alive = false;
    cur.next = links[right].next;
    if (cur.next >= 0) links[cur.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const PairMap::Slot* pm = merges_.find(syms[cur.prev], syms[top.pos])) {
        heap.push_back({pm->rank, cur.prev, pm->new_id});
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    }
    if (cur.next >= 0) {
      if (const PairMap::Slot* nm = merges_.find(syms[top.pos], syms[cur.next])) {
        heap.push_back({nm->rank, top.pos, nm->new_id});
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    }
  }
  int32_t w = 0;
  for (int32_t i = 0; i < n; ++i)
    if (links[i].alive) syms[w++] = syms[i];
  syms.resize(static_cast<size_t>(w));
}

}  // namespace ingot::tok::detail
