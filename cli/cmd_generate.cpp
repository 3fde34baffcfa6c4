// `ingot generate`: greedy generation from token ids, one line per step as a debugging runner prints.
#include <cstdio>

#include "common.h"
#include "runtime/generate.h"

namespace ingot::cli {

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate tokens greedily from a prompt of token ids");
  struct Args {
    ModelArgs model;
    std::string prompt_ids;
    int max_new = 16;
    int64_t capacity = 0;
    bool ignore_eos = false;
  };
  auto a = std::make_shared<Args>();
  a->model.add_to(*cmd);
  cmd->add_option("--prompt-ids", a->prompt_ids, "comma-separated token ids")->required();
  cmd->add_option("--max-new-tokens", a->max_new, "tokens to generate")->check(CLI::PositiveNumber);
  cmd->add_option("--capacity", a->capacity, "cache slots (default: prompt + max new tokens - 1)");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "do not stop at the end-of-sequence ids");
  cmd->callback([a] {
    std::vector<int32_t> prompt = parse_ids(a->prompt_ids);
    RuntimeOptions rt;
    rt.capacity = a->capacity ? a->capacity : slots_needed(int64_t(prompt.size()), a->max_new);
    Loaded l = load_model(a->model, rt);
    GenerateOptions go;
    go.max_new_tokens = a->max_new;
    if (!a->ignore_eos) go.eos_ids = l.engine->spec.eos_ids;
    std::vector<int32_t> out = generate_greedy(*l.model, prompt, go, [](int step, bool prefill, int32_t tok) {
      std::printf("step %d %s token %d\n", step, prefill ? "prefill" : "decode", tok);
      std::fflush(stdout);
    });
    std::printf("generated %zu tokens\n", out.size());
  });
}

}  // namespace ingot::cli
