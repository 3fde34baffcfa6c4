// `ingot bench --svg`: the renderer (cli/bench_svg.cpp) on hand-made results, without a model, and
// one end-to-end run of the built binary on the demo model that sweeps batch sizes and prompt lengths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "bench_svg.h"
#include "test_helpers.h"

namespace ingot::cli {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// "" when `s` is well-formed enough for an XML parser: every tag closed in order, quotes paired inside
// tags, and every '&' outside a tag starting one of the five entities. Otherwise what is wrong.
std::string xml_problem(const std::string& s) {
  std::vector<std::string> open;
  size_t i = 0;
  for (;;) {
    const size_t lt = s.find('<', i);
    // The text between tags: no stray '>' and only known entities.
    const std::string body = s.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
    if (body.find('>') != std::string::npos) return "stray '>' in text near " + std::to_string(i);
    for (size_t a = body.find('&'); a != std::string::npos; a = body.find('&', a + 1)) {
      bool known = false;
      for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"}) known = known || body.compare(a, strlen(e), e) == 0;
      if (!known) return "bare '&' in text near " + std::to_string(i + a);
    }
    if (lt == std::string::npos) break;
    if (s.compare(lt, 5, "<?xml") == 0) {
      const size_t end = s.find("?>", lt);
      if (end == std::string::npos) return "unclosed <?xml";
      i = end + 2;
      continue;
    }
    const size_t gt = s.find('>', lt);
    if (gt == std::string::npos) return "unclosed '<' at " + std::to_string(lt);
    const std::string tag = s.substr(lt + 1, gt - lt - 1);
    if (tag.empty() || tag.find('<') != std::string::npos) return "bad tag at " + std::to_string(lt);
    if (std::count(tag.begin(), tag.end(), '"') % 2) return "unpaired quote in <" + tag + ">";
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return "</" + tag.substr(1) + "> closes nothing open";
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find_first_of(" \t\n")));
    }
    i = gt + 1;
  }
  return open.empty() ? "" : "<" + open.back() + "> never closed";
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// No NaN or infinity printed anywhere (the renderer's own words contain neither).
void expect_finite_text(const std::string& svg) {
  std::string lower = svg;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  EXPECT_EQ(lower.find("nan"), std::string::npos);
  EXPECT_EQ(lower.find("inf"), std::string::npos);
}

json result(int batch, int prompt, double tok_s, double ceiling = std::numeric_limits<double>::quiet_NaN()) {
  json r = {{"batch", batch}, {"prompt_len", prompt}, {"decode_tok_s", tok_s}};
  if (std::isfinite(ceiling)) r["ceiling_tok_s"] = ceiling;
  return r;
}

std::string render(const json& results, const std::vector<PeerPoint>& peers = {}, const std::string& title = "t") {
  return render_svg(bench_figure(results, peers, title, {"a note"}));
}

TEST(BenchSvg, SeriesCeilingAndPeersInAWellFormedDocument) {
  json rs = json::array();
  for (int b : {1, 8, 64})
    for (int p : {128, 1024}) rs.push_back(result(b, p, 100.0 * b / (p / 128.0), 200.0 * b));
  const std::string svg = render(rs, {{"transformers eager", 1, 128, 133.6}});
  EXPECT_EQ(xml_problem(svg), "");
  for (const char* s : {"prompt 128", "prompt 1024", "batch 1", "batch 8", "batch 64", "ceiling, prompt 128",
                        "ceiling, batch 64", "transformers eager (prompt 128)", "transformers eager (batch 1)",
                        "batch size", "prompt length"})
    EXPECT_NE(svg.find(s), std::string::npos) << s;
  EXPECT_EQ(count(svg, "class=\"pt\""), 12u);      // 6 measurements, once in each panel
  EXPECT_EQ(count(svg, "class=\"ceiling\""), 5u);  // 2 prompt lengths + 3 batch sizes
  EXPECT_EQ(count(svg, "class=\"peer\""), 2u);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("href"), std::string::npos);  // self-contained: nothing fetched
  expect_finite_text(svg);
}

