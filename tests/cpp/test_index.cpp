// Index files: "feature_index,label_index,key" lines parsed into a SampleIndex, with blank lines, spaces,
// CRLF and signs tolerated; every malformed line an InvalidArgument naming file and line; keys that
// cannot name a file refused. Mirrors tests/test_index.py.
#include <cerrno>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/errors.hpp"
#include "npyfeed/index.hpp"

using namespace npyfeed;
using npyfeed::test::contains;

namespace {

SampleIndex parse(const std::string& text, const std::string& name = "idx.txt") {
  SampleIndex index;
  parse_index_text(text, name, index);
  return index;
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
  CHECK(index.feature_index == (std::vector<std::int64_t>{5, 7, 9, -3}));
  CHECK(index.label_index == (std::vector<std::int64_t>{0, 1, -2, 4}));
  CHECK(index.key_id == (std::vector<std::uint32_t>{0, 1, 0, 2}));
  CHECK(index.line == (std::vector<std::uint64_t>{1, 3, 4, 6}));
  CHECK_EQ(index.where(1), "idx.txt:3");
  CHECK_EQ(parse("").size(), 0u);
  CHECK_EQ(parse("\n\n  \n").size(), 0u);
  const std::string big = std::to_string(std::numeric_limits<std::int64_t>::max());
  const std::string small = std::to_string(std::numeric_limits<std::int64_t>::min());
  SampleIndex extremes = parse(big + "," + small + ",k with spaces");
  CHECK_EQ(extremes.feature_index[0], std::numeric_limits<std::int64_t>::max());
  CHECK_EQ(extremes.label_index[0], std::numeric_limits<std::int64_t>::min());
  CHECK_EQ(extremes.keys[0], "k with spaces");
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
  expect_bad(std::string("1,2,a\0b", 7), "idx.txt:1: key 'a");           // what() ends at the NUL
  expect_bad("1,2," + std::string(200, 'z') + ",x", "(line: '1,2,zzz");  // the line shown, cut short
}

TEST_CASE("SampleIndex::add refuses keys that cannot name a file, naming the source") {
  SampleIndex index;
  index.sources.push_back("list");
  index.add(1, 2, "ok", 0, 1);
  auto e = CHECK_THROWS(InvalidArgument, index.add(1, 2, "../x", 0, 2));
  if (e) CHECK(contains(e->what(), "list:2: key '../x' cannot name a file"));
  CHECK_EQ(index.size(), 1u);
}

TEST_CASE("read_index_files: several files in order, missing files, binary files") {
  test::TempDir dir;
  test::write_file(dir.file("one.txt"), "1,0,a\n2,0,b\n", {});
  test::write_file(dir.file("two.txt"), "\n3,1,a\n", {});
  SampleIndex index = read_index_files({dir.file("one.txt"), dir.file("two.txt")});
  CHECK_EQ(index.size(), 3u);
  CHECK(index.keys == (std::vector<std::string>{"a", "b"}));
  CHECK_EQ(index.where(2), dir.file("two.txt") + ":2");
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
