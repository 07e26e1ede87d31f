// npyfeed's TensorFlow ops, registered through TensorFlow's stable C API only (tf_c_api.h), so that one binary
// loads in every TensorFlow from 2.15 on. The ops read feeds that _core owns, through the C ABI of
// npyfeed/tf/tf_feed_abi.h (this library links no copy of the core): npyfeed.tf passes the table's address to
// npyfeed_tf_ops_init() once, after tf.load_op_library, and each op gets the feed's id as an input.
//
//   NpyfeedTake(feed, epoch, batch) -> x, y      batch b of epoch e; the tensors adopt npyfeed's aligned
//                                                buffers (no copy), given back when TensorFlow lets go
//   NpyfeedNextPass(feed, pass) -> epoch, batch  where a new pass starts: its epoch and first batch (`pass` is
//                                                the pass's dataset element: an input that keeps the call
//                                                from being folded)
//   NpyfeedSeenEpoch(feed, epoch) -> epoch       a pass restored at `epoch`: the next pass comes after it
//   NpyfeedStartRows(feed, epoch, batch)         gather="device", resident: that batch's start rows into the
//     -> start, lo, hi, label                    arrays on the device, int64 [B] each
//   NpyfeedNumGroups(feed, epoch) -> count       gather="device", streamed: the epoch's groups of batches
//   NpyfeedGroup(feed, epoch, group)             and one group: its arrays in the storage type T (adopted, no
//     -> factors, labels, start, lo, hi, label,  copy), its samples' start rows, and the end of each of its
//        batch_ends                              batches in them (the core's batch sizes), int64 [batches]
//
// Errors are TensorFlow errors with npyfeed's message (naming the file, index line, key). A stale id (the
// dataset is gone) fails with FAILED_PRECONDITION. No kernel calls Python, so none holds up interpreter exit.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "npyfeed/tf/tf_feed_abi.h"
#include "tf_c_api.h"

namespace {

std::atomic<const NpyfeedTfFeedApi*> g_api{nullptr};

/// A TF_Status for one call.
class Status {
 public:
  Status() : status_(TF_NewStatus()) {}
  ~Status() { TF_DeleteStatus(status_); }
  Status(const Status&) = delete;
  Status& operator=(const Status&) = delete;
  TF_Status* get() const { return status_; }
  bool ok() const { return TF_GetCode(status_) == TF_OK; }

