/* Memory advice for arrays the Python layer allocates: huge pages under a large new
 * output before its first touch, as NumPy gives its own arrays (torch's allocator
 * does not, and a 64 MiB output then takes 16384 page faults instead of 32). */
#include "memory.h"

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

void gdn_advise_huge_pages(void *p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || bytes < GDN_HUGE_ADVICE_BYTES) return;
    const uintptr_t lo = ((uintptr_t)p + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    const uintptr_t hi = ((uintptr_t)p + (uintptr_t)bytes) / (uintptr_t)page * (uintptr_t)page;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p, (void)bytes;
#endif
}
