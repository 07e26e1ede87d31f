// The header parser as a pure function: valid headers of every version, key order and byte order, and
// malformed ones, each refused with an NpyFormatError at the right byte offset. Mirrors tests/test_npy_header.py.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/format/npy_header.hpp"

using namespace npyfeed;
using npyfeed::test::contains;
using namespace std::string_literals;

namespace {

using Bytes = std::vector<std::byte>;

Bytes bytes_of(const std::string& s) {
  Bytes b(s.size());
  std::transform(s.begin(), s.end(), b.begin(), [](char c) { return static_cast<std::byte>(c); });
  return b;
}

using npyfeed::test::npy_text;
using npyfeed::test::preamble;

Bytes npy(const std::string& dict, int major = 1, std::size_t align = 64) {
  return bytes_of(npy_text(dict, major, align));
}

using npyfeed::test::dict_of;

NpyHeader parse(const Bytes& b, std::size_t cap = kDefaultMaxHeaderSize) { return parse_npy_header(b, cap); }

// The file offset of `needle` inside the v1 header text `dict` (errors point at the offending value).
std::uint64_t at(const std::string& dict, const std::string& needle) {
  std::size_t i = dict.find(needle);
  if (i == std::string::npos) throw std::logic_error("test bug: '" + needle + "' is not in " + dict);
  return 10 + i;
}

// Expects an NpyFormatError at `offset` whose reason mentions `part`.
void expect_error(const Bytes& b, std::uint64_t offset, const std::string& part,
                  std::size_t cap = kDefaultMaxHeaderSize, int line = __builtin_LINE()) {
  try {
    parse(b, cap);
    test::report(__FILE__, line, "no NpyFormatError (expected one about '" + part + "')");
  } catch (const NpyFormatError& e) {
    if (e.offset() != offset) {
      test::report(__FILE__, line,
                   "offset " + std::to_string(e.offset()) + ", expected " + std::to_string(offset) + ": " + e.what());
    }
    if (!contains(e.reason(), part)) test::report(__FILE__, line, "reason '" + e.reason() + "' lacks '" + part + "'");
    if (!e.path().empty()) test::report(__FILE__, line, "the parser named a path: " + e.path());
  }
}

}  // namespace

TEST_CASE("v1 header: fields, sizes and data offset") {
  Bytes b = npy(dict_of("'<f4'", "(3, 4)"));
  NpyHeader h = parse(b);
  CHECK_EQ(h.major_version, 1);
  CHECK_EQ(h.minor_version, 0);
  CHECK_EQ(h.descr_text, std::string("<f4"));
  CHECK_EQ(h.itemsize, 4u);
  CHECK_EQ(h.scalar.kind, 'f');
  CHECK_EQ(h.scalar.size, 4u);
  CHECK(!h.scalar.swapped);
  CHECK(!h.fortran_order);
  CHECK(h.shape == std::vector<std::int64_t>{3, 4});
  CHECK_EQ(h.count, 12u);
  CHECK_EQ(h.nbytes, 48u);
  CHECK_EQ(h.data_offset, b.size());
  CHECK_EQ(h.data_offset % 64, 0u);
  CHECK_EQ(npy_header_end(std::span<const std::byte>(b).first(kMaxPreambleSize)), b.size());
}

TEST_CASE("v2 and v3 headers use a 4-byte length") {
  for (int major : {2, 3}) {
    Bytes b = npy(dict_of("'<i8'", "(5,)"), major);
    NpyHeader h = parse(b);
    CHECK_EQ(h.major_version, major);
    CHECK_EQ(h.data_offset, b.size());
    CHECK_EQ(h.nbytes, 40u);
    CHECK_EQ(npy_header_end(std::span<const std::byte>(b).first(kMaxPreambleSize)), b.size());
  }
  // A v2 header longer than 65535 bytes (the reason v2 exists), under a raised cap.
  std::string big = "{'descr': [";
  for (int i = 0; i < 5000; ++i) big += "('field" + std::to_string(i) + "', '<u1'), ";
  big += "], 'fortran_order': False, 'shape': (2,)}";
  Bytes b = npy(big, 2);
  CHECK(b.size() > 65536);
  NpyHeader h = parse(b, 200000);
  CHECK_EQ(h.itemsize, 5000u);
  CHECK_EQ(h.nbytes, 10000u);
  expect_error(b, 8, "exceeds the limit");
}