 private:
  TF_Status* status_;
};

void fail(TF_OpKernelContext* ctx, int code, const char* message) {
  Status status;
  TF_SetStatus(status.get(), static_cast<TF_Code>(code), message);
  TF_OpKernelContext_Failure(ctx, status.get());
}

const NpyfeedTfFeedApi* api_or_fail(TF_OpKernelContext* ctx) {
  const NpyfeedTfFeedApi* api = g_api.load(std::memory_order_acquire);
  if (api == nullptr) {
    fail(ctx, TF_FAILED_PRECONDITION, "npyfeed.tf: the op library was loaded without npyfeed_tf_ops_init()");
  }
  return api;
}

/// Scalar int64 inputs [0, n). False (and the kernel failed) if one cannot be read.
bool scalar_inputs(TF_OpKernelContext* ctx, int n, int64_t* out) {
  for (int i = 0; i < n; ++i) {
    Status status;
    TF_Tensor* t = nullptr;
    TF_GetInput(ctx, i, &t, status.get());
    if (!status.ok() || TF_TensorByteSize(t) != sizeof(int64_t)) {
      if (t != nullptr) TF_DeleteTensor(t);
      fail(ctx, TF_INTERNAL, "npyfeed.tf: expected a scalar int64 input");
      return false;
    }
    std::memcpy(&out[i], TF_TensorData(t), sizeof(int64_t));
    TF_DeleteTensor(t);
  }
  return true;
}

// The feed table and an op's `n` scalar inputs (the feed's id first, then positions, which must not be negative:
// `positions` names them in the message). Null, and the kernel failed, otherwise.
const NpyfeedTfFeedApi* begin_call(TF_OpKernelContext* ctx, int n, int64_t* in, const char* positions) {
  const NpyfeedTfFeedApi* api = api_or_fail(ctx);
  if (api == nullptr || !scalar_inputs(ctx, n, in)) return nullptr;
  for (int i = 1; i < n; ++i) {
    if (in[i] < 0) {
      fail(ctx, TF_INVALID_ARGUMENT, (std::string("npyfeed.tf: ") + positions + " must not be negative").c_str());
      return nullptr;
    }
  }
  return api;
}

void release(void*, size_t, void* owner) { g_api.load(std::memory_order_acquire)->release(owner); }

// Hands `data` (owned by `owner`) to output `index` without a copy; the tensor gives `owner` back when it dies.
bool set_adopted_output(TF_OpKernelContext* ctx, int index, TF_DataType dtype, const int64_t* dims, int rank,
                        void* data, size_t bytes, void* owner) {
  TF_Tensor* t = TF_NewTensor(dtype, dims, rank, data, bytes, release, owner);  // owns `owner` from here on
  if (t == nullptr) {
    fail(ctx, TF_INTERNAL, "npyfeed.tf: TF_NewTensor failed");
    return false;
  }
  Status status;
  TF_SetOutput(ctx, index, t, status.get());
  TF_DeleteTensor(t);
  if (!status.ok()) TF_OpKernelContext_Failure(ctx, status.get());
  return status.ok();
}

// ---- NpyfeedTake

struct TakeKernel {
  TF_DataType dtype;
};

void* create_take(TF_OpKernelConstruction* ctx) {
  auto* kernel = new TakeKernel{TF_FLOAT};
  Status status;
  TF_OpKernelConstruction_GetAttrType(ctx, "T", &kernel->dtype, status.get());
  if (!status.ok()) TF_OpKernelConstruction_Failure(ctx, status.get());  // TensorFlow drops the kernel
  return kernel;
}

void compute_take(void* k, TF_OpKernelContext* ctx) {
  const TF_DataType dtype = static_cast<TakeKernel*>(k)->dtype;
  int64_t in[3];
  const NpyfeedTfFeedApi* api = begin_call(ctx, 3, in, "epoch and batch");
  if (api == nullptr) return;
  NpyfeedTfBatch b;
  if (int code = api->take(in[0], static_cast<uint64_t>(in[1]), static_cast<uint64_t>(in[2]), &b); code != 0) {
    return fail(ctx, code, api->last_error());
  }
  if (b.item_size != (dtype == TF_FLOAT ? 4 : 8)) {
    api->release(b.x_owner);
    api->release(b.y_owner);
    return fail(ctx, TF_INVALID_ARGUMENT, "npyfeed.tf: the op's dtype is not the feed's");
  }
  void* y_owner = b.y_owner;
  if (!set_adopted_output(ctx, 0, dtype, b.x_dims, b.x_rank, b.x, b.x_bytes, b.x_owner)) {
    api->release(y_owner);
    return;
  }
  set_adopted_output(ctx, 1, dtype, b.y_dims, b.y_rank, b.y, b.y_bytes, y_owner);
}

// ---- NpyfeedNextPass, NpyfeedSeenEpoch

void* create_plain(TF_OpKernelConstruction*) { return nullptr; }
void delete_plain(void*) {}

bool set_scalar_output(TF_OpKernelContext* ctx, int64_t value, int index = 0) {
  Status status;
  TF_Tensor* t = TF_AllocateOutput(ctx, index, TF_INT64, nullptr, 0, sizeof(int64_t), status.get());
  if (status.ok()) std::memcpy(TF_TensorData(t), &value, sizeof(value));
  if (t != nullptr) TF_DeleteTensor(t);
  if (!status.ok()) TF_OpKernelContext_Failure(ctx, status.get());
  return status.ok();
}

void compute_next_pass(void*, TF_OpKernelContext* ctx) {
  int64_t in[2];
  const NpyfeedTfFeedApi* api = api_or_fail(ctx);
  if (api == nullptr || !scalar_inputs(ctx, 2, in)) return;
  int64_t epoch = 0;
  int64_t batch = 0;
  if (int code = api->next_pass(in[0], &epoch, &batch); code != 0) return fail(ctx, code, api->last_error());
  if (set_scalar_output(ctx, epoch, 0)) set_scalar_output(ctx, batch, 1);
}

void compute_seen_epoch(void*, TF_OpKernelContext* ctx) {
  int64_t in[2];
  const NpyfeedTfFeedApi* api = api_or_fail(ctx);
  if (api == nullptr || !scalar_inputs(ctx, 2, in)) return;
  if (int code = api->seen_epoch(in[0], in[1]); code != 0) return fail(ctx, code, api->last_error());
  set_scalar_output(ctx, in[1]);
}

// ---- NpyfeedStartRows, NpyfeedNumGroups, NpyfeedGroup (gather="device")

// Output `index`: `count` int64 values, copied into a TensorFlow tensor of its own.
bool set_int64_output(TF_OpKernelContext* ctx, int index, const int64_t* values, size_t count) {
  const int64_t dims[1] = {static_cast<int64_t>(count)};
  Status status;
  TF_Tensor* t = TF_AllocateOutput(ctx, index, TF_INT64, dims, 1, count * sizeof(int64_t), status.get());
  if (status.ok() && count > 0) std::memcpy(TF_TensorData(t), values, count * sizeof(int64_t));
  if (t != nullptr) TF_DeleteTensor(t);
  if (!status.ok()) TF_OpKernelContext_Failure(ctx, status.get());
  return status.ok();
}

// Outputs [first, first + 4): the start rows, copied into TensorFlow's own tensors (32 bytes a sample).
bool set_start_rows(TF_OpKernelContext* ctx, int first, const NpyfeedTfRows& rows) {
  const int64_t* parts[4] = {rows.start, rows.lo, rows.hi, rows.label};
  for (int i = 0; i < 4; ++i) {
    if (!set_int64_output(ctx, first + i, parts[i], rows.count)) return false;
  }
  return true;
}

void compute_start_rows(void*, TF_OpKernelContext* ctx) {
  int64_t in[3];
  const NpyfeedTfFeedApi* api = begin_call(ctx, 3, in, "epoch and batch");
  if (api == nullptr) return;
  NpyfeedTfRows rows;
  if (int code = api->start_rows(in[0], static_cast<uint64_t>(in[1]), static_cast<uint64_t>(in[2]), &rows); code != 0) {
    return fail(ctx, code, api->last_error());
  }
  set_start_rows(ctx, 0, rows);
  api->release(rows.owner);
}

void compute_num_groups(void*, TF_OpKernelContext* ctx) {
  int64_t in[2];
  const NpyfeedTfFeedApi* api = begin_call(ctx, 2, in, "the epoch");
  if (api == nullptr) return;
  int64_t count = 0;
  if (int code = api->num_groups(in[0], static_cast<uint64_t>(in[1]), &count); code != 0) {
    return fail(ctx, code, api->last_error());
  }
  set_scalar_output(ctx, count);
}

// The storage type of a group (NpyfeedTfGroup::storage) as TensorFlow's.
TF_DataType storage_dtype(int32_t storage) {
  static const TF_DataType kTypes[] = {TF_HALF, TF_BFLOAT16, TF_FLOAT, TF_DOUBLE};
  return storage >= 0 && storage < 4 ? kTypes[storage] : static_cast<TF_DataType>(0);
}

void compute_group(void* k, TF_OpKernelContext* ctx) {
  const TF_DataType dtype = static_cast<TakeKernel*>(k)->dtype;
  int64_t in[3];
  const NpyfeedTfFeedApi* api = begin_call(ctx, 3, in, "epoch and group");
  if (api == nullptr) return;
  NpyfeedTfGroup g;
  if (int code = api->group(in[0], static_cast<uint64_t>(in[1]), static_cast<uint64_t>(in[2]), &g); code != 0) {
    return fail(ctx, code, api->last_error());
  }
  void* labels_owner = g.labels_owner;
  const bool ok = storage_dtype(g.storage) == dtype;
  const size_t item = dtype == TF_DOUBLE ? 8 : dtype == TF_FLOAT ? 4 : 2;
  const int64_t factor_dims[2] = {g.factor_rows, g.factor_elems};
  const int64_t label_dims[2] = {g.label_rows, g.label_elems};
  if (!ok) {
    api->release(g.factors_owner);
    api->release(labels_owner);
    fail(ctx, TF_INVALID_ARGUMENT, "npyfeed.tf: the op's dtype is not the feed's storage type");
  } else if (!set_adopted_output(ctx, 0, dtype, factor_dims, 2, g.factors,
                                 static_cast<size_t>(g.factor_rows * g.factor_elems) * item, g.factors_owner)) {
    api->release(labels_owner);
  } else if (set_adopted_output(ctx, 1, dtype, label_dims, 2, g.labels,
                                static_cast<size_t>(g.label_rows * g.label_elems) * item, labels_owner) &&
             set_start_rows(ctx, 2, g.rows)) {
    set_int64_output(ctx, 6, g.batch_ends, g.num_batches);
  }
  api->release(g.rows.owner);
  api->release(g.batch_ends_owner);
}

// ---- Registration

void unknown_shape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeInferenceContextSetUnknownShape(ctx, status);
}

