#include "npyfeed/format/py_literal.hpp"

#include <cctype>
#include <limits>

namespace npyfeed::detail {

namespace {

class Parser {
 public:
  Parser(std::string_view text, bool allow_long_suffix, int max_depth)
      : text_(text), allow_long_suffix_(allow_long_suffix), max_depth_(max_depth) {}

  // Outside brackets Python's tokenizer reads the text line by line, and an indented line opens a block,
  // which a literal cannot: ast.literal_eval strips leading spaces and tabs of the first line only, so
  // "\n  {...}" is an "unexpected indent" (the same in Python 3.11 to 3.13). Inside brackets layout is free.
  PyLiteral parse_all() {
    while (!at_end() && (peek() == ' ' || peek() == '\t')) ++pos_;  // literal_eval's lstrip(" \t")
    if (skip_blank_lines()) fail("unexpected indent before the literal (an indented first line)");
    PyLiteral value = parse_value(0);
    // The rest of the literal's line: spaces, continuations, a comment.
    while (!at_end()) {
      if (peek() == ' ' || peek() == '\t' || peek() == '\f')
        ++pos_;
      else if (peek() == '\\' && continuation_length() > 0)
        pos_ += continuation_length();
      else
        break;
    }
    skip_comment();
    if (!at_end() && !at_newline()) fail("unexpected text after the literal");
    if (skip_blank_lines()) fail("unexpected indent after the literal");
    if (!at_end()) fail("unexpected text after the literal");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& reason) { throw PyLiteralError{pos_, reason}; }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  // Whitespace, comments and line continuations, as the Python tokenizer skips them inside brackets.
  void skip_space() {
    while (!at_end()) {
      char c = text_[pos_];
      // Not '\v': Python's tokenizer refuses it.
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f') {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && text_[pos_] != '\n' && text_[pos_] != '\r') ++pos_;
      } else if (c == '\\' && continuation_length() > 0) {
        pos_ += continuation_length();
      } else {
        break;
      }
    }
  }

  bool at_newline() const { return peek() == '\n' || peek() == '\r'; }

  void skip_newline() {
    if (peek() == '\r') ++pos_;
    if (peek() == '\n') ++pos_;
  }

  void skip_comment() {
    if (peek() == '#') {
      while (!at_end() && !at_newline()) ++pos_;
    }
  }

  // Skips the indentation of the line starting at pos_ as Python's tokenizer measures it: a form feed resets
  // the column, and across backslash-newlines the column of the first backslash counts where it is not 0.
  // Returns whether the line is indented (column > 0).
  bool skip_indentation() {
    std::size_t column = 0;
    std::size_t continued_at = 0;
    while (!at_end()) {
      char c = peek();
      if (c == ' ') {
        ++column;
      } else if (c == '\t') {
        column = (column / 8 + 1) * 8;
      } else if (c == '\f') {
        column = 0;
      } else if (c == '\\' && continuation_length() > 0) {
        if (continued_at == 0) continued_at = column;
        pos_ += continuation_length();
        continue;
      } else {
        break;
      }
      ++pos_;
    }
    return (continued_at != 0 ? continued_at : column) != 0;
  }

  // Skips blank and comment-only lines from the start of a line. Stops at the first character of the next
  // line with content (or the end) and returns whether that line is indented: Python refuses both an
  // indented line with content and, at the end of the text, an indented last line without a newline.
  bool skip_blank_lines() {
    while (true) {
      std::size_t line_start = pos_;
      bool indented = skip_indentation();
      if (peek() == '#') {  // a comment line is blank, however indented
        skip_comment();
        indented = false;
      }
      if (at_newline()) {
        skip_newline();
        continue;
      }
      if (indented) pos_ = line_start;
      return indented;
    }
  }

  // Length of a backslash-newline at pos_, or 0. Python refuses one that ends the text.
  std::size_t continuation_length() const {
    std::size_t n = 1;
    if (pos_ + n < text_.size() && text_[pos_ + n] == '\r') ++n;
    if (pos_ + n < text_.size() && text_[pos_ + n] == '\n') ++n;
    return n > 1 && pos_ + n < text_.size() ? n : 0;
  }

  PyLiteral parse_value(int depth) {
    if (depth > max_depth_) fail("literal nested too deeply");
    skip_space();
    if (at_end()) fail("unexpected end of header");
    const std::size_t start = pos_;
    PyLiteral value = parse_token(depth);
    value.position = start;
    return value;
  }

