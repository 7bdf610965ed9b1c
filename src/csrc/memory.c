/* Memory for arrays the Python layer allocates.
 * - Huge pages under a large new output before its first touch, as NumPy gives its own
 *   arrays (torch's allocator does not, and a 64 MiB output then takes 16384 page
 *   faults instead of 32).
 * - Blocks for new outputs of GDN_REUSE_MIN_BYTES or more, handed back to a small cache
 *   when the array that used one is freed, so that the next call's output reuses memory
 *   that is already mapped: a new 64 MiB output from malloc is mapped afresh each call
 *   and the kernel's first stores fault it in, zeroed by the OS (D=8192 4x1024 prefill,
 *   two threads, 2-core Xeon: 16.2 ms with a new out, 6.1 ms with a given one), and so
 *   is a new 8 MiB torch tensor in a fresh process (~515 page faults and 3-15 ms a call
 *   against 0.8 ms for the NumPy call, whose block malloc reused). */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE 1   /* MAP_ANONYMOUS under a strict -std=c99 */
#endif
#include "memory.h"

#include <stddef.h>

#if defined(__linux__)
#include <pthread.h>
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

#if defined(__linux__)

#define GDN_BLOCK_SLOTS 8

/* The cached blocks, oldest first, under the lock. */
static struct { void *p; int64_t size; } cached[GDN_BLOCK_SLOTS];
static int ncached;
static int64_t held, limit = GDN_BLOCK_CACHE_DEFAULT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* A fork while another thread holds the lock would leave it held in the child: the
 * lock is taken around fork() and released on both sides. */
static void lock_for_fork(void) { pthread_mutex_lock(&lock); }
static void unlock_after_fork(void) { pthread_mutex_unlock(&lock); }
static void arm_fork_lock(void) { pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork); }
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void take_lock(void) {
    pthread_once(&fork_once, arm_fork_lock);
    pthread_mutex_lock(&lock);
}

/* An anonymous mapping of `size` bytes (a multiple of GDN_BLOCK_ALIGN) aligned to
 * GDN_BLOCK_ALIGN, so that huge pages can back all of it. */
static void *map_block(int64_t size, int huge) {
    const size_t span = (size_t)size + GDN_BLOCK_ALIGN;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)raw + GDN_BLOCK_ALIGN - 1) / GDN_BLOCK_ALIGN * GDN_BLOCK_ALIGN);
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + span > p + size) munmap(p + size, (size_t)(raw + span - (p + size)));
#if defined(MADV_HUGEPAGE)
    if (huge) (void)madvise(p, (size_t)size, MADV_HUGEPAGE);
#else
    (void)huge;
#endif
    return p;
}

/* Unmap cached blocks, oldest first, until the cache holds no more than `keep` bytes
 * in no more than `slots` blocks. Under the lock. */
static void trim(int64_t keep, int slots) {
    int drop = 0;
    while (drop < ncached && (held > keep || ncached - drop > slots)) {
        munmap(cached[drop].p, (size_t)cached[drop].size);
        held -= cached[drop].size;
        drop++;
    }
    for (int i = drop; i < ncached; i++) cached[i - drop] = cached[i];
    ncached -= drop;
}

void *gdn_block_take(int64_t bytes, int huge, int64_t *size) {
    if (bytes < GDN_REUSE_MIN_BYTES) return NULL;
    const int64_t want = (bytes + GDN_BLOCK_ALIGN - 1) / GDN_BLOCK_ALIGN * GDN_BLOCK_ALIGN;
    take_lock();
    if (limit <= 0) {
        pthread_mutex_unlock(&lock);
        return NULL;
    }
    int best = -1;
    for (int i = 0; i < ncached; i++)
        if (cached[i].size >= want && cached[i].size <= 2 * want && (best < 0 || cached[i].size < cached[best].size))
            best = i;
    if (best >= 0) {
        void *p = cached[best].p;
        *size = cached[best].size;
        held -= *size;
        for (int i = best + 1; i < ncached; i++) cached[i - 1] = cached[i];
        ncached--;
        pthread_mutex_unlock(&lock);
#if defined(MADV_HUGEPAGE)
        if (huge) (void)madvise(p, (size_t)*size, MADV_HUGEPAGE);   /* (mapped without, when NumPy's switch was off) */
#endif
        return p;
    }
    pthread_mutex_unlock(&lock);
    void *p = map_block(want, huge);
    if (p != NULL) *size = want;
    return p;
}

void gdn_block_give(void *p, int64_t size) {
    take_lock();
    if (size <= limit) {
        trim(limit - size, GDN_BLOCK_SLOTS - 1);
        cached[ncached].p = p;
        cached[ncached].size = size;
        ncached++;
        held += size;
        p = NULL;
    }
    pthread_mutex_unlock(&lock);
    if (p != NULL) munmap(p, (size_t)size);
}

int64_t gdn_block_cache_limit(int64_t bytes) {
    take_lock();
    const int64_t previous = limit;
    limit = bytes > 0 ? bytes : 0;
    trim(limit, GDN_BLOCK_SLOTS);
    pthread_mutex_unlock(&lock);
    return previous;
}

int64_t gdn_block_cache_held(void) {
    take_lock();
    const int64_t h = held;
    pthread_mutex_unlock(&lock);
    return h;
}

#else   /* no reuse: callers allocate as usual */

static int64_t limit = GDN_BLOCK_CACHE_DEFAULT;

void *gdn_block_take(int64_t bytes, int huge, int64_t *size) {
    (void)bytes, (void)huge, (void)size;
    return NULL;
}

void gdn_block_give(void *p, int64_t size) { (void)p, (void)size; }

int64_t gdn_block_cache_limit(int64_t bytes) {
    const int64_t previous = limit;
    limit = bytes > 0 ? bytes : 0;
    return previous;
}

int64_t gdn_block_cache_held(void) { return 0; }

#endif