TEST_CASE("v3 header: utf-8 field names") {
  // 'é' and '名' as utf-8 bytes; v3 is utf-8, v1/v2 would be latin-1.
  Bytes b = npy("{'descr': [('\xc3\xa9', '<i4'), ('\xe5\x90\x8d', '<f8')], 'fortran_order': False, 'shape': (2,)}", 3);
  NpyHeader h = parse(b);
  CHECK_EQ(h.itemsize, 12u);
  CHECK_EQ(h.nbytes, 24u);
  CHECK(h.descr_text.empty());
  CHECK_EQ(h.scalar.kind, '\0');
  REQUIRE(h.descr.items.size() == 2);
  CHECK_EQ(h.descr.items[0].items[0].str, std::string("\xc3\xa9"));
  // Invalid utf-8 in a v3 header.
  expect_error(npy("{'descr': '<i4', 'fortran_order': False, 'shape': (), '\xff': 1}", 3), 12, "utf-8");
  // In v1 the same byte is latin-1 'ÿ' and only the extra key is wrong.
  expect_error(npy("{'descr': '<i4', 'fortran_order': False, 'shape': (), '\xff': 1}", 1), 10, "exactly the keys");
}

TEST_CASE("keys in any order") {
  const std::string items[3] = {"'descr': '>u2'", "'fortran_order': True", "'shape': (7, 2)"};
  int perm[3] = {0, 1, 2};
  int seen = 0;
  do {
    std::string dict = "{" + items[perm[0]] + ", " + items[perm[1]] + ", " + items[perm[2]] + "}";
    NpyHeader h = parse(npy(dict));
    CHECK_EQ(h.descr_text, std::string(">u2"));
    CHECK(h.fortran_order);
    CHECK(h.shape == std::vector<std::int64_t>{7, 2});
    CHECK_EQ(h.nbytes, 28u);
    ++seen;
  } while (std::next_permutation(perm, perm + 3));
  CHECK_EQ(seen, 6);
}

TEST_CASE("byte orders") {
  struct Case {
    const char* descr;
    char kind;
    std::uint32_t size;
    bool swapped;
  };
  const Case cases[] = {
      {"'<i8'", 'i', 8, false}, {"'>i8'", 'i', 8, true},    {"'|u1'", 'u', 1, false}, {"'>u1'", 'u', 1, false},
      {"'=f8'", 'f', 8, false}, {"'<f2'", 'f', 2, false},   {"'>f2'", 'f', 2, true},  {"'|b1'", 'b', 1, false},
      {"'?'", 'b', 1, false},   {"'<c16'", 'c', 16, false}, {"'>c8'", 'c', 8, true},  {"'<u4'", 'u', 4, false},
  };
  for (const Case& c : cases) {
    NpyHeader h = parse(npy(dict_of(c.descr, "(2,)")));
    CHECK_EQ(h.scalar.kind, c.kind);
    CHECK_EQ(h.scalar.size, c.size);
    CHECK_EQ(h.scalar.swapped, c.swapped);
    CHECK_EQ(h.itemsize, static_cast<std::uint64_t>(c.size));
  }
}