  PyLiteral parse_token(int depth) {
    char c = peek();
    if (c == '{') return parse_dict(depth);
    if (c == '[') return parse_sequence(depth, ']', PyLiteral::Kind::kList);
    if (c == '(') return parse_sequence(depth, ')', PyLiteral::Kind::kTuple);
    if (c == '\'' || c == '"') return parse_strings();
    if ((c == 'u' || c == 'U') && pos_ + 1 < text_.size() && (text_[pos_ + 1] == '\'' || text_[pos_ + 1] == '"')) {
      return parse_strings();
    }
    if (c == '-' || c == '+' || std::isdigit(static_cast<unsigned char>(c))) return parse_int();
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') return parse_name();
    fail(std::string("unexpected character '") + c + "'");
  }

  PyLiteral parse_dict(int depth) {
    PyLiteral dict;
    dict.kind = PyLiteral::Kind::kDict;
    ++pos_;  // '{'
    skip_space();
    while (peek() != '}') {
      PyLiteral key = parse_value(depth + 1);
      skip_space();
      if (peek() != ':') fail("expected ':' in dict");
      ++pos_;
      PyLiteral value = parse_value(depth + 1);
      // Python keeps the last value of a repeated key; so do we (np.load does the same).
      bool replaced = false;
      for (std::size_t i = 0; i + 1 < dict.items.size(); i += 2) {
        if (same_key(dict.items[i], key)) {
          dict.items[i + 1] = std::move(value);
          replaced = true;
          break;
        }
      }
      if (!replaced) {
        dict.items.push_back(std::move(key));
        dict.items.push_back(std::move(value));
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        fail("expected ',' or '}' in dict");
      }
    }
    ++pos_;
    return dict;
  }

  static bool same_key(const PyLiteral& a, const PyLiteral& b) {
    if (a.is_int_like() && b.is_int_like()) return a.as_int() == b.as_int();
    if (a.kind != b.kind) return false;
    if (a.kind == PyLiteral::Kind::kStr) return a.str == b.str;
    if (a.kind == PyLiteral::Kind::kNone) return true;
    return false;  // tuples as keys never match the keys we look for; keep them distinct
  }

