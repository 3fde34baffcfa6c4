#include "options.h"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "core/error.h"

namespace ingot::cli {

CLI::Validator at_least(double min) {
  char m[32];
  std::snprintf(m, sizeof m, "%g", min);
  const std::string ms = m;
  return CLI::Validator(
      [min, ms](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return "'" + s + "' is not a number";
        if (!(v >= min)) return "must be at least " + ms + " (got " + s + ")";
        return {};
      },
      min == 1 ? "POSITIVE" : min == 0 ? "NONNEGATIVE" : ">= " + ms, "at least " + ms);
}

CLI::Validator dtype_names() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        for (const char* n : {"fp32", "fp16", "bf16", "f32", "f16"})
          if (s == n) return {};
        return "'" + s + "' is not a dtype (expected fp32, fp16 or bf16; f32 and f16 also work)";
      },
      "fp32|fp16|bf16", "dtype");
}

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
std::vector<const CLI::App*> commands(const CLI::App& app) {
  return app.get_subcommands([](const CLI::App*) { return true; });
}
}  // namespace

void check_command(const CLI::App& app, const std::string& word) {
  for (const CLI::App* sub : commands(app))
    if (sub->get_name() == word) return;
  const std::string near = nearest_command(app, word);
  throw Error("unknown command '" + word + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?") +
              " (`ingot help` lists the commands)");
}

std::string nearest_command(const CLI::App& app, const std::string& word) {
  std::string best;
  size_t best_d = 0;
  for (const CLI::App* sub : commands(app)) {
    const size_t d = edit_distance(word, sub->get_name());
    if (best.empty() || d < best_d) best = sub->get_name(), best_d = d;
  }
  // Beyond a third of the word, the nearest command is a guess, not a correction.
  return best_d <= std::max<size_t>(2, word.size() / 3) ? best : std::string();
}

std::vector<std::string> model_inputs(const ModelArgs& m) {
  if (!m.engine_path.empty()) return {m.engine_path};
  if (!m.model_dir.empty()) return checkpoint_files(m.model_dir);
  return {};
}

void add_help(CLI::App& app) {
  auto* cmd = app.add_subcommand("help", "Show the commands, or one command's options");
  auto topic = std::make_shared<std::string>();
  cmd->add_option("command", *topic, "the command to explain");
  cmd->callback([&app, topic] {
    if (topic->empty()) {
      // Not app.help(): with `help` itself selected, that would explain `help`.
      std::printf("%s", app.get_formatter()->make_help(&app, app.get_name(), CLI::AppFormatMode::Normal).c_str());
      return;
    }
    check_command(app, *topic);
    std::printf("%s", app.get_subcommand(*topic)->help(app.get_name()).c_str());
  });
}

}  // namespace ingot::cli
