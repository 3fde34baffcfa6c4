// `ingot eval-logits`: the last-position logits of many contexts of varied length, packed into as few
// forward calls as the workspace allows, or (--decode) fed token by token through the decode path.
// tools/compare_16bit.py and tools/precision_study.py feed it the contexts they also give
// transformers, to compare 16-bit paths against an f32 reference.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

#include "common.h"
#include "core/error.h"
#include "core/files.h"
#include "io/safetensors.h"
#include "options.h"

namespace ingot::cli {

void add_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval-logits", "Last-position logits of many contexts (for numerics studies)");
  struct Args {
    ModelArgs model;
    std::string contexts, out;
    int max_batch = 32;
    bool force = false, decode = false;
  };
  auto a = std::make_shared<Args>();
  a->model.add_to(*cmd);
  cmd->add_option("--contexts", a->contexts,
                  "safetensors with input_ids [N, S] int64 and lengths [N] int64 (row n uses its first lengths[n] ids)")
      ->required();
  cmd->add_option("-o,--output,--out", a->out, "safetensors to write: logits [N, vocab] float32")->required();
  cmd->add_flag("--force", a->force, "replace the output file if it exists (never an input)");
  cmd->add_option("--max-batch", a->max_batch, "rows per forward call")->check(at_least(1));
  cmd->add_flag("--decode", a->decode,
                "feed every context one token per call (the decode path: one-token rows, --max-batch of them at "
                "a time; --max-batch 1 is batch-1 decode) instead of whole contexts as prefill");
  cmd->callback([a] {
    std::vector<std::string> inputs = model_inputs(a->model);
    inputs.push_back(a->contexts);
    check_output_path(a->out, "--output", a->force, inputs);
    SafetensorsFile f(a->contexts);
    const TensorEntry* ids = f.find("input_ids");
    const TensorEntry* lens = f.find("lengths");
    if (!ids || ids->dtype != DType::I64 || ids->shape.size() != 2)
      throw Error(a->contexts + ": needs 'input_ids' as int64 [N, S]");
    const int64_t N = ids->shape[0], S = ids->shape[1];
    if (!lens || lens->dtype != DType::I64 || lens->shape != Shape{N})
      throw Error(a->contexts + ": needs 'lengths' as int64 [N]");
    // Copied out of the mapping: safetensors places tensors at any byte offset, so the int64 values
    // need not be aligned where they lie.
    std::vector<int64_t> id(static_cast<size_t>(N * S)), len(static_cast<size_t>(N));
    std::memcpy(id.data(), ids->data, id.size() * sizeof(int64_t));
    std::memcpy(len.data(), lens->data, len.size() * sizeof(int64_t));
    for (int64_t n = 0; n < N; ++n)
      if (len[size_t(n)] < 1 || len[size_t(n)] > S)
        throw Error(a->contexts + ": lengths[" + std::to_string(n) + "] = " + std::to_string(len[size_t(n)]) + " is outside [1, " +
                    std::to_string(S) + "]");
    for (size_t i = 0; i < id.size(); ++i)
      if (id[i] < 0 || id[i] > INT32_MAX)
        throw Error(a->contexts + ": input_ids[" + std::to_string(int64_t(i) / S) + ", " + std::to_string(int64_t(i) % S) +
                    "] = " + std::to_string(id[i]) + " is not a token id");
    RuntimeOptions rt;
    rt.max_batch = int(std::min<int64_t>(N, a->max_batch));
    rt.capacity = S;
    Loaded l = load_model(a->model, rt);
    const int64_t V = l.engine->spec.vocab;
    HostTensor out(DType::F32, {N, V});
    const auto progress = [&](int64_t done) {
      if (!a->model.quiet) std::fprintf(stderr, "\r%lld/%lld contexts", (long long)done, (long long)N);
    };
    if (a->decode) {
      // Rows n0.. share the calls: step t gives each row still running its token t at slot t, and a
      // row's logits come back at its last token (forward returns them in call order).
      for (int64_t n0 = 0; n0 < N; n0 += rt.max_batch) {
        const int64_t rows = std::min<int64_t>(rt.max_batch, N - n0);
        const int64_t steps = *std::max_element(len.begin() + n0, len.begin() + n0 + rows);
        for (int64_t t = 0; t < steps; ++t) {
          Batch b;
          std::vector<int64_t> ends;
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t n = n0 + r;
            if (t >= len[size_t(n)]) continue;
            const bool last = t == len[size_t(n)] - 1;
            b.rows.push_back(BatchRow{int(r), {int32_t(id[size_t(n * S + t)])}, t, {}, false, last});
            if (last) ends.push_back(n);
          }
          HostTensor lg = l.model->forward(b);
          for (size_t i = 0; i < ends.size(); ++i)
            std::memcpy(out.as<float>() + ends[i] * V, lg.as<float>() + int64_t(i) * V, size_t(V) * sizeof(float));
        }
        progress(n0 + rows);
      }
    } else {
      for (int64_t n0 = 0; n0 < N;) {
        Batch b;
        int64_t tokens = 0;
        for (int64_t n = n0; n < N && int64_t(b.rows.size()) < rt.max_batch && tokens + len[size_t(n)] <= l.model->max_tokens(); ++n) {
          std::vector<int32_t> t(static_cast<size_t>(len[size_t(n)]));
          for (int64_t i = 0; i < len[size_t(n)]; ++i) t[size_t(i)] = int32_t(id[size_t(n * S + i)]);
          b.rows.push_back(BatchRow{int(b.rows.size()), std::move(t), 0, {}, false});
          tokens += len[size_t(n)];
        }
        if (b.rows.empty()) throw Error("eval-logits: context " + std::to_string(n0) + " does not fit the workspace");
        HostTensor lg = l.model->forward(b);
        std::memcpy(out.as<float>() + n0 * V, lg.data(), lg.nbytes());
        n0 += int64_t(b.rows.size());
        progress(n0);
      }
    }
    if (!a->model.quiet) std::fprintf(stderr, "\n");
    write_safetensors(a->out, {{"logits", out.view()}},
                      {{"device", l.backend->name()}, {"dtype", std::string(dtype_name(l.engine->weight_dtype))},
                       {"activations", std::string(dtype_name(l.backend->activation_dtype()))},
                       {"path", a->decode ? "decode" : "prefill"}});
  });
}

}  // namespace ingot::cli
