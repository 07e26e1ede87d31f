// Index files: one sample per line, "feature_index,label_index,key". Blank lines and spaces around
// fields are tolerated; anything else malformed is an error naming the file and line.
//
// A SampleIndex is compact: 12 bytes per sample (int32 feature row, int32 label row, uint32 key id), in
// memory or in a mapped cache file (index_cache.hpp) that every process on a node shares. Rows that do not
// fit in an int32 (any int64 is accepted) are kept in a short side table. Line numbers are not stored: a
// message recomputes them from the text, starting at the nearest checkpoint (one per ~1 MiB of text).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace npyfeed {

/// A row that does not fit the int32 column: sample id and its value (sorted by id).
struct WideValue {
  std::uint64_t sample;
  std::int64_t value;
};

/// Where the text of samples [sample, next checkpoint's sample) starts: byte offset and 1-based line of its
/// first line in index file `source`.
struct IndexCheckpoint {
  std::uint64_t sample;
  std::uint64_t offset;
  std::uint64_t line;
  std::uint64_t source;
};

/// The columns of an index, wherever they live (owned arrays or a mapped cache file kept alive by `owner`).
struct IndexColumns {
  std::shared_ptr<const void> owner;
  std::span<const std::int32_t> feature;  // kWide: look the value up in wide_feature
  std::span<const std::int32_t> label;
  std::span<const std::uint32_t> key;
  std::span<const WideValue> wide_feature;
  std::span<const WideValue> wide_label;
  std::span<const IndexCheckpoint> checkpoints;  // for samples from index files (compiled text)
};

class SampleIndex {
 public:
  /// The int32 value that means "see the side table".
  static constexpr std::int32_t kWide = INT32_MIN;

  std::vector<std::string> keys;     // distinct keys, in order of first appearance
  std::vector<std::string> sources;  // index file names (or "<list>")

  SampleIndex() = default;
  /// An index over `columns`; `source_begin[s]` is the first sample of source s, `text_sources[s]` whether
  /// source s is an index file (line numbers recomputed from its text) or a list (line = position + 1).
  SampleIndex(std::vector<std::string> keys, std::vector<std::string> sources, std::vector<std::uint64_t> source_begin,
              std::vector<bool> text_sources, IndexColumns columns);

  std::size_t size() const noexcept { return columns_.key.size(); }  // samples after finish()
  std::int64_t feature(std::size_t i) const { return value(columns_.feature, columns_.wide_feature, i); }
  std::int64_t label(std::size_t i) const { return value(columns_.label, columns_.wide_label, i); }
  std::uint32_t key(std::size_t i) const { return columns_.key[i]; }
  const IndexColumns& columns() const noexcept { return columns_; }
  std::span<const std::uint64_t> source_begin() const noexcept { return source_begin_; }
  const std::vector<bool>& text_sources() const noexcept { return text_sources_; }

  /// Adds one sample from a list (line = position in its source + 1); call finish() when done. Throws
  /// InvalidArgument for a key that cannot name a file. For building small indexes (lists, tests).
  void add(std::int64_t feature, std::int64_t label, std::string_view key, std::uint32_t source_id,
           std::uint64_t line_no);
  /// Makes the samples added so far readable (compacts them into columns).
  void finish();
  /// "file:line" of sample i, for messages (reads the index file from a checkpoint for compiled text).
  std::string where(std::size_t i) const;
  /// Bytes per sample held in this process's own memory (0 for a mapped cache, for tests and benchmarks).
  std::uint64_t private_bytes() const noexcept { return private_bytes_; }
  void set_private_bytes(std::uint64_t bytes) noexcept { private_bytes_ = bytes; }

 private:
  static std::int64_t value(std::span<const std::int32_t> column, std::span<const WideValue> wide, std::size_t i);

  IndexColumns columns_;
  std::vector<std::uint64_t> source_begin_;
  std::vector<bool> text_sources_;
  std::uint64_t private_bytes_ = 0;
  // add(): samples waiting for finish(), and the lines given for them.
  std::vector<std::int64_t> pending_feature_, pending_label_;
  std::vector<std::uint32_t> pending_key_;
  std::vector<std::uint32_t> pending_source_;
  std::vector<std::uint64_t> pending_line_;
  std::shared_ptr<const std::vector<std::uint64_t>> lines_;  // per sample, for indexes built with add()
  std::unordered_map<std::string, std::uint32_t> key_ids_;
};

/// Identity of an index file when it was read: what a cache entry is keyed by.
struct IndexFileIdentity {
  std::string path;  // absolute
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
  std::uint64_t inode = 0;
  std::uint64_t device = 0;
  bool operator==(const IndexFileIdentity&) const = default;
};

/// Stats `path`. Throws OsError (ENOENT for a missing file).
IndexFileIdentity index_file_identity(const std::string& path);

/// A line of an index file that a collecting read (read_index_files with `problems`) left out, or a whole
/// file it left out (line 0: a NUL byte, or more than kMostMalformedLinesPerChunk malformed lines in 1 MiB).
struct IndexLineProblem {
  std::string path;
  std::uint64_t line = 0;  // 1-based
  std::string why;         // what read_index_files would throw for it, without "path:line: "
};

/// What a collecting read left out: the first `limit` malformed lines in file and line order and every file left
/// out whole (line 0), and how many problems in all.
struct IndexProblems {
  std::size_t limit = 1000;
  std::vector<IndexLineProblem> listed;
  std::uint64_t total = 0;
};

/// Malformed lines in one 1 MiB chunk beyond which a collecting read leaves the whole file out.
inline constexpr std::size_t kMostMalformedLinesPerChunk = 10000;

/// Reads and parses index files in order, in parallel chunks split at newlines, on up to `threads` threads.
/// Throws OsError / InvalidArgument (the first malformed line, naming file and line). With `problems`, malformed
/// lines (and files that are not text) are left out and listed there instead (for checking an index: where()
/// still names the right lines); an OsError (a file that cannot be read) is still thrown.
SampleIndex read_index_files(const std::vector<std::string>& paths, std::size_t threads = 1,
                             IndexProblems* problems = nullptr);

/// An index from columns in memory (a list of (feature_index, label_index, key) tuples), named `name` in
/// messages; entry i is "line" i + 1. Throws InvalidArgument for columns of different lengths.
SampleIndex index_from_columns(std::span<const std::int64_t> feature, std::span<const std::int64_t> label,
                               const std::vector<std::string>& keys, const std::string& name);

/// An index of `keys` and no lines (a dense source's: its samples are per-key ranges, dense_index.hpp).
SampleIndex keys_only_index(const std::vector<std::string>& keys, const std::string& name);

}  // namespace npyfeed
