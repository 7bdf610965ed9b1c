/* Threads: the OpenMP loop, its size threshold, the fork guard, per-thread scratch. */
#include <stdlib.h>

#include "threads.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <unistd.h>
#define GDN_HAVE_FORK 1
#endif

/* Below this many bytes a call runs on the calling thread: a second thread gained
 * 0.96x at 84 kB, 1.14x at 168 kB and 1.29x at 336 kB (B=1, T=4, bf16, D = 2048,
 * 4096, 8192), against its cost when another process holds the other core (measured
 * with benchmarks/bench_threshold.py on a 2-core Zen 5). */
static int64_t parallel_min_bytes = 256 * 1024;

int64_t gdn_set_parallel_min_bytes(int64_t bytes) {
    const int64_t previous = parallel_min_bytes;
    parallel_min_bytes = bytes;
    return previous;
}

/* A forked child runs every call on its calling thread. GNU OpenMP cannot run a
 * parallel region in a child of a process that had started its pool (the child
 * waits forever for the parent's threads), and the pool is shared with every other
 * user of the same libgomp (torch's), so whether it was started is not knowable
 * here. pthread_atfork sees every fork() through libc (os.fork, multiprocessing,
 * C code); the pid check, made only before a parallel region, sees a raw clone(). */
static int in_forked_child;
#ifdef GDN_HAVE_FORK
static pid_t guard_pid;
static void mark_forked_child(void) { in_forked_child = 1; }
#endif

void gdn_fork_guard_init(void) {
#ifdef GDN_HAVE_FORK
    guard_pid = getpid();
    pthread_atfork(NULL, NULL, mark_forked_child);
#endif
}

static int forked(void) {
#ifdef GDN_HAVE_FORK
    if (!in_forked_child && getpid() != guard_pid) in_forked_child = 1;
#endif
    return in_forked_child;
}

int gdn_num_procs(void) {
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    return 0;
#endif
}

int gdn_threads_for(int num_threads, int64_t units, int64_t bytes) {
    if (num_threads > units) num_threads = (int)units;
    if (num_threads > 1 && (bytes < parallel_min_bytes || forked())) num_threads = 1;
    return num_threads < 1 ? 1 : num_threads;
}

void gdn_parallel_for(int nthreads, int64_t units, gdn_range_fn fn, void *ctx) {
#ifdef _OPENMP
    if (nthreads > 1) {
        /* contiguous ranges of units per thread: with one request, units are
         * neighbouring channel blocks, and interleaving them across threads measured
         * slower (B=8: 1.08x vs 1.58x from a second thread) */
#pragma omp parallel num_threads(nthreads)
        {
            const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
            fn(ctx, units * t / n, units * (t + 1) / n);
        }
        return;
    }
#endif
    (void)nthreads;
    fn(ctx, 0, units);
}

/* ---- per-thread scratch: a block per OS thread, grown when a call needs more ---- */
typedef struct {
    int64_t floats;
    char pad[56];          /* data starts 64 bytes in */
    float data[];
} scratch_block;

static scratch_block *grow(scratch_block *s, int64_t n) {
    void *mem = NULL;
    free(s);
#if defined(_WIN32)
    mem = malloc(sizeof(scratch_block) + (size_t)n * sizeof(float));
#else
    if (posix_memalign(&mem, 64, sizeof(scratch_block) + (size_t)n * sizeof(float))) mem = NULL;
#endif
    if (mem) ((scratch_block *)mem)->floats = n;
    return (scratch_block *)mem;
}

#if defined(_WIN32)
static __declspec(thread) scratch_block *scratch_tls;  /* not freed at thread end on Windows */

float *gdn_thread_scratch(int64_t n) {
    if (!scratch_tls || scratch_tls->floats < n) scratch_tls = grow(scratch_tls, n);
    return scratch_tls ? scratch_tls->data : NULL;
}
#else
#include <pthread.h>

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;

static void make_key(void) { scratch_key_ok = pthread_key_create(&scratch_key, free) == 0; }

float *gdn_thread_scratch(int64_t n) {
    pthread_once(&scratch_once, make_key);
    if (!scratch_key_ok) return NULL;
    scratch_block *s = (scratch_block *)pthread_getspecific(scratch_key);
    if (!s || s->floats < n) {
        s = grow(s, n);
        pthread_setspecific(scratch_key, s);
    }
    return s ? s->data : NULL;
}
#endif
