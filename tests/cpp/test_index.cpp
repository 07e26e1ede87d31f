// Index files: "feature_index,label_index,key" lines parsed into a SampleIndex, with blank lines, spaces,
// CRLF and signs tolerated; every malformed line an InvalidArgument naming file and line; keys that
// cannot name a file refused; the parallel parse (chunks of ~1 MiB) agrees with the text line by line.
// Mirrors tests/test_index.py.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/index/index.hpp"

using namespace npyfeed;
using npyfeed::test::contains;

namespace {

// Parses `text` as the index file idx.txt (in a fresh temporary folder) on `threads` threads.
SampleIndex parse(const std::string& text, std::size_t threads = 2) {
  static test::TempDir dir;
  test::write_file(dir.file("idx.txt"), text, {});
  return read_index_files({dir.file("idx.txt")}, threads);
}

std::vector<std::int64_t> features(const SampleIndex& index) {
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < index.size(); ++i) out.push_back(index.feature(i));
  return out;
}

std::vector<std::int64_t> labels(const SampleIndex& index) {
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < index.size(); ++i) out.push_back(index.label(i));
  return out;
}

std::vector<std::uint32_t> key_ids(const SampleIndex& index) {
  std::vector<std::uint32_t> out;
  for (std::size_t i = 0; i < index.size(); ++i) out.push_back(index.key(i));
  return out;
}

std::string line_of(const SampleIndex& index, std::size_t i) {
  const std::string w = index.where(i);
  return w.substr(w.rfind(':') + 1);
}

void expect_bad(const std::string& text, const std::string& part, int line = __builtin_LINE()) {
  try {
    parse(text);
    test::report(__FILE__, line, "no error for: " + text);
  } catch (const InvalidArgument& e) {
    if (!contains(e.what(), part))
      test::report(__FILE__, line, std::string("message '") + e.what() + "' lacks '" + part + "'");
  }
}

}  // namespace

TEST_CASE("lines, blanks, spaces, CRLF, signs; keys in order of first appearance") {
  SampleIndex index = parse("5,0,b\n\n  7 , 1 ,a \r\n+9,-2,b\n\t\n-3,+4,c");
  REQUIRE(index.size() == 4u);
  CHECK(index.keys == (std::vector<std::string>{"b", "a", "c"}));
  CHECK(features(index) == (std::vector<std::int64_t>{5, 7, 9, -3}));
  CHECK(labels(index) == (std::vector<std::int64_t>{0, 1, -2, 4}));
  CHECK(key_ids(index) == (std::vector<std::uint32_t>{0, 1, 0, 2}));
  CHECK_EQ(line_of(index, 0), "1");
  CHECK_EQ(line_of(index, 1), "3");
  CHECK_EQ(line_of(index, 2), "4");
  CHECK_EQ(line_of(index, 3), "6");
  CHECK(contains(index.where(1), "idx.txt:3"));
  CHECK_EQ(parse("").size(), 0u);
  CHECK_EQ(parse("\n\n  \n").size(), 0u);
  const std::string big = std::to_string(std::numeric_limits<std::int64_t>::max());
  const std::string small = std::to_string(std::numeric_limits<std::int64_t>::min());
  const std::string i32min = std::to_string(std::numeric_limits<std::int32_t>::min());
  SampleIndex extremes = parse(big + "," + small + ",k with spaces\n" + i32min + ",2147483647,k\n1,2147483648,k\n");
  CHECK(features(extremes) == (std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::max(),
                                                         std::numeric_limits<std::int32_t>::min(), 1}));
  CHECK(labels(extremes) ==
        (std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(), 2147483647, 2147483648}));
  CHECK_EQ(extremes.keys[0], "k with spaces");
  CHECK_EQ(extremes.columns().wide_feature.size(), 2u);  // INT64_MAX and INT32_MIN (the marker) are wide
  CHECK_EQ(extremes.columns().wide_label.size(), 2u);
}

