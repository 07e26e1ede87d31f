#include "npyfeed/format/npy_header.hpp"

#include <bit>
#include <cctype>
#include <climits>
#include <cstring>
#include <string_view>

#include "npyfeed/common/checked.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/common/utf8.hpp"

namespace npyfeed {

namespace {

using detail::PyLiteral;

constexpr unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

[[noreturn]] void fail(std::uint64_t offset, const std::string& reason) { throw NpyFormatError("", offset, reason); }

struct Preamble {
  int major;
  int minor;
  std::size_t size;        // 10 or 12
  std::uint64_t text_len;  // header text length
};

Preamble read_preamble(std::span<const std::byte> bytes, std::size_t max_header_size) {
  if (bytes.size() < 8) {
    if (bytes.empty()) fail(0, "empty file, not a .npy file");
    // 6 or 7 bytes may hold the whole magic: compare no more of it than there is.
    const std::size_t n = bytes.size() < sizeof kMagic ? bytes.size() : sizeof kMagic;
    if (std::memcmp(bytes.data(), kMagic, n) != 0) fail(0, "not a .npy file (bad magic)");
    fail(bytes.size(), "file too short for a .npy header");
  }
  if (std::memcmp(bytes.data(), kMagic, 6) != 0) fail(0, "not a .npy file (bad magic, expected \\x93NUMPY)");
  Preamble p{};
  p.major = static_cast<unsigned char>(bytes[6]);
  p.minor = static_cast<unsigned char>(bytes[7]);
  if (p.major < 1 || p.major > 3 || p.minor != 0) {
    fail(6, "unsupported .npy format version " + std::to_string(p.major) + "." + std::to_string(p.minor) +
                " (1.0, 2.0 and 3.0 are supported)");
  }
  p.size = p.major == 1 ? 10 : 12;
  if (bytes.size() < p.size) fail(bytes.size(), "file too short for a .npy header length field");
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  if (p.major == 1) {
    p.text_len = static_cast<std::uint64_t>(u[8]) | (static_cast<std::uint64_t>(u[9]) << 8);
  } else {
    p.text_len = static_cast<std::uint64_t>(u[8]) | (static_cast<std::uint64_t>(u[9]) << 8) |
                 (static_cast<std::uint64_t>(u[10]) << 16) | (static_cast<std::uint64_t>(u[11]) << 24);
  }
  // numpy counts characters; v1/v2 are latin-1 (one byte each). For v3 the exact count comes after decoding.
  if (p.major < 3 && p.text_len > max_header_size) {
    fail(8, "header length " + std::to_string(p.text_len) + " exceeds the limit of " + std::to_string(max_header_size) +
                " bytes (raise max_header_size if you trust this file)");
  }
  if (p.major == 3 && p.text_len > 4 * static_cast<std::uint64_t>(max_header_size)) {
    fail(8, "header length " + std::to_string(p.text_len) + " exceeds the limit of " + std::to_string(max_header_size) +
                " characters (raise max_header_size if you trust this file)");
  }
  return p;
}

std::string latin1_to_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x80) {
      out += ch;
    } else {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

const PyLiteral* dict_get(const PyLiteral& dict, std::string_view key) {
  for (std::size_t i = 0; i + 1 < dict.items.size(); i += 2) {
    if (dict.items[i].kind == PyLiteral::Kind::kStr && dict.items[i].str == key) return &dict.items[i + 1];
  }
  return nullptr;
}

struct TypeStr {
  char byteorder;
  char kind;
  std::uint64_t size;  // number after the kind letter
};

// Parses numpy's array-interface typestr: [<>|=]?kind digits ([unit])?, as dtype.str writes it.
bool parse_typestr(std::string_view s, TypeStr& out) {
  std::size_t i = 0;
  out.byteorder = '=';
  if (i < s.size() && (s[i] == '<' || s[i] == '>' || s[i] == '|' || s[i] == '=')) out.byteorder = s[i++];
  if (i >= s.size()) return false;
  out.kind = s[i++];
  if (i >= s.size() || s[i] < '0' || s[i] > '9') {
    // A bare kind letter: only the ones with an implied size.
    if (i != s.size()) return false;
    if (out.kind == '?') {
      out.kind = 'b';
      out.size = 1;
      return true;
    }
    if (out.kind == 'b') {
      out.kind = 'i';
      out.size = 1;
      return true;
    }  // numpy: 'b' is int8, 'b1' is bool
    if (out.kind == 'O') {
      out.size = 8;
      return true;
    }  // '|O', as np.save writes it: refused with its own message
    return false;
  }
  std::uint64_t n = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    if (n > (std::uint64_t{1} << 40)) return false;
    n = n * 10 + static_cast<std::uint64_t>(s[i++] - '0');
  }
  out.size = n;
  if (i < s.size()) {
    if (out.kind != 'M' && out.kind != 'm') return false;
    if (s[i] != '[' || s.back() != ']') return false;
    for (std::size_t k = i + 1; k + 1 < s.size(); ++k) {
      if (!std::isalnum(static_cast<unsigned char>(s[k]))) return false;
    }
  }
  return true;
}

std::uint64_t typestr_itemsize(const PyLiteral& descr, ScalarType* scalar) {
  const std::string& s = descr.str;
  auto bad = [&]() { fail(descr.position, "unsupported dtype descr '" + s + "'"); };
  TypeStr t{};
  if (!parse_typestr(s, t)) bad();
  std::uint64_t itemsize = t.size;
  switch (t.kind) {
    case 'b':  // 'b1' (a bare '?' arrives here as 'b1'; numpy refuses '?1')
      if (t.size != 1) bad();
      break;
    case 'i':
    case 'u':
      if (t.size != 1 && t.size != 2 && t.size != 4 && t.size != 8) bad();
      break;
    case 'f':
      if (t.size != 2 && t.size != 4 && t.size != 8 && t.size != 12 && t.size != 16) bad();
      break;
    case 'c':
      if (t.size != 8 && t.size != 16 && t.size != 24 && t.size != 32) bad();
      break;
    case 'M':
    case 'm':
      if (t.size != 8) bad();
      break;
    case 'S':
    case 'V':
    case 'a':
      break;
    case 'U':
      itemsize = detail::checked_mul(t.size, 4, [&] { bad(); });
      break;
    case 'O':
      fail(descr.position, "object arrays cannot be loaded: npyfeed never unpickles (descr '" + s + "')");
    default:
      bad();
  }
  if (scalar != nullptr && (t.kind == 'b' || t.kind == 'i' || t.kind == 'u' || t.kind == 'f' || t.kind == 'c')) {
    scalar->kind = t.kind;
    scalar->size = static_cast<std::uint32_t>(t.size);
    constexpr char kNative = std::endian::native == std::endian::little ? '<' : '>';
    scalar->swapped = t.size > 1 && (t.byteorder == '<' || t.byteorder == '>') && t.byteorder != kNative;
  }
  return itemsize;
}

constexpr int kMaxDescrDepth = 16;

// Elements in a subarray shape, as numpy.dtype((base, shape)) takes it: an int, or a tuple or list of ints.
std::uint64_t subarray_count(const PyLiteral& shape) {
  auto dim = [](const PyLiteral& d) {
    if (d.kind != PyLiteral::Kind::kInt) fail(d.position, "bad subarray shape in descr");
    if (d.as_int() < 0) fail(d.position, "negative subarray shape in descr");
    return static_cast<std::uint64_t>(d.as_int());
  };
  if (shape.kind == PyLiteral::Kind::kInt) return dim(shape);
  if (shape.kind != PyLiteral::Kind::kTuple && shape.kind != PyLiteral::Kind::kList) {
    fail(shape.position, "bad subarray shape in descr");
  }
  std::uint64_t count = 1;
  for (const PyLiteral& d : shape.items) {
    count = detail::checked_mul(count, dim(d), [&] { fail(shape.position, "subarray shape in descr too large"); });
  }
  return count;
}

// A `(descr, shape)` subarray, as numpy's descr_to_dtype reads it: items 0 and 1 (it ignores any more).
void check_subarray(const PyLiteral& descr) {
  if (descr.items.size() < 2) fail(descr.position, "a subarray descr must be a (descr, shape) pair");
}

// The grammar of numpy.lib.format.descr_to_dtype:
//   descr    := typestr | (descr, shape) | [field, ...]
//   field    := (name, descr) | (name, descr, shape)       name := str | (title, name)
// so fields nest structs and subarrays to any depth: ('c', ('<f8', (5,)), (2,)) is a (2,) array of (5,) arrays.
std::uint64_t descr_itemsize_impl(const PyLiteral& descr, ScalarType* scalar, int depth) {
  if (depth > kMaxDescrDepth) fail(descr.position, "dtype descr nested too deeply");
  if (descr.kind == PyLiteral::Kind::kStr) return typestr_itemsize(descr, scalar);
  auto too_large = [&] { fail(descr.position, "structured dtype too large"); };
  if (descr.kind == PyLiteral::Kind::kTuple) {
    check_subarray(descr);
    std::uint64_t base = descr_itemsize_impl(descr.items[0], nullptr, depth + 1);
    return detail::checked_mul(base, subarray_count(descr.items[1]), too_large);
  }
  if (descr.kind != PyLiteral::Kind::kList) {
    fail(descr.position, "descr is neither a type string, a (descr, shape) subarray nor a list of fields");
  }
  std::uint64_t total = 0;
  for (const PyLiteral& field : descr.items) {
    if (field.kind != PyLiteral::Kind::kTuple || field.items.size() < 2 || field.items.size() > 3) {
      fail(field.position, "a field of a structured descr must be (name, descr) or (name, descr, shape)");
    }
    const PyLiteral& name = field.items[0];
    bool name_ok = name.kind == PyLiteral::Kind::kStr ||
                   (name.kind == PyLiteral::Kind::kTuple && name.items.size() == 2 &&
                    name.items[0].kind == PyLiteral::Kind::kStr && name.items[1].kind == PyLiteral::Kind::kStr);
    if (!name_ok) fail(name.position, "a field name of a structured descr must be a string or a (title, name) pair");
    std::uint64_t size = descr_itemsize_impl(field.items[1], nullptr, depth + 1);
    if (field.items.size() == 3) size = detail::checked_mul(size, subarray_count(field.items[2]), too_large);
    total = detail::checked_add(total, size, too_large);
  }
  return total;
}

// Positions of every value, from offsets in the parsed (utf-8) text to byte offsets in the file.
template <class ToFile>
void to_file_offsets(PyLiteral& value, const ToFile& to_file) {
  value.position = to_file(value.position);
  for (PyLiteral& item : value.items) to_file_offsets(item, to_file);
}

}  // namespace