TEST_CASE("fortran order, 0-d and empty shapes") {
  NpyHeader f = parse(npy(dict_of("'<f8'", "(2, 3, 4)", "True")));
  CHECK(f.fortran_order);
  CHECK_EQ(f.nbytes, 192u);
  NpyHeader scalar = parse(npy(dict_of("'<f8'", "()")));
  CHECK(scalar.shape.empty());
  CHECK_EQ(scalar.count, 1u);
  CHECK_EQ(scalar.nbytes, 8u);
  NpyHeader empty = parse(npy(dict_of("'<f8'", "(0, 5)")));
  CHECK_EQ(empty.count, 0u);
  CHECK_EQ(empty.nbytes, 0u);
  // As in numpy, a zero dimension does not excuse the others from overflowing.
  std::string zero_huge = dict_of("'<f8'", "(0, 9223372036854775807, 9223372036854775807)");
  expect_error(npy(zero_huge), at(zero_huge, "(0,"), "overflows");
  CHECK_EQ(parse(npy(dict_of("'<f8'", "(0, 576460752303423488)"))).nbytes, 0u);
}

TEST_CASE("other dtypes and their item sizes") {
  struct Case {
    const char* descr;
    std::uint64_t itemsize;
  };
  const Case cases[] = {
      {"'|S10'", 10},
      {"'<U3'", 12},
      {"'|V16'", 16},
      {"'<M8[ns]'", 8},
      {"'<m8[D]'", 8},
      {"'<M8'", 8},
      {"'<f16'", 16},
      {"[('a', '<i4', (2, 3)), ('b', '<f8')]", 32},
      {"[('a', '<i4', 2), (('title', 'b'), '|u1')]", 9},
      {"[('outer', [('x', '<f4'), ('y', '<f4')]), ('n', '<i2')]", 10},
      {"[('', '|V3'), ('x', '<u1')]", 4},
      // Fields whose type is itself a subarray or a subarray of structs, as numpy writes them (numpy's own
      // format tests: record_arrays[4] and test_descr_to_dtype).
      {"[('c', ('<f8', (5,)), (2,))]", 80},
      {"[('x', ([('a', '|i1'), ('', '|V3'), ('b', '|i1'), ('', '|V3')], (3,)), (4,))]", 96},
      {"[('a', (([('a', '<i8'), ('b', [('a', '|i1'), ('', '|V3'), ('b', '|i1'), ('', '|V3')])], (3,)), (4,)), (5,))]",
       16 * 60},
      {"[(('t', 'x'), ('>f4', (2,)), 3), ('y', ('<i2', ()))]", 26},
      // What numpy.dtype((base, shape)) also takes: a list or an int as the shape; extra tuple items are ignored.
      {"[('a', ('<i4', [2]))]", 8},
      {"[('a', ('<i4', 0))]", 0},
      {"[('a', ('<i4', (2,), 'ignored'))]", 8},
  };
  for (const Case& c : cases) {
    NpyHeader h = parse(npy(dict_of(c.descr, "(3,)")));
    CHECK_EQ(h.itemsize, c.itemsize);
    CHECK_EQ(h.nbytes, 3 * c.itemsize);
    CHECK_EQ(descr_itemsize(h.descr), c.itemsize);
  }
  CHECK_EQ(parse(npy(dict_of("'|S10'", "(1,)"))).scalar.kind, '\0');  // not numeric
}

TEST_CASE("a (descr, shape) subarray as the whole descr") {
  // np.load reads prod(shape) base elements per array element and reshapes them to the header's shape: that
  // works only for one element per element or an empty array, and gives the base dtype.
  for (const char* descr : {"('<i4', (1,))", "('<i4', ())", "('<i4', 1)", "(('<i4', (1, 1)), [1])"}) {
    NpyHeader h = parse(npy(dict_of(descr, "(3,)")));
    CHECK_EQ(h.itemsize, 4u);
    CHECK_EQ(h.nbytes, 12u);
    CHECK_EQ(h.descr_text, std::string("<i4"));
    CHECK_EQ(h.scalar.kind, 'i');
    CHECK_EQ(descr_itemsize(h.descr), 4u);
  }
  NpyHeader empty = parse(npy(dict_of("([('a', '<i2')], (2,))", "(0, 4)")));
  CHECK_EQ(empty.itemsize, 2u);
  CHECK_EQ(empty.nbytes, 0u);
  CHECK(empty.descr.kind == detail::PyLiteral::Kind::kList);
  std::string two = dict_of("('<i4', (2,))", "(3,)");
  expect_error(npy(two), at(two, "('<i4'"), "subarray of 2 elements");
  std::string scalar = dict_of("('<i4', (2,))", "()");
  expect_error(npy(scalar), at(scalar, "('<i4'"), "subarray of 2 elements");
}