TEST(BenchSvg, NoCeilingWhenTheBackendMeasuredNone) {
  const std::string svg = render(json::array({result(1, 4, 10), result(2, 4, 18)}));
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "class=\"ceiling\""), 0u);
  EXPECT_EQ(count(svg, "class=\"pt\""), 4u);
}

TEST(BenchSvg, TextIsEscaped) {
  const std::string nasty = "a<b>&\"c'd";
  const std::string svg = render(json::array({result(1, 4, 10)}), {{nasty, 1, 4, 5}}, "model " + nasty);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find("a&lt;b&gt;&amp;&quot;c&apos;d"), std::string::npos);
  EXPECT_EQ(svg.find(nasty), std::string::npos);
  EXPECT_EQ(xml_escape("x\x01y"), "x y");  // control characters are not XML
}

TEST(BenchSvg, SinglePoint) {
  const std::string svg = render(json::array({result(1, 128, 187.2, 400)}));
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "class=\"pt\""), 2u);
  EXPECT_EQ(count(svg, "class=\"ceiling\""), 2u);
  expect_finite_text(svg);
}

TEST(BenchSvg, NaNSkippedZeroAndEqualValuesDrawn) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  json rs = json::array({result(1, 4, 0), result(2, 4, 0), result(4, 4, nan)});
  std::string svg = render(rs);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "class=\"pt\""), 4u);  // the NaN point in neither panel
  expect_finite_text(svg);
  svg = render(json::array({result(1, 4, 50), result(2, 4, 50), result(4, 4, 50)}));
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "class=\"pt\""), 6u);
  expect_finite_text(svg);
  // Infinity (a zero-length decode) is skipped like NaN.
  PlotPanel p;
  p.series.push_back({"s", {{1, 1}, {2, std::numeric_limits<double>::infinity()}, {0, 3}, {-1, 2}}, 0, false});
  svg = render_svg({"t", {}, {p}});
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "class=\"pt\""), 1u);  // x 0 and -1 have no place on a log axis
  expect_finite_text(svg);
}

TEST(BenchSvg, VeryLargeValues) {
  const std::string svg = render(json::array({result(1, 4, 1e300, DBL_MAX), result(1 << 20, 1 << 20, 1e15)}));
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "class=\"pt\""), 4u);
  expect_finite_text(svg);
}

TEST(BenchSvg, NoResults) {
  const std::string svg = render(json::array());
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find("no data"), std::string::npos);
  expect_finite_text(svg);
}

TEST(BenchSvg, PeersAsAnArray) {
  const auto p = parse_peers(R"([{"name": "transformers", "batch": 1, "prompt_len": 128, "decode_tok_s": 133.6},
                                 {"name": "vllm", "batch": 64, "prompt_len": 128, "decode_tok_s": 9000}])",
                             "p.json");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].name, "transformers");
  EXPECT_EQ(p[1].batch, 64);
  EXPECT_EQ(p[1].prompt_len, 128);
  EXPECT_DOUBLE_EQ(p[0].decode_tok_s, 133.6);
}

TEST(BenchSvg, PeersAsPeerHfPrintsThem) {
  // bench/peer_hf.py: a header line, one line per (mode, batch), failures as their own lines.
  const std::string text =
      R"({"gpu": "NVIDIA H200", "torch": "2.11.0", "matmul_tflops_bf16": 792.0})" "\n"
      R"({"engine": "transformers", "mode": "eager", "shape": "qwen3-8b", "batch": 1, "prompt_len": 128, "new_tokens": 256, "ttft_ms": 20.1, "decode_tok_s_per_seq": 33.5, "decode_tok_s": 33.5, "peak_memory_bytes": 1})" "\n"
      R"({"engine": "transformers", "mode": "static+compile", "shape": "qwen3-8b", "batch_failed": 64, "error": "OOM"})" "\n";
  const auto p = parse_peers(text, "hf.jsonl");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].name, "transformers eager");
  EXPECT_EQ(p[0].batch, 1);
}

