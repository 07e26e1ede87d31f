// Page-locked (pinned) host memory for copies to a CUDA GPU, through the CUDA runtime the process has loaded.
//
// A GPU copies from ordinary (pageable) memory through a staging buffer of the driver's, one chunk at a time:
// measured on an H200 (PCIe 5.0 x16), 10.3 GB/s for a batch of the users' shape, against 51.9 GB/s from
// page-locked memory, which the GPU reads by DMA directly. Registering a batch buffer once
// (cudaHostRegister) and recycling it makes every later copy of a batch in it a DMA copy, with no extra host
// copy into a staging buffer of the framework's. The core never links CUDA: the runtime's four functions are
// looked up at run time (dlopen), in the library PyTorch, TensorFlow or CuPy has already loaded.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace npyfeed {

/// The CUDA runtime's functions this needs (their C signatures; cudaError_t is an int, 0 = success).
struct CudaHostApi {
  int (*get_device)(int* device) = nullptr;
  int (*set_device)(int device) = nullptr;
  int (*host_register)(void* ptr, std::size_t size, unsigned int flags) = nullptr;
  int (*host_unregister)(void* ptr) = nullptr;
  const char* (*error_string)(int error) = nullptr;  // may stay null
};

/// The CUDA runtime found for this process: its functions and the name it was loaded by.
struct CudaRuntime {
  CudaHostApi api;
  std::string library;
};

/// The CUDA runtime library, looked up here and nowhere else (the Python package opens the library this names,
/// for cudaMemGetInfo): `library` when not empty (a path or a file name, as dlopen takes it), else the
/// environment's NPYFEED_CUDA_RUNTIME when set, else the first of libcudart.so.13, .12, .11.0 and libcudart.so
/// that is already loaded (by PyTorch, TensorFlow, CuPy), else the first that loads. Throws Error naming what was
/// tried when none has the functions. The library is never closed: buffers registered through it may outlive
/// anything that could close it.
CudaRuntime find_cuda_runtime(const std::string& library);

/// Registers host buffers with the CUDA runtime as page-locked for one device. Thread-safe.
class PageLocker {
 public:
  /// Over `api` (every function but error_string set), for CUDA device `device` (its ordinal; -1: the
  /// calling thread's current device, asked now); `library` names where the functions came from, for messages.
  PageLocker(CudaHostApi api, int device, std::string library);
  /// A locker over find_cuda_runtime(library) for `device`. Throws Error as it does.
  static std::shared_ptr<const PageLocker> open(const std::string& library, int device);

  /// Page-locks [data, data + size) for every CUDA context (cudaHostRegisterPortable), with this locker's
  /// device current on the calling thread during the call (the caller's current device is restored after).
  /// Throws Error with the runtime's message on failure.
  void lock(void* data, std::size_t size) const;
  /// Undoes lock(data, ...); errors are ignored (at exit the runtime may be unloading).
  void unlock(void* data) const noexcept;

  int device() const noexcept { return device_; }
  const std::string& library() const noexcept { return library_; }

 private:
  CudaHostApi api_;
  int device_;
  std::string library_;
};

}  // namespace npyfeed
