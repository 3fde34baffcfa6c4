#include "bench_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"

namespace ingot::cli {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Layout, in SVG user units (pixels at 100%): two panels side by side, each a plot area with its
// legend to the right.
constexpr double kPanelW = 620, kPanelH = 390;
constexpr double kPlotLeft = 72, kPlotRight = 170, kPlotTop = 34, kPlotH = 290;  // margins inside a panel
constexpr double kNoteLine = 16;

// Colour-blind-safe (Okabe-Ito) order; series beyond it reuse the colours.
constexpr const char* kPalette[] = {"#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000",
                                    "#f0e442"};

const char* color_of(int i) {
  const int n = int(sizeof kPalette / sizeof kPalette[0]);
  return kPalette[((i % n) + n) % n];
}

// A coordinate: finite by the callers' checks; one decimal is finer than a screen pixel.
std::string coord(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

// A tick or tooltip value, short: 2500 -> "2.5k", 29476 -> "29.48k". Only finite values come here.
std::string short_number(double v) {
  const double a = std::fabs(v);
  char b[48];
  if (v == 0) return "0";
  if (a >= 1e12 || a < 1e-3) std::snprintf(b, sizeof b, "%.3g", v);
  else if (a >= 1e9) std::snprintf(b, sizeof b, "%.4gG", v / 1e9);
  else if (a >= 1e6) std::snprintf(b, sizeof b, "%.4gM", v / 1e6);
  else if (a >= 1e3) std::snprintf(b, sizeof b, "%.4gk", v / 1e3);
  else std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

// A log2 tick (a power of two): integers as written up to 512, then in units of 1024 ("1k", "32k"),
// as context lengths are usually spoken of.
std::string pow2_label(double v) {
  if (v >= 1024 && v < 1e15 && std::fmod(v, 1024) == 0) return short_number(v / 1024).append("k");
  if (v >= 1 && v < 1024) return std::to_string(int64_t(v));
  return short_number(v);
}

// One axis: the data range mapped onto [p0, p1] pixels, linear or in log2.
struct Axis {
  bool log2 = false;
  double lo = 0, hi = 1;  // in axis space (log2 of the value when log2)
  double p0 = 0, p1 = 1;
  std::vector<double> ticks;  // values (not axis space)

  bool usable(double v) const { return std::isfinite(v) && (!log2 || v > 0); }
  double pos(double v) const {
    const double t = log2 ? std::log2(v) : v;
    return p0 + (t - lo) / (hi - lo) * (p1 - p0);
  }
};

// Powers of two covering [min, max], at most about ten ticks.
Axis log2_axis(double min, double max, double p0, double p1) {
  Axis a;
  a.log2 = true;
  a.p0 = p0, a.p1 = p1;
  if (!(min > 0) || !std::isfinite(min) || !std::isfinite(max)) min = 1, max = 2;
  double lo = std::floor(std::log2(min)), hi = std::ceil(std::log2(max));
  if (hi <= lo) lo -= 1, hi += 1;  // a single x: one power of two either side
  a.lo = lo, a.hi = hi;
  const double step = std::max(1.0, std::ceil((hi - lo) / 10));
  for (double e = lo; e <= hi + 1e-9; e += step) a.ticks.push_back(std::exp2(e));
  return a;
}

// From min(0, min) to max rounded up to a 1-2-5 step, about five ticks.
Axis linear_axis(double min, double max, double p0, double p1) {
  Axis a;
  a.p0 = p0, a.p1 = p1;
  if (!std::isfinite(min) || !std::isfinite(max)) min = 0, max = 1;
  double lo = std::min(0.0, min), hi = max;
  if (!(hi > lo)) hi = lo + 1;  // all values equal (all zero): a unit range above them
  const double raw = (hi - lo) / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  double step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
  if (!std::isfinite(step)) step = raw;  // a range near the double's limit: a plain fifth of it
  const double nlo = std::floor(lo / step) * step, nhi = std::ceil(hi / step) * step;
  // Near the double's limit the rounded range overflows; the data's own range is then the axis.
  if (std::isfinite(nlo) && std::isfinite(nhi) && nhi > nlo) lo = nlo, hi = nhi;
  a.lo = lo, a.hi = hi;
  for (int i = 0; i <= 12; ++i) {
    const double v = lo + i * step;
    if (!std::isfinite(v) || v > hi + step * 1e-6) break;
    a.ticks.push_back(v);
  }
  return a;
}

std::string text(double x, double y, const std::string& s, const char* extra = "") {
  return "<text x=\"" + coord(x) + "\" y=\"" + coord(y) + "\"" + extra + ">" + xml_escape(s) + "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2, const std::string& style) {
  return "<line x1=\"" + coord(x1) + "\" y1=\"" + coord(y1) + "\" x2=\"" + coord(x2) + "\" y2=\"" + coord(y2) +
         "\" " + style + "/>\n";
}

std::string diamond(double x, double y, double r) {
  return "M" + coord(x) + " " + coord(y - r) + " L" + coord(x + r) + " " + coord(y) + " L" + coord(x) + " " +
         coord(y + r) + " L" + coord(x - r) + " " + coord(y) + " Z";
}

void render_panel(std::ostringstream& o, const PlotPanel& p, double ox, double oy) {
  const double left = ox + kPlotLeft, right = ox + kPanelW - kPlotRight, top = oy + kPlotTop,
               bottom = top + kPlotH;
  // The ranges over everything drawn: series (ceilings included) and markers.
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  auto take = [&](const PlotPoint& q) {
    if (!std::isfinite(q.x) || !std::isfinite(q.y) || (p.log2_x && q.x <= 0)) return;
    xmin = std::min(xmin, q.x), xmax = std::max(xmax, q.x);
    ymin = std::min(ymin, q.y), ymax = std::max(ymax, q.y);
  };
  for (const PlotSeries& s : p.series)
    for (const PlotPoint& q : s.points) take(q);
  for (const PlotMarker& m : p.markers) take(m.at);
  const bool any = xmin <= xmax;
  const Axis X = p.log2_x ? log2_axis(any ? xmin : 1, any ? xmax : 2, left, right)
                          : linear_axis(any ? xmin : 0, any ? xmax : 1, left, right);
  const Axis Y = linear_axis(any ? ymin : 0, any ? ymax : 1, bottom, top);
  auto ok = [&](const PlotPoint& q) { return X.usable(q.x) && Y.usable(q.y); };

  o << "<g class=\"panel\">\n";
  o << text(ox + kPanelW / 2 - kPlotRight / 2, oy + 18, p.title, " text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\"");
  // Grid and ticks.
  for (double v : X.ticks) {
    const double x = X.pos(v);
    o << line(x, top, x, bottom, "stroke=\"#e5e5e5\"");
    o << line(x, bottom, x, bottom + 5, "stroke=\"#333\"");
    o << text(x, bottom + 18, X.log2 ? pow2_label(v) : short_number(v), " text-anchor=\"middle\"");
  }
  for (double v : Y.ticks) {
    const double y = Y.pos(v);
    o << line(left, y, right, y, "stroke=\"#e5e5e5\"");
    o << line(left - 5, y, left, y, "stroke=\"#333\"");
    o << text(left - 8, y + 4, short_number(v), " text-anchor=\"end\"");
  }
  o << "<rect x=\"" << coord(left) << "\" y=\"" << coord(top) << "\" width=\"" << coord(right - left)
    << "\" height=\"" << coord(bottom - top) << "\" fill=\"none\" stroke=\"#333\"/>\n";
  o << text((left + right) / 2, bottom + 40, p.x_label, " text-anchor=\"middle\"");
  const double ylx = ox + 16, yly = (top + bottom) / 2;
  o << "<text x=\"" << coord(ylx) << "\" y=\"" << coord(yly) << "\" text-anchor=\"middle\" transform=\"rotate(-90 "
    << coord(ylx) << " " << coord(yly) << ")\">" << xml_escape(p.y_label) << "</text>\n";
  if (!any) o << text((left + right) / 2, (top + bottom) / 2, "no data", " text-anchor=\"middle\" fill=\"#888\"");

  // Series: lines through the usable points in x order; measured points get markers with a tooltip.
  for (const PlotSeries& s : p.series) {
    std::vector<PlotPoint> pts;
    for (const PlotPoint& q : s.points)
      if (ok(q)) pts.push_back(q);
    std::sort(pts.begin(), pts.end(), [](const PlotPoint& a, const PlotPoint& b) { return a.x < b.x; });
    const std::string col = color_of(s.color);
    const std::string stroke = "stroke=\"" + col + "\" stroke-width=\"" + (s.dashed ? "1.5" : "2") + "\"" +
                               (s.dashed ? " stroke-dasharray=\"6 4\"" : "");
    o << "<g class=\"" << (s.dashed ? "ceiling" : "series") << "\"><title>" << xml_escape(s.name) << "</title>\n";
    if (pts.size() >= 2) {
      o << "<polyline fill=\"none\" " << stroke << " points=\"";
      for (size_t i = 0; i < pts.size(); ++i) o << (i ? " " : "") << coord(X.pos(pts[i].x)) << "," << coord(Y.pos(pts[i].y));
      o << "\"/>\n";
    } else if (pts.size() == 1 && s.dashed) {  // a lone ceiling: a short dash at its height
      const double x = X.pos(pts[0].x), y = Y.pos(pts[0].y);
      o << line(x - 12, y, x + 12, y, stroke);
    }
    if (!s.dashed)
      for (const PlotPoint& q : pts)
        o << "<circle class=\"pt\" cx=\"" << coord(X.pos(q.x)) << "\" cy=\"" << coord(Y.pos(q.y))
          << "\" r=\"3.5\" fill=\"" << col << "\"><title>" << xml_escape(s.name + ": " + short_number(q.x) + ", " +
                                                                        short_number(q.y) + " tok/s")
          << "</title></circle>\n";
    o << "</g>\n";
  }
  // Labels of peers at nearly the same place are stacked upwards instead of printed over each other.
  std::vector<PlotPoint> placed;  // label anchors used so far, in pixels
  for (const PlotMarker& m : p.markers) {
    if (!ok(m.at)) continue;
    const double x = X.pos(m.at.x), y = Y.pos(m.at.y);
    double ty = y - 6;
    for (bool moved = true; moved;) {
      moved = false;
      for (const PlotPoint& q : placed)
        if (std::fabs(q.x - x) < 120 && std::fabs(q.y - ty) < 11) ty = q.y - 12, moved = true;
    }
    placed.push_back({x, ty});
    o << "<g class=\"peer\"><title>" << xml_escape(m.label + ": " + short_number(m.at.y) + " tok/s") << "</title>\n";
    o << "<path d=\"" << diamond(x, y, 5) << "\" fill=\"#fff\" stroke=\"#111\" stroke-width=\"1.5\"/>\n";
    o << text(x + 8, ty, m.label, " font-size=\"10\"");
    o << "</g>\n";
  }

  // Legend, right of the plot.
  double ly = top + 8;
  const double lx = right + 12;
  for (const PlotSeries& s : p.series) {
    const std::string col = color_of(s.color);
    o << line(lx, ly, lx + 22, ly,
              "stroke=\"" + col + "\" stroke-width=\"2\"" + (s.dashed ? " stroke-dasharray=\"6 4\"" : ""));
    o << text(lx + 28, ly + 4, s.name, " font-size=\"11\"");
    ly += 16;
  }
  if (!p.markers.empty()) {
    o << "<path d=\"" << diamond(lx + 11, ly, 5) << "\" fill=\"#fff\" stroke=\"#111\" stroke-width=\"1.5\"/>\n";
    o << text(lx + 28, ly + 4, "peers (labelled)", " font-size=\"11\"");
  }
  o << "</g>\n";
}

std::string describe(const std::string& path, bool array, size_t index) {
  return path + ": " + (array ? "entry " : "line ") + std::to_string(index + 1);
}

int64_t positive_integer(const nlohmann::json& o, const char* field, const std::string& where) {
  if (!o.contains(field)) throw Error(where + ": missing \"" + field + "\"");
  const nlohmann::json& v = o[field];
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (int64_t(1) << 40))
    throw Error(where + ": \"" + field + "\" must be an integer >= 1 (got " + v.dump() + ")");
  return v.get<int64_t>();
}

PeerPoint peer_point(const nlohmann::json& o, const std::string& where) {
  if (!o.is_object()) throw Error(where + ": expected a JSON object, got " + o.dump().substr(0, 80));
  PeerPoint p;
  if (o.contains("name")) {
    if (!o["name"].is_string() || o["name"].get<std::string>().empty())
      throw Error(where + ": \"name\" must be a non-empty string");
    p.name = o["name"].get<std::string>();
  } else if (o.contains("engine") && o["engine"].is_string()) {  // peer_hf.py's lines
    p.name = o["engine"].get<std::string>();
    if (o.contains("mode") && o["mode"].is_string()) p.name += " " + o["mode"].get<std::string>();
  } else {
    throw Error(where + ": missing \"name\"");
  }
  p.batch = positive_integer(o, "batch", where);
  p.prompt_len = positive_integer(o, "prompt_len", where);
  if (!o.contains("decode_tok_s")) throw Error(where + ": missing \"decode_tok_s\"");
  const nlohmann::json& d = o["decode_tok_s"];
  if (!d.is_number() || !std::isfinite(d.get<double>()) || d.get<double>() < 0)
    throw Error(where + ": \"decode_tok_s\" must be a finite number >= 0 (got " + d.dump() + ")");
  p.decode_tok_s = d.get<double>();
  return p;
}

// peer_hf.py's lines that carry no measurement: its header and the runs that failed.
bool informational(const nlohmann::json& o) {
  return o.is_object() && !o.contains("decode_tok_s") && (o.contains("gpu") || o.contains("batch_failed"));
}

double number_or_nan(const nlohmann::json& r, const char* field) {
  return r.contains(field) && r[field].is_number() ? r[field].get<double>() : kNaN;
}

}  // namespace

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters other than tab and newline are not allowed in XML 1.0 at all.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') out += ' ';
        else out += c;
    }
  }
  return out;
}

