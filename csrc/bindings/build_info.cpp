// What this build of the core holds and what it can use on this machine (npyfeed.build_info): the compiler and
// C++ library it was built with and the glibc it targets (compile-time macros), liburing and zlib compiled in, and
// the core's own run-time probes: whether a ring can be set up (io_uring_enabled) and which vector kernels run.
#include <pybind11/pybind11.h>

#include <cstdio>
#include <string>

#include "bind.hpp"
#include "npyfeed/common/settings.hpp"
#include "npyfeed/format/zip_archive.hpp"
#include "npyfeed/gather/cpu_features.hpp"
#include "npyfeed/gather/stream_copy.hpp"
#include "npyfeed/io/read_queue.hpp"

#if defined(__GLIBC__)
#include <gnu/libc-version.h>
#endif

// Set by CMake (NPYFEED_TOOLCHAIN, NPYFEED_GLIBC_TARGET): a wheel build names its cross toolchain and the glibc it
// targets; a build with the system's compiler leaves both empty.
#ifndef NPYFEED_TOOLCHAIN
#define NPYFEED_TOOLCHAIN ""
#endif
#ifndef NPYFEED_GLIBC_TARGET
#define NPYFEED_GLIBC_TARGET ""
#endif

namespace npyfeed::bindings {

namespace py = pybind11;

namespace {

std::string dotted(int major, int minor, int patch) {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::string compiler() {
#if defined(__clang__)
  return "Clang " + dotted(__clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
  return "GCC " + dotted(__GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
  return "unknown";
#endif
}

std::string cxx_library() {
#if defined(_LIBCPP_VERSION)
  return "libc++ " + std::to_string(_LIBCPP_VERSION);
#elif defined(_GLIBCXX_RELEASE)
  return "libstdc++ " + std::to_string(_GLIBCXX_RELEASE) + " (" + std::to_string(__GLIBCXX__) + ")";
#else
  return "unknown";
#endif
}

py::dict build_info() {
  const auto& cpu = detail::cpu_features();
  py::dict d;
  d["compiler"] = compiler();
#ifdef __VERSION__
  d["compiler_version"] = std::string(__VERSION__);
#else
  d["compiler_version"] = std::string();
#endif
  d["toolchain"] = std::string(NPYFEED_TOOLCHAIN);
  d["cxx_library"] = cxx_library();
  d["glibc_target"] = std::string(NPYFEED_GLIBC_TARGET).empty() ? std::string("system") : NPYFEED_GLIBC_TARGET;
#if defined(__GLIBC__)
  d["glibc_headers"] = std::to_string(__GLIBC__) + "." + std::to_string(__GLIBC_MINOR__);
  d["glibc_runtime"] = std::string(gnu_get_libc_version());
#else
  d["glibc_headers"] = py::none();
  d["glibc_runtime"] = py::none();
#endif
  d["io_uring_compiled"] = io_uring_built();
  d["io_uring_usable"] = io_uring_enabled();
  d["zlib"] = have_inflate();
#if NPYFEED_STREAMING_STORES
  const bool simd = true;  // the AVX2 and AVX-512 kernels are compiled in, chosen at run time
#else
  const bool simd = false;
#endif
  d["simd_kernels_compiled"] = simd;
  d["cpu_vendor"] = cpu.vendor;
  d["avx2_available"] = cpu.avx2;
  d["avx512_available"] = cpu.avx512f;
  // AVX2 kernels run where the CPU has AVX2 (the transform's loops; the conversions also need F16C), AVX-512
  // ones where use_avx512() says (streamed copies and loops; the conversions also need AVX-512BW).
  d["avx2_used"] = simd && cpu.avx2;
  d["avx512_used"] = detail::use_avx512();
  return d;
}

}  // namespace

void bind_build_info(py::module_& m) {
  m.def("build_info", &build_info,
        "What this build holds (compiler, C++ library, glibc, liburing, zlib, vector kernels) and what it uses here "
        "(io_uring usable, AVX2/AVX-512 available and used), as a dict; npyfeed.build_info adds the Python side.");
  m.def(
      "core_settings",
      [] {
        py::list rows;
        for (const auto& setting : settings::table()) rows.append(py::make_tuple(setting.name, setting.meaning));
        return rows;
      },
      "The environment variables the core reads, (name, what it does) each: npyfeed.settings adds their values and "
      "the Python package's own.");
}

}  // namespace npyfeed::bindings
