// A minimal test harness for the C++ tests: no third-party framework, no Python.
//
//   TEST_CASE("name") { CHECK(x == 1); CHECK_EQ(a, b); auto e = CHECK_THROWS(NpyFormatError, f()); }
//
// CHECK* record a failure and carry on; REQUIRE stops the test case. CHECK_THROWS returns
// std::optional<Type> holding the caught exception, so its fields can be checked. main() (check_main.cpp)
// runs every case, or those whose name contains one of the arguments; `--list` prints the names.
// The short macro names are test-only (like doctest's and Catch's) and never leak into the library.
#pragma once

#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

namespace npyfeed::test {

struct TestCase {
  const char* name;
  void (*fn)();
};

inline std::vector<TestCase>& registry() {
  static std::vector<TestCase> cases;
  return cases;
}

inline bool add_test(const char* name, void (*fn)()) {
  registry().push_back({name, fn});
  return true;
}

/// Failures in the test case that is running.
inline int& failures() {
  static int n = 0;
  return n;
}

/// Thrown by REQUIRE to abandon the current test case.
struct RequireFailed {};

inline void report(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what.c_str());
  ++failures();
}

template <class T>
std::string show(const T& v) {
  if constexpr (requires(std::ostream& os) { os << v; }) {
    std::ostringstream os;
    if constexpr (std::is_same_v<T, char> || std::is_same_v<T, unsigned char> || std::is_same_v<T, signed char>) {
      os << static_cast<int>(v);
    } else {
      os << v;
    }
    return os.str();
  } else {
    return "<" + std::string(typeid(T).name()) + ">";
  }
}

template <class A, class B>
void check_eq(const A& a, const B& b, const char* text, const char* file, int line) {
  if (!(a == b)) report(file, line, std::string(text) + "  (" + show(a) + " vs " + show(b) + ")");
}

template <class E, class F>
std::optional<E> check_throws(F&& f, const char* type, const char* text, const char* file, int line) {
  try {
    f();
  } catch (const E& e) {
    return e;
  } catch (const std::exception& e) {
    report(file, line, std::string(text) + " threw " + typeid(e).name() + " (" + e.what() + "), expected " + type);
    return std::nullopt;
  } catch (...) {
    report(file, line, std::string(text) + " threw something other than " + type);
    return std::nullopt;
  }
  report(file, line, std::string(text) + " did not throw " + type);
  return std::nullopt;
}

/// True when `text` contains `part` (for checking error messages).
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace npyfeed::test

#define NPYFEED_TEST_CAT2(a, b) a##b
#define NPYFEED_TEST_CAT(a, b) NPYFEED_TEST_CAT2(a, b)
#define NPYFEED_TEST_CASE_IMPL(fn, name)                                                                      \
  static void fn();                                                                                           \
  [[maybe_unused]] static const bool NPYFEED_TEST_CAT(fn, _registered) = ::npyfeed::test::add_test(name, fn); \
  static void fn()
#define TEST_CASE(name) NPYFEED_TEST_CASE_IMPL(NPYFEED_TEST_CAT(test_case_, __LINE__), name)

#define CHECK(...)                                                                 \
  do {                                                                             \
    if (!(__VA_ARGS__)) ::npyfeed::test::report(__FILE__, __LINE__, #__VA_ARGS__); \
  } while (0)
#define REQUIRE(...)                                             \
  do {                                                           \
    if (!(__VA_ARGS__)) {                                        \
      ::npyfeed::test::report(__FILE__, __LINE__, #__VA_ARGS__); \
      throw ::npyfeed::test::RequireFailed{};                    \
    }                                                            \
  } while (0)
#define CHECK_EQ(a, b) ::npyfeed::test::check_eq((a), (b), #a " == " #b, __FILE__, __LINE__)
#define CHECK_THROWS(Type, ...) \
  ::npyfeed::test::check_throws<Type>([&] { (void)(__VA_ARGS__); }, #Type, #__VA_ARGS__, __FILE__, __LINE__)
