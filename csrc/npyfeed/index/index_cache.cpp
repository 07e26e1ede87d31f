#include "npyfeed/index/index_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <type_traits>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/io/file.hpp"
#include "npyfeed/io/mapped_file.hpp"

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace npyfeed {

namespace {

// The file, every section 64-byte aligned, integers in host byte order (a cache never leaves its node):
//
//   +--------------------+  0
//   | Header             |  magic, version, counts, section offsets, section hashes, header hash
//   +--------------------+  meta_offset
//   | sources, keys      |  per source: size, mtime_ns, inode, device, first sample, path length, path;
//   |                    |  per key: length, bytes
//   +--------------------+  offsets[kFeature] ...
//   | int32 feature[n]   |
//   | int32 label[n]     |
//   | uint32 key[n]      |
//   | IndexCheckpoint[c] |
//   | WideValue wide_feature[], wide_label[]
//   +--------------------+  file_bytes
constexpr char kMagic[8] = {'N', 'P', 'Y', 'F', 'I', 'D', 'X', '\n'};
constexpr std::uint64_t kAlign = 64;

enum Section { kMeta, kFeature, kLabel, kKey, kCheckpoints, kWideFeature, kWideLabel, kSections };

struct Header {
  char magic[8];
  std::uint32_t version;
  std::uint32_t header_bytes;
  std::uint64_t file_bytes;
  std::uint64_t samples;
  std::uint64_t keys;
  std::uint64_t sources;
  std::uint64_t offset[kSections];
  std::uint64_t bytes[kSections];
  std::uint64_t hash[kSections];
  std::uint64_t header_hash;  // over the header with this field zero
};
static_assert(std::is_trivially_copyable_v<Header>);

constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull,
                        kP4 = 0x85EBCA77C2B2AE63ull, kP5 = 0x27D4EB2F165667C5ull;

std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
std::uint64_t round64(std::uint64_t acc, std::uint64_t in) { return rotl(acc + in * kP2, 31) * kP1; }
std::uint64_t load64(const std::byte* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::uint64_t align_up(std::uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

std::uint64_t header_hash(Header h) {
  h.header_hash = 0;
  return index_cache_hash(std::as_bytes(std::span(&h, 1)), 1);
}

template <typename T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

void put_text(std::string& out, const std::string& s) {
  put(out, static_cast<std::uint64_t>(s.size()));
  out += s;
}

// Reads the meta section, every read checked against its end.
class MetaReader {
 public:
  explicit MetaReader(std::span<const std::byte> data) : data_(data) {}
  bool u64(std::uint64_t& v) {
    if (data_.size() - pos_ < 8) return false;
    std::memcpy(&v, data_.data() + pos_, 8);
    pos_ += 8;
    return true;
  }
  bool text(std::string& s) {
    std::uint64_t n;
    if (!u64(n) || n > data_.size() - pos_) return false;
    s.assign(reinterpret_cast<const char*>(data_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool at_end() const { return pos_ == data_.size(); }

 private:
  std::span<const std::byte> data_;
  std::size_t pos_ = 0;
};

void write_all(int fd, const void* data, std::size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, std::min<std::size_t>(size, 1u << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw OsError(errno, path, "cannot write");
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

// Whether `fd` is the file named `path` now. ENOENT is an answer (no file there); other errors throw.
bool names_file(int fd, const std::string& path) {
  struct stat held, named;
  if (::fstat(fd, &held) != 0) throw OsError(errno, path, "cannot stat the lock file");
  if (::stat(path.c_str(), &named) != 0) {
    if (errno == ENOENT) return false;
    throw OsError(errno, path, "cannot stat the lock file");
  }
  return held.st_dev == named.st_dev && held.st_ino == named.st_ino;
}

// An exclusive flock on a lock file beside the entry, which its holder removes before letting go, so that no
// lock file outlives its use (one per entry piled up otherwise, failed opens' too).
//
// Removing it is safe because a lock counts only on the file the path names: a process that opened the file
// before its holder removed it wakes up holding a nameless file, sees that the path no longer names it, and
// opens the path again (creating a new file, or waiting for whoever created it). The file a holder locked
// cannot be removed under it, since only a holder removes the file, and only its own. (An older npyfeed, which
// does not check, may build an entry a second time beside this one; both rename a complete file into place.)
class Lock {
 public:
  explicit Lock(const std::string& path) : path_(path) {
    for (;;) {
      fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd_ < 0) throw OsError(errno, path, "cannot open the lock file");
      try {
        while (::flock(fd_, LOCK_EX) != 0) {
          if (errno != EINTR) throw OsError(errno, path, "cannot lock");
        }
        if (names_file(fd_, path)) return;
      } catch (...) {
        ::close(fd_);
        throw;
      }
      ::close(fd_);  // removed by the holder this one waited for: lock the file the path names now
    }
  }
  ~Lock() {
    ::unlink(path_.c_str());  // while still held: see above
    ::close(fd_);             // closing releases the lock
  }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// Removes a lock file nobody holds (left by an older npyfeed, or by a process killed while it held one), by
// taking it without waiting, as a holder would; a lock file in use stays.
void remove_unused_lock(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return;  // none: the usual case
  try {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && names_file(fd, path)) ::unlink(path.c_str());
  } catch (const OsError&) {
    // A lock file that cannot be examined is left alone.
  }
  ::close(fd);
}

bool fail(std::string* why, const std::string& text) {
  if (why != nullptr) *why = text;
  return false;
}

}  // namespace

std::uint64_t index_cache_hash(std::span<const std::byte> data, std::uint64_t seed) {
  const std::byte* p = data.data();
  const std::byte* end = p + data.size();
  std::uint64_t h;
  if (data.size() >= 32) {
    std::uint64_t a = seed + kP1 + kP2, b = seed + kP2, c = seed, d = seed - kP1;
    for (; end - p >= 32; p += 32) {
      a = round64(a, load64(p));
      b = round64(b, load64(p + 8));
      c = round64(c, load64(p + 16));
      d = round64(d, load64(p + 24));
    }
    h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18);
    for (std::uint64_t v : {a, b, c, d}) h = (h ^ round64(0, v)) * kP1 + kP4;
  } else {
    h = seed + kP5;
  }
  h += data.size();
  for (; end - p >= 8; p += 8) h = rotl(h ^ round64(0, load64(p)), 27) * kP1 + kP4;
  for (; p < end; ++p) h = rotl(h ^ (static_cast<std::uint64_t>(*p) * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

std::string index_cache_path(const std::string& cache_dir, const std::vector<IndexFileIdentity>& files) {
  std::string names = "npyfeed index v" + std::to_string(kIndexCacheVersion);
  for (const auto& f : files) names += '\0' + f.path;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(index_cache_hash(std::as_bytes(std::span(names)))));
  return (std::filesystem::path(cache_dir) / ("index-" + std::string(hex) + ".npyidx")).string();
}

void write_index_cache(const std::string& path, const SampleIndex& index, const std::vector<IndexFileIdentity>& files) {
  const IndexColumns& c = index.columns();
  std::string meta;
  for (std::size_t s = 0; s < files.size(); ++s) {
    put(meta, files[s].size);
    put(meta, files[s].mtime_ns);
    put(meta, files[s].inode);
    put(meta, files[s].device);
    put(meta, s < index.source_begin().size() ? index.source_begin()[s] : index.size());
    put_text(meta, files[s].path);
  }
  for (const auto& k : index.keys) put_text(meta, k);

  const std::span<const std::byte> sections[kSections] = {
      std::as_bytes(std::span(meta)), std::as_bytes(c.feature),      std::as_bytes(c.label),      std::as_bytes(c.key),
      std::as_bytes(c.checkpoints),   std::as_bytes(c.wide_feature), std::as_bytes(c.wide_label),
  };
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kIndexCacheVersion;
  h.header_bytes = sizeof(Header);
  h.samples = index.size();
  h.keys = index.keys.size();
  h.sources = files.size();
  std::uint64_t at = align_up(sizeof(Header));
  for (int s = 0; s < kSections; ++s) {
    h.offset[s] = at;
    h.bytes[s] = sections[s].size();
    h.hash[s] = index_cache_hash(sections[s], static_cast<std::uint64_t>(s));
    at = align_up(at + sections[s].size());
  }
  h.file_bytes = at;
  h.header_hash = header_hash(h);

  std::random_device rd;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw OsError(errno, tmp, "cannot create");
  try {
    static const char zeros[kAlign] = {};
    write_all(fd, &h, sizeof h, tmp);
    std::uint64_t written = sizeof h;
    for (int s = 0; s < kSections; ++s) {
      write_all(fd, zeros, h.offset[s] - written, tmp);
      write_all(fd, sections[s].data(), sections[s].size(), tmp);
      written = h.offset[s] + sections[s].size();
    }
    write_all(fd, zeros, h.file_bytes - written, tmp);
    if (::close(fd) != 0) {
      const int e = errno;
      throw OsError(e, tmp, "cannot write");
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw OsError(errno, path, "cannot rename the cache into place");
  } catch (...) {
    ::close(fd);  // harmless when already closed (EBADF)
    ::unlink(tmp.c_str());
    throw;
  }
}

bool open_index_cache(const std::string& path, const std::vector<IndexFileIdentity>& files,
                      const std::vector<std::string>& names, SampleIndex& out, std::string* why) {
  std::shared_ptr<MappedFile> map;
  try {
    File file = File::open(path);
    if (file.size() < sizeof(Header)) return fail(why, "truncated header");
    map = MappedFile::map(file);
  } catch (const Error& e) {
    return fail(why, e.what());
  }
  Header h;
  std::memcpy(&h, map->data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return fail(why, "not an index cache");
  if (h.version != kIndexCacheVersion || h.header_bytes != sizeof(Header)) return fail(why, "other version");
  if (h.header_hash != header_hash(h)) return fail(why, "header checksum");
  if (h.file_bytes != map->size()) return fail(why, "size differs from header (truncated?)");
  if (h.sources != files.size() || h.keys > UINT32_MAX) return fail(why, "counts");
  const std::uint64_t n = h.samples;
  const std::uint64_t elems[kSections] = {h.bytes[kMeta], n, n, n, 0, 0, 0};
  const std::uint64_t elem_size[kSections] = {
      1, 4, 4, 4, sizeof(IndexCheckpoint), sizeof(WideValue), sizeof(WideValue)};
  for (int s = 0; s < kSections; ++s) {
    if (h.offset[s] % kAlign != 0 || h.offset[s] < sizeof(Header) || h.offset[s] > h.file_bytes ||
        h.bytes[s] > h.file_bytes - h.offset[s] || h.bytes[s] % elem_size[s] != 0)
      return fail(why, "section bounds");
    if (s <= kKey && h.bytes[s] / elem_size[s] != elems[s]) return fail(why, "section sizes");
  }
  auto section = [&](int s) { return std::span<const std::byte>(map->data() + h.offset[s], h.bytes[s]); };
  for (int s = 0; s < kSections; ++s) {
    if (index_cache_hash(section(s), static_cast<std::uint64_t>(s)) != h.hash[s]) return fail(why, "checksum");
  }

  MetaReader meta(section(kMeta));
  std::vector<std::uint64_t> source_begin;
  for (const IndexFileIdentity& f : files) {
    IndexFileIdentity got;
    std::uint64_t mtime, begin;
    if (!meta.u64(got.size) || !meta.u64(mtime) || !meta.u64(got.inode) || !meta.u64(got.device) || !meta.u64(begin) ||
        !meta.text(got.path))
      return fail(why, "meta");
    got.mtime_ns = static_cast<std::int64_t>(mtime);
    if (!(got == f)) return fail(why, "stale: " + f.path + " changed");
    if (begin > n || (!source_begin.empty() && begin < source_begin.back())) return fail(why, "source bounds");
    source_begin.push_back(begin);
  }
  std::vector<std::string> keys(h.keys);
  for (auto& k : keys) {
    if (!meta.text(k)) return fail(why, "keys");
  }
  if (!meta.at_end()) return fail(why, "meta length");

  auto typed = [&]<typename T>(int s, T*) {
    return std::span<const T>(reinterpret_cast<const T*>(map->data() + h.offset[s]), h.bytes[s] / sizeof(T));
  };
  IndexColumns c;
  c.feature = typed(kFeature, static_cast<std::int32_t*>(nullptr));
  c.label = typed(kLabel, static_cast<std::int32_t*>(nullptr));
  c.key = typed(kKey, static_cast<std::uint32_t*>(nullptr));
  c.checkpoints = typed(kCheckpoints, static_cast<IndexCheckpoint*>(nullptr));
  c.wide_feature = typed(kWideFeature, static_cast<WideValue*>(nullptr));
  c.wide_label = typed(kWideLabel, static_cast<WideValue*>(nullptr));
  // What lookups rely on: sorted tables inside the samples and sources (key ids are checked where used).
  for (std::size_t i = 0; i < c.checkpoints.size(); ++i) {
    const IndexCheckpoint& cp = c.checkpoints[i];
    if (cp.sample >= n || cp.source >= files.size() || (i > 0 && cp.sample < c.checkpoints[i - 1].sample))
      return fail(why, "checkpoints");
  }
  for (auto wide : {c.wide_feature, c.wide_label}) {
    for (std::size_t i = 0; i < wide.size(); ++i) {
      if (wide[i].sample >= n || (i > 0 && wide[i].sample <= wide[i - 1].sample)) return fail(why, "wide values");
    }
  }
  c.owner = std::move(map);
  out =
      SampleIndex(std::move(keys), names, std::move(source_begin), std::vector<bool>(files.size(), true), std::move(c));
  return true;
}

namespace {

// Compiles in memory, then gives the parse's freed chunks back to the system (glibc keeps them otherwise).
SampleIndex compile(const std::vector<std::string>& paths, std::size_t threads) {
  SampleIndex index = read_index_files(paths, threads);
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
  return index;
}

}  // namespace

IndexLoad load_index(const std::vector<std::string>& paths, const std::string& cache_dir, std::size_t threads) {
  IndexLoad result;
  if (cache_dir.empty()) {
    result.index = compile(paths, threads);
    result.built = true;
    return result;
  }
  std::vector<IndexFileIdentity> files;
  for (const auto& p : paths) files.push_back(index_file_identity(p));
  const std::string path = index_cache_path(cache_dir, files);
  // Most opens find a complete entry and take no lock.
  if (open_index_cache(path, files, paths, result.index)) {
    result.cache_path = path;
    remove_unused_lock(path + ".lock");
    return result;
  }
  std::unique_ptr<Lock> lock;
  try {
    std::filesystem::create_directories(cache_dir);
    lock = std::make_unique<Lock>(path + ".lock");
  } catch (const std::exception& e) {
    result.index = compile(paths, threads);
    result.built = true;
    result.warning = std::string("cannot use the index cache in ") + cache_dir + " (" + e.what() +
                     "); the index is kept in this process's memory";
    return result;
  }
  // Another process may have built it while this one waited for the lock.
  if (open_index_cache(path, files, paths, result.index)) {
    result.cache_path = path;
    return result;
  }
  {
    SampleIndex compiled = compile(paths, threads);
    result.built = true;
    try {
      write_index_cache(path, compiled, files);
    } catch (const OsError& e) {
      result.index = std::move(compiled);
      result.warning =
          std::string("cannot write the index cache (") + e.what() + "); the index is kept in this process's memory";
      return result;
    }
    result.index = std::move(compiled);
  }
  // Share the entry just written (one page-cache copy) rather than keep the compiled columns.
  SampleIndex mapped;
  std::string why;
  if (open_index_cache(path, files, paths, mapped, &why)) {
    result.index = std::move(mapped);
    result.cache_path = path;
#ifdef __GLIBC__
    ::malloc_trim(0);  // the compile's chunks: give their pages back
#endif
  } else {
    result.warning = "the index cache just written does not read back (" + why + "); the index is kept in memory";
  }
  return result;
}

}  // namespace npyfeed
