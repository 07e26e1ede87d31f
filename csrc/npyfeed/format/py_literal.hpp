// A parser for the subset of Python literal syntax that `.npy` headers use: dicts, lists, tuples,
// strings, integers, True/False/None. It is what `ast.literal_eval` would accept for such headers,
// and nothing is ever evaluated. Pure: bytes in, a value tree out.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace npyfeed::detail {

struct PyLiteral {
  enum class Kind { kNone, kBool, kInt, kStr, kTuple, kList, kDict };
  Kind kind = Kind::kNone;
  bool boolean = false;
  std::int64_t integer = 0;
  std::string str;               // utf-8
  std::vector<PyLiteral> items;  // tuple/list elements; dict as key, value, key, value...
  std::size_t position = 0;      // where the value starts in the text (parse_npy_header makes it a file offset)

  bool is_int_like() const { return kind == Kind::kInt || kind == Kind::kBool; }
  std::int64_t as_int() const { return kind == Kind::kBool ? (boolean ? 1 : 0) : integer; }
};

/// Thrown by `parse_py_literal`; `position` is the offset inside the text.
struct PyLiteralError {
  std::size_t position;
  std::string reason;
};

/// Parses `text` (utf-8) as one Python literal, as `ast.literal_eval` reads it: leading spaces and tabs are
/// stripped, then the first line that is not blank or a comment must not be indented, and neither may a last
/// line of only spaces or tabs without a newline (Python's "unexpected indent"). `allow_long_suffix` accepts
/// Python 2's `3L`. Throws `PyLiteralError`.
PyLiteral parse_py_literal(std::string_view text, bool allow_long_suffix, int max_depth = 32);

}  // namespace npyfeed::detail
