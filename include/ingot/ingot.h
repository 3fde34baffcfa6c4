// ingot's public C++ API: load an engine file (.ingot, from `ingot build`) or a Hugging Face checkpoint
// folder, then generate text from a prompt or a chat, with sampling and a per-token streaming
// callback; lower-level calls tokenize, detokenize, render chats and return logits. Everything else
// (backends, kernels, file formats) stays behind this header. Errors are thrown as std::runtime_error
// whose message names the problem (file, field, limit).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ingot::api {

struct LoadConfig {
  std::string device = "auto";  // auto (the GPU when usable), cpu or cuda
  int threads = 0;              // CPU threads; 0 = all cores
  // GPU: kernels whose result for a sequence does not depend on what else runs beside it or how its
  // prompt is chunked, at a speed cost (docs/performance.md). The CPU backend always is.
  bool batch_invariant = false;
  bool verify = true;           // engine files: check every weight's checksum while loading
  std::string dtype;     // weight dtype: "" (the checkpoint's), fp32, fp16 or bf16; an engine keeps its own
  // Activation and KV-cache dtype: "" = the weights' on the GPU, f32 on the CPU; "f32" on the GPU keeps
  // activations and the cache in f32 over 16-bit (not INT4) weights (docs/performance.md, precision).
  std::string activations;
  // A checkpoint folder's linear weights as INT4 (symmetric, round to nearest) with this many input
  // columns per scale, a power of two in [32, 256]; 0 = not quantized. CPU only (docs/quantization.md).
  int64_t int4_group_size = 0;
  // With int4_group_size: a calibration file for activation-aware scales (docs/quantization.md): text
  // (tokenized with the folder's tokenizer) or whitespace-separated token ids; both empty: plain RTN.
  std::string calibration_text, calibration_ids;
  bool quantize_lm_head = false;  // with int4_group_size: the untied LM head as INT4 too
  // Cache slots, i.e. prompt + generated tokens, allocated at load. 0 = min(4096,
  // max_position_embeddings, and for an engine file the capacity it was built for). An engine file
  // refuses a value above the capacity it was built for.
  int64_t capacity = 0;
  // Tensor-parallel ranks: the model split over this many ranks (docs/tensor-parallel.md). On the CPU
  // threads of this process; on the GPU one process per GPU: this process becomes rank 0 and starts
  // ranks 1..N-1 by re-executing its own executable with its own command line (SPMD), so a program
  // using it there must run the same calls in every process. 0 = the source's: an engine directory from `ingot build --tp N`
  // runs at its N (another N given here is refused), anything else at 1 (not split).
  int tp = 0;
  // Engine files: called with bytes verified so far and in all (from one thread at a time).
  std::function<void(uint64_t done, uint64_t total)> progress;
  // A file whose text replaces the model's chat template ("" = the model's own). It is read and parsed
  // by load(); errors name the file and the template's line.
  std::string chat_template_file;
  // The caller will chat: load() refuses, before reading any weights, a model without a tokenizer or
  // a chat template (its own or chat_template_file).
  bool chat = false;
};

struct Sampling {
  float temperature = 0.0f;         // 0 = greedy
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off
  uint64_t seed = 0;                // the same seed and inputs give the same tokens
  // OpenAI's penalties over the generated tokens (not the prompt), each in [-2, 2], 0 = off: the
  // logit of a token generated c times loses frequency_penalty * c + presence_penalty.
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
};

struct GenerateConfig {
  int max_new_tokens = 256;
  Sampling sampling;
  std::vector<std::string> stop;  // stop strings (the text is cut before them)
  bool ignore_eos = false;
  // Stop where the cache ends (stop_reason "capacity") instead of refusing a request whose
  // max_new_tokens runs past it; a prompt that leaves no room gives no tokens and computes nothing.
  // For conversations, which grow until the cache is full.
  bool fit_capacity = false;
  // Called before generation with one-line warnings: the prompt plus max_new_tokens run past the
  // model's max_position_embeddings (it still runs; output beyond may degrade).
  std::function<void(const std::string& warning)> on_warning;
};

struct Message {
  std::string role;  // system | user | assistant
  std::string content;
};

struct ChatConfig {
  bool add_generation_prompt = true;
  int enable_thinking = -1;  // -1: leave to the template; 0 / 1: pass enable_thinking=false / true
};

struct Result {
  std::string text;                // generated text
  std::vector<int32_t> token_ids;  // generated ids
  int64_t prompt_tokens = 0;
  int64_t computed_prompt_tokens = 0;  // prompt tokens computed (the rest came from the cached prefix)
  std::string stop_reason;             // eos | stop_string | length | capacity (fit_capacity)
  double ttft_s = 0;                   // call start to first token
  double decode_s = 0;                 // first token to last
  double decode_tokens_per_s() const {
    return token_ids.size() > 1 && decode_s > 0 ? double(token_ids.size() - 1) / decode_s : 0.0;
  }
};

// Called once per generated token with the text it completed (empty while a multi-byte character or
// a possible stop string is pending). Text still pending when generation ends comes in one last call
// with token_id -1.
using OnToken = std::function<void(int32_t token_id, std::string_view text)>;

class Model {
 public:
  // `path`: an engine file or a checkpoint folder (config.json, safetensors, tokenizer.json).
  static Model load(const std::string& path, const LoadConfig& config = {});
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  Result generate(std::string_view prompt, const GenerateConfig& config = {}, const OnToken& on_token = {});
  // From token ids. A model without a tokenizer generates ids only (the text stays empty, and stop
  // strings are refused).
  Result generate(const std::vector<int32_t>& prompt_ids, const GenerateConfig& config = {},
                  const OnToken& on_token = {});
  // Renders the messages with the chat template (LoadConfig::chat_template_file, else the model's) and
  // generates the assistant's reply. The conversation's cached prefix is reused across calls.
  Result chat(const std::vector<Message>& messages, const GenerateConfig& config = {}, const OnToken& on_token = {},
              const ChatConfig& chat = {});

  std::vector<int32_t> tokenize(std::string_view text, bool add_special_tokens = true) const;
  std::string detokenize(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;
  std::string render_chat(const std::vector<Message>& messages, const ChatConfig& chat = {}) const;
  // Next-token logits after each of `ids` (a fresh sequence): ids.size() rows of vocab_size() floats.
  std::vector<float> logits(const std::vector<int32_t>& ids);

  int64_t vocab_size() const;   // the model's
  int64_t capacity() const;     // cache slots: the most prompt + generated tokens per call
  std::string device() const;   // cpu or cuda
  double load_seconds() const;  // time load() took
  void reset();                 // forget the cached conversation

  // Tensor parallelism with ranks as processes (LoadConfig::tp > 1 on the GPU: one process per GPU,
  // each running this program from the start). A program whose input reaches only the first process
  // (a server, a terminal) calls this once after load(): the first process gets true and drives the
  // model; every other process runs the model calls the first one makes, until that Model is gone,
  // and then gets false and should end. Programs that make the same calls in every process (a batch
  // job) need not call it. Always true without ranks as processes.
  bool lead_ranks();

 private:
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ingot::api
