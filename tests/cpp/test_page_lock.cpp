// PageLocker and page-locked BufferPools over a fake CUDA runtime: every buffer registered once, on pages of
// its own, with the locker's device current and the caller's restored; unregistered before its pages go and
// not before; reuse keeps the registration; a refused registration is an Error with the runtime's message.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "check.hpp"
#include "npyfeed/common/aligned_buffer.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/device/page_lock.hpp"

using namespace npyfeed;

namespace {

struct FakeRuntime {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> registered;  // start -> bytes
  int registers = 0, unregisters = 0, set_device_calls = 0, errors = 0;
  int device_at_register = -1;
  int fail_with = 0;  // cudaHostRegister's answer while non-zero
};
FakeRuntime fake;
thread_local int current_device = 3;

int fake_get_device(int* device) {
  *device = current_device;
  return 0;
}
int fake_set_device(int device) {
  std::lock_guard lock(fake.mutex);
  ++fake.set_device_calls;
  current_device = device;
  return 0;
}
int fake_register(void* ptr, std::size_t size, unsigned int flags) {
  std::lock_guard lock(fake.mutex);
  if (fake.fail_with != 0) return fake.fail_with;
  const auto start = reinterpret_cast<std::uintptr_t>(ptr);
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  if (start % page != 0 || flags != 1) ++fake.errors;  // pages of its own, portable
  for (const auto& [s, n] : fake.registered) {         // CUDA refuses a page registered twice
    if (start / page <= (s + n - 1) / page && s / page <= (start + size - 1) / page) ++fake.errors;
  }
  // The memory is there and writable: registering pins it.
  static_cast<volatile unsigned char*>(ptr)[size - 1] = 1;
  fake.registered[start] = size;
  ++fake.registers;
  fake.device_at_register = current_device;
  return 0;
}
int fake_unregister(void* ptr) {
  std::lock_guard lock(fake.mutex);
  auto it = fake.registered.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == fake.registered.end()) {
    ++fake.errors;
    return 1;
  }
  // Still mapped when unregistered: mincore fails with ENOMEM on an unmapped page.
  unsigned char resident = 0;
  if (::mincore(ptr, 1, &resident) != 0) ++fake.errors;
  fake.registered.erase(it);
  ++fake.unregisters;
  return 0;
}
const char* fake_error_string(int error) { return error == 2 ? "out of memory" : "unknown"; }

std::shared_ptr<const PageLocker> fake_locker(int device) {
  CudaHostApi api;
  api.get_device = fake_get_device;
  api.set_device = fake_set_device;
  api.host_register = fake_register;
  api.host_unregister = fake_unregister;
  api.error_string = fake_error_string;
  return std::make_shared<const PageLocker>(api, device, "fake");
}

void reset() {
  std::lock_guard lock(fake.mutex);
  fake.registered.clear();
  fake.registers = fake.unregisters = fake.set_device_calls = fake.errors = 0;
  fake.device_at_register = -1;
  fake.fail_with = 0;
}

}  // namespace

TEST_CASE("page-locked pool: each buffer registered once on pages of its own, unregistered before unmapping") {
  reset();
  {
    auto pool = std::make_shared<BufferPool>(8, std::function<std::uint64_t(std::size_t)>{}, fake_locker(1));
    std::vector<std::shared_ptr<AlignedBuffer>> held;
    for (std::size_t size :
         {std::size_t{100}, std::size_t{100}, std::size_t{0}, std::size_t{4097}, std::size_t{3} << 20}) {
      held.push_back(pool->acquire(size));
      CHECK(held.back()->page_locked());
      CHECK_EQ(held.back()->size(), size);
      CHECK_EQ(reinterpret_cast<std::uintptr_t>(held.back()->data()) % 64, std::uintptr_t{0});
    }
    CHECK_EQ(fake.registers, 5);
    CHECK_EQ(fake.errors, 0);  // no page shared between two buffers, all portable
    CHECK_EQ(fake.device_at_register, 1);
    CHECK_EQ(current_device, 3);  // the caller's device restored
    held.clear();                 // back to the pool: still registered
    CHECK_EQ(fake.unregisters, 0);
    auto again = pool->acquire(100);
    CHECK_EQ(fake.registers, 5);  // reused, not registered again
    CHECK_EQ(pool->reused(), std::uint64_t{1});
  }
  CHECK_EQ(fake.unregisters, 5);  // the pool and the last buffer gone: every registration undone
  CHECK(fake.registered.empty());
  CHECK_EQ(fake.errors, 0);
}

TEST_CASE("page locker: no device switch when the locker's device is current") {
  reset();
  current_device = 2;
  auto pool = std::make_shared<BufferPool>(2, std::function<std::uint64_t(std::size_t)>{}, fake_locker(2));
  auto buffer = pool->acquire(1000);
  CHECK_EQ(fake.set_device_calls, 0);
  CHECK_EQ(fake.device_at_register, 2);
  current_device = 3;
}

TEST_CASE("page locker: a refused registration is an Error with the runtime's message, nothing leaked") {
  reset();
  auto pool = std::make_shared<BufferPool>(2, std::function<std::uint64_t(std::size_t)>{}, fake_locker(0));
  fake.fail_with = 2;
  std::string message;
  try {
    pool->acquire(1 << 20);
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(test::contains(message, "out of memory"));
  CHECK(test::contains(message, "cudaHostRegister"));
  CHECK(test::contains(message, "device 0"));
  CHECK_EQ(current_device, 3);
  fake.fail_with = 0;
  auto buffer = pool->acquire(1 << 20);  // the next one works
  CHECK(buffer->page_locked());
  buffer.reset();
  pool.reset();
  CHECK_EQ(fake.unregisters, 1);
}

TEST_CASE("pool without a locker: nothing registered") {
  reset();
  auto pool = std::make_shared<BufferPool>(2);
  auto buffer = pool->acquire(100);
  CHECK(!buffer->page_locked());
  CHECK_EQ(fake.registers, 0);
}

TEST_CASE("PageLocker::open: a library that is not there is an Error naming it") {
  CHECK_THROWS(Error, PageLocker::open("/nonexistent/libcudart-npyfeed-test.so", 0));
  std::string message;
  try {
    PageLocker::open("/nonexistent/libcudart-npyfeed-test.so", 0);
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(test::contains(message, "/nonexistent/libcudart-npyfeed-test.so"));
  CHECK_THROWS(InvalidArgument, fake_locker(-2));
  current_device = 3;
  CHECK_EQ(fake_locker(-1)->device(), 3);  // -1: the current device
}