TEST_CASE("indentation outside brackets, as ast.literal_eval reads it") {
  const std::string dict = dict_of("'<i2'", "(4,)");
  // Leading spaces and tabs are stripped; blank lines, comments, form feeds and continuations are fine.
  for (const std::string& prefix : {" \t "s, "\n"s, "\r\n"s, "\r"s, "#c\n"s, "  #c\n"s, "\n  #c\n"s, "\n  \n"s, "\\\n"s,
                                    "\f"s, "\n\f"s, "\n \f"s, " \f"s, "\n\\\n"s}) {
    CHECK_EQ(parse(npy(prefix + dict)).nbytes, 8u);
  }
  // An indented first line (after a newline, a comment line, a continuation or a form feed) is an
  // "unexpected indent", as in Python; the offset is the start of that line.
  const std::pair<std::string, std::uint64_t> indented[] = {{"\n "s, 11},     {"\n\t"s, 11},     {"\r "s, 11},
                                                            {"#c\n "s, 13},   {"\\\n "s, 10},    {"\f "s, 10},
                                                            {"\n \\\n"s, 11}, {"\f \\\n\f"s, 10}};
  for (const auto& [prefix, offset] : indented) expect_error(npy(prefix + dict), offset, "unexpected indent");
  // After the literal: blank lines and comments are fine (a comment line however indented), but not a last
  // line of only spaces without a newline.
  for (const std::string& suffix : {"\n"s, "\n  \n"s, "  # c\n  #d"s, "\n \f"s, "\f"s, "\n\f"s, " \\\n "s}) {
    std::string text = dict + suffix;
    CHECK_EQ(parse(bytes_of(preamble(1, 0, text.size()) + text)).nbytes, 8u);
  }
  const std::pair<std::string, std::uint64_t> indented_last[] = {
      {"\n "s, 1}, {"\n\t"s, 1}, {"\n\n  "s, 2}, {"\n \\\n\f"s, 1}, {"\n #c\n "s, 5}};
  for (const auto& [suffix, line] : indented_last) {
    std::string text = dict + suffix;
    expect_error(bytes_of(preamble(1, 0, text.size()) + text), 10 + dict.size() + line, "unexpected indent");
  }
}

TEST_CASE("python literal syntax numpy accepts") {
  // Double quotes, no spaces, trailing commas, v1's long suffix, comments and line continuations, a repeated
  // key (Python keeps the last value, so np.load does too).
  const std::string dicts[] = {
      "{\"descr\":\"<i2\",\"fortran_order\":False,\"shape\":(4,)}",
      "{'descr': '<i2', 'fortran_order': False, 'shape': (4L,), }",
      "{'descr': '<i2', # a comment\n 'fortran_order': False, 'shape': (4,)}",
      "{'descr': '<i2', \\\n 'fortran_order': False, 'shape': (4,)}",
      "{'descr': '<f8', 'descr': '<i2', 'fortran_order': False, 'shape': (4,)}",
      "{'descr': u'<i2', 'fortran_order': False, 'shape': (0x4,)}",
      "{'descr': '<' 'i2', 'fortran_order': False, 'shape': (4,)}",
  };
  for (const std::string& d : dicts) {
    NpyHeader h = parse(npy(d));
    CHECK_EQ(h.descr_text, std::string("<i2"));
    CHECK_EQ(h.nbytes, 8u);
  }
  // Old writers aligned the data to 16 bytes, not 64.
  Bytes old = npy(dict_of("'<i2'", "(4,)"), 1, 16);
  CHECK_EQ(parse(old).data_offset, old.size());
  CHECK_EQ(old.size() % 16, 0u);
}

