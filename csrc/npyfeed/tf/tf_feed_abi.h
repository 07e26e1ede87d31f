/* The C ABI between _core and the TensorFlow op library (_tf_ops.so): a versioned table of functions that
 * _core fills and the op library calls, so that the op library holds no copy of the core (one thread pool, one
 * set of feeds). Plain C: the two sides may be built by different compilers or at different times.
 *
 * Feeds: _core keeps a registry of feeds by id (int64, never reused in a process). Python registers a feed when
 * it builds a pipeline and unregisters it when the dataset (or the graph that captured it) is gone; the id is
 * all a TensorFlow graph holds. A call with an id that is no longer registered fails (FAILED_PRECONDITION),
 * it never reaches freed memory: a call in flight holds the feed itself until it returns.
 *
 * Errors: every function returns a TF_Code value (0 = OK, 1 CANCELLED, 3 INVALID_ARGUMENT, 5 NOT_FOUND,
 * 9 FAILED_PRECONDITION, 2 UNKNOWN, ...); the message of the last failure on the calling thread is last_error().
 */
#ifndef NPYFEED_TF_FEED_ABI_H_
#define NPYFEED_TF_FEED_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NPYFEED_TF_FEED_ABI_VERSION 5
#define NPYFEED_TF_MAX_DIMS 32 /* numpy's limit on dimensions (NPY_MAXDIMS) */

/* A batch: x and y are 64-byte aligned and owned by `owner` until release(owner). dims include the batch
 * dimension (count). */
typedef struct NpyfeedTfBatch {
  void* x;
  void* y;
  size_t x_bytes;
  size_t y_bytes;
  int32_t item_size; /* 4: float32, 8: float64 */
  int32_t x_rank;
  int32_t y_rank;
  int64_t x_dims[NPYFEED_TF_MAX_DIMS];
  int64_t y_dims[NPYFEED_TF_MAX_DIMS];
  void* x_owner;
  void* y_owner;
} NpyfeedTfBatch;

/* gather="device": the start rows of `count` samples (device_rows.hpp: window row j of sample i is factor row
 * start[i] + j where lo[i] <= j < hi[i], the zero row elsewhere; its label is label row label[i]), owned by
 * `owner` until release(owner). */
typedef struct NpyfeedTfRows {
  const int64_t* start;
  const int64_t* lo;
  const int64_t* hi;
  const int64_t* label;
  size_t count;
  void* owner;
} NpyfeedTfRows;

/* gather="device", streamed: a group's upload, (rows, elems) arrays of the feed's storage type (64-byte aligned,
 * zero row last, each owned by its owner until release), its samples' start rows, and where each of its batches
 * ends in them: batch i is samples [batch_ends[i - 1] (0 for the first), batch_ends[i]) of `rows`, `num_batches`
 * of them, owned by `batch_ends_owner` until release. */
typedef struct NpyfeedTfGroup {
  void* factors;
  void* labels;
  int64_t factor_rows;
  int64_t factor_elems;
  int64_t label_rows;
  int64_t label_elems;
  int32_t storage; /* 0 float16, 1 bfloat16, 2 float32, 3 float64 */
  void* factors_owner;
  void* labels_owner;
  NpyfeedTfRows rows;
  const int64_t* batch_ends;
  size_t num_batches;
  void* batch_ends_owner;
} NpyfeedTfGroup;

typedef struct NpyfeedTfFeedApi {
  uint32_t abi_version; /* NPYFEED_TF_FEED_ABI_VERSION */
  uint32_t struct_size; /* sizeof(NpyfeedTfFeedApi) */
  /* Batch `batch` of epoch `epoch` of feed `feed`, complete. On OK, *out holds two owners to release. */
  int (*take)(int64_t feed, uint64_t epoch, uint64_t batch, NpyfeedTfBatch* out);
  /* Where the feed's next pass starts: *epoch and its first batch *batch (each call starts a new pass). */
  int (*next_pass)(int64_t feed, int64_t* epoch, int64_t* batch);
  /* A pass of epoch `epoch` was seen (a restored iterator): the next pass comes after it. */
  int (*seen_epoch)(int64_t feed, int64_t epoch);
  /* Gives back an owner from take(): the buffer returns to its pool once nothing else holds it. */
  void (*release)(void* owner);
  /* The message of the last failure on this thread (valid until the next call on it). */
  const char* (*last_error)(void);
  /* gather="device" (a feed made with device rows; FAILED_PRECONDITION otherwise): the start rows of batch
   * `batch` of epoch `epoch` (resident); the number of groups of epoch `epoch`, and group `index` (streamed). */
  int (*start_rows)(int64_t feed, uint64_t epoch, uint64_t batch, NpyfeedTfRows* out);
  int (*num_groups)(int64_t feed, uint64_t epoch, int64_t* out);
  int (*group)(int64_t feed, uint64_t epoch, uint64_t index, NpyfeedTfGroup* out);
} NpyfeedTfFeedApi;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NPYFEED_TF_FEED_ABI_H_ */
