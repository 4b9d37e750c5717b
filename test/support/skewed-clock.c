/*
 * A redis-server whose clock is off: preloaded (LD_PRELOAD), it shifts the wall clock by
 * SKEWED_CLOCK_OFFSET_MS and makes the wall and monotonic clocks run at SKEWED_CLOCK_RATE times
 * real time from the moment the process first reads them. Redis's TIME, its key expiry and its
 * timers all follow it. libfaketime does the same but cannot start a redis-server: its
 * initialisation calls back into jemalloc, which reads the clock (libfaketime issues #130, #327);
 * this shim calls the kernel directly and needs no initialisation beyond two getenv() calls.
 *
 * Built by test/support/skewed-clock.ts with the system's C compiler.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int ready;
static long long offset_ns;
static double rate = 1.0;
static long long base_real, base_mono;

static long long to_ns(const struct timespec *ts) {
  return ts->tv_sec * 1000000000LL + ts->tv_nsec;
}

static void init(void) {
  if (ready) return;
  const char *offset = getenv("SKEWED_CLOCK_OFFSET_MS");
  const char *speed = getenv("SKEWED_CLOCK_RATE");
  offset_ns = offset ? (long long)(atof(offset) * 1000000.0) : 0;
  rate = speed ? atof(speed) : 1.0;
  struct timespec ts;
  syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
  base_real = to_ns(&ts);
  syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
  base_mono = to_ns(&ts);
  ready = 1;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
  long rc = syscall(SYS_clock_gettime, id, ts);
  if (rc != 0) return (int)rc;
  init();
  long long base, shift = 0;
  switch (id) {
    case CLOCK_REALTIME:
    case CLOCK_REALTIME_COARSE:
      base = base_real;
      shift = offset_ns;
      break;
    case CLOCK_MONOTONIC:
    case CLOCK_MONOTONIC_COARSE:
    case CLOCK_MONOTONIC_RAW:
    case CLOCK_BOOTTIME:
      base = base_mono;
      break;
    default:
      return 0;
  }
  long long t = base + (long long)((double)(to_ns(ts) - base) * rate) + shift;
  ts->tv_sec = t / 1000000000LL;
  ts->tv_nsec = t % 1000000000LL;
  return 0;
}

int gettimeofday(struct timeval *tv, void *tz) {
  (void)tz;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tv->tv_sec = ts.tv_sec;
  tv->tv_usec = ts.tv_nsec / 1000;
  return 0;
}

time_t time(time_t *out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out) *out = ts.tv_sec;
  return ts.tv_sec;
}
