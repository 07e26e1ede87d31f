// The part of TensorFlow's stable C API (tensorflow/c/tf_status.h, tf_tensor.h, ops.h, kernels.h) that the op
// library uses, declared here so that it builds without TensorFlow. These are C functions exported by
// libtensorflow_framework.so.2 (the one TensorFlow has loaded when it loads the op library); opaque types are
// only ever used through pointers, and the enum values are TensorFlow's (stable: they are on the wire).
// Nothing from kernels_experimental.h or any C++ header: those are what changes between releases.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

typedef struct TF_Status TF_Status;
typedef struct TF_Tensor TF_Tensor;
typedef struct TF_OpDefinitionBuilder TF_OpDefinitionBuilder;
typedef struct TF_ShapeInferenceContext TF_ShapeInferenceContext;
typedef struct TF_KernelBuilder TF_KernelBuilder;
typedef struct TF_OpKernelConstruction TF_OpKernelConstruction;
typedef struct TF_OpKernelContext TF_OpKernelContext;

typedef enum TF_Code {
  TF_OK = 0,
  TF_INVALID_ARGUMENT = 3,
  TF_FAILED_PRECONDITION = 9,
  TF_INTERNAL = 13,
} TF_Code;  // others by value
typedef enum TF_DataType { TF_FLOAT = 1, TF_DOUBLE = 2, TF_INT64 = 9, TF_BFLOAT16 = 14, TF_HALF = 19 } TF_DataType;

// Each function as X(return type, name, (parameters), (arguments)): declared below, and forwarded by
// framework_symbols.cpp where the library does not link TensorFlow's framework by name.
#define NPYFEED_TF_C_FUNCTIONS(X)                                                                                 \
  /* tf_status.h */                                                                                               \
  X(TF_Status*, TF_NewStatus, (void), ())                                                                         \
  X(void, TF_DeleteStatus, (TF_Status * status), (status))                                                        \
  X(void, TF_SetStatus, (TF_Status * status, TF_Code code, const char* message), (status, code, message))         \
  X(TF_Code, TF_GetCode, (const TF_Status* status), (status))                                                     \
  /* tf_tensor.h */                                                                                               \
  X(TF_Tensor*, TF_NewTensor,                                                                                     \
    (TF_DataType dtype, const int64_t* dims, int num_dims, void* data, size_t len,                                \
     void (*deallocator)(void* data, size_t len, void* arg), void* deallocator_arg),                              \
    (dtype, dims, num_dims, data, len, deallocator, deallocator_arg))                                             \
  X(void, TF_DeleteTensor, (TF_Tensor * tensor), (tensor))                                                        \
  X(void*, TF_TensorData, (const TF_Tensor* tensor), (tensor))                                                    \
  X(size_t, TF_TensorByteSize, (const TF_Tensor* tensor), (tensor))                                               \
  /* ops.h */                                                                                                     \
  X(TF_OpDefinitionBuilder*, TF_NewOpDefinitionBuilder, (const char* op_name), (op_name))                         \
  X(void, TF_OpDefinitionBuilderAddInput, (TF_OpDefinitionBuilder * builder, const char* spec), (builder, spec))  \
  X(void, TF_OpDefinitionBuilderAddOutput, (TF_OpDefinitionBuilder * builder, const char* spec), (builder, spec)) \
  X(void, TF_OpDefinitionBuilderAddAttr, (TF_OpDefinitionBuilder * builder, const char* spec), (builder, spec))   \
  X(void, TF_OpDefinitionBuilderSetShapeInferenceFunction,                                                        \
    (TF_OpDefinitionBuilder * builder, void (*func)(TF_ShapeInferenceContext * ctx, TF_Status * status)),         \
    (builder, func))                                                                                              \
  X(void, TF_RegisterOpDefinition, (TF_OpDefinitionBuilder * builder, TF_Status * status), (builder, status))     \
  X(void, TF_ShapeInferenceContextSetUnknownShape, (TF_ShapeInferenceContext * ctx, TF_Status * status),          \
    (ctx, status))                                                                                                \
  /* kernels.h */                                                                                                 \
  X(TF_KernelBuilder*, TF_NewKernelBuilder,                                                                       \
    (const char* op_name, const char* device_name, void* (*create_func)(TF_OpKernelConstruction*),                \
     void (*compute_func)(void*, TF_OpKernelContext*), void (*delete_func)(void*)),                               \
    (op_name, device_name, create_func, compute_func, delete_func))                                               \
  X(void, TF_RegisterKernelBuilder, (const char* kernel_name, TF_KernelBuilder* builder, TF_Status* status),      \
    (kernel_name, builder, status))                                                                               \
  X(void, TF_OpKernelConstruction_GetAttrType,                                                                    \
    (TF_OpKernelConstruction * ctx, const char* attr_name, TF_DataType* val, TF_Status* status),                  \
    (ctx, attr_name, val, status))                                                                                \
  X(void, TF_OpKernelConstruction_Failure, (TF_OpKernelConstruction * ctx, TF_Status * status), (ctx, status))    \
  X(void, TF_GetInput, (TF_OpKernelContext * ctx, int i, TF_Tensor** tensor, TF_Status* status),                  \
    (ctx, i, tensor, status))                                                                                     \
  X(void, TF_SetOutput, (TF_OpKernelContext * ctx, int i, const TF_Tensor* tensor, TF_Status* status),            \
    (ctx, i, tensor, status))                                                                                     \
  X(TF_Tensor*, TF_AllocateOutput,                                                                                \
    (TF_OpKernelContext * context, int index, TF_DataType dtype, const int64_t* dims, int num_dims, size_t len,   \
     TF_Status* status),                                                                                          \
    (context, index, dtype, dims, num_dims, len, status))                                                         \
  X(void, TF_OpKernelContext_Failure, (TF_OpKernelContext * ctx, TF_Status * status), (ctx, status))

#define NPYFEED_TF_DECLARE(ret, name, params, args) ret name params;
NPYFEED_TF_C_FUNCTIONS(NPYFEED_TF_DECLARE)
#undef NPYFEED_TF_DECLARE

}  // extern "C"

// Whether the functions above can be called: always where the library links TensorFlow's framework by name;
// where it looks them up when loaded instead (framework_symbols.cpp), whether every one was found.
#ifdef NPYFEED_TF_LOOKUP_FUNCTIONS
bool npyfeed_tf_functions_resolved();
#else
constexpr bool npyfeed_tf_functions_resolved() { return true; }
#endif
