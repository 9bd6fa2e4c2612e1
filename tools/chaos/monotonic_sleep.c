/* Preloaded before Debian's libfaketime 0.9.10 for a node under a skewed wall clock.
 *
 * With FAKETIME_DONT_FAKE_MONOTONIC=1, libfaketime 0.9.10's clock_nanosleep() still rewrites
 * an absolute CLOCK_MONOTONIC deadline as if it were a faked one, and the kernel refuses the
 * result: Python 3.11+'s time.sleep(), which sleeps that way, fails with EINVAL (libfaketime
 * issue 426, fixed upstream after 0.9.10). A monotonic deadline needs no faking at all, so
 * this hands every clock but CLOCK_REALTIME straight to the kernel and the rest to the next
 * clock_nanosleep in line (libfaketime's).
 *
 * librdkafka waits on C11 condition variables (glibc's cnd_timedwait), whose deadline is a
 * CLOCK_REALTIME instant it computes from the faked wall clock; libfaketime wraps
 * pthread_cond_timedwait but not cnd_timedwait, so the kernel waited for that instant by the
 * true clock: every timed wait of a node running 5 s ahead took 5 s longer (a Producer's
 * poll(1.0) took 6 s), and its appends, retries and rebalances crawled through a broker fault,
 * which a machine whose whole clock is ahead never sees. The deadline is moved back by the
 * offset, so the wait is as long as it was asked to be.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/syscall.h>
#include <threads.h>
#include <time.h>
#include <unistd.h>

int clock_nanosleep(clockid_t id, int flags, const struct timespec *req, struct timespec *rem) {
    static int (*next)(clockid_t, int, const struct timespec *, struct timespec *);
    if (id != CLOCK_REALTIME) {
        /* clock_nanosleep returns the error number itself, not -1 and errno */
        return syscall(SYS_clock_nanosleep, id, flags, req, rem) == 0 ? 0 : errno;
    }
    if (next == NULL) {
        next = (int (*)(clockid_t, int, const struct timespec *, struct timespec *))dlsym(
            RTLD_NEXT, "clock_nanosleep");
    }
    return next(id, flags, req, rem);
}

int cnd_timedwait(cnd_t *restrict cond, mtx_t *restrict mtx, const struct timespec *restrict at) {
    static int (*next)(cnd_t *, mtx_t *, const struct timespec *);
    if (next == NULL) {
        next = (int (*)(cnd_t *, mtx_t *, const struct timespec *))dlsym(RTLD_NEXT, "cnd_timedwait");
    }
    struct timespec faked, real, moved;
    clock_gettime(CLOCK_REALTIME, &faked);             /* libfaketime's: the skewed wall clock */
    syscall(SYS_clock_gettime, CLOCK_REALTIME, &real); /* the kernel's */
    long long offset = (long long)(faked.tv_sec - real.tv_sec) * 1000000000LL +
                       (faked.tv_nsec - real.tv_nsec);
    long long deadline = (long long)at->tv_sec * 1000000000LL + at->tv_nsec - offset;
    if (deadline < 0) {
        deadline = 0;
    }
    moved.tv_sec = deadline / 1000000000LL;
    moved.tv_nsec = deadline % 1000000000LL;
    return next(cond, mtx, &moved);
}