  PyLiteral parse_sequence(int depth, char close, PyLiteral::Kind kind) {
    PyLiteral seq;
    seq.kind = kind;
    ++pos_;
    skip_space();
    bool saw_comma = false;
    while (peek() != close) {
      seq.items.push_back(parse_value(depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        saw_comma = true;
        skip_space();
      } else if (peek() != close) {
        fail(std::string("expected ',' or '") + close + "'");
      }
    }
    ++pos_;
    // "(x)" is just x in Python, not a tuple.
    if (kind == PyLiteral::Kind::kTuple && seq.items.size() == 1 && !saw_comma) return std::move(seq.items[0]);
    return seq;
  }

  PyLiteral parse_strings() {
    // Adjacent string literals concatenate, as in Python source.
    PyLiteral s;
    s.kind = PyLiteral::Kind::kStr;
    do {
      s.str += parse_one_string();
      skip_space();
    } while (peek() == '\'' || peek() == '"' ||
             ((peek() == 'u' || peek() == 'U') && pos_ + 1 < text_.size() &&
              (text_[pos_ + 1] == '\'' || text_[pos_ + 1] == '"')));
    return s;
  }

  static void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::uint32_t parse_hex(int digits) {
    std::uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      if (at_end() || !std::isxdigit(static_cast<unsigned char>(peek()))) fail("bad escape in string");
      char h = text_[pos_++];
      value = value * 16 + static_cast<std::uint32_t>(
                               std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
    }
    return value;
  }

  std::string parse_one_string() {
    if (peek() == 'u' || peek() == 'U') ++pos_;
    char quote = text_[pos_];
    if (pos_ + 2 < text_.size() && text_[pos_ + 1] == quote && text_[pos_ + 2] == quote) {
      fail("triple-quoted strings are not supported in headers");
    }
    ++pos_;
    std::string out;
    while (true) {
      if (at_end()) fail("unterminated string");
      char c = text_[pos_++];
      if (c == quote) break;
      if (c == '\n' || c == '\r') fail("newline in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_end()) fail("unterminated string");
      char e = text_[pos_++];
      switch (e) {
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '0':
        case '1':
        case '2':
        case '3':
        case '4':
        case '5':
        case '6':
        case '7': {
          std::uint32_t value = static_cast<std::uint32_t>(e - '0');
          for (int i = 0; i < 2 && !at_end() && peek() >= '0' && peek() <= '7'; ++i)
            value = value * 8 + static_cast<std::uint32_t>(text_[pos_++] - '0');
          append_utf8(out, value);
          break;
        }
        case 'x':
          append_utf8(out, parse_hex(2));
          break;
        case 'u':
          append_utf8(out, parse_hex(4));
          break;
        case 'U': {
          std::uint32_t cp = parse_hex(8);
          if (cp > 0x10FFFF) fail("bad \\U escape in string");
          append_utf8(out, cp);
          break;
        }
        case '\n':
          break;    // line continuation inside a string
        case '\r':  // the same with a \r or \r\n newline
          if (peek() == '\n') ++pos_;
          break;
        case 'N':  // \N{name} needs Unicode's name table: refuse rather than keep it verbatim (a wrong name)
          fail("\\N{...} escapes are not supported in headers");
        default:
          out += '\\';  // Python keeps unknown escapes as they are
          out += e;
      }
    }
    return out;
  }

  PyLiteral parse_int() {
    // One sign at most: ast.literal_eval refuses --3 (an operator applied to an expression).
    bool negative = peek() == '-';
    if (peek() == '-' || peek() == '+') {
      ++pos_;
      skip_space();
    }
    if (at_end() || !std::isdigit(static_cast<unsigned char>(peek()))) fail("expected a number");
    int base = 10;
    if (peek() == '0' && pos_ + 1 < text_.size()) {
      char p = static_cast<char>(std::tolower(text_[pos_ + 1]));
      if (p == 'x') base = 16;
      if (p == 'o') base = 8;
      if (p == 'b') base = 2;
      if (base != 10) pos_ += 2;
    }
    // Magnitude up to 2^63 so that INT64_MIN parses; anything larger is refused.
    const std::uint64_t limit =
        static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + (negative ? 1 : 0);
    std::uint64_t magnitude = 0;
    std::size_t digits = 0;
    const std::size_t first_digit = pos_;
    bool last_underscore = false;
    while (!at_end()) {
      char c = static_cast<char>(std::tolower(peek()));
      // Single underscores between digits, and right after a base prefix (0x_1f), as in Python.
      if (c == '_' && (digits > 0 || base != 10) && !last_underscore) {
        last_underscore = true;
        ++pos_;
        continue;
      }
      int d;
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else
        break;
      if (d >= base) break;
      last_underscore = false;
      if (magnitude > (limit - static_cast<std::uint64_t>(d)) / static_cast<std::uint64_t>(base))
        fail("integer too large");
      magnitude = magnitude * static_cast<std::uint64_t>(base) + static_cast<std::uint64_t>(d);
      ++digits;
      ++pos_;
    }
    if (digits == 0 || last_underscore) fail("malformed integer");
    if (base == 10 && digits > 1 && text_[first_digit] == '0' && magnitude != 0) fail("leading zeros are not allowed");
    if (allow_long_suffix_ && peek() == 'L') ++pos_;  // numpy's Python 2 filter drops 'L' only, not 'l'
    if (!at_end() && (std::isalnum(static_cast<unsigned char>(peek())) || peek() == '.' || peek() == '_')) {
      fail("numbers other than integers are not allowed here");
    }
    PyLiteral v;
    v.kind = PyLiteral::Kind::kInt;
    v.integer = negative ? static_cast<std::int64_t>(0 - magnitude) : static_cast<std::int64_t>(magnitude);
    return v;
  }

  PyLiteral parse_name() {
    std::size_t start = pos_;
    while (!at_end() && (std::isalnum(static_cast<unsigned char>(peek())) || peek() == '_')) ++pos_;
    std::string_view name = text_.substr(start, pos_ - start);
    PyLiteral v;
    if (name == "True" || name == "False") {
      v.kind = PyLiteral::Kind::kBool;
      v.boolean = name == "True";
    } else if (name == "None") {
      v.kind = PyLiteral::Kind::kNone;
    } else {
      pos_ = start;
      fail("names and expressions are not allowed in a header ('" + std::string(name) + "')");
    }
    return v;
  }

  std::string_view text_;
  bool allow_long_suffix_;
  int max_depth_;
  std::size_t pos_ = 0;
};

}  // namespace

PyLiteral parse_py_literal(std::string_view text, bool allow_long_suffix, int max_depth) {
  return Parser(text, allow_long_suffix, max_depth).parse_all();
}

}  // namespace npyfeed::detail
