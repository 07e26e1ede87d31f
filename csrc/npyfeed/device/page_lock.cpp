#include "npyfeed/device/page_lock.hpp"

#include <dlfcn.h>

#include <optional>
#include <utility>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/common/settings.hpp"

namespace npyfeed {

namespace {

constexpr unsigned int kHostRegisterPortable = 0x01;  // cudaHostRegisterPortable
constexpr const char* kRuntimeNames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"};

std::string error_text(const CudaHostApi& api, int error) {
  const char* text = api.error_string ? api.error_string(error) : nullptr;
  return (text ? std::string(text) : std::string("CUDA error")) + " (" + std::to_string(error) + ")";
}

// The runtime's functions from an opened library; false when one is missing. The handle is never closed: the
// buffers registered through it may outlive anything that could close it.
bool resolve(void* handle, CudaHostApi& api) {
  api.get_device = reinterpret_cast<int (*)(int*)>(::dlsym(handle, "cudaGetDevice"));
  api.set_device = reinterpret_cast<int (*)(int)>(::dlsym(handle, "cudaSetDevice"));
  api.host_register = reinterpret_cast<int (*)(void*, std::size_t, unsigned int)>(::dlsym(handle, "cudaHostRegister"));
  api.host_unregister = reinterpret_cast<int (*)(void*)>(::dlsym(handle, "cudaHostUnregister"));
  api.error_string = reinterpret_cast<const char* (*)(int)>(::dlsym(handle, "cudaGetErrorString"));
  return api.get_device && api.set_device && api.host_register && api.host_unregister;
}

// The caller's current device, switched to `device` for the scope and back after (not switched at all when it
// already is the one): a thread of the user's keeps the device it chose.
class CurrentDevice {
 public:
  CurrentDevice(const CudaHostApi& api, int device) : api_(api) {
    if (api_.get_device(&previous_) != 0) previous_ = -1;
    switched_ = previous_ != device;
    if (switched_) {
      const int error = api_.set_device(device);
      if (error != 0) {
        throw Error("npyfeed: pin_memory: cannot make CUDA device " + std::to_string(device) +
                    " current: " + error_text(api_, error));
      }
    }
  }
  ~CurrentDevice() {
    if (switched_ && previous_ >= 0) api_.set_device(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  const CudaHostApi& api_;
  int previous_ = -1;
  bool switched_ = false;
};

}  // namespace

PageLocker::PageLocker(CudaHostApi api, int device, std::string library)
    : api_(api), device_(device), library_(std::move(library)) {
  if (!api_.get_device || !api_.set_device || !api_.host_register || !api_.host_unregister) {
    throw InvalidArgument(
        "npyfeed: PageLocker needs cudaGetDevice, cudaSetDevice, cudaHostRegister and "
        "cudaHostUnregister");
  }
  if (device_ == -1) {
    const int error = api_.get_device(&device_);
    if (error != 0) throw Error("npyfeed: pin_memory: cannot tell the current CUDA device: " + error_text(api_, error));
  }
  if (device_ < 0) throw InvalidArgument("npyfeed: pin_memory: a CUDA device is an ordinal >= 0");
  // A device that cannot be made current (none there, a driver too old) is refused here, where the pipeline is
  // made, not at its first batch.
  CurrentDevice probe(api_, device_);
}

CudaRuntime find_cuda_runtime(const std::string& library) {
  // A library that loads but lacks the functions is not a CUDA runtime: passed over, like one that is not there.
  auto attempt = [](const std::string& name, int flags) -> std::optional<CudaRuntime> {
    void* handle = ::dlopen(name.c_str(), flags);
    CudaHostApi api;
    if (!handle || !resolve(handle, api)) return std::nullopt;
    return CudaRuntime{api, name};
  };
  const std::string named = !library.empty() ? library : settings::cuda_runtime().value_or("");
  if (!named.empty()) {
    if (auto runtime = attempt(named, RTLD_NOW | RTLD_LOCAL)) return *runtime;
    throw Error("npyfeed: pin_memory: " + named + " is not a CUDA runtime that can be loaded (no such library, or no " +
                "cudaHostRegister in it)");
  }
  for (const char* name : kRuntimeNames) {  // one the process has loaded already: the framework's own
    if (auto runtime = attempt(name, RTLD_NOW | RTLD_NOLOAD)) return *runtime;
  }
  std::string tried;
  for (const char* name : kRuntimeNames) {
    if (auto runtime = attempt(name, RTLD_NOW | RTLD_LOCAL)) return *runtime;
    tried += (tried.empty() ? "" : ", ") + std::string(name);
  }
  throw Error(
      "npyfeed: pin_memory needs the CUDA runtime (libcudart), loaded by PyTorch, TensorFlow or CuPy or "
      "findable by the dynamic loader, and none was found (tried " +
      tried + "); set NPYFEED_CUDA_RUNTIME to its path, or leave pin_memory off");
}

std::shared_ptr<const PageLocker> PageLocker::open(const std::string& library, int device) {
  CudaRuntime runtime = find_cuda_runtime(library);
  return std::make_shared<const PageLocker>(runtime.api, device, std::move(runtime.library));
}

void PageLocker::lock(void* data, std::size_t size) const {
  CurrentDevice current(api_, device_);
  const int error = api_.host_register(data, size, kHostRegisterPortable);
  if (error != 0) {
    throw Error("npyfeed: pin_memory: cannot page-lock a buffer of " + std::to_string(size) +
                " bytes for CUDA device " + std::to_string(device_) + " (cudaHostRegister, " + library_ +
                "): " + error_text(api_, error));
  }
}

void PageLocker::unlock(void* data) const noexcept { api_.host_unregister(data); }

}  // namespace npyfeed
