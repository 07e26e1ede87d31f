// TensorFlow's C functions for an op library that does not name libtensorflow_framework.so.2 as a needed library
// (the wheels' build, NPYFEED_TF_OPS_NEED_FRAMEWORK=OFF: a manylinux wheel may need only the system's libraries).
// Each TF_* function the ops call is defined here, hidden, and forwards to TensorFlow's, looked up when the library
// is loaded: in the framework TensorFlow has already loaded (RTLD_NOLOAD: never a second copy), else in the
// process's global scope. The lookup runs before the ops register themselves (a constructor of a higher priority
// than feed_ops.cpp's static initialisers); if a function is missing, no op registers and npyfeed_tf_ops_init()
// says so, and npyfeed.tf falls back to tf.numpy_function with one warning.
#include <dlfcn.h>

#include "tf_c_api.h"

namespace {

struct Resolved {
#define NPYFEED_TF_POINTER(ret, name, params, args) ret(*name) params = nullptr;
  NPYFEED_TF_C_FUNCTIONS(NPYFEED_TF_POINTER)
#undef NPYFEED_TF_POINTER
};

Resolved g_tf;
bool g_resolved = false;

void* lookup(void* framework, const char* name) {
  void* symbol = framework != nullptr ? dlsym(framework, name) : nullptr;
  return symbol != nullptr ? symbol : dlsym(RTLD_DEFAULT, name);
}

__attribute__((constructor(101))) void resolve_tensorflow() {
  // dlopen with RTLD_NOLOAD only finds a library already loaded; the handle is kept (the library stays loaded for
  // as long as TensorFlow runs anyway).
  void* framework = dlopen("libtensorflow_framework.so.2", RTLD_LAZY | RTLD_NOLOAD);
  bool all = true;
#define NPYFEED_TF_RESOLVE(ret, name, params, args)                      \
  g_tf.name = reinterpret_cast<ret(*) params>(lookup(framework, #name)); \
  all = all && g_tf.name != nullptr;
  NPYFEED_TF_C_FUNCTIONS(NPYFEED_TF_RESOLVE)
#undef NPYFEED_TF_RESOLVE
  g_resolved = all;
}

}  // namespace

/// Whether every TF_* function was found (feed_ops.cpp registers no op otherwise).
bool npyfeed_tf_functions_resolved() { return g_resolved; }

#define NPYFEED_TF_FORWARD(ret, name, params, args) \
  ret name params { return g_tf.name args; }
NPYFEED_TF_C_FUNCTIONS(NPYFEED_TF_FORWARD)
#undef NPYFEED_TF_FORWARD