struct OpSpec {
  const char* name;
  const char* inputs[3];
  const char* outputs[7];
  const char* attr;
  void* (*create)(TF_OpKernelConstruction*);
  void (*compute)(void*, TF_OpKernelContext*);
  void (*destroy)(void*);
};

void delete_take(void* k) { delete static_cast<TakeKernel*>(k); }

// Not stateful: a checkpoint of the pipeline (symbolic, positions only) must not refuse the ops as external
// state. Every op has an input that comes from the dataset, so none can be folded into a constant.
const OpSpec kOps[] = {
    {"NpyfeedTake",
     {"feed: int64", "epoch: int64", "batch: int64"},
     {"x: T", "y: T"},
     "T: {float, double}",
     create_take,
     compute_take,
     delete_take},
    {"NpyfeedNextPass",
     {"feed: int64", "pass: int64", nullptr},
     {"epoch: int64", "batch: int64"},
     nullptr,
     create_plain,
     compute_next_pass,
     delete_plain},
    {"NpyfeedSeenEpoch",
     {"feed: int64", "epoch: int64", nullptr},
     {"out: int64", nullptr},
     nullptr,
     create_plain,
     compute_seen_epoch,
     delete_plain},
    {"NpyfeedStartRows",
     {"feed: int64", "epoch: int64", "batch: int64"},
     {"start: int64", "lo: int64", "hi: int64", "label: int64"},
     nullptr,
     create_plain,
     compute_start_rows,
     delete_plain},
    {"NpyfeedNumGroups",
     {"feed: int64", "epoch: int64", nullptr},
     {"count: int64"},
     nullptr,
     create_plain,
     compute_num_groups,
     delete_plain},
    {"NpyfeedGroup",
     {"feed: int64", "epoch: int64", "group: int64"},
     {"factors: T", "labels: T", "start: int64", "lo: int64", "hi: int64", "label: int64", "batch_ends: int64"},
     "T: {half, bfloat16, float, double}",
     create_take,
     compute_group,
     delete_take},
};

