// `ingot bench --svg`: the bench's results as a picture, decode tok/s against batch size and against
// prompt length, with the copy-bandwidth ceiling and the peers' points. The SVG is written by hand here:
// Debian has no SVG plotting library for C++ worth a dependency for two line charts, and the output must
// be one self-contained file (no scripts, no fonts or styles fetched from elsewhere) that a Markdown
// page can show. Everything here is pure (values in, text out) so it is tested without a model.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ingot::cli {

struct PlotPoint {
  double x = 0, y = 0;  // axis units (x: batch size or tokens; y: tokens per second)
};

// One line of a panel. Points with a non-finite coordinate, or x <= 0 on a log axis, are skipped.
struct PlotSeries {
  std::string name;  // the legend's text
  std::vector<PlotPoint> points;
  int color = 0;         // index into the palette; a ceiling shares its series' colour
  bool dashed = false;   // ceilings are dashed and carry no point markers
};

// A labelled point of another engine (a peer), drawn as a diamond with its label beside it.
struct PlotMarker {
  std::string label;
  PlotPoint at;
};

struct PlotPanel {
  std::string title, x_label, y_label;
  bool log2_x = true;  // ticks at powers of two
  std::vector<PlotSeries> series;
  std::vector<PlotMarker> markers;
};

struct Figure {
  std::string title;
  std::vector<std::string> notes;  // lines under the title (workload, what the ceiling is)
  std::vector<PlotPanel> panels;   // side by side
};

// The whole SVG document. Text is escaped; nothing non-finite reaches the output.
std::string render_svg(const Figure& f);

// &, <, >, " and ' as XML entities.
std::string xml_escape(const std::string& s);

// A point another engine measured (`--peer FILE`).
struct PeerPoint {
  std::string name;
  int64_t batch = 0, prompt_len = 0;
  double decode_tok_s = 0;  // aggregate over the batch
};

// The points of a --peer file's text: a JSON array of objects, or one JSON object per line (what
// bench/peer_hf.py prints). Each object needs "batch" and "prompt_len" (integers >= 1),
// "decode_tok_s" (a finite number >= 0) and a "name" (or peer_hf.py's "engine", with its "mode"
// appended). Objects without a measurement (peer_hf.py's header line with "gpu", its failure lines
// with "batch_failed") are skipped. Throws Error naming `path`, the entry and the field.
std::vector<PeerPoint> parse_peers(const std::string& text, const std::string& path);

// The two panels from `ingot bench --json`'s results (fields batch, prompt_len, decode_tok_s and,
// where the backend measured its copy bandwidth, ceiling_tok_s) and the peers' points.
Figure bench_figure(const nlohmann::json& results, const std::vector<PeerPoint>& peers, const std::string& title,
                    const std::vector<std::string>& notes);

}  // namespace ingot::cli
