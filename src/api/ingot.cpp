// The public API (include/ingot/ingot.h) over the engine: an engine file or checkpoint folder becomes
// an Engine, a backend and a Model with one cache row, a tokenizer (from the folder, or from the texts
// the engine file embeds) and a Session that streams text and keeps the conversation's prefix cached.
#include "ingot/ingot.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>

#include "backend/backend.h"
#include "core/error.h"
#include "io/engine_file.h"
#include "io/engine_tokenizer.h"
#include "runtime/chat.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

#ifdef INGOT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ingot::api {

namespace fs = std::filesystem;

namespace {

std::string resolve_device(const std::string& device) {
  if (device == "auto") {
#ifdef INGOT_WITH_CUDA
    return cuda_available() ? "cuda" : "cpu";
#else
    return "cpu";
#endif
  }
#ifndef INGOT_WITH_CUDA
  if (device == "cuda") throw Error("this build of ingot has no CUDA backend");
#endif
  if (device == "cpu" || device == "cuda") return device;
  throw Error("unknown device '" + device + "' (expected auto, cpu or cuda)");
}

std::unique_ptr<Backend> make_backend(const std::string& device, DType dtype, int threads) {
#ifdef INGOT_WITH_CUDA
  if (device == "cuda") return make_cuda_backend(dtype);
#else
  (void)dtype;
#endif
  return make_cpu_backend(threads);
}

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

}  // namespace

struct Model::Impl {
  std::string source;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ingot::Model> model;
  std::optional<tok::Tokenizer> tokenizer;
  std::optional<ChatFormat> chat;  // the template file's, or the tokenizer's once a chat needs it
  std::unique_ptr<Session> session;
  std::vector<int32_t> eos_ids;
  std::string device;
  double load_s = 0;

  const tok::Tokenizer& tk() const {
    if (!tokenizer) throw Error(source + ": no tokenizer (tokenizer.json) came with the model");
    return *tokenizer;
  }

  const ChatFormat& chat_format() {
    if (!chat) chat = ChatFormat::from_tokenizer(tk(), source);
    return *chat;
  }

