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

typedef enum TF_Code { TF_OK = 0, TF_FAILED_PRECONDITION = 9, TF_INTERNAL = 13 } TF_Code;  // others by value
typedef enum TF_DataType { TF_FLOAT = 1, TF_DOUBLE = 2, TF_INT64 = 9, TF_BFLOAT16 = 14, TF_HALF = 19 } TF_DataType;

// tf_status.h
TF_Status* TF_NewStatus(void);
void TF_DeleteStatus(TF_Status* status);
void TF_SetStatus(TF_Status* status, TF_Code code, const char* message);
TF_Code TF_GetCode(const TF_Status* status);

// tf_tensor.h
TF_Tensor* TF_NewTensor(TF_DataType dtype, const int64_t* dims, int num_dims, void* data, size_t len,
                        void (*deallocator)(void* data, size_t len, void* arg), void* deallocator_arg);
void TF_DeleteTensor(TF_Tensor* tensor);
void* TF_TensorData(const TF_Tensor* tensor);
size_t TF_TensorByteSize(const TF_Tensor* tensor);

// ops.h
TF_OpDefinitionBuilder* TF_NewOpDefinitionBuilder(const char* op_name);
void TF_OpDefinitionBuilderAddInput(TF_OpDefinitionBuilder* builder, const char* input_spec);
void TF_OpDefinitionBuilderAddOutput(TF_OpDefinitionBuilder* builder, const char* output_spec);
void TF_OpDefinitionBuilderAddAttr(TF_OpDefinitionBuilder* builder, const char* attr_spec);
void TF_OpDefinitionBuilderSetShapeInferenceFunction(TF_OpDefinitionBuilder* builder,
                                                     void (*shape_inference_func)(TF_ShapeInferenceContext* ctx,
                                                                                  TF_Status* status));
void TF_RegisterOpDefinition(TF_OpDefinitionBuilder* builder, TF_Status* status);
void TF_ShapeInferenceContextSetUnknownShape(TF_ShapeInferenceContext* ctx, TF_Status* status);

// kernels.h
TF_KernelBuilder* TF_NewKernelBuilder(const char* op_name, const char* device_name,
                                      void* (*create_func)(TF_OpKernelConstruction*),
                                      void (*compute_func)(void*, TF_OpKernelContext*), void (*delete_func)(void*));
void TF_RegisterKernelBuilder(const char* kernel_name, TF_KernelBuilder* builder, TF_Status* status);
void TF_OpKernelConstruction_GetAttrType(TF_OpKernelConstruction* ctx, const char* attr_name, TF_DataType* val,
                                         TF_Status* status);
void TF_GetInput(TF_OpKernelContext* ctx, int i, TF_Tensor** tensor, TF_Status* status);
void TF_SetOutput(TF_OpKernelContext* ctx, int i, const TF_Tensor* tensor, TF_Status* status);
TF_Tensor* TF_AllocateOutput(TF_OpKernelContext* context, int index, TF_DataType dtype, const int64_t* dims,
                             int num_dims, size_t len, TF_Status* status);
void TF_OpKernelContext_Failure(TF_OpKernelContext* ctx, TF_Status* status);

}  // extern "C"
