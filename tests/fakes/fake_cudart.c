/* A stand-in for the CUDA runtime's host-memory registration (libcudart), for tests/test_pin_memory.py: it
 * keeps the registered ranges and counts misuse the real runtime would refuse or that would corrupt memory
 * (a page registered twice, a range not page-aligned or not portable, an unregister of memory never registered
 * or already unmapped). Built by the test with the system C compiler. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_RANGES 4096

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t starts[MAX_RANGES];
static size_t sizes[MAX_RANGES];
static int live, registers, unregisters, errors, fail_with, fail_set_device, device_at_register = -1;
static __thread int current_device = 0;

int cudaGetDevice(int* device) {
  *device = current_device;
  return 0;
}

int cudaSetDevice(int device) {
  pthread_mutex_lock(&lock);
  int error = fail_set_device;
  pthread_mutex_unlock(&lock);
  if (error) return error;
  current_device = device;
  return 0;
}

int cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  uintptr_t start = (uintptr_t)ptr, page = (uintptr_t)sysconf(_SC_PAGESIZE);
  int i;
  pthread_mutex_lock(&lock);
  if (fail_with) {
    int error = fail_with;
    pthread_mutex_unlock(&lock);
    return error;
  }
  if (start % page != 0 || flags != 1 || size == 0 || live == MAX_RANGES) errors++;
  for (i = 0; i < live; i++) {
    if (start / page <= (starts[i] + sizes[i] - 1) / page && starts[i] / page <= (start + size - 1) / page) errors++;
  }
  if (live < MAX_RANGES) {
    starts[live] = start;
    sizes[live] = size;
    live++;
  }
  registers++;
  device_at_register = current_device;
  pthread_mutex_unlock(&lock);
  return 0;
}

int cudaHostUnregister(void* ptr) {
  unsigned char resident;
  int i;
  pthread_mutex_lock(&lock);
  for (i = 0; i < live; i++) {
    if (starts[i] == (uintptr_t)ptr) break;
  }
  if (i == live || mincore(ptr, 1, &resident) != 0) {
    errors++;
    pthread_mutex_unlock(&lock);
    return 1;
  }
  starts[i] = starts[live - 1];
  sizes[i] = sizes[live - 1];
  live--;
  unregisters++;
  pthread_mutex_unlock(&lock);
  return 0;
}

const char* cudaGetErrorString(int error) {
  return error == 2 ? "out of memory" : error == 35 ? "CUDA driver version is insufficient" : "unknown error";
}

/* The test's view: live ranges, registers, unregisters, errors, the device current at the last register. */
void fake_counts(int* out) {
  pthread_mutex_lock(&lock);
  out[0] = live;
  out[1] = registers;
  out[2] = unregisters;
  out[3] = errors;
  out[4] = device_at_register;
  pthread_mutex_unlock(&lock);
}

void fake_fail_set_device(int error) {
  pthread_mutex_lock(&lock);
  fail_set_device = error;
  pthread_mutex_unlock(&lock);
}

void fake_fail_with(int error) {
  pthread_mutex_lock(&lock);
  fail_with = error;
  pthread_mutex_unlock(&lock);
}