TEST_CASE("malformed preambles: offsets point at the bad bytes") {
  expect_error({}, 0, "empty file");
  expect_error(bytes_of("\x93NUM"), 4, "too short");
  expect_error(bytes_of("xNUMPY\x01\x00\x10\x00"s), 0, "bad magic");
  expect_error(bytes_of("\x93NUMPX\x01\x00\x10\x00"s), 0, "bad magic");
  expect_error(bytes_of("\x93numpy\x01\x00\x10\x00"s), 0, "bad magic");
  expect_error(bytes_of("N"), 0, "bad magic");
  // 6 and 7 bytes: the whole magic or more is there, but not the version (once read past the magic).
  expect_error(bytes_of("\x93NUMPY"), 6, "too short");
  expect_error(bytes_of("\x93NUMPY\x01"), 7, "too short");
  expect_error(bytes_of("\x93NUMPZ\x01"), 0, "bad magic");
  expect_error(bytes_of(preamble(4, 0, 16)), 6, "version 4.0");
  expect_error(bytes_of(preamble(1, 1, 16)), 6, "version 1.1");
  expect_error(bytes_of(preamble(0, 0, 16)), 6, "version 0.0");
  expect_error(bytes_of(std::string("\x93NUMPY\x01\x00\x10", 9)), 9, "length field");
  expect_error(bytes_of(std::string("\x93NUMPY\x02\x00\x10\x00", 10)), 10, "length field");
  // The header announces more text than there is.
  expect_error(bytes_of(preamble(1, 0, 118) + "{'descr': '<i2'"), 25, "header is truncated");
  // The length field itself is over the cap, before anything is read.
  expect_error(bytes_of(preamble(2, 0, 0xffffffff)), 8, "exceeds the limit");
  CHECK_THROWS(NpyFormatError, npy_header_end(bytes_of(preamble(2, 0, 0xffffffff))));
}

TEST_CASE("the header size cap, counted in characters") {
  std::string dict = dict_of("'<i2'", "(4,)");
  Bytes b = npy(dict);
  std::size_t text_len = b.size() - 10;
  CHECK_EQ(parse(b, text_len).nbytes, 8u);
  expect_error(b, 8, "exceeds the limit", text_len - 1);
  // v3: utf-8 bytes may exceed the cap as long as the characters do not.
  std::string name(30, 'x');
  std::string wide;
  for (int i = 0; i < 30; ++i) wide += "\xe5\x90\x8d";  // 3 bytes, 1 character
  Bytes narrow3 = npy("{'descr': [('" + name + "', '<i4')], 'fortran_order': False, 'shape': ()}", 3);
  Bytes wide3 = npy("{'descr': [('" + wide + "', '<i4')], 'fortran_order': False, 'shape': ()}", 3);
  std::size_t chars = narrow3.size() - 12;
  // The padding differs with the byte length; compare against each file's own character count.
  std::size_t wide_chars = wide3.size() - 12 - 60;
  CHECK_EQ(parse(narrow3, chars).itemsize, 4u);
  CHECK_EQ(parse(wide3, wide_chars).itemsize, 4u);
  expect_error(wide3, 8, "exceeds the limit", wide_chars - 1);
}