std::uint64_t descr_itemsize(const PyLiteral& descr, ScalarType* scalar) {
  return descr_itemsize_impl(descr, scalar, 0);
}

std::uint64_t dtype_str_itemsize(const std::string& typestr, ScalarType* scalar) {
  PyLiteral descr;
  descr.kind = PyLiteral::Kind::kStr;
  descr.str = typestr;
  return descr_itemsize(descr, scalar);
}

std::uint64_t npy_header_end(std::span<const std::byte> prefix, std::size_t max_header_size) {
  Preamble p = read_preamble(prefix, max_header_size);
  return p.size + p.text_len;
}

NpyHeader parse_npy_header(std::span<const std::byte> bytes, std::size_t max_header_size) {
  Preamble p = read_preamble(bytes, max_header_size);
  const std::uint64_t end = p.size + p.text_len;
  if (bytes.size() < end) {
    fail(bytes.size(), "header is truncated: it announces " + std::to_string(p.text_len) +
                           " bytes of header text, the file ends first");
  }
  std::string_view raw(reinterpret_cast<const char*>(bytes.data()) + p.size, p.text_len);
  if (std::memchr(raw.data(), '\0', raw.size()) != nullptr) {
    fail(p.size + static_cast<std::uint64_t>(static_cast<const char*>(std::memchr(raw.data(), '\0', raw.size())) -
                                             raw.data()),
         "NUL byte in header text");
  }
  std::string text;
  if (p.major == 3) {
    std::int64_t chars = detail::utf8_length(raw);
    if (chars < 0) fail(p.size, "header text of a version 3.0 file is not valid utf-8");
    if (static_cast<std::uint64_t>(chars) > max_header_size) {
      fail(8, "header length " + std::to_string(chars) + " exceeds the limit of " + std::to_string(max_header_size) +
                  " characters (raise max_header_size if you trust this file)");
    }
    text.assign(raw);
  } else {
    text = latin1_to_utf8(raw);
  }

  // Offsets in the parsed text -> offsets in the file: a latin-1 byte >= 0x80 became two bytes of utf-8.
  std::vector<std::uint32_t> raw_of;
  if (text.size() != raw.size()) {
    raw_of.reserve(text.size() + 1);
    for (std::size_t j = 0; j < raw.size(); ++j) {
      raw_of.push_back(static_cast<std::uint32_t>(j));
      if (static_cast<unsigned char>(raw[j]) >= 0x80) raw_of.push_back(static_cast<std::uint32_t>(j));
    }
    raw_of.push_back(static_cast<std::uint32_t>(raw.size()));
  }
  auto to_file = [&](std::size_t text_pos) -> std::uint64_t {
    if (text_pos > text.size()) text_pos = text.size();
    return p.size + (raw_of.empty() ? text_pos : raw_of[text_pos]);
  };

  PyLiteral dict;
  try {
    dict = detail::parse_py_literal(text, /*allow_long_suffix=*/p.major < 3);
  } catch (const detail::PyLiteralError& e) {
    fail(to_file(e.position), "cannot parse header: " + e.reason);
  }
  to_file_offsets(dict, to_file);
  if (dict.kind != PyLiteral::Kind::kDict) fail(dict.position, "header is not a dictionary");
  const PyLiteral* descr = dict_get(dict, "descr");
  const PyLiteral* fortran = dict_get(dict, "fortran_order");
  const PyLiteral* shape = dict_get(dict, "shape");
  if (descr == nullptr || fortran == nullptr || shape == nullptr || dict.items.size() != 6) {
    fail(dict.position, "header does not contain exactly the keys 'descr', 'fortran_order' and 'shape'");
  }
  if (fortran->kind != PyLiteral::Kind::kBool) fail(fortran->position, "'fortran_order' is not a bool");
  if (shape->kind != PyLiteral::Kind::kTuple) fail(shape->position, "'shape' is not a tuple of integers");

  NpyHeader h;
  h.major_version = p.major;
  h.minor_version = p.minor;
  h.fortran_order = fortran->boolean;
  h.data_offset = end;
  auto too_big = [&] { fail(shape->position, "array too large: prod(shape) * itemsize overflows 64 bits"); };
  std::uint64_t count = 1;
  bool zero = false;
  for (const PyLiteral& d : shape->items) {
    // Not bools: np.load accepts them in the header, then reshape refuses them.
    if (d.kind != PyLiteral::Kind::kInt) fail(d.position, "'shape' is not a tuple of integers");
    if (d.as_int() < 0) fail(d.position, "negative dimension " + std::to_string(d.as_int()) + " in shape");
    h.shape.push_back(d.as_int());
    if (d.as_int() == 0)
      zero = true;
    else
      count = detail::checked_mul(count, static_cast<std::uint64_t>(d.as_int()), too_big);
  }
  if (h.shape.size() > 64) fail(shape->position, "too many dimensions (numpy allows 64)");
  h.count = zero ? 0 : count;

  // A (descr, shape) subarray as the whole descr: numpy reads prod(shape) base elements per array element,
  // then reshapes them to the header's shape, which works only when prod(shape) is 1 or the array is empty,
  // and gives an array of the base dtype. numpy never writes such a header.
  const PyLiteral* base = descr;
  std::uint64_t per_element = 1;
  for (int depth = 0; base->kind == PyLiteral::Kind::kTuple; ++depth) {
    if (depth > kMaxDescrDepth) fail(base->position, "dtype descr nested too deeply");
    check_subarray(*base);
    per_element = detail::checked_mul(per_element, subarray_count(base->items[1]),
                                      [&] { fail(base->position, "subarray shape in descr too large"); });
    base = &base->items[0];
  }
  h.itemsize = descr_itemsize_impl(*base, &h.scalar, 0);
  if (per_element != 1 && h.count != 0) {
    fail(descr->position, "the descr is a subarray of " + std::to_string(per_element) +
                              " elements: np.load cannot give it the shape in the header");
  }
  if (base->kind == PyLiteral::Kind::kStr) h.descr_text = base->str;
  h.descr = *base;
  // numpy itself refuses arrays whose byte size does not fit in a signed 64-bit integer.
  std::uint64_t nbytes = detail::checked_mul(count, h.itemsize, too_big);
  if (nbytes > static_cast<std::uint64_t>(INT64_MAX)) too_big();
  h.nbytes = zero ? 0 : nbytes;
  return h;
}

}  // namespace npyfeed
