// The smallest program on ingot's public API: load a model (engine file or checkpoint folder), stream
// a sampled reply to a prompt token by token, and print the timings.
#include <ingot/ingot.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL PROMPT [MAX_NEW_TOKENS]\n", argv[0]);
    return 2;
  }
  try {
    ingot::api::Model model = ingot::api::Model::load(argv[1]);
    ingot::api::GenerateConfig config;
    config.max_new_tokens = argc > 3 ? std::atoi(argv[3]) : 32;
    config.sampling.temperature = 0.7f;
    config.sampling.top_p = 0.9f;
    config.sampling.seed = 1;
    ingot::api::Result r = model.generate(argv[2], config, [](int32_t, std::string_view text) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n[%s: loaded in %.2f s, %zu tokens, first after %.1f ms, %.1f tok/s, stop: %s]\n",
                model.device().c_str(), model.load_seconds(), r.token_ids.size(), r.ttft_s * 1e3,
                r.decode_tokens_per_s(), r.stop_reason.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