std::string render_svg(const Figure& f) {
  const double panels_top = 40 + kNoteLine * double(f.notes.size()) + 8;
  const double width = kPanelW * double(std::max<size_t>(1, f.panels.size())), height = panels_top + kPanelH;
  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << coord(width) << "\" height=\"" << coord(height)
    << "\" viewBox=\"0 0 " << coord(width) << " " << coord(height)
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<title>" << xml_escape(f.title) << "</title>\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n";
  o << text(16, 26, f.title, " font-size=\"16\" font-weight=\"bold\"");
  for (size_t i = 0; i < f.notes.size(); ++i) o << text(16, 46 + kNoteLine * double(i), f.notes[i], " fill=\"#444\"");
  for (size_t i = 0; i < f.panels.size(); ++i) render_panel(o, f.panels[i], kPanelW * double(i), panels_top);
  o << "</svg>\n";
  return o.str();
}

std::vector<PeerPoint> parse_peers(const std::string& text, const std::string& path) {
  std::vector<PeerPoint> out;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) throw Error(path + ": empty; expected peer points as JSON (see `ingot bench --help`)");
  auto take = [&](const nlohmann::json& o, const std::string& where) {
    if (!informational(o)) out.push_back(peer_point(o, where));
  };
  // One JSON value (an array, or a lone object even when pretty-printed) or else one object per line.
  nlohmann::json whole = nlohmann::json::parse(text, nullptr, false);
  if (!whole.is_discarded() && whole.is_array()) {
    for (size_t i = 0; i < whole.size(); ++i) take(whole[i], describe(path, true, i));
  } else if (!whole.is_discarded()) {
    if (!whole.is_object()) throw Error(path + ": expected a JSON array of objects or one object per line");
    take(whole, path);
  } else {
    if (text[first] == '[') {
      try {
        const nlohmann::json again = nlohmann::json::parse(text);  // only for the parser's message
        (void)again;
      } catch (const nlohmann::json::exception& e) {
        throw Error(path + ": not valid JSON: " + e.what());
      }
    }
    std::istringstream lines(text);
    std::string l;
    for (size_t n = 0; std::getline(lines, l); ++n) {
      if (l.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json o = nlohmann::json::parse(l, nullptr, false);
      if (o.is_discarded()) throw Error(describe(path, false, n) + ": not valid JSON");
      take(o, describe(path, false, n));
    }
  }
  if (out.empty()) throw Error(path + ": holds no measured point (objects with name, batch, prompt_len, decode_tok_s)");
  return out;
}

