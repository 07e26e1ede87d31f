// settings: the one reader of the core's environment variables. Each accessor's parse (switches "0"/"1", counts,
// text), an unparsable value read as unset, a change seen at the next call, and the table naming each variable once.
#include <cstdlib>
#include <set>
#include <string>
#include <utility>

#include "check.hpp"
#include "npyfeed/common/settings.hpp"

using namespace npyfeed;

namespace {

// Sets `name` to `value` (nullptr: unsets it) for one scope, then restores what was there.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedVariable() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("settings: a switch is 0 or 1, anything else unset") {
  const std::pair<const char*, std::optional<bool> (*)()> switches[] = {{"NPYFEED_POPULATE", &settings::populate},
                                                                        {"NPYFEED_IO_URING", &settings::io_uring},
                                                                        {"NPYFEED_STREAMING", &settings::streaming},
                                                                        {"NPYFEED_PREFETCH", &settings::prefetch},
                                                                        {"NPYFEED_AVX512", &settings::avx512}};
  for (const auto& [name, accessor] : switches) {
    {
      ScopedVariable v(name, "0");
      CHECK(accessor() == std::optional<bool>(false));
    }
    {
      ScopedVariable v(name, "1");
      CHECK(accessor() == std::optional<bool>(true));
    }
    for (const char* other : {"", "yes", "01", " 1", "true", "2"}) {
      ScopedVariable v(name, other);
      CHECK(!accessor().has_value());
    }
    ScopedVariable v(name, nullptr);
    CHECK(!accessor().has_value());
  }
}

TEST_CASE("settings: a count is a positive decimal integer, anything else unset") {
  {
    ScopedVariable v("NPYFEED_MAX_MAPPINGS", "12345");
    CHECK(settings::max_mappings() == std::optional<std::size_t>(12345));
  }
  for (const char* other : {"", "0", "-3", "12x", " 12", "1e3", "99999999999999999999999"}) {
    ScopedVariable v("NPYFEED_MAX_MAPPINGS", other);
    CHECK(!settings::max_mappings().has_value());
  }
}

TEST_CASE("settings: text as given, read again at each call") {
  ScopedVariable v("NPYFEED_CUDA_RUNTIME", "/opt/cuda/lib64/libcudart.so.12");
  CHECK(settings::cuda_runtime() == std::optional<std::string>("/opt/cuda/lib64/libcudart.so.12"));
  ::setenv("NPYFEED_CUDA_RUNTIME", "libcudart.so", 1);
  CHECK(settings::cuda_runtime() == std::optional<std::string>("libcudart.so"));
  ::setenv("NPYFEED_CUDA_RUNTIME", "", 1);
  CHECK(!settings::cuda_runtime().has_value());
}

TEST_CASE("settings: the table names each variable once, each with what it does") {
  std::set<std::string> names;
  for (const auto& setting : settings::table()) {
    CHECK(std::string(setting.name).rfind("NPYFEED_", 0) == 0);
    CHECK(std::string(setting.meaning).size() > 10);
    CHECK(names.insert(setting.name).second);
  }
  CHECK_EQ(names.size(), std::size_t{7});
  for (const char* name : {"NPYFEED_MAX_MAPPINGS", "NPYFEED_POPULATE", "NPYFEED_IO_URING", "NPYFEED_STREAMING",
                           "NPYFEED_PREFETCH", "NPYFEED_AVX512", "NPYFEED_CUDA_RUNTIME"})
    CHECK(names.count(name) == 1);
}