TEST(BenchSvg, BadPeersNameTheFileAndTheField) {
  using test::expect_error;
  expect_error([] { parse_peers("[{\"name\": \"x\", \"batch\": 1, \"prompt_len\": 4", "p.json"); },
               {"p.json", "not valid JSON"});
  expect_error([] { parse_peers("{\"name\": \"x\"\nnot json\n", "p.json"); }, {"p.json", "line 1", "not valid JSON"});
  expect_error([] { parse_peers(R"([{"name": "x", "batch": 1, "prompt_len": 4}])", "p.json"); },
               {"p.json", "entry 1", "missing \"decode_tok_s\""});
  expect_error([] { parse_peers(R"([{"batch": 1, "prompt_len": 4, "decode_tok_s": 1}])", "p.json"); },
               {"p.json", "entry 1", "missing \"name\""});
  expect_error([] { parse_peers(R"([{"name": "x", "batch": 0, "prompt_len": 4, "decode_tok_s": 1}])", "p.json"); },
               {"p.json", "\"batch\" must be an integer >= 1"});
  expect_error([] { parse_peers(R"([{"name": "x", "batch": 1, "prompt_len": "4", "decode_tok_s": 1}])", "p.json"); },
               {"p.json", "\"prompt_len\" must be an integer >= 1"});
  expect_error([] { parse_peers(R"([{"name": "x", "batch": 1, "prompt_len": 4, "decode_tok_s": -1}])", "p.json"); },
               {"p.json", "\"decode_tok_s\" must be a finite number >= 0"});
  expect_error([] { parse_peers("  \n", "p.json"); }, {"p.json", "empty"});
  expect_error([] { parse_peers("[]", "p.json"); }, {"p.json", "no measured point"});
  expect_error([] { parse_peers("42", "p.json"); }, {"p.json", "expected a JSON array"});
}

// stdout of `ingot <args>` (stderr to the test's log), and the exit status.
std::pair<int, std::string> run_ingot(const std::string& args) {
  const std::string cmd = std::string("'") + INGOT_BINARY + "' " + args + " </dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(BenchSvgCli, SweepsBatchAndPromptLengthIntoOnePicture) {
  test::TempDir dir;
  const std::string svg_path = dir.file("bench.svg"), peer_path = dir.file("peer.json");
  std::ofstream(peer_path) << R"([{"name": "peer", "batch": 2, "prompt_len": 8, "decode_tok_s": 12.5}])";
  const auto [rc, out] = run_ingot("bench --model '" + std::string(INGOT_SOURCE_DIR) +
                                   "/models/demo' --device cpu --threads 1 --batch 1,2 --prompt-len 4,8 "
                                   "--max-new-tokens 4 --json --svg '" + svg_path + "' --peer '" + peer_path + "'");
  ASSERT_EQ(rc, 0) << out;
  const json rs = json::parse(out);
  ASSERT_EQ(rs.size(), 4u);
  // Batch-major: every prompt length at batch 1, then at batch 2.
  const int order[4][2] = {{1, 4}, {1, 8}, {2, 4}, {2, 8}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(rs[i]["batch"], order[i][0]);
    EXPECT_EQ(rs[i]["prompt_len"], order[i][1]);
    EXPECT_TRUE(rs[i].contains("decode_mean_context"));
    EXPECT_FALSE(rs[i].contains("ceiling_tok_s"));  // the CPU backend measures no copy bandwidth
  }
  std::ifstream in(svg_path);
  ASSERT_TRUE(in.good());
  const std::string svg((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "class=\"pt\""), 8u);  // 2 batch sizes x 2 prompt lengths, in each panel
  for (const char* s : {"prompt 4", "prompt 8", "batch 1", "batch 2", "peer (prompt 8)", "peer (batch 2)", "demo"})
    EXPECT_NE(svg.find(s), std::string::npos) << s;
  EXPECT_EQ(count(svg, "class=\"peer\""), 2u);
  expect_finite_text(svg);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.str())) files += e.is_regular_file();
  EXPECT_EQ(files, 2u);  // the picture and the peer file: no temporary left behind
}

}  // namespace
}  // namespace ingot::cli