Figure bench_figure(const nlohmann::json& results, const std::vector<PeerPoint>& peers, const std::string& title,
                    const std::vector<std::string>& notes) {
  Figure f;
  f.title = title;
  f.notes = notes;
  // Rows keyed by (batch, prompt length), each with its decode rate and ceiling (NaN when absent).
  struct Row {
    double tok_s, ceiling;
  };
  std::map<std::pair<int64_t, int64_t>, Row> rows;
  std::set<int64_t> batches, prompts;
  bool any_ceiling = false;
  for (const nlohmann::json& r : results) {
    if (!r.is_object() || !r.contains("batch") || !r.contains("prompt_len")) continue;
    if (!r["batch"].is_number_integer() || !r["prompt_len"].is_number_integer()) continue;
    const int64_t b = r["batch"].get<int64_t>(), pl = r["prompt_len"].get<int64_t>();
    const Row row{number_or_nan(r, "decode_tok_s"), number_or_nan(r, "ceiling_tok_s")};
    any_ceiling = any_ceiling || std::isfinite(row.ceiling);
    rows[{b, pl}] = row;
    batches.insert(b);
    prompts.insert(pl);
  }
  const std::string y_label = "decode tok/s (aggregate over the batch)";
  // (a) against batch size, one line per prompt length.
  PlotPanel a;
  a.title = "decode throughput vs batch size";
  a.x_label = "batch size (concurrent requests, log2)";
  a.y_label = y_label;
  PlotPanel c;
  c.title = "decode throughput vs prompt length";
  c.x_label = "prompt length in tokens (log2; decode runs on from it)";
  c.y_label = y_label;
  int color = 0;
  for (int64_t pl : prompts) {
    PlotSeries s{"prompt " + std::to_string(pl), {}, color, false}, ceil{"ceiling, prompt " + std::to_string(pl), {}, color, true};
    for (int64_t b : batches) {
      auto it = rows.find({b, pl});
      if (it == rows.end()) continue;
      s.points.push_back({double(b), it->second.tok_s});
      ceil.points.push_back({double(b), it->second.ceiling});
    }
    a.series.push_back(s);
    if (any_ceiling) a.series.push_back(ceil);
    ++color;
  }
  color = 0;
  for (int64_t b : batches) {
    PlotSeries s{"batch " + std::to_string(b), {}, color, false}, ceil{"ceiling, batch " + std::to_string(b), {}, color, true};
    for (int64_t pl : prompts) {
      auto it = rows.find({b, pl});
      if (it == rows.end()) continue;
      s.points.push_back({double(pl), it->second.tok_s});
      ceil.points.push_back({double(pl), it->second.ceiling});
    }
    c.series.push_back(s);
    if (any_ceiling) c.series.push_back(ceil);
    ++color;
  }
  for (const PeerPoint& p : peers) {
    a.markers.push_back({p.name + " (prompt " + std::to_string(p.prompt_len) + ")", {double(p.batch), p.decode_tok_s}});
    c.markers.push_back({p.name + " (batch " + std::to_string(p.batch) + ")", {double(p.prompt_len), p.decode_tok_s}});
  }
  f.panels = {a, c};
  return f;
}

}  // namespace ingot::cli
