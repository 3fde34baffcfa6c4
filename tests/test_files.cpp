// Reading user-named files and writing outputs: errors that name the path and the reason, outputs that
// never replace an input, and writes that leave the old file intact until the new one is complete.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/files.h"
#include "core/mapped_file.h"
#include "io/safetensors.h"
#include "test_helpers.h"

namespace fs = std::filesystem;
using namespace ingot;
using test::expect_error;

namespace {
void put(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }
std::string get(const std::string& path) { return read_file(path); }
size_t entries(const std::string& dir) { return size_t(std::distance(fs::directory_iterator(dir), {})); }
}  // namespace

TEST(ReadFile, NamesWhatIsWrongWithThePath) {
  test::TempDir d;
  put(d.file("a.txt"), "abc");
  EXPECT_EQ(read_file(d.file("a.txt")), "abc");
  expect_error([&] { read_file(d.str()); }, {d.str() + ": is a directory, not a file"});
  expect_error([&] { read_file(d.file("none")); }, {d.file("none") + ": does not exist"});
  put(d.file("f"), "x");
  expect_error([&] { read_file(d.file("f") + "/g"); }, {"/f/g: cannot read: Not a directory"});
  expect_error([&] { MappedFile m(d.str()); }, {d.str() + ": is a directory, not a file"});
  expect_error([&] { MappedFile m(d.file("none")); }, {"does not exist"});
}

TEST(OutputPath, NeverAnInputEvenWithForce) {
  test::TempDir d;
  const std::string in = d.file("in.safetensors");
  put(in, "input");
  fs::create_hard_link(in, d.file("hard"));
  fs::create_symlink(in, d.file("soft"));
  for (const std::string& out : {in, d.file("hard"), d.file("soft"), d.str() + "/./in.safetensors"})
    for (bool force : {false, true})
      expect_error([&] { check_output_path(out, "-o", force, {d.file("other"), in}); },
                   {"-o " + out, "is the same file as " + in, "--force never replaces an input"});
  EXPECT_EQ(get(in), "input");
  EXPECT_EQ(entries(d.str()), 3u);  // the probe file is gone
}

TEST(OutputPath, ExistingFileNeedsForceAndTheFolderMustBeWritable) {
  test::TempDir d;
  put(d.file("old"), "old");
  expect_error([&] { check_output_path(d.file("old"), "--output", false, {}); }, {"--output", "exists", "--force"});
  EXPECT_NO_THROW(check_output_path(d.file("old"), "--output", true, {}));
  EXPECT_NO_THROW(check_output_path(d.file("new"), "--output", false, {}));
  EXPECT_FALSE(fs::exists(d.file("new")));
  expect_error([&] { check_output_path(d.file("no/x"), "-o", true, {}); },
               {"cannot write in folder " + d.file("no"), "No such file or directory"});
  expect_error([&] { check_output_path(d.file("old/x"), "-o", true, {}); }, {d.file("old") + " is not a directory"});
  expect_error([&] { check_output_path(d.str(), "-o", true, {}); }, {"is a directory"});
  expect_error([&] { check_output_path("", "-o", true, {}); }, {"-o", "empty"});
  EXPECT_EQ(get(d.file("old")), "old");
  EXPECT_EQ(entries(d.str()), 1u);
}

TEST(OutputFile, ReplacesOnlyOnCommit) {
  test::TempDir d;
  put(d.file("out"), "old");
  {
    OutputFile f(d.file("out"));
    f.write("new", 3);
    EXPECT_EQ(get(d.file("out")), "old");  // abandoned: the old file stays, the temporary goes
  }
  EXPECT_EQ(get(d.file("out")), "old");
  EXPECT_EQ(entries(d.str()), 1u);
  OutputFile f(d.file("out"));
  f.write("new", 3);
  f.commit();
  EXPECT_EQ(get(d.file("out")), "new");
  EXPECT_EQ(entries(d.str()), 1u);
  expect_error([&] { OutputFile g(d.file("none/out")); }, {"cannot write in folder " + d.file("none")});
}

TEST(OutputFile, SafetensorsAreWrittenBesideAndRenamed) {
  test::TempDir d;
  const float v[2] = {1.0f, 2.0f};
  write_safetensors(d.file("t.safetensors"), {{"x", TensorView{DType::F32, {2}, v}}}, {});
  SafetensorsFile f(d.file("t.safetensors"));
  ASSERT_NE(f.find("x"), nullptr);
  EXPECT_EQ(entries(d.str()), 1u);
  expect_error([&] { write_safetensors(d.file("no/t.safetensors"), {{"x", TensorView{DType::F32, {2}, v}}}, {}); },
               {"cannot write in folder"});
}