TEST_CASE("many chunks: the parallel parse equals a line-by-line reading, lines and keys included") {
  // ~6 MiB: several chunks, chunk borders inside runs of one key, blank lines and CRLF sprinkled in.
  std::string text;
  std::vector<std::int64_t> want_feature, want_label;
  std::vector<std::string> want_key;
  std::vector<std::size_t> want_line;
  std::size_t line = 0;
  for (std::int64_t i = 0; i < 300000; ++i) {
    if (i % 977 == 0) {
      text += "\n";
      ++line;
    }
    const std::string key = "key" + std::to_string((i / 5000) * 7 % 41);
    const std::int64_t feature = i * 7919 % 100003 - 5;
    const std::int64_t label = i % 13 == 0 ? (std::int64_t{1} << 40) + i : i % 4800;
    text += std::to_string(feature) + "," + std::to_string(label) + "," + key + (i % 11 == 0 ? "\r\n" : "\n");
    ++line;
    want_feature.push_back(feature);
    want_label.push_back(label);
    want_key.push_back(key);
    want_line.push_back(line);
  }
  for (std::size_t threads : {1u, 2u, 4u}) {
    SampleIndex index = parse(text, threads);
    REQUIRE(index.size() == want_feature.size());
    CHECK(features(index) == want_feature);
    CHECK(labels(index) == want_label);
    bool keys_ok = true;
    for (std::size_t i = 0; i < index.size(); ++i) keys_ok = keys_ok && index.keys[index.key(i)] == want_key[i];
    CHECK(keys_ok);
    CHECK_EQ(index.keys[0], "key0");
    CHECK_EQ(index.keys[1], "key7");
    for (std::size_t i : {0ul, 1ul, 977ul, 123456ul, 299999ul})
      CHECK_EQ(line_of(index, i), std::to_string(want_line[i]));
  }
  // A malformed line far into the file: still its file and line.
  std::string bad = text + "1,2\n";
  auto e = CHECK_THROWS(InvalidArgument, parse(bad, 2));
  if (e) CHECK(contains(e->what(), "idx.txt:" + std::to_string(line + 1) + ": expected"));
  std::string bad_key = text.substr(0, text.size() / 2);
  bad_key = bad_key.substr(0, bad_key.rfind('\n') + 1);
  const std::size_t bad_line = static_cast<std::size_t>(std::count(bad_key.begin(), bad_key.end(), '\n')) + 1;
  auto k = CHECK_THROWS(InvalidArgument, parse(bad_key + "1,2,../up\n" + text, 2));
  if (k) CHECK(contains(k->what(), "idx.txt:" + std::to_string(bad_line) + ": key '../up' cannot name a file"));
}

TEST_CASE("malformed lines name the file and line") {
  expect_bad("1,2,a\n3,4", "idx.txt:2: expected 'feature_index,label_index,key'");
  expect_bad("1,2,a,b", "idx.txt:1: too many fields");
  expect_bad("1,2,   ", "idx.txt:1: empty key");
  expect_bad("x,2,a", "feature_index is not an integer");
  expect_bad("1,2.5,a", "label_index is not an integer");
  expect_bad("1,,a", "label_index is not an integer");
  expect_bad("99999999999999999999,0,a", "feature_index is not an integer");
  expect_bad("1 2,0,a", "feature_index is not an integer");
  expect_bad("\n\n1,2,..", "idx.txt:3: key '..' cannot name a file");
  expect_bad("1,2,.", "cannot name a file");
  expect_bad("1,2,a/b", "cannot name a file");
  expect_bad(std::string("1,2,a\0b", 7), "idx.txt: NUL byte in index file");  // a key with a NUL: not text
  expect_bad("1,2," + std::string(200, 'z') + ",x", "(line: '1,2,zzz");       // the line shown, cut short
}

TEST_CASE("SampleIndex::add refuses keys that cannot name a file, naming the source") {
  SampleIndex index;
  index.sources.push_back("list");
  index.add(1, 2, "ok", 0, 1);
  auto e = CHECK_THROWS(InvalidArgument, index.add(1, 2, "../x", 0, 2));
  if (e) CHECK(contains(e->what(), "list:2: key '../x' cannot name a file"));
  index.add(-(std::int64_t{1} << 50), 3, "ok", 0, 7);
  index.finish();
  CHECK_EQ(index.size(), 2u);
  CHECK_EQ(index.feature(1), -(std::int64_t{1} << 50));
  CHECK_EQ(index.label(1), 3);
  CHECK_EQ(index.where(1), "list:7");
}

TEST_CASE("read_index_files: several files in order, missing files, binary files") {
  test::TempDir dir;
  test::write_file(dir.file("one.txt"), "1,0,a\n2,0,b\n", {});
  test::write_file(dir.file("two.txt"), "\n3,1,a\n", {});
  SampleIndex index = read_index_files({dir.file("one.txt"), dir.file("two.txt")});
  CHECK_EQ(index.size(), 3u);
  CHECK(index.keys == (std::vector<std::string>{"a", "b"}));
  CHECK_EQ(index.where(2), dir.file("two.txt") + ":2");
  CHECK_EQ(index.where(1), dir.file("one.txt") + ":2");
  auto missing = CHECK_THROWS(OsError, read_index_files({dir.file("one.txt"), dir.file("none.txt")}));
  if (missing) {
    CHECK_EQ(missing->error_number(), ENOENT);
    CHECK_EQ(missing->path(), dir.file("none.txt"));
  }
  test::write_file(dir.file("bin.txt"), std::string("1,0,a\n\0\0", 8), {});
  auto binary = CHECK_THROWS(InvalidArgument, read_index_files({dir.file("bin.txt")}));
  if (binary) CHECK(contains(binary->what(), "NUL byte in index file"));
  auto bad = CHECK_THROWS(InvalidArgument, read_index_files({dir.file("one.txt"), dir.file("bin.txt")}));
  (void)bad;
  test::write_file(dir.file("bad.txt"), "1,0,a\nnope\n", {});
  auto line = CHECK_THROWS(InvalidArgument, read_index_files({dir.file("bad.txt")}));
  if (line) CHECK(contains(line->what(), dir.file("bad.txt") + ":2:"));
}
