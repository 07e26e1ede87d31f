// Overflow-checked arithmetic on sizes. `on_overflow` must not return.
#pragma once

#include <cstdint>

namespace npyfeed::detail {

template <class OnOverflow>
std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, OnOverflow on_overflow) {
  std::uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) on_overflow();
  return r;
}

template <class OnOverflow>
std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, OnOverflow on_overflow) {
  std::uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) on_overflow();
  return r;
}

}  // namespace npyfeed::detail
