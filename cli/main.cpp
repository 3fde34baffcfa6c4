// ingot: build, check, run and benchmark decoder-only LLMs.
#include <cstdio>
#include <exception>

#include "common.h"
#include "core/error.h"
#include "options.h"

int main(int argc, char** argv) {
  CLI::App app{"ingot: static-KV-cache inference engine for Llama 3.x, Qwen2/2.5 and Qwen3"};
  // Before the commands are added: they copy these defaults, so every --help shows each default.
  app.option_defaults()->always_capture_default();
  app.name("ingot");
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
  ingot::cli::add_serve(app);
  ingot::cli::add_export(app);
  ingot::cli::add_help(app);
  // Every failure ends here as one line and exit 1, whatever threw it.
  try {
    // CLI11 would call a mistyped command an unexpected argument; name it and suggest the nearest.
    if (argc > 1 && argv[1][0] != '-') ingot::cli::check_command(app, argv[1]);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // Same shape as every other failure: one line, exit 1.
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of host memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "error: an unknown exception ended the command\n");
    return 1;
  }
  return 0;
}
