// The parts of the module, one per concept, each registering its names (module.cpp calls them in order).
#pragma once

#include <pybind11/pybind11.h>

namespace npyfeed::bindings {

/// Headers, whole-file and `.npz` loads, page-cache warm (loads.cpp).
void bind_loads(pybind11::module_& m);
/// Indexes and window sources (windows.cpp).
void bind_windows(pybind11::module_& m);
/// Plans of epochs and their streams of batches (plans.cpp).
void bind_plans(pybind11::module_& m);
/// Batches formed on a device: the host's half (device.cpp).
void bind_device(pybind11::module_& m);
/// npyfeed.tf's feeds for its op library (tf_feed.cpp).
void bind_tf_feed(pybind11::module_& m);
/// What the build holds and what it uses on this machine (build_info.cpp).
void bind_build_info(pybind11::module_& m);
/// _core.testing, the one hook for what only tests and benchmarks ask (testing.cpp).
void bind_testing(pybind11::module_& m);

}  // namespace npyfeed::bindings
