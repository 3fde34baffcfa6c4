// The public API (include/ingot/ingot.h) over the runtime: the runtime's loader (runtime/loader.h)
// makes the Engine, backend and Model with one cache row, a tokenizer comes from the folder or from
// the texts the engine file embeds, and the Generator streams text and keeps the conversation's
// prefix cached in its one slot.
#include "ingot/ingot.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "io/engine_file.h"
#include "io/engine_tokenizer.h"
#include "runtime/tp_engine_dir.h"
#include "runtime/chat.h"
#include "runtime/generator.h"
#include "runtime/loader.h"
#include "runtime/text_decoder.h"
#include "tokenizer/tokenizer.h"

namespace ingot::api {

namespace fs = std::filesystem;

namespace {

nlohmann::ordered_json to_json(const std::vector<Message>& messages) {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const Message& m : messages) j.push_back({{"role", m.role}, {"content", m.content}});
  return j;
}

ChatOptions chat_options(const ChatConfig& c) {
  ChatOptions o;
  o.add_generation_prompt = c.add_generation_prompt;
  if (c.enable_thinking >= 0) o.enable_thinking = c.enable_thinking != 0;
  return o;
}

// The public sampling settings as the runtime's (the one conversion).
SamplingParams to_runtime(const Sampling& s) {
  return SamplingParams{s.temperature, s.top_k,   s.top_p,           s.min_p,
                        s.repetition_penalty, s.seed, s.frequency_penalty, s.presence_penalty};
}

}  // namespace

struct Model::Impl {
  std::string source;
  Loaded loaded;
  std::unique_ptr<Generator> gen;  // over loaded.model's one row
  std::optional<tok::Tokenizer> tokenizer;
  std::optional<ChatFormat> chat;  // the template file's, or the tokenizer's once a chat needs it
  std::vector<int32_t> eos_ids;
  double load_s = 0;
  // The conversation row's history, for continuing a model whose state cannot be rewound: the tokens
  // the row holds (the last prompt and every token of its reply), and the chat and reply that made
  // them (null after a plain generate or a failed chat).
  std::vector<int32_t> held;
  nlohmann::ordered_json last_messages;
  std::string last_reply;

  const tok::Tokenizer& tk() const {
    if (!tokenizer) throw Error(source + ": no tokenizer (tokenizer.json) came with the model");
    return *tokenizer;
  }

  const ChatFormat& chat_format() {
    if (!chat) chat = ChatFormat::from_tokenizer(tk(), source);
    return *chat;
  }

  // A chat's next turn on a model whose state cannot be rewound, when the template re-renders the
  // history otherwise than the row holds it (ChatFormat::next_turn): the held tokens and the new
  // turn's, so only the new turn is prefilled. Only for the same conversation continued by exactly
  // the reply it got and one new message; nullopt otherwise (the rendered ids are used as they are).
  std::optional<std::vector<int32_t>> continuation(const ChatFormat& format, const nlohmann::ordered_json& msgs,
                                                   const ChatOptions& opts, const std::string& text,
                                                   const std::vector<int32_t>& rendered) {
    if (loaded.model->state().rewindable() || held.empty() || !last_messages.is_array()) return std::nullopt;
    if (rendered.size() >= held.size() && std::equal(held.begin(), held.end(), rendered.begin()))
      return std::nullopt;  // the rendering extends what the row holds: nothing to work around
    const size_t n = last_messages.size();
    if (msgs.size() != n + 2 || !std::equal(last_messages.begin(), last_messages.end(), msgs.begin()))
      return std::nullopt;
    const nlohmann::ordered_json& reply = msgs[n];
    if (reply.value("role", "") != "assistant" || !reply.contains("content") || reply["content"] != last_reply)
      return std::nullopt;
    std::vector<std::string> ends;
    for (int32_t e : eos_ids) ends.push_back(tk().decode(std::vector<int32_t>{e}, false));
    auto next = format.next_turn(tk(), msgs, opts, ends, text);
    if (!next) return std::nullopt;
    // A reply cut by a length limit does not end with the end-of-turn marker: the template adds it.
    const std::vector<int32_t> marker = tk().encode(next->marker, false);
    const bool closed = !marker.empty() && held.size() >= marker.size() &&
                        std::equal(marker.rbegin(), marker.rend(), held.rbegin());
    std::vector<int32_t> ids = held;
    const std::vector<int32_t> add = tk().encode(closed ? next->text : next->marker + next->text, false);
    ids.insert(ids.end(), add.begin(), add.end());
    return ids;
  }

  Result run(const std::vector<int32_t>& ids, const GenerateConfig& c, const OnToken& on_token) {
    Request req;
    req.prompt = ids;
    req.max_new_tokens = c.max_new_tokens;
    req.sampling = to_runtime(c.sampling);
    if (!c.ignore_eos) req.eos_ids = eos_ids;
    req.stop = c.stop;
    if (tokenizer) req.text = text_decoder(*tokenizer);  // without one: token ids only
    req.fit_capacity = c.fit_capacity;
    req.slot = 0;  // the conversation's row: a follow-up prefills only what differs
    req.on_warning = c.on_warning;
    if (on_token) req.on_token = [&on_token](const TokenEvent& e) { on_token(e.id, e.text); };
    held.clear();
    Completion done = gen->generate(std::move(req));
    held = ids;
    held.insert(held.end(), done.ids.begin(), done.ids.end());
    Result r;
    r.text = std::move(done.text);
    r.token_ids = std::move(done.ids);
    r.prompt_tokens = done.prompt_tokens;
    r.computed_prompt_tokens = done.computed_prompt_tokens;
    r.stop_reason = stop_reason_name(done.stop);
    r.ttft_s = done.ttft_s;
    r.decode_s = done.decode_s;
    return r;
  }
};

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

