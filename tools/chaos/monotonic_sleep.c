/* Preloaded before Debian's libfaketime 0.9.10 for a node under a skewed wall clock.
 *
 * With FAKETIME_DONT_FAKE_MONOTONIC=1, libfaketime 0.9.10's clock_nanosleep() still rewrites
 * an absolute CLOCK_MONOTONIC deadline as if it were a faked one, and the kernel refuses the
 * result: Python 3.11+'s time.sleep(), which sleeps that way, fails with EINVAL (libfaketime
 * issue 426, fixed upstream after 0.9.10). A monotonic deadline needs no faking at all, so
 * this hands every clock but CLOCK_REALTIME straight to the kernel and the rest to the next
 * clock_nanosleep in line (libfaketime's).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/syscall.h>
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