TEST_CASE("malformed header text") {
  const std::size_t t = 10;  // start of the v1 header text
  expect_error(npy("[1, 2]"), t, "not a dictionary");
  expect_error(npy("{'descr': '<i2', 'fortran_order': False}"), t, "exactly the keys");
  expect_error(npy("{'descr': '<i2', 'fortran_order': False, 'shape': (4,), 'extra': 1}"), t, "exactly the keys");
  expect_error(npy("{'Descr': '<i2', 'fortran_order': False, 'shape': (4,)}"), t, "exactly the keys");
  // Errors about a value point at that value.
  const std::pair<std::string, std::string> bad_values[] = {
      {dict_of("'<i2'", "(4,)", "0"), "0,"}, {dict_of("'<i2'", "(4,)", "'False'"), "'False'"},
      {dict_of("'<i2'", "[4]"), "[4]"},      {dict_of("'<i2'", "4"), "4,"},
      {dict_of("'<i2'", "('4',)"), "'4'"},   {dict_of("'<i2'", "(None,)"), "None"},
      {dict_of("'<i2'", "(4, -1)"), "-1"}};
  for (const auto& [dict, where] : bad_values) {
    expect_error(npy(dict), at(dict, where), contains(dict, "-1") ? "negative dimension" : "is not a");
  }
  // Position-bearing literal errors point inside the text: here at the '.' of 3.5.
  std::string d = dict_of("'<i2'", "(3.5,)");
  expect_error(npy(d), t + d.find("3.5") + 1, "integers");
  std::string expr = "{'descr': __import__('os'), 'fortran_order': False, 'shape': ()}";
  expect_error(npy(expr), t + expr.find("__import__"), "names and expressions");
  std::string call = dict_of("'<i2'", "(1+1,)");
  expect_error(npy(call), t + call.find("+1,"), "expected");
  Bytes unclosed = npy("{'descr': '<i2', 'fortran_order': False, 'shape': (4,)");
  expect_error(unclosed, unclosed.size(), "expected ',' or '}'");
  expect_error(npy("{'descr': '''<i2''', 'fortran_order': False, 'shape': (4,)}"), t + 10, "triple-quoted");
  // NUL inside the text: offset of the NUL byte.
  std::string nul = dict_of("'<i2'", "(4,)");
  nul[12] = '\0';
  expect_error(npy(nul), t + 12, "NUL");
  // Nesting bombs stop at the depth limit (the dict is depth 0, the first '[' at text offset 10 depth 1, so the
  // 33rd '[' at offset 42 is one too many) instead of exhausting the stack.
  std::string deep =
      "{'descr': " + std::string(200, '[') + std::string(200, ']') + ", 'fortran_order': False, 'shape': ()}";
  expect_error(npy(deep), t + 42, "nested too deeply");
}

TEST_CASE("dtypes that must be refused") {
  // Object arrays: numpy writes '|O' and would unpickle them.
  std::string object = dict_of("'|O'", "(2,)");
  expect_error(npy(object), at(object, "'|O'"), "'|O'");
  std::string object8 = dict_of("'<O8'", "(2,)");
  expect_error(npy(object8), at(object8, "'<O8'"), "never unpickles");
  std::string field = dict_of("[('a', '|O')]", "(2,)");
  expect_error(npy(field), at(field, "'|O'"), "'|O'");
  std::string nested = dict_of("[('a', [('b', ('<i4', (2,))), ('c', ('|O', 3))])]", "(2,)");
  expect_error(npy(nested), at(nested, "'|O'"), "never unpickles");
  // Each error points at the offending value (`where`, the first match in the header text).
  const std::pair<const char*, const char*> cases[] = {{"'<i3'", "'<i3'"},
                                                       {"'<x4'", "'<x4'"},
                                                       {"'<f3'", "'<f3'"},
                                                       {"'<c4'", "'<c4'"},
                                                       {"''", "''"},
                                                       {"'<'", "'<'"},
                                                       {"'<M4'", "'<M4'"},
                                                       {"'<M8[n-s]'", "'<M8"},
                                                       {"'<i4x'", "'<i4x'"},
                                                       {"1", "1,"},
                                                       {"None", "None"},
                                                       {"[('a',)]", "('a',)"},
                                                       {"[('a', '<i4', -1)]", "-1"},
                                                       {"[('a', '<i4', (2, -1))]", "-1"},
                                                       {"[(1, '<i4')]", "1,"},
                                                       {"'<U99999999999999999999'", "'<U9"},
                                                       {"[('a', ('<i4',))]", "('<i4',)"},
                                                       {"[('a', ('<i4', 'x'))]", "'x'"},
                                                       {"[('a', ('<i4', (2,)), (True,))]", "True"},
                                                       {"[('a', [('b', '<i3')], 2)]", "'<i3'"},
                                                       {"[('a', ('<f8', (5,)), (2,)), ('b', ('<f8', (-5,)))]", "-5"},
                                                       {"('<i4', (2,))", "('<i4'"},
                                                       {"('<i4', (-1,))", "-1"},
                                                       {"(('<i4', (1,)), ('x',))", "'x'"}};
  for (const auto& [descr, where] : cases) {
    std::string dict = dict_of(descr, "(2,)");
    expect_error(npy(dict), at(dict, where), "");
  }
  // Latin-1 v1/v2 text is parsed as utf-8: offsets still count the file's bytes.
  std::string latin = "{'descr': [('\xe9t\xe9', '<i3')], 'fortran_order': False, 'shape': (2,)}";
  expect_error(npy(latin), at(latin, "'<i3'"), "'<i3'");
}

