#include "npyfeed/gather/transform.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/gather/convert.hpp"
#include "npyfeed/gather/cpu_features.hpp"
#include "npyfeed/gather/stream_copy.hpp"

namespace npyfeed {

namespace {

// kDivide: normalise by dividing by std, where a reciprocal 1/std would be subnormal (else multiplied by it).
// kStreamed: the rows written past the caches (finish_streamed).
enum : unsigned { kNan = 1, kPosinf = 2, kNeginf = 4, kNormalize = 8, kDivide = 16, kStreamed = 32 };

// Shortest text that reads back as `v` (as Python's repr of a float).
std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string shape_text(const std::vector<std::int64_t>& s) {  // as Python prints a tuple
  std::string t = "(";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + (s.size() == 1 ? ",)" : ")");
}

std::uint64_t elems_of(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (std::int64_t d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

// `values` of `shape` broadcast (numpy's rules, the row's shape unchanged) to a row of `row_shape`, flattened.
std::vector<double> broadcast_to_row(const std::vector<double>& values, const std::vector<std::int64_t>& shape,
                                     const std::vector<std::int64_t>& row_shape, const std::string& what) {
  const std::size_t nd = row_shape.size();
  bool fits = shape.size() <= nd && values.size() == elems_of(shape);
  for (std::size_t k = 0; fits && k < shape.size(); ++k) {
    const std::int64_t d = shape[shape.size() - 1 - k];
    fits = d == 1 || d == row_shape[nd - 1 - k];
  }
  if (!fits) {
    throw InvalidArgument("normalize: " + what + " of shape " + shape_text(shape) +
                          " does not broadcast to the rows of shape " + shape_text(row_shape) +
                          " (one value per selected feature, or a shape numpy broadcasts to the row)");
  }
  const std::uint64_t n = elems_of(row_shape);
  std::vector<double> out(n);
  std::vector<std::int64_t> at(nd, 0);  // multi-index of element e of the row
  for (std::uint64_t e = 0; e < n; ++e) {
    std::uint64_t flat = 0;
    for (std::size_t k = 0; k < shape.size(); ++k) {
      const std::int64_t d = shape[k];
      const std::int64_t i = d == 1 ? 0 : at[nd - shape.size() + k];
      flat = flat * static_cast<std::uint64_t>(d) + static_cast<std::uint64_t>(i);
    }
    out[e] = values[flat];
    for (std::size_t k = nd; k-- > 0;) {
      if (++at[k] < row_shape[k]) break;
      at[k] = 0;
    }
  }
  return out;
}

template <class Out>
struct FinishArgs {
  Out nan, posinf, neginf;
  const Out* mean;
  const Out* std;
  std::uint64_t elems;                      // per row
  const std::byte* prefetch_end = nullptr;  // streamed: the source fetched ahead up to here (nullptr: not at all)
};

// One element finished: its NaN and infinities replaced, then normalised (`scale`: 1/std, or std under kDivide).
// The loops below apply it element by element, or in vector registers to the same effect.
template <class Out, unsigned F>
[[gnu::always_inline]] inline Out finish_value(Out v, std::uint64_t j, Out nan, Out posinf, Out neginf, const Out* mean,
                                               const Out* scale) {
  [[maybe_unused]] constexpr Out kInf = std::numeric_limits<Out>::infinity();  // unused by some kernels
  if constexpr ((F & kNan) != 0) v = v != v ? nan : v;
  if constexpr ((F & kPosinf) != 0) v = v == kInf ? posinf : v;
  if constexpr ((F & kNeginf) != 0) v = v == -kInf ? neginf : v;
  if constexpr ((F & kNormalize) != 0 && (F & kDivide) != 0) v = (v - mean[j]) / scale[j];
  if constexpr ((F & kNormalize) != 0 && (F & kDivide) == 0) v = (v - mean[j]) * scale[j];
  return v;
}

// One branch-free loop per combination of options, so each vectorises on its own; from `src` (rows already in
// the output type: the source's own elements, or `dst` itself) to `dst`, so that a source stored as the output
// wants it is read once, not copied and then passed over again.
// The arguments are copied into locals first: the stores could otherwise alias them, and reloading them for every
// element keeps the loop scalar.
// Normalisation multiplies by 1/std (rounded once to Out): within an ulp of numpy's division, and several times
// cheaper. Replacement tests one block of elements for any NaN or infinity first (all exponent bits set: one AND
// and one compare per element, fused with the copy where nothing else changes the values) and replaces only in
// blocks that hold one: data is mostly finite, and the three selects would cost more than the copy.
template <class Out, unsigned F, bool kStream>
[[gnu::always_inline]] inline void finish_body(const FinishArgs<Out>& a, const Out* src, Out* dst, std::uint64_t rows) {
  using Bits = std::conditional_t<sizeof(Out) == 4, std::uint32_t, std::uint64_t>;
  constexpr Bits kExponent = static_cast<Bits>(sizeof(Out) == 4 ? 0x7F800000ull : 0x7FF0000000000000ull);
  constexpr std::uint64_t kBlock = 256;
  constexpr bool kReplace = (F & (kNan | kPosinf | kNeginf)) != 0;
  const Out nan = a.nan, posinf = a.posinf, neginf = a.neginf;
  const Out* const mean = a.mean;
  const Out* const scale = a.std;  // 1/std, or std under kDivide
  const std::uint64_t n = a.elems;
  auto finished = [&](Out v, std::uint64_t j) { return finish_value<Out, F>(v, j, nan, posinf, neginf, mean, scale); };
  auto normalized = [&](Out v, std::uint64_t j) {  // a value known to be finite
    return finish_value<Out, F & ~(kNan | kPosinf | kNeginf)>(v, j, nan, posinf, neginf, mean, scale);
  };
  auto special = [&](Out v) {
    Bits bits;
    std::memcpy(&bits, &v, sizeof bits);
    return (bits & kExponent) == kExponent ? Bits{1} : Bits{0};
  };
  // Streamed: each block computed into `buffer` (in L1) and written past the caches, the source read ahead
  // with a non-temporal prefetch, as the plain gather's streaming_copy does.
  alignas(64) Out buffer[kStream ? kBlock : 1];
  for (std::uint64_t r = 0; r < rows; ++r) {
    const Out* in = src + r * n;
    for (std::uint64_t j0 = 0; j0 < n; j0 += kBlock) {
      const std::uint64_t end = std::min(n, j0 + kBlock);
      Out* const out = kStream ? buffer : dst + r * n + j0;  // element j at out[j - j0]
      if (kStream && a.prefetch_end != nullptr) {
        const auto* block = reinterpret_cast<const std::byte*>(in + j0) + detail::kSourcePrefetchBytes;
        detail::prefetch_once(block, std::min(block + (end - j0) * sizeof(Out), a.prefetch_end));
      }
      // Element j of the block at from[j - j0] and to[j - j0]. In place (`src` is `dst`, not streamed), both are
      // one pointer, so that the compiler sees each element read before it is written: given two pointers, clang
      // checks at run time that the ranges do not overlap, finds that they do, and runs its scalar loop.
      auto finish_block = [&](const Out* from, Out* to) __attribute__((always_inline)) {
        if constexpr (kReplace) {
          Bits any = 0;
          if constexpr ((F & kNormalize) == 0) {
            // Copied while testing (in place, the same values are written back): a block without NaN or inf is
            // done.
            for (std::uint64_t j = j0; j < end; ++j) {
              const Out v = from[j - j0];
              any |= special(v);
              to[j - j0] = v;
            }
            if (any == 0) return;
          } else {
            for (std::uint64_t j = j0; j < end; ++j) any |= special(from[j - j0]);
          }
          if (any != 0) {
            for (std::uint64_t j = j0; j < end; ++j) to[j - j0] = finished(from[j - j0], j);
            return;
          }
        }
        for (std::uint64_t j = j0; j < end; ++j) to[j - j0] = normalized(from[j - j0], j);
      };
      if (!kStream && in == dst + r * n) {
        Out* const io = dst + r * n + j0;
        finish_block(io, io);
      } else {
        finish_block(in + j0, out);
      }
      if constexpr (kStream) {
        detail::stream_unfenced(reinterpret_cast<std::byte*>(dst + r * n + j0),
                                reinterpret_cast<const std::byte*>(buffer), (end - j0) * sizeof(Out));
      }
    }
  }
}

// The loops compiled twice: for the baseline ISA and, on x86-64, for AVX2 (twice the lanes: the difference between
// a pass that costs half the copy and one that hides under it), chosen once at run time.
template <class Out, unsigned F>
void finish_rows(const FinishArgs<Out>& a, const Out* src, Out* dst, std::uint64_t rows) {
  finish_body<Out, F & ~kStreamed, (F & kStreamed) != 0>(a, src, dst, rows);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define NPYFEED_HAVE_AVX2_KERNELS 1
template <class Out, unsigned F>
[[gnu::target("avx2")]] void finish_rows_avx2(const FinishArgs<Out>& a, const Out* src, Out* dst, std::uint64_t rows) {
  finish_body<Out, F & ~kStreamed, (F & kStreamed) != 0>(a, src, dst, rows);
}
#endif

#if NPYFEED_HAVE_AVX2_KERNELS && NPYFEED_STREAMING_STORES
#define NPYFEED_HAVE_AVX512_KERNELS 1
// The streamed loops again with AVX-512 (x86-64 CPUs that have it, where the kernel saves its registers), written
// by hand: each line of the source loaded into a register, its NaNs and infinities replaced by masked moves and
// normalised there, and streamed to the batch whole from the register, as the plain gather's streaming_copy does.
// finish_body's block in L1 costs a store and a load more a line and four 16-byte streaming stores in place of
// one; no block test either: a line's replacements cost fewer instructions than a branch on them.
template <class Out>
struct Lanes;
template <>
struct Lanes<float> {
  using V = __m512;
  static constexpr std::size_t kCount = 16;
  [[gnu::target("avx512f")]] static V load(const float* p) { return _mm512_loadu_ps(p); }
  [[gnu::target("avx512f")]] static V splat(float v) { return _mm512_set1_ps(v); }
  [[gnu::target("avx512f")]] static __mmask16 unordered(V v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); }
  [[gnu::target("avx512f")]] static __mmask16 equal(V v, V w) { return _mm512_cmp_ps_mask(v, w, _CMP_EQ_OQ); }
  [[gnu::target("avx512f")]] static V blend(V v, __mmask16 m, V w) { return _mm512_mask_mov_ps(v, m, w); }
  [[gnu::target("avx512f")]] static V sub(V v, V w) { return _mm512_sub_ps(v, w); }
  [[gnu::target("avx512f")]] static V mul(V v, V w) { return _mm512_mul_ps(v, w); }
  [[gnu::target("avx512f")]] static V div(V v, V w) { return _mm512_div_ps(v, w); }
  [[gnu::target("avx512f")]] static void stream(float* p, V v) { _mm512_stream_ps(p, v); }
};
template <>
struct Lanes<double> {
  using V = __m512d;
  static constexpr std::size_t kCount = 8;
  [[gnu::target("avx512f")]] static V load(const double* p) { return _mm512_loadu_pd(p); }
  [[gnu::target("avx512f")]] static V splat(double v) { return _mm512_set1_pd(v); }
  [[gnu::target("avx512f")]] static __mmask8 unordered(V v) { return _mm512_cmp_pd_mask(v, v, _CMP_UNORD_Q); }
  [[gnu::target("avx512f")]] static __mmask8 equal(V v, V w) { return _mm512_cmp_pd_mask(v, w, _CMP_EQ_OQ); }
  [[gnu::target("avx512f")]] static V blend(V v, __mmask8 m, V w) { return _mm512_mask_mov_pd(v, m, w); }
  [[gnu::target("avx512f")]] static V sub(V v, V w) { return _mm512_sub_pd(v, w); }
  [[gnu::target("avx512f")]] static V mul(V v, V w) { return _mm512_mul_pd(v, w); }
  [[gnu::target("avx512f")]] static V div(V v, V w) { return _mm512_div_pd(v, w); }
  [[gnu::target("avx512f")]] static void stream(double* p, V v) { _mm512_stream_pd(p, v); }
};

template <class Out, unsigned F>
[[gnu::target("avx512f")]] void finish_streamed_avx512(const FinishArgs<Out>& a, const Out* src, Out* dst,
                                                       std::uint64_t rows) {
  using L = Lanes<Out>;
  constexpr Out kInf = std::numeric_limits<Out>::infinity();
  constexpr bool kNormal = (F & kNormalize) != 0;
  const Out nan = a.nan, posinf = a.posinf, neginf = a.neginf;
  const Out* const mean = a.mean;
  const Out* const scale = a.std;
  const auto* const prefetch_end = a.prefetch_end;
  const typename L::V vnan = L::splat(nan), vposinf = L::splat(posinf), vneginf = L::splat(neginf);
  const typename L::V vinf = L::splat(kInf), vminf = L::splat(-kInf);
  // Without normalisation an element's result does not depend on its column: the rows are one run.
  const std::uint64_t n = kNormal ? a.elems : a.elems * rows;
  const std::uint64_t runs = kNormal ? rows : 1;
  auto one = [&](Out v, std::uint64_t j) { return finish_value<Out, F>(v, j, nan, posinf, neginf, mean, scale); };
  for (std::uint64_t r = 0; r < runs; ++r) {
    const Out* in = src + r * n;
    Out* out = dst + r * n;
    // Elements up to the first 64-byte line of the destination and after its last one stored as usual.
    const std::uint64_t head = std::min<std::uint64_t>(n, detail::bytes_to_boundary(out, 64) / sizeof(Out));
    const std::uint64_t body_end = head + (n - head) / L::kCount * L::kCount;
    for (std::uint64_t j = 0; j < head; ++j) out[j] = one(in[j], j);
    for (std::uint64_t j = head; j < body_end; j += L::kCount) {
      if (prefetch_end != nullptr) {
        const auto* ahead = reinterpret_cast<const std::byte*>(in + j) + detail::kSourcePrefetchBytes;
        if (ahead < prefetch_end) _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_NTA);
      }
      typename L::V v = L::load(in + j);
      if constexpr ((F & kNan) != 0) v = L::blend(v, L::unordered(v), vnan);
      if constexpr ((F & kPosinf) != 0) v = L::blend(v, L::equal(v, vinf), vposinf);
      if constexpr ((F & kNeginf) != 0) v = L::blend(v, L::equal(v, vminf), vneginf);
      if constexpr (kNormal && (F & kDivide) != 0) v = L::div(L::sub(v, L::load(mean + j)), L::load(scale + j));
      if constexpr (kNormal && (F & kDivide) == 0) v = L::mul(L::sub(v, L::load(mean + j)), L::load(scale + j));
      L::stream(out + j, v);
    }
    for (std::uint64_t j = body_end; j < n; ++j) out[j] = one(in[j], j);
  }
}

#endif

template <class Out>
using FinishFn = void (*)(const FinishArgs<Out>&, const Out*, Out*, std::uint64_t);

template <class Out, unsigned F>
FinishFn<Out> finish_kernel() {
#ifdef NPYFEED_HAVE_AVX512_KERNELS
  if constexpr ((F & kStreamed) != 0) {
    if (detail::use_avx512()) return &finish_streamed_avx512<Out, F & ~kStreamed>;
  }
#endif
#ifdef NPYFEED_HAVE_AVX2_KERNELS
  if (detail::cpu_features().avx2) return &finish_rows_avx2<Out, F>;
#endif
  return &finish_rows<Out, F>;
}

template <class Out, std::size_t... I>
std::array<FinishFn<Out>, sizeof...(I)> finish_table(std::index_sequence<I...>) {
  return {finish_kernel<Out, I>()...};
}

}  // namespace

std::vector<std::int64_t> ColumnSpec::resolve(std::uint64_t length, const std::string& argument) const {
  const auto n = static_cast<std::int64_t>(length);
  std::vector<std::int64_t> out;
  switch (kind) {
    case Kind::kAll:
      out.resize(length);
      for (std::int64_t c = 0; c < n; ++c) out[static_cast<std::size_t>(c)] = c;
      return out;
    case Kind::kList:
      out.reserve(list.size());
      for (std::size_t i = 0; i < list.size(); ++i) {
        const std::int64_t c = list[i];
        if (c < -n || c >= n) {
          throw InvalidArgument(argument + ": column " + std::to_string(c) + " (position " + std::to_string(i) +
                                ") is out of range for rows of " + std::to_string(n) + " columns");
        }
        out.push_back(c < 0 ? c + n : c);
      }
      break;
    case Kind::kSlice: {
      // Python's slice.indices(length).
      const std::int64_t s = step.value_or(1);
      if (s == 0) throw InvalidArgument(argument + ": slice step cannot be zero");
      const std::int64_t lower = s > 0 ? 0 : -1;
      const std::int64_t upper = s > 0 ? n : n - 1;
      auto clamp = [&](std::optional<std::int64_t> v, std::int64_t none) {
        if (!v) return none;
        std::int64_t x = *v;
        if (x < 0) {
          x = x < -n ? lower : x + n;
          return std::max(x, lower);
        }
        return std::min(x, upper);
      };
      const std::int64_t first = clamp(start, s > 0 ? lower : upper);
      const std::int64_t last = clamp(stop, s > 0 ? upper : lower);
      for (std::int64_t c = first; s > 0 ? c < last : c > last; c += s) out.push_back(c);
      if (out.empty()) {
        auto part = [](std::optional<std::int64_t> v) { return v ? std::to_string(*v) : std::string("None"); };
        throw InvalidArgument(argument + ": slice(" + part(start) + ", " + part(stop) + ", " + part(step) +
                              ") selects no columns of rows of " + std::to_string(n) + " columns");
      }
      return out;
    }
  }
  if (out.empty()) throw InvalidArgument(argument + ": selects no columns (give at least one)");
  return out;
}

RowTransform::RowTransform(std::uint64_t src_elems, std::vector<std::int64_t> columns, bool select,
                           const TransformOptions& o, std::vector<double> mean, std::vector<double> std)
    : src_elems_(src_elems), out_elems_(select ? columns.size() : src_elems), select_(select) {
  for (std::size_t j = 0; select_ && j < columns.size(); ++j) {
    const auto c = static_cast<std::uint64_t>(columns[j]);
    if (!runs_.empty() && runs_.back().src + runs_.back().len == c && runs_.back().dst + runs_.back().len == j) {
      ++runs_.back().len;
    } else {
      runs_.push_back({c, j, 1});
    }
    needed_.push_back(c);
  }
  std::sort(needed_.begin(), needed_.end());
  needed_.erase(std::unique(needed_.begin(), needed_.end()), needed_.end());
  // Many short runs (a scattered list): one index per output column instead, a loop the compiler can vectorise.
  if (select_ && runs_.size() * 4 > out_elems_ && src_elems_ <= UINT32_MAX) {
    gather_.assign(columns.begin(), columns.end());
  }
  if (o.nan) flags_ |= kNan, nan_ = *o.nan;
  if (o.posinf) flags_ |= kPosinf, posinf_ = *o.posinf;
  if (o.neginf) flags_ |= kNeginf, neginf_ = *o.neginf;
  if (!mean.empty()) {
    flags_ |= kNormalize;
    // Per output dtype: the mean, and 1/std rounded once from the std in that dtype; the std itself where any
    // reciprocal would be subnormal (a std above ~1e38 as a float32), so that no precision is lost.
    mean32_.assign(mean.begin(), mean.end());
    mean64_ = std::move(mean);
    for (const double sd : std) {
      const auto s32 = static_cast<float>(sd);
      scale32_.push_back(1.0f / s32);
      scale64_.push_back(1.0 / sd);
      divide32_ = divide32_ || !std::isnormal(scale32_.back());
      divide64_ = divide64_ || !std::isnormal(scale64_.back());
    }
    if (divide32_) scale32_.assign(std.begin(), std.end());
    if (divide64_) scale64_ = std::move(std);
  }
}

template <class Out>
void RowTransform::finish(Out* dst, std::uint64_t rows) const {
  finish_from(dst, dst, rows);
}

template <class Out>
void RowTransform::finish_from(const Out* src, Out* dst, std::uint64_t rows) const {
  finish_rows_from(src, dst, rows, false, nullptr);
}

template <class Out>
void RowTransform::finish_streamed(const Out* src, Out* dst, std::uint64_t rows, detail::SourceReuse reuse) const {
  // Rows read again soon go through the caches (no non-temporal prefetch): as detail::streaming_copy.
  const auto* end = reinterpret_cast<const std::byte*>(src + rows * out_elems_);
  finish_rows_from(src, dst, rows, true, reuse == detail::SourceReuse::kOnce ? end : nullptr);
  detail::stream_fence();
}

template <class Out>
void RowTransform::finish_rows_from(const Out* src, Out* dst, std::uint64_t rows, bool streamed,
                                    const std::byte* prefetch_end) const {
  if (flags_ == 0) return;
  static const auto table = finish_table<Out>(std::make_index_sequence<64>());
  FinishArgs<Out> a{
      static_cast<Out>(nan_), static_cast<Out>(posinf_), static_cast<Out>(neginf_), nullptr, nullptr, out_elems_};
  unsigned flags = flags_;
  if constexpr (sizeof(Out) == 4) {
    a.mean = mean32_.data();
    a.std = scale32_.data();
    if (divide32_) flags |= kDivide;
  } else {
    a.mean = mean64_.data();
    a.std = scale64_.data();
    if (divide64_) flags |= kDivide;
  }
  if (streamed) flags |= kStreamed;
  a.prefetch_end = prefetch_end;
  table[flags](a, src, dst, rows);
}

template <class Out>
void RowTransform::apply(const std::byte* src, const ScalarType& type, std::uint64_t rows, Out* dst,
                         detail::SourceReuse reuse) const {
  const bool native = type.kind == 'f' && type.size == sizeof(Out) && !type.swapped &&
                      reinterpret_cast<std::uintptr_t>(src) % alignof(Out) == 0;
  if (!select_) {
    if (flags_ == 0) return detail::convert(src, type, rows * src_elems_, dst);    // the plain gather, unchanged
    if (native) return finish_from(reinterpret_cast<const Out*>(src), dst, rows);  // one pass, source to batch
    // Converted a few rows at a time, each finished while it is still in cache.
    const std::uint64_t chunk = std::max<std::uint64_t>(1, 4096 / std::max<std::uint64_t>(src_elems_, 1));
    for (std::uint64_t r = 0; r < rows; r += chunk) {
      const std::uint64_t n = std::min(chunk, rows - r);
      Out* d = dst + r * src_elems_;
      detail::convert(src + r * src_elems_ * type.size, type, n * src_elems_, d);
      finish(d, n);
    }
    return;
  }
  // A selection: row by row, finished a few rows at a time while they are still in cache (one call per row
  // would cost more than the pass itself over rows this short).
  const std::uint64_t isz = type.size;
  const std::uint64_t row_bytes = src_elems_ * isz;
  const bool gather = !gather_.empty() && native;
  const std::uint32_t* cols = gather_.data();
  const std::uint64_t chunk = std::max<std::uint64_t>(1, 4096 / std::max<std::uint64_t>(out_elems_, 1));
  // Rows read once: the columns read of the next row fetched ahead with a non-temporal hint (as the plain copy's
  // detail::streaming_copy; every 4th column: 1.1x the rate), not where the next copy reads them again. Two
  // loops: with the prefetch only a branch away, the loop without it ran 20% slower.
  const std::uint64_t first_needed = needed_.front() * isz;
  const std::uint64_t end_needed = (needed_.back() + 1) * isz;
  // Everything the loops read copied into locals: a store to `d` could otherwise alias them (the members, the
  // captured variables), reloaded for every element (a selection of every 4th column ran 8% slower).
  const std::uint64_t out_elems = out_elems_;
  auto select = [=, this](auto ahead) {
    for (std::uint64_t r0 = 0; r0 < rows; r0 += chunk) {
      const std::uint64_t r1 = std::min(rows, r0 + chunk);
      for (std::uint64_t r = r0; r < r1; ++r) {
        const std::byte* s = src + r * row_bytes;
        Out* d = dst + r * out_elems;
        if (ahead && r + 1 < rows) detail::prefetch_once(s + row_bytes + first_needed, s + row_bytes + end_needed);
        if (gather) {
          const Out* in = reinterpret_cast<const Out*>(s);
          for (std::uint64_t j = 0; j < out_elems; ++j) d[j] = in[cols[j]];
        } else {
          for (const ColumnRun& run : runs_) detail::convert(s + run.src * isz, type, run.len, d + run.dst);
        }
      }
      finish(dst + r0 * out_elems, r1 - r0);
    }
  };
  if (reuse == detail::SourceReuse::kOnce) {
    select(std::true_type{});
  } else {
    select(std::false_type{});
  }
}

template void RowTransform::apply<float>(const std::byte*, const ScalarType&, std::uint64_t, float*,
                                         detail::SourceReuse) const;
template void RowTransform::apply<double>(const std::byte*, const ScalarType&, std::uint64_t, double*,
                                          detail::SourceReuse) const;
template void RowTransform::finish<float>(float*, std::uint64_t) const;
template void RowTransform::finish<double>(double*, std::uint64_t) const;
template void RowTransform::finish_from<float>(const float*, float*, std::uint64_t) const;
template void RowTransform::finish_from<double>(const double*, double*, std::uint64_t) const;
template void RowTransform::finish_streamed<float>(const float*, float*, std::uint64_t, detail::SourceReuse) const;
template void RowTransform::finish_streamed<double>(const double*, double*, std::uint64_t, detail::SourceReuse) const;

GatherTransform::GatherTransform(const TransformOptions& o, const std::vector<std::int64_t>& x_row_shape,
                                 const std::vector<std::int64_t>& y_row_shape, std::uint32_t out_size) {
  const std::uint64_t x_elems = elems_of(x_row_shape);
  const std::uint64_t y_elems = elems_of(y_row_shape);
  const bool select_x = o.features.kind != ColumnSpec::Kind::kAll;
  const bool select_y = o.label_columns.kind != ColumnSpec::Kind::kAll;
  std::vector<std::int64_t> x_cols, y_cols;
  if (select_x) x_cols = o.features.resolve(x_elems, "features");
  if (select_y) y_cols = o.label_columns.resolve(y_elems, "label_columns");
  x_shape_ = select_x ? std::vector<std::int64_t>{static_cast<std::int64_t>(x_cols.size())} : x_row_shape;
  y_shape_ = select_y ? std::vector<std::int64_t>{static_cast<std::int64_t>(y_cols.size())} : y_row_shape;

  std::vector<double> mean, std;
  if (o.normalize) {
    mean = broadcast_to_row(o.mean, o.mean_shape, x_shape_, "mean");
    std = broadcast_to_row(o.std, o.std_shape, x_shape_, "std");
    // Finite in the output dtype too (1e300 is infinite as a float32, and 1e-50 a zero std).
    auto finite_out = [&](double v) { return out_size == 4 ? std::isfinite(static_cast<float>(v)) : std::isfinite(v); };
    const std::string as_out = out_size == 4 ? " as a float32" : "";
    for (std::size_t i = 0; i < o.mean.size(); ++i) {
      if (!finite_out(o.mean[i])) {
        throw InvalidArgument("normalize: mean[" + std::to_string(i) + "] is " + number_text(o.mean[i]) +
                              " (the mean must be finite" + as_out + ")");
      }
    }
    for (std::size_t i = 0; i < o.std.size(); ++i) {
      const double s = o.std[i];
      if (!finite_out(s) || !(out_size == 4 ? static_cast<float>(s) > 0 : s > 0)) {
        throw InvalidArgument("normalize: std[" + std::to_string(i) + "] is " + number_text(s) +
                              " (the std must be positive and finite" + as_out + ")");
      }
    }
  }
  x_ = RowTransform(x_elems, std::move(x_cols), select_x, o, std::move(mean), std::move(std));
  y_ = RowTransform(y_elems, std::move(y_cols), select_y, o, {}, {});
}

}  // namespace npyfeed
