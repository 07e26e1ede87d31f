// The `.npy` header: a pure function from bytes to a validated header. No IO, so it can be tested and fuzzed.
// Spec: numpy.lib.format. Magic "\x93NUMPY", version (1|2|3).0, a little-endian header length (2 bytes in
// v1, 4 in v2/v3), then a Python-literal dict with exactly 'descr', 'fortran_order' and 'shape'.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "npyfeed/format/py_literal.hpp"

namespace npyfeed {

/// numpy's default cap on the header text (`max_header_size` in np.load).
inline constexpr std::size_t kDefaultMaxHeaderSize = 10000;
/// Bytes before the header text: magic (6) + version (2) + length (2 or 4).
inline constexpr std::size_t kMaxPreambleSize = 12;

/// A plain numeric element type, as the gather converts it. `kind` is numpy's kind letter:
/// 'b' bool, 'i' signed, 'u' unsigned, 'f' float, 'c' complex, others are not numeric.
struct ScalarType {
  char kind = '\0';
  std::uint32_t size = 0;
  bool swapped = false;  // stored in the non-native byte order
};

struct NpyHeader {
  int major_version = 0;
  int minor_version = 0;
  // The 'descr' value as written (a typestr or a list of fields, whose fields may nest structs and
  // (descr, shape) subarrays); a top-level (descr, shape) that np.load accepts is unwrapped to its base.
  // The `position` of each value in it is its byte offset in the file.
  detail::PyLiteral descr;
  std::string descr_text;  // the typestr when descr is a string, else empty
  ScalarType scalar;       // kind '\0' unless descr is a simple numeric typestr
  std::uint64_t itemsize = 0;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
  std::uint64_t count = 0;        // product of shape
  std::uint64_t data_offset = 0;  // where the array data starts
  std::uint64_t nbytes = 0;       // count * itemsize
};

/// How many bytes `parse_npy_header` needs: the data offset announced by the preamble.
/// `prefix` must hold at least `kMaxPreambleSize` bytes or the whole file if shorter.
/// Throws NpyFormatError (without a path) on a bad magic, version or an over-cap length.
std::uint64_t npy_header_end(std::span<const std::byte> prefix, std::size_t max_header_size = kDefaultMaxHeaderSize);

/// Parses and validates a header from the first bytes of a file (at least `npy_header_end` of them).
/// Never evaluates text; refuses object dtypes; checks `prod(shape) * itemsize` for overflow.
/// It does not know the file size: compare `data_offset + nbytes` with it before reading.
/// Throws NpyFormatError (without a path; use `with_path`) whose offset is the byte where the offending
/// value (a field, a dimension, a typestr) starts in the file.
NpyHeader parse_npy_header(std::span<const std::byte> bytes, std::size_t max_header_size = kDefaultMaxHeaderSize);

/// Itemsize of a descr value (typestr, (descr, shape) subarray or list of fields, nested to any depth).
/// Throws NpyFormatError for what np.load refuses, at the `position` of the offending value.
/// When `scalar` is given and descr is a plain numeric typestr, it is filled in.
std::uint64_t descr_itemsize(const detail::PyLiteral& descr, ScalarType* scalar = nullptr);

/// Itemsize of an array-protocol type string (numpy's dtype.str, e.g. "<f4"), as a header's descr would have
/// it; `scalar` as for descr_itemsize. Throws NpyFormatError for what np.load refuses.
std::uint64_t dtype_str_itemsize(const std::string& typestr, ScalarType* scalar = nullptr);

}  // namespace npyfeed