TEST_CASE("shapes whose byte size overflows") {
  const std::size_t t = 10;
  const std::pair<const char*, const char*> overflows[] = {
      {"'<f8'", "(4294967296, 4294967296)"},
      {"'|u1'", "(4611686018427387904, 2)"},  // 2^63 bytes > INT64_MAX
      {"'<f8'", "(1152921504606846976,)"},    // 2^60 * 8
  };
  for (const auto& [descr, shape] : overflows) {
    std::string dict = dict_of(descr, shape);
    expect_error(npy(dict), at(dict, shape), "overflows");
  }
  // 2^63 does not fit in int64 at all: a literal error at the number.
  std::string d = dict_of("'|u1'", "(9223372036854775808,)");
  expect_error(npy(d), t + d.find("9223372036854775808") + 18, "too large");
  // The largest representable size passes the parser (the loader then checks the file holds it).
  NpyHeader h = parse(npy(dict_of("'|u1'", "(9223372036854775807,)")));
  CHECK_EQ(h.nbytes, 9223372036854775807ull);
  // Structured itemsizes overflow too.
  std::string big_field = dict_of("[('a', '<f8', (4294967296, 4294967296))]", "(1,)");
  expect_error(npy(big_field), at(big_field, "(4294967296"), "too large");
  std::string big_sub = dict_of("[('a', ('<f8', (4294967296, 4294967296)))]", "(1,)");
  expect_error(npy(big_sub), at(big_sub, "(4294967296"), "too large");
  // numpy allows 64 dimensions.
  std::string shape64 = "(";
  for (int i = 0; i < 64; ++i) shape64 += "1,";
  CHECK_EQ(parse(npy(dict_of("'<i2'", shape64 + ")"))).shape.size(), 64u);
  std::string dims65 = dict_of("'<i2'", shape64 + "1,)");
  expect_error(npy(dims65), at(dims65, "(1,"), "too many dimensions");
}

TEST_CASE("descr_itemsize on literal values") {
  NpyHeader h = parse(npy(dict_of("[('a', '<i4', (2, 3)), ('b', [('c', '>f8'), ('d', '|S5')])]", "()")));
  CHECK_EQ(descr_itemsize(h.descr), 24u + 13u);
  detail::PyLiteral number;
  number.kind = detail::PyLiteral::Kind::kInt;
  number.integer = 4;
  CHECK_THROWS(NpyFormatError, descr_itemsize(number));
  auto e = CHECK_THROWS(NpyFormatError, parse(npy(dict_of("'<x4'", "()"))));
  if (e) CHECK(contains(e->what(), "<bytes>"));  // no path yet: the loader adds it
  if (e) CHECK(contains(e->with_path("/data/a.npy").what(), "/data/a.npy"));
}
