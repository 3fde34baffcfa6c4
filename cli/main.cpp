// ingot: build, check, run and benchmark decoder-only LLMs.
#include <cstdio>

#include "common.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"ingot: static-KV-cache inference engine for Llama 3.x, Qwen2/2.5 and Qwen3"};
  app.set_version_flag("--version", std::string(INGOT_VERSION));
  app.require_subcommand(1);
  ingot::cli::add_generate(app);
  ingot::cli::add_check(app);
  ingot::cli::add_bench(app);
  ingot::cli::add_text_commands(app);
  ingot::cli::add_chat(app);
  ingot::cli::add_eval(app);
  ingot::cli::add_build(app);
  ingot::cli::add_inspect(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ingot::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of host memory\n");
    return 1;
  }
  return 0;
}
