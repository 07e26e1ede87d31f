/* An LD_PRELOAD shim that injects read faults into npyfeed (tests/test_faults.py compiles and uses it).
 *
 *   cc -shared -fPIC -O2 -o shim.so tests/faults/shim.c -ldl
 *   LD_PRELOAD=./shim.so NPYFEED_FAULT_PATH=victim NPYFEED_FAULT_MODE=eio python3 -c '...'
 *
 * It wraps open/openat (all variants) and close to remember which descriptors belong to a path containing
 * NPYFEED_FAULT_PATH ("watched"), and pread to fail some reads on them:
 *
 *   NPYFEED_FAULT_MODE        eio: fail with EIO; eintr: fail with EINTR; short: read fewer bytes;
 *                             eof: return 0 (as if the file ended there); pause: the NTH read creates
 *                             NPYFEED_FAULT_PAUSE_FILE, and the affected reads wait until someone deletes
 *                             it, then read normally;
 *                             none: only count (for NPYFEED_FAULT_REPORT).
 *   NPYFEED_FAULT_NTH         the first watched read to affect, counting from 1 (default 1)
 *   NPYFEED_FAULT_COUNT       how many watched reads from there on to affect; 0 = all (default 1)
 *   NPYFEED_FAULT_EVERY       of those, only every k-th one (default 1): eintr with EVERY=2 and COUNT=0
 *                             makes every read fail once, then succeed when retried
 *   NPYFEED_FAULT_MIN_OFFSET  only reads at or after this file offset count as watched (default 0)
 *   NPYFEED_FAULT_SHORT       short mode: at most this many bytes per read (default: half the request, >= 1)
 *   NPYFEED_FAULT_REPORT      at exit, write "reads=N faults=F max_open=M fault_offset=O" here (M: most
 *                             watched descriptors open at once; O: file offset of the last faulted read, or -1)
 *
 * Without NPYFEED_FAULT_PATH nothing is watched and the shim only passes calls through.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FDS 65536

static unsigned char g_watched[MAX_FDS];
static long g_reads, g_faults, g_open, g_max_open, g_fault_offset = -1;
static int g_pause_created, g_pause_released;

static const char* g_path;
static const char* g_mode = "none";
static long g_nth = 1, g_count = 1, g_every = 1, g_min_offset, g_short;
static const char* g_pause_file;
static const char* g_report;

static long env_long(const char* name, long fallback) {
  const char* v = getenv(name);
  return v && *v ? strtol(v, NULL, 10) : fallback;
}

__attribute__((constructor)) static void shim_init(void) {
  g_path = getenv("NPYFEED_FAULT_PATH");
  if (g_path && !*g_path) g_path = NULL;
  if (getenv("NPYFEED_FAULT_MODE")) g_mode = getenv("NPYFEED_FAULT_MODE");
  g_nth = env_long("NPYFEED_FAULT_NTH", 1);
  g_count = env_long("NPYFEED_FAULT_COUNT", 1);
  g_every = env_long("NPYFEED_FAULT_EVERY", 1);
  if (g_every < 1) g_every = 1;
  g_min_offset = env_long("NPYFEED_FAULT_MIN_OFFSET", 0);
  g_short = env_long("NPYFEED_FAULT_SHORT", 0);
  g_pause_file = getenv("NPYFEED_FAULT_PAUSE_FILE");
  g_report = getenv("NPYFEED_FAULT_REPORT");
}

__attribute__((destructor)) static void shim_report(void) {
  if (!g_report) return;
  FILE* f = fopen(g_report, "w");
  if (!f) return;
  fprintf(f, "reads=%ld faults=%ld max_open=%ld fault_offset=%ld\n", __atomic_load_n(&g_reads, __ATOMIC_SEQ_CST),
          __atomic_load_n(&g_faults, __ATOMIC_SEQ_CST), __atomic_load_n(&g_max_open, __ATOMIC_SEQ_CST),
          __atomic_load_n(&g_fault_offset, __ATOMIC_SEQ_CST));
  fclose(f);
}

static void* real(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (!f) {
    fprintf(stderr, "fault shim: no %s\n", name);
    abort();
  }
  return f;
}

static int remember(int fd, const char* path) {
  if (fd >= 0 && fd < MAX_FDS && g_path && path && strstr(path, g_path)) {
    if (!__atomic_exchange_n(&g_watched[fd], 1, __ATOMIC_SEQ_CST)) {
      long now = __atomic_add_fetch(&g_open, 1, __ATOMIC_SEQ_CST);
      long max = __atomic_load_n(&g_max_open, __ATOMIC_SEQ_CST);
      while (now > max && !__atomic_compare_exchange_n(&g_max_open, &max, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
      }
    }
  }
  return fd;
}

static void forget(int fd) {
  if (fd >= 0 && fd < MAX_FDS && __atomic_exchange_n(&g_watched[fd], 0, __ATOMIC_SEQ_CST)) {
    __atomic_sub_fetch(&g_open, 1, __ATOMIC_SEQ_CST);
  }
}

static mode_t mode_arg(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

#define WRAP_OPEN(name)                                            \
  int name(const char* path, int flags, ...) {                     \
    static int (*next)(const char*, int, ...);                     \
    if (!next) next = (int (*)(const char*, int, ...))real(#name); \
    va_list ap;                                                    \
    va_start(ap, flags);                                           \
    mode_t mode = mode_arg(flags, ap);                             \
    va_end(ap);                                                    \
    return remember(next(path, flags, mode), path);                \
  }
WRAP_OPEN(open)
WRAP_OPEN(open64)

#define WRAP_OPENAT(name)                                               \
  int name(int dirfd, const char* path, int flags, ...) {               \
    static int (*next)(int, const char*, int, ...);                     \
    if (!next) next = (int (*)(int, const char*, int, ...))real(#name); \
    va_list ap;                                                         \
    va_start(ap, flags);                                                \
    mode_t mode = mode_arg(flags, ap);                                  \
    va_end(ap);                                                         \
    return remember(next(dirfd, path, flags, mode), path);              \
  }
WRAP_OPENAT(openat)
WRAP_OPENAT(openat64)

/* What _FORTIFY_SOURCE builds call instead of open/openat. */
#define WRAP_OPEN_2(name)                                     \
  int name(const char* path, int flags) {                     \
    static int (*next)(const char*, int);                     \
    if (!next) next = (int (*)(const char*, int))real(#name); \
    return remember(next(path, flags), path);                 \
  }
WRAP_OPEN_2(__open_2)
WRAP_OPEN_2(__open64_2)

int close(int fd) {
  static int (*next)(int);
  if (!next) next = (int (*)(int))real("close");
  forget(fd);
  return next(fd);
}

static ssize_t faulty_pread(ssize_t (*next)(int, void*, size_t, off_t), int fd, void* buf, size_t count, off_t offset) {
  if (fd < 0 || fd >= MAX_FDS || !__atomic_load_n(&g_watched[fd], __ATOMIC_SEQ_CST) || offset < g_min_offset) {
    return next(fd, buf, count, offset);
  }
  long n = __atomic_add_fetch(&g_reads, 1, __ATOMIC_SEQ_CST);
  int hit =
      n >= g_nth && (g_count == 0 || n < g_nth + g_count) && (n - g_nth) % g_every == 0 && strcmp(g_mode, "none") != 0;
  if (!hit) return next(fd, buf, count, offset);
  __atomic_add_fetch(&g_faults, 1, __ATOMIC_SEQ_CST);
  __atomic_store_n(&g_fault_offset, (long)offset, __ATOMIC_SEQ_CST);
  if (strcmp(g_mode, "eio") == 0) {
    errno = EIO;
    return -1;
  }
  if (strcmp(g_mode, "eintr") == 0) {
    errno = EINTR;
    return -1;
  }
  if (strcmp(g_mode, "eof") == 0) return 0;
  if (strcmp(g_mode, "short") == 0) {
    /* Read whole 4 KiB blocks (an O_DIRECT read must stay aligned) but report only `most` bytes: to the
     * caller that is a short read, and what it reads again is the same data. */
    size_t most = g_short > 0 ? (size_t)g_short : count / 2;
    if (most == 0) most = 1;
    size_t ask = (most + 4095) / 4096 * 4096;
    ssize_t got = next(fd, buf, ask < count ? ask : count, offset);
    return got > (ssize_t)most ? (ssize_t)most : got;
  }
  if (strcmp(g_mode, "pause") == 0 && g_pause_file) {
    /* The NTH read creates the marker; it and every later affected read wait until the marker has been
     * created and deleted again, so all of them are held at this point together. */
    if (n == g_nth) {
      static int (*next_open)(const char*, int, ...);
      static int (*next_close)(int);
      if (!next_open) next_open = (int (*)(const char*, int, ...))real("open");
      if (!next_close) next_close = (int (*)(int))real("close");
      int marker = next_open(g_pause_file, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
      if (marker >= 0) next_close(marker);
      __atomic_store_n(&g_pause_created, 1, __ATOMIC_SEQ_CST);
    }
    while (!__atomic_load_n(&g_pause_released, __ATOMIC_SEQ_CST)) {
      if (__atomic_load_n(&g_pause_created, __ATOMIC_SEQ_CST) && access(g_pause_file, F_OK) != 0) {
        __atomic_store_n(&g_pause_released, 1, __ATOMIC_SEQ_CST);
      } else {
        usleep(1000);
      }
    }
  }
  return next(fd, buf, count, offset);
}

ssize_t pread(int fd, void* buf, size_t count, off_t offset) {
  static ssize_t (*next)(int, void*, size_t, off_t);
  if (!next) next = (ssize_t (*)(int, void*, size_t, off_t))real("pread");
  return faulty_pread(next, fd, buf, count, offset);
}

ssize_t pread64(int fd, void* buf, size_t count, off_t offset) {
  static ssize_t (*next)(int, void*, size_t, off_t);
  if (!next) next = (ssize_t (*)(int, void*, size_t, off_t))real("pread64");
  return faulty_pread(next, fd, buf, count, offset);
}
