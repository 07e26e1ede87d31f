// Runs the registered test cases: all of them, or those whose name contains one of the arguments.
#include <cstdio>
#include <string>

#include "check.hpp"

int main(int argc, char** argv) {
  using namespace npyfeed::test;
  std::vector<std::string> filters(argv + 1, argv + argc);
  if (filters.size() == 1 && filters[0] == "--list") {
    for (const auto& c : registry()) std::printf("%s\n", c.name);
    return 0;
  }
  int run = 0;
  int failed = 0;
  for (const auto& c : registry()) {
    bool selected = filters.empty();
    for (const auto& f : filters) selected = selected || std::string(c.name).find(f) != std::string::npos;
    if (!selected) continue;
    ++run;
    failures() = 0;
    try {
      c.fn();
    } catch (const RequireFailed&) {
    } catch (const std::exception& e) {
      std::fprintf(stderr, "unexpected exception: %s\n", e.what());
      ++failures();
    } catch (...) {
      std::fprintf(stderr, "unexpected exception of unknown type\n");
      ++failures();
    }
    std::printf("%-6s %s\n", failures() == 0 ? "ok" : "FAIL", c.name);
    if (failures() != 0) ++failed;
  }
  std::printf("%d test cases, %d passed, %d failed\n", run, run - failed, failed);
  if (run == 0) {
    std::fprintf(stderr, "no test case matched\n");
    return 1;
  }
  return failed == 0 ? 0 : 1;
}