  Result run(const std::vector<int32_t>& ids, const GenerateConfig& c, const OnToken& on_token) {
    TextRequest req;
    req.prompt_ids = ids;
    req.max_new_tokens = c.max_new_tokens;
    const int64_t room = model->state().max_new_tokens(int64_t(ids.size()));
    if (c.fit_capacity && !ids.empty() && c.max_new_tokens > room) {
      if (room < 1) {
        Result r;
        r.prompt_tokens = int64_t(ids.size());
        r.stop_reason = "capacity";
        return r;
      }
      req.max_new_tokens = int(room);
    }
    if (c.on_warning && !ids.empty())
      if (std::string w = position_limit_warning(model->spec().max_position, int64_t(ids.size()), req.max_new_tokens);
          !w.empty())
        c.on_warning(w);
    req.sampling = SamplingParams{c.sampling.temperature, c.sampling.top_k,  c.sampling.top_p,
                                  c.sampling.min_p,       c.sampling.repetition_penalty, c.sampling.seed};
    if (!c.ignore_eos) req.eos_ids = eos_ids;
    req.stop_strings = c.stop;
    std::string pending;
    std::function<void(std::string_view)> on_text;
    std::function<void(int32_t)> on_id;
    if (on_token) {
      on_text = [&](std::string_view t) { pending += t; };
      on_id = [&](int32_t id) {
        on_token(id, pending);
        pending.clear();
      };
    }
    TextResult t = session->generate(req, on_text, on_id);
    if (on_token && !pending.empty()) on_token(-1, pending);
    Result r;
    r.text = std::move(t.text);
    r.token_ids = std::move(t.ids);
    r.prompt_tokens = t.prompt_tokens;
    r.computed_prompt_tokens = t.prefilled_tokens;
    r.stop_reason = t.stop_reason;
    if (r.stop_reason == "length" && req.max_new_tokens < c.max_new_tokens) r.stop_reason = "capacity";
    r.ttft_s = t.ttft_s;
    r.decode_s = t.decode_s;
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
  // A chat that cannot happen is refused before any weights are read.
  if (!c.chat_template_file.empty()) im->chat = ChatFormat::from_file(c.chat_template_file);
  if (c.chat) {
    if (fs::is_directory(path)) {
      if (fs::exists(fs::path(path) / "tokenizer.json")) im->tokenizer = tok::Tokenizer::from_folder(path);
    } else {
      im->tokenizer = tokenizer_from_engine(inspect_engine(path));
    }
    im->chat_format();
  }
  im->device = resolve_device(c.device);
  // The CPU backend does not depend on the weights' dtype: made first, its cache and workspace join
  // the host memory check that precedes the build or the checksum pass.
  if (im->device == "cpu") im->backend = make_cpu_backend(c.threads);
  RuntimeOptions rt;
  rt.capacity = c.capacity;
  if (fs::is_directory(path)) {
    BuildOptions bo;
    if (!c.dtype.empty()) bo.dtype = parse_dtype(c.dtype);
    const ModelSpec spec = load_model_spec(path);
    check_host_memory(spec, build_dtype(path, spec, bo.dtype), rt, true, im->backend.get());
    im->engine = std::make_unique<Engine>(build_engine(path, bo));
    if (!im->tokenizer && fs::exists(fs::path(path) / "tokenizer.json"))
      im->tokenizer = tok::Tokenizer::from_folder(path);
  } else {
    {
      const EngineFileInfo info = inspect_engine(path);
      rt = fit_engine_bounds(info, rt, false);
      check_host_memory(info.spec, info.weight_dtype, rt, false, im->backend.get());
    }
    LoadOptions lo;
    lo.verify = c.verify;
    lo.progress = c.progress;
    LoadedEngine le = load_engine(path, lo);
    if (!c.dtype.empty() && parse_dtype(c.dtype) != le.engine.weight_dtype)
      throw Error(path + ": the engine holds " + std::string(dtype_name(le.engine.weight_dtype)) +
                  " weights; rebuild it to change the dtype");
    if (!im->tokenizer) im->tokenizer = tokenizer_from_engine(le.info);
    im->engine = std::make_unique<Engine>(std::move(le.engine));
#ifdef INGOT_WITH_CUDA
    if (im->device == "cuda") {
      int major = 0, minor = 0;
      if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
          cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess)
        check_device_capability(le.info, major, minor);
    }
#endif
  }
  if (!im->backend) im->backend = make_backend(im->device, im->engine->weight_dtype, c.threads);
  im->model = std::make_unique<ingot::Model>(*im->engine, *im->backend, rt);
  for (int64_t e : im->engine->spec.eos_ids) im->eos_ids.push_back(int32_t(e));
  if (im->tokenizer) {
    for (int32_t e : im->tokenizer->eos_ids())
      if (std::find(im->eos_ids.begin(), im->eos_ids.end(), e) == im->eos_ids.end()) im->eos_ids.push_back(e);
    im->session = std::make_unique<Session>(*im->model, *im->tokenizer);
  }
  im->load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Model(std::move(im));
}

Result Model::generate(std::string_view prompt, const GenerateConfig& c, const OnToken& on_token) {
  return impl_->run(impl_->tk().encode(prompt, true), c, on_token);
}

Result Model::generate(const std::vector<int32_t>& ids, const GenerateConfig& c, const OnToken& on_token) {
  impl_->tk();  // streaming text needs the tokenizer
  return impl_->run(ids, c, on_token);
}

Result Model::chat(const std::vector<Message>& messages, const GenerateConfig& c, const OnToken& on_token,
                   const ChatConfig& chat) {
  return impl_->run(impl_->chat_format().ids(impl_->tk(), to_json(messages), chat_options(chat)), c, on_token);
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
  ingot::Model& m = *impl_->model;
  const int64_t V = m.spec().vocab;
  std::vector<float> out;
  out.reserve(ids.size() * size_t(V));
  if (impl_->session) impl_->session->reset();  // the cache row is about to hold this sequence instead
  for (size_t at = 0; at < ids.size();) {
    const size_t n = std::min<size_t>(size_t(m.max_tokens()), ids.size() - at);
    HostTensor lg = m.forward(Batch{{BatchRow{0, std::vector<int32_t>(ids.begin() + long(at), ids.begin() + long(at + n)),
                                              int64_t(at), {}, true}}});
    out.insert(out.end(), lg.as<float>(), lg.as<float>() + lg.numel());
    at += n;
  }
  return out;
}

int64_t Model::vocab_size() const { return impl_->model->spec().vocab; }
int64_t Model::capacity() const { return impl_->model->state().capacity(); }
std::string Model::device() const { return impl_->device; }
double Model::load_seconds() const { return impl_->load_s; }
void Model::reset() {
  if (impl_->session) impl_->session->reset();
}

}  // namespace ingot::api
