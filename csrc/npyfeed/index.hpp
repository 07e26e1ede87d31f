// Index files: one sample per line, "feature_index,label_index,key". Blank lines and spaces around
// fields are tolerated; anything else malformed is an error naming the file and line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace npyfeed {

struct SampleIndex {
  std::vector<std::string> keys;            // distinct keys, in order of first appearance
  std::vector<std::int64_t> feature_index;  // one entry per sample
  std::vector<std::int64_t> label_index;
  std::vector<std::uint32_t> key_id;  // into `keys`
  std::vector<std::uint32_t> source;  // into `sources`
  std::vector<std::uint64_t> line;    // 1-based line in its source
  std::vector<std::string> sources;   // index file names (or "<list>")

  std::size_t size() const noexcept { return feature_index.size(); }
  /// Adds one sample. Throws InvalidArgument for a key that cannot name a file.
  void add(std::int64_t feature, std::int64_t label, std::string_view key, std::uint32_t source_id,
           std::uint64_t line_no);
  /// "file:line" of sample i, for messages.
  std::string where(std::size_t i) const;

 private:
  std::unordered_map<std::string, std::uint32_t> key_ids_;
};

/// Parses the text of one index file into `index`. `name` is used in messages. Throws InvalidArgument.
void parse_index_text(std::string_view text, const std::string& name, SampleIndex& index);

/// Reads and parses index files in order. Throws OsError / InvalidArgument.
SampleIndex read_index_files(const std::vector<std::string>& paths);

}  // namespace npyfeed
