// The compiled index cache: built once, then mapped; stale entries (an index file edited or touched)
// rebuilt; every byte of a corrupt or truncated entry refused (rebuilt by load_index), never read out of
// bounds; an unwritable cache dir a warning. Mirrors tests/test_index_cache.py.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/index/index_cache.hpp"

using namespace npyfeed;
using npyfeed::test::contains;

namespace {

std::string sample_text(int lines, int shift = 0) {
  std::string text;
  for (int i = 0; i < lines; ++i) {
    text += std::to_string(i % 97 + shift) + "," + std::to_string(i % 13) + ",k" + std::to_string(i / 50) + "\n";
    if (i % 31 == 0) text += "\n";
  }
  text += "5000000000,-1,big\n";  // a wide value
  return text;
}

// Columns, keys and lines of an index, for comparing two of them.
std::string dump(const SampleIndex& index) {
  std::string out;
  for (std::size_t i = 0; i < index.size(); ++i) {
    out += std::to_string(index.feature(i)) + "," + std::to_string(index.label(i)) + "," + index.keys[index.key(i)];
    if (i % 37 == 0) out += "@" + index.where(i);
    out += "\n";
  }
  return out;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// The names in `folder`, sorted.
std::vector<std::string> names_in(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(folder)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

bool any_lock_file(const std::string& folder) {
  for (const auto& name : names_in(folder)) {
    if (name.ends_with(".lock")) return true;
  }
  return false;
}

// Opens (creating) and flocks `path` as another process would; the lock is released by close().
int hold(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  return fd;
}

// Waits (up to 20 s) until /proc/locks shows a process waiting for an flock on the file `fd` is open on.
bool someone_waits_on(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return false;
  const std::string inode = ":" + std::to_string(st.st_ino) + " ";
  for (int i = 0; i < 2000; ++i) {
    std::ifstream locks("/proc/locks");
    for (std::string line; std::getline(locks, line);) {
      if (line.find("->") != std::string::npos && line.find(inode) != std::string::npos) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

TEST_CASE("built once, then mapped with the same content; no private copy") {
  test::TempDir dir;
  test::write_file(dir.file("a.txt"), sample_text(1000), {});
  test::write_file(dir.file("b.txt"), sample_text(300, 5), {});
  const std::vector<std::string> paths{dir.file("a.txt"), dir.file("b.txt")};
  const std::string expected = dump(read_index_files(paths, 2));
  IndexLoad first = load_index(paths, dir.file("cache"), 2);
  CHECK(first.built);
  CHECK(first.warning.empty());
  REQUIRE(!first.cache_path.empty());
  CHECK_EQ(dump(first.index), expected);
  CHECK_EQ(first.index.private_bytes(), 0u);  // the mapping, not the compiled columns
  IndexLoad second = load_index(paths, dir.file("cache"), 1);
  CHECK(!second.built);
  CHECK_EQ(second.cache_path, first.cache_path);
  CHECK_EQ(dump(second.index), expected);
  CHECK_EQ(second.index.where(1001), dir.file("b.txt") + ":1");  // after a.txt's 1000 lines and its wide one
  CHECK_EQ(second.index.where(1002), dir.file("b.txt") + ":3");  // line 2 is blank
  // No cache dir: compiled in memory.
  IndexLoad plain = load_index(paths, "", 2);
  CHECK(plain.built);
  CHECK(plain.cache_path.empty());
  CHECK_EQ(dump(plain.index), expected);
}

TEST_CASE("an edited or touched index file makes the entry stale: rebuilt") {
  test::TempDir dir;
  test::write_file(dir.file("a.txt"), sample_text(200), {});
  const std::vector<std::string> paths{dir.file("a.txt")};
  CHECK(load_index(paths, dir.file("cache"), 1).built);
  CHECK(!load_index(paths, dir.file("cache"), 1).built);
  test::write_file(dir.file("a.txt"), sample_text(200, 1), {});  // same size, new content
  IndexLoad edited = load_index(paths, dir.file("cache"), 1);
  CHECK(edited.built);
  CHECK_EQ(dump(edited.index), dump(read_index_files(paths)));
  struct timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}};
  times[1].tv_sec = 1000000000;  // mtime only
  times[1].tv_nsec = 0;
  REQUIRE(::utimensat(AT_FDCWD, dir.file("a.txt").c_str(), times, 0) == 0);
  CHECK(load_index(paths, dir.file("cache"), 1).built);
  CHECK(!load_index(paths, dir.file("cache"), 1).built);
}

TEST_CASE("every corrupted byte and every truncation is refused, and load_index rebuilds") {
  test::TempDir dir;
  test::write_file(dir.file("a.txt"), sample_text(120), {});
  const std::vector<std::string> paths{dir.file("a.txt")};
  IndexLoad built = load_index(paths, dir.file("cache"), 1);
  const std::string expected = dump(built.index);
  const std::string good = read_all(built.cache_path);
  const std::vector<IndexFileIdentity> files{index_file_identity(paths[0])};
  SampleIndex out;
  REQUIRE(open_index_cache(built.cache_path, files, paths, out));
  std::size_t refused = 0, checked = 0;
  for (std::size_t at = 0; at < good.size(); ++at) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x5a);
    write_all(built.cache_path, bad);
    SampleIndex got;
    // Padding between sections is not read: a flip there may be accepted, and must read the same.
    if (open_index_cache(built.cache_path, files, paths, got)) {
      CHECK_EQ(dump(got), expected);
    } else {
      ++refused;
    }
    ++checked;
  }
  CHECK(refused > checked * 3 / 4);
  for (std::size_t size : {0ul, 7ul, 100ul, good.size() / 2, good.size() - 1}) {
    write_all(built.cache_path, good.substr(0, size));
    SampleIndex got;
    std::string why;
    CHECK(!open_index_cache(built.cache_path, files, paths, got, &why));
    CHECK(!why.empty());
  }
  write_all(built.cache_path, good.substr(0, good.size() / 3));
  IndexLoad rebuilt = load_index(paths, dir.file("cache"), 1);
  CHECK(rebuilt.built);
  CHECK_EQ(dump(rebuilt.index), expected);
  CHECK_EQ(read_all(rebuilt.cache_path), good);  // the same bytes as the first build
}

TEST_CASE("a cache dir that cannot be created degrades to memory with a warning") {
  test::TempDir dir;
  test::write_file(dir.file("a.txt"), sample_text(50), {});
  test::write_file(dir.file("blocker"), "a file", {});
  IndexLoad load = load_index({dir.file("a.txt")}, dir.file("blocker") + "/cache", 1);
  CHECK(load.built);
  CHECK(load.cache_path.empty());
  CHECK(contains(load.warning, "cannot use the index cache"));
  CHECK_EQ(dump(load.index), dump(read_index_files({dir.file("a.txt")})));
  // A malformed line is the error, cache or not.
  test::write_file(dir.file("bad.txt"), "1,2,a\n3,x,b\n", {});
  auto e = CHECK_THROWS(InvalidArgument, load_index({dir.file("bad.txt")}, dir.file("cache"), 1));
  if (e) CHECK(contains(e->what(), dir.file("bad.txt") + ":2: label_index is not an integer"));
  auto missing = CHECK_THROWS(OsError, load_index({dir.file("none.txt")}, dir.file("cache"), 1));
}

TEST_CASE("no lock file is left: after a build, a failed build, and a hit (which removes one nobody holds)") {
  test::TempDir dir;
  test::write_file(dir.file("a.txt"), sample_text(100), {});
  const std::vector<std::string> paths{dir.file("a.txt")};
  const std::string cache = dir.file("cache");
  IndexLoad built = load_index(paths, cache, 1);
  CHECK(built.built);
  CHECK_EQ(names_in(cache), std::vector<std::string>{std::filesystem::path(built.cache_path).filename().string()});
  test::write_file(dir.file("bad.txt"), "1,2,a\n3,x,b\n", {});
  CHECK_THROWS(InvalidArgument, load_index({dir.file("bad.txt")}, cache, 1));
  CHECK(!any_lock_file(cache));
  CHECK_EQ(names_in(cache).size(), 1u);  // and no entry for the failed one
  // One left by an older npyfeed (or a process killed while holding it): the next hit removes it.
  const std::string lock = built.cache_path + ".lock";
  test::write_file(lock, "", {});
  CHECK(!load_index(paths, cache, 1).built);
  CHECK(!std::filesystem::exists(lock));
  // One in use stays.
  const int held = hold(lock);
  CHECK(!load_index(paths, cache, 1).built);
  CHECK(std::filesystem::exists(lock));
  ::close(held);
}

TEST_CASE("a waiter whose lock file its holder removed waits for the lock file the path names now") {
  test::TempDir dir;
  test::write_file(dir.file("a.txt"), sample_text(100), {});
  const std::vector<std::string> paths{dir.file("a.txt")};
  const std::string cache = dir.file("cache");
  std::filesystem::create_directories(cache);
  const std::string lock = index_cache_path(cache, {index_file_identity(paths[0])}) + ".lock";
  const int first = hold(lock);
  std::atomic<bool> done{false}, built{false};
  std::thread opener([&] {
    built = load_index(paths, cache, 1).built;
    done = true;
  });
  const bool waited = someone_waits_on(first);  // the opener waits on the first lock file
  CHECK(waited);
  CHECK_EQ(::unlink(lock.c_str()), 0);  // its holder lets go as npyfeed does: removed while still held ...
  const int second = hold(lock);        // ... and another process creates and takes a new one at once
  ::close(first);
  // The opener now holds the nameless first file: it must see that and wait for the second.
  CHECK(someone_waits_on(second));
  CHECK(!done);
  ::close(second);
  opener.join();
  CHECK(done);
  CHECK(built);
  CHECK(!std::filesystem::exists(lock));
}

TEST_CASE("threads opening together build each entry once, and leave no lock file") {
  test::TempDir dir;
  std::vector<std::vector<std::string>> sets;
  for (int s = 0; s < 4; ++s) {
    test::write_file(dir.file("i" + std::to_string(s) + ".txt"), sample_text(3000, s), {});
    sets.push_back({dir.file("i" + std::to_string(s) + ".txt")});
  }
  const std::string cache = dir.file("cache");
  std::atomic<int> builds[4] = {0, 0, 0, 0};
  std::atomic<bool> same{true};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 4; ++i) {
        const int s = (i + t) % 4;
        IndexLoad load = load_index(sets[s], cache, 1);
        if (load.built) ++builds[s];
        if (dump(load.index) != dump(read_index_files(sets[s]))) same = false;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& b : builds) CHECK_EQ(b.load(), 1);
  CHECK(same);
  CHECK_EQ(names_in(cache).size(), 4u);
  CHECK(!any_lock_file(cache));
}

TEST_CASE("the checksum sees every bit, at every length") {
  std::vector<std::byte> data(200);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 31);
  for (std::size_t len : {0ul, 1ul, 7ul, 8ul, 31ul, 32ul, 33ul, 200ul}) {
    const std::uint64_t h = index_cache_hash(std::span(data).first(len));
    CHECK(h != index_cache_hash(std::span(data).first(len), 1));
    for (std::size_t bit = 0; bit < len * 8; bit += 5) {
      auto copy = data;
      copy[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
      CHECK(index_cache_hash(std::span(copy).first(len)) != h);
    }
  }
}
