// The SIGBUS guard: a guarded copy from a mapping whose file shrank returns false (again and again, from
// many threads at once), an unguarded fault or a SIGBUS sent with kill() still reaches the handler that was
// installed before npyfeed's (or the default action: the process dies with SIGBUS). The dying cases run
// in forked children.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/io/fault_guard.hpp"

using namespace npyfeed;
using npyfeed::test::TempDir;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// The sanitizers install their own SIGBUS handler first (it reports, then exits): npyfeed chains to it.
constexpr bool kSanitizerHandlesSigbus = true;
#else
constexpr bool kSanitizerHandlesSigbus = false;
#endif

constexpr std::size_t kPage = 4096;
constexpr std::size_t kBytes = 16 * kPage;

// A file of kBytes mapped whole, then truncated to one page: pages 1.. raise SIGBUS when touched.
struct ShrunkMapping {
  explicit ShrunkMapping(const TempDir& dir) {
    const std::string path = dir.file("victim.bin");
    npyfeed::test::write_file(path, "", npyfeed::test::pattern(kBytes, 3));
    FILE* f = std::fopen(path.c_str(), "rb");
    data = static_cast<const std::byte*>(::mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fileno(f), 0));
    std::fclose(f);
    if (::truncate(path.c_str(), kPage) != 0) data = nullptr;
  }
  ~ShrunkMapping() {
    if (data != nullptr && data != MAP_FAILED) ::munmap(const_cast<std::byte*>(data), kBytes);
  }
  const std::byte* data = nullptr;
};

bool copy_bytes(const std::byte* src, std::byte* dst, std::size_t n) {
  return guarded([&] { std::memcpy(dst, src, n); });
}

// Runs `body` in a forked child; returns its wait status.
template <class F>
int in_child(F&& body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    body();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

void exit_42(int) { ::_exit(42); }

}  // namespace

TEST_CASE("a guarded copy of lost pages returns false, and the next one works") {
  TempDir dir;
  ShrunkMapping m(dir);
  REQUIRE(m.data != nullptr);
  std::vector<std::byte> out(kBytes);
  CHECK(copy_bytes(m.data, out.data(), kPage));  // the page still in the file
  CHECK(out[10] == npyfeed::test::pattern(kBytes, 3)[10]);
  for (int round = 0; round < 3; ++round) {  // SIGBUS is unblocked again after each recovery
    CHECK(!copy_bytes(m.data, out.data(), kBytes));
    CHECK(!copy_bytes(m.data + 5 * kPage, out.data(), 10));
  }
  CHECK(copy_bytes(m.data + 100, out.data(), 100));
}

TEST_CASE("nested guards: the inner one recovers, the outer carries on") {
  TempDir dir;
  ShrunkMapping m(dir);
  REQUIRE(m.data != nullptr);
  std::byte b{};
  bool inner = true;
  const bool outer = guarded([&] {
    inner = copy_bytes(m.data + 3 * kPage, &b, 1);
    std::memcpy(&b, m.data, 1);
  });
  CHECK(!inner);
  CHECK(outer);
  CHECK(!guarded([&] {
    std::memcpy(&b, m.data, 1);
    std::memcpy(&b, m.data + 2 * kPage, 1);
  }));
}

TEST_CASE("guarded copies fault on many threads at once") {
  TempDir dir;
  ShrunkMapping m(dir);
  REQUIRE(m.data != nullptr);
  std::atomic<int> recovered{0}, copied{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::vector<std::byte> out(kBytes);
      for (int i = 0; i < 50; ++i) {
        if (!copy_bytes(m.data, out.data(), kBytes)) recovered.fetch_add(1);
        if (copy_bytes(m.data, out.data(), kPage)) copied.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK_EQ(recovered.load(), 200);
  CHECK_EQ(copied.load(), 200);
}

TEST_CASE("a fault outside a guarded copy reaches the previous handler") {
  TempDir dir;
  const int status = in_child([&] {
    struct sigaction previous = {};
    previous.sa_handler = exit_42;
    ::sigaction(SIGBUS, &previous, nullptr);
    ShrunkMapping m(dir);
    std::byte b{};
    if (copy_bytes(m.data + 2 * kPage, &b, 1)) ::_exit(1);            // installs npyfeed's handler (and recovers)
    b = *static_cast<const volatile std::byte*>(m.data + 2 * kPage);  // not guarded
    ::_exit(2);
  });
  CHECK(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 42);
}

// A handler installed after npyfeed's that re-raises the fault at its thread (as Python's faulthandler does).
struct sigaction g_npyfeed_handler;
void reraise(int sig) {
  ::sigaction(sig, &g_npyfeed_handler, nullptr);
  ::raise(sig);
}

TEST_CASE("a fault re-raised by a handler installed later is still recovered") {
  TempDir dir;
  const int status = in_child([&] {
    ShrunkMapping m(dir);
    std::byte b{};
    if (copy_bytes(m.data + 2 * kPage, &b, 1)) ::_exit(101);  // installs npyfeed's handler
    struct sigaction later = {};
    later.sa_handler = reraise;
    later.sa_flags = SA_NODEFER;
    ::sigaction(SIGBUS, &later, &g_npyfeed_handler);
    if (copy_bytes(m.data + 2 * kPage, &b, 1)) ::_exit(102);
    ::_exit(copy_bytes(m.data, &b, 1) ? 0 : 103);
  });
  if (kSanitizerHandlesSigbus) return;  // the sanitizer's sigaction and raise interceptors get in between
  CHECK(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
}

TEST_CASE("a fault outside a guarded copy still kills with SIGBUS by default") {
  TempDir dir;
  const int status = in_child([&] {
    ShrunkMapping m(dir);
    std::byte b{};
    if (copy_bytes(m.data + 2 * kPage, &b, 1)) ::_exit(101);
    b = *static_cast<const volatile std::byte*>(m.data + 2 * kPage);
    ::_exit(102);
  });
  if (kSanitizerHandlesSigbus) {
    CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) >= 101));  // the sanitizer reported it and exited
  } else {
    CHECK(WIFSIGNALED(status));
    CHECK_EQ(WTERMSIG(status), SIGBUS);
  }
}

TEST_CASE("SIGBUS sent with kill() inside a guarded copy is not recovered") {
  const int status = in_child([&] {
    std::byte a{}, b{};
    if (!copy_bytes(&a, &b, 1)) ::_exit(101);  // installs the handler
    (void)guarded([&] { ::kill(::getpid(), SIGBUS); });
    ::_exit(102);  // SIGBUS from kill() was swallowed
  });
  if (kSanitizerHandlesSigbus) {
    CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) >= 101));
  } else {
    CHECK(WIFSIGNALED(status));
    CHECK_EQ(WTERMSIG(status), SIGBUS);
  }
}