Model Model::load(const std::string& path, const LoadConfig& c) {
  const auto t0 = std::chrono::steady_clock::now();
  auto im = std::make_unique<Impl>();
  im->source = path;
  // A folder is a checkpoint, unless it holds a manifest: then it is an engine directory (`build --tp`).
  const bool engine_dir = fs::is_directory(path) && fs::exists(fs::path(path) / kTpManifestName);
  const bool folder = fs::is_directory(path) && !engine_dir;
  // A chat that cannot happen is refused before any weights are read.
  if (!c.chat_template_file.empty()) im->chat = ChatFormat::from_file(c.chat_template_file);
  if (c.chat) {
    if (folder) {
      if (fs::exists(fs::path(path) / "tokenizer.json")) im->tokenizer = tok::Tokenizer::from_folder(path);
    } else {
      im->tokenizer = tokenizer_from_engine(engine_dir ? inspect_tp_engine_dir(path).ranks[0] : inspect_engine(path));
    }
    im->chat_format();
  }
  LoadSpec ls;
  (folder ? ls.model_dir : ls.engine_path) = path;
  ls.device = c.device;
  ls.dtype = c.dtype;
  ls.activations = c.activations;
  ls.threads = c.threads;
  ls.batch_invariant = c.batch_invariant;
  ls.verify = c.verify;
  if (c.int4_group_size) ls.int4_group_size = c.int4_group_size;
  ls.calibration_text = c.calibration_text;
  ls.calibration_ids = c.calibration_ids;
  ls.quantize_lm_head = c.quantize_lm_head;
  ls.progress = c.progress;
  RuntimeOptions rt;
  rt.capacity = c.capacity;
  rt.tp = c.tp ? c.tp : 1;
  ls.tp_given = c.tp != 0;
  im->loaded = ingot::load(ls, rt);
  if (!im->tokenizer) {
    if (im->loaded.engine_file) im->tokenizer = tokenizer_from_engine(*im->loaded.engine_file);
    else if (fs::exists(fs::path(path) / "tokenizer.json")) im->tokenizer = tok::Tokenizer::from_folder(path);
  }
  im->gen = std::make_unique<Generator>(*im->loaded.model);
  for (int64_t e : im->loaded.engine->spec.eos_ids) im->eos_ids.push_back(int32_t(e));
  if (im->tokenizer)
    for (int32_t e : im->tokenizer->eos_ids())
      if (std::find(im->eos_ids.begin(), im->eos_ids.end(), e) == im->eos_ids.end()) im->eos_ids.push_back(e);
  im->load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Model(std::move(im));
}

Result Model::generate(std::string_view prompt, const GenerateConfig& c, const OnToken& on_token) {
  impl_->last_messages = nullptr;
  return impl_->run(impl_->tk().encode(prompt, true), c, on_token);
}

Result Model::generate(const std::vector<int32_t>& ids, const GenerateConfig& c, const OnToken& on_token) {
  impl_->last_messages = nullptr;
  return impl_->run(ids, c, on_token);
}

Result Model::chat(const std::vector<Message>& messages, const GenerateConfig& c, const OnToken& on_token,
                   const ChatConfig& chat) {
  const ChatFormat& format = impl_->chat_format();
  const nlohmann::ordered_json msgs = to_json(messages);
  const ChatOptions opts = chat_options(chat);
  const std::string text = format.render(impl_->tk(), msgs, opts);
  std::vector<int32_t> ids = impl_->tk().encode(text, false);
  if (auto next = impl_->continuation(format, msgs, opts, text, ids)) ids = std::move(*next);
  impl_->last_messages = nullptr;
  Result r = impl_->run(ids, c, on_token);
  impl_->last_messages = msgs;
  impl_->last_reply = r.text;
  return r;
}

std::vector<int32_t> Model::tokenize(std::string_view text, bool add_special_tokens) const {
  return impl_->tk().encode(text, add_special_tokens);
}

std::string Model::detokenize(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return impl_->tk().decode(ids, skip_special_tokens);
}

std::string Model::render_chat(const std::vector<Message>& messages, const ChatConfig& chat) const {
  return impl_->chat_format().render(impl_->tk(), to_json(messages), chat_options(chat));
}

std::vector<float> Model::logits(const std::vector<int32_t>& ids) {
  if (ids.empty()) throw Error("logits: no tokens");
  ingot::Model& m = *impl_->loaded.model;
  const int64_t V = m.spec().vocab;
  std::vector<float> out;
  out.reserve(ids.size() * size_t(V));
  impl_->gen->forget(0);  // the cache row is about to hold this sequence instead
  for (size_t at = 0; at < ids.size();) {
    const size_t n = std::min<size_t>(size_t(m.max_tokens()), ids.size() - at);
    HostTensor lg = m.forward(Batch{{BatchRow{0, std::vector<int32_t>(ids.begin() + long(at), ids.begin() + long(at + n)),
                                              int64_t(at), {}, true}}});
    out.insert(out.end(), lg.as<float>(), lg.as<float>() + lg.numel());
    at += n;
  }
  return out;
}

bool Model::lead_ranks() { return impl_->loaded.model->lead_ranks(); }

int64_t Model::vocab_size() const { return impl_->loaded.model->spec().vocab; }
int64_t Model::capacity() const { return impl_->loaded.model->state().capacity(); }
std::string Model::device() const { return impl_->loaded.device; }
double Model::load_seconds() const { return impl_->load_s; }
void Model::reset() {
  impl_->gen->forget_all();
  impl_->held.clear();  // the next chat renders its messages afresh
  impl_->last_messages = nullptr;
}

}  // namespace ingot::api