// Failures here cannot be raised: they leave the op unregistered, and using it says so.
[[maybe_unused]] const bool kRegistered = [] {
  if (!npyfeed_tf_functions_resolved()) return false;
  for (const OpSpec& op : kOps) {
    TF_OpDefinitionBuilder* builder = TF_NewOpDefinitionBuilder(op.name);
    for (const char* input : op.inputs) {
      if (input != nullptr) TF_OpDefinitionBuilderAddInput(builder, input);
    }
    for (const char* output : op.outputs) {
      if (output != nullptr) TF_OpDefinitionBuilderAddOutput(builder, output);
    }
    if (op.attr != nullptr) TF_OpDefinitionBuilderAddAttr(builder, op.attr);
    TF_OpDefinitionBuilderSetShapeInferenceFunction(builder, unknown_shape);
    Status status;
    TF_RegisterOpDefinition(builder, status.get());
    if (!status.ok()) continue;
    TF_KernelBuilder* kernel = TF_NewKernelBuilder(op.name, "CPU", op.create, op.compute, op.destroy);
    TF_RegisterKernelBuilder(op.name, kernel, status.get());
  }
  return true;
}();

}  // namespace

/// Gives the op library _core's feed table (npyfeed/tf/tf_feed_abi.h). Returns 0, or -1 if the table's version or
/// size is not this library's (a _core from another build), or -2 if TensorFlow's C functions were not found (so no
/// op is registered). Called once; later calls must pass the same table.
extern "C" __attribute__((visibility("default"))) int npyfeed_tf_ops_init(const void* table) {
  if (!npyfeed_tf_functions_resolved()) return -2;
  const auto* api = static_cast<const NpyfeedTfFeedApi*>(table);
  if (api == nullptr || api->abi_version != NPYFEED_TF_FEED_ABI_VERSION ||
      api->struct_size < sizeof(NpyfeedTfFeedApi)) {
    return -1;
  }
  g_api.store(api, std::memory_order_release);
  return 0;
}
