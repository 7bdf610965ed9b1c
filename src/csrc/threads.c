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
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;
static void mark_forked_child(void) { in_forked_child = 1; }
static void arm_fork_guard(void) {
    guard_pid = getpid();
    pthread_atfork(NULL, NULL, mark_forked_child);
}
#endif

void gdn_fork_guard_init(void) {
#ifdef GDN_HAVE_FORK
    pthread_once(&guard_once, arm_fork_guard);
#endif
}

#if defined(GDN_HAVE_FORK) && (defined(__GNUC__) || defined(__clang__))
/* Armed when the code is loaded, in the process that loads it, so that a program
 * linking the C core without calling gdn_fork_guard_init (benchmarks/bench_kernel.c,
 * compare_isas.c) is not taken for a forked child: unarmed, guard_pid 0 never equals
 * getpid() and every call ran on one thread, whatever it asked for. */
__attribute__((constructor)) static void arm_at_load(void) { gdn_fork_guard_init(); }
#endif

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

/* ---- the team of a call that did not ask for a count: fewer threads while they stall ----
 *
 * A team call returns only when every thread of it has run, and a thread the
 * scheduler parked behind another process holds the caller for milliseconds: with
 * other processes busy on a 2-core machine libgomp's threads spin for work and at the
 * join (~3 ms, GOMP_SPINCOUNT), use up their share of a busy core, and a worker
 * started a call 5-7.5 ms late (median), so 2-thread calls took 4-18 ms against about
 * 1 ms on one thread (B=16, bf16, D=8192). libgomp's own dynamic team size
 * (omp_set_dynamic) follows the 15-minute load average, the wait policy is read once
 * from the environment at load, and dynamic scheduling still waits for the late
 * thread to reach the end of the region (docs/design.md).
 * So each team call of a default call is timed against the caller's own share: the
 * call was slow when it took longer than that share would take for every unit on one
 * thread. Two slow calls among the last four halve the team of this calling thread's
 * later default calls; after a backoff one call tries twice the team again (a probe):
 * a slow probe doubles the backoff (up to GDN_BACKOFF_MAX), a fast one restores the
 * team and halves it. The state is per calling thread (each has its own OpenMP team),
 * so it needs no locks. */
#define GDN_BACKOFF_MIN 0.01
#define GDN_BACKOFF_MAX 1.0
#define GDN_SLOW_OF_LAST_4 2

static GDN_THREAD_LOCAL gdn_adapt_state adapt = {GDN_NO_CAP, 0, 1, 0.0, GDN_BACKOFF_MIN, 0, 0, 0, 0};

static int popcount4(unsigned h) { return (int)((h & 1) + ((h >> 1) & 1) + ((h >> 2) & 1) + ((h >> 3) & 1)); }

/* Threads for a default call that may use up to n, at time now (seconds). */
static int adapt_team(int n, double now) {
    if (n <= adapt.cap) return n;
    if (now >= adapt.retry_at) return adapt.cap * 2 < n ? adapt.cap * 2 : n;   /* probe */
    adapt.capped_calls++;
    return adapt.cap;
}

/* Record a team call of k threads (k > 1) of a default call that asked for up to n. */
static void adapt_record(int k, int n, int slow, double now) {
    if (k > adapt.cap) {   /* a probe */
        adapt.probes++;
        if (slow) {
            adapt.backoff = adapt.backoff * 2 < GDN_BACKOFF_MAX ? adapt.backoff * 2 : GDN_BACKOFF_MAX;
            adapt.retry_at = now + adapt.backoff;
        } else {
            adapt.cap = k < n ? k : GDN_NO_CAP;
            adapt.backoff = adapt.backoff / 2 > GDN_BACKOFF_MIN ? adapt.backoff / 2 : GDN_BACKOFF_MIN;
            adapt.retry_at = now + adapt.backoff;   /* a still larger team after another wait */
            adapt.history = 0;
        }
        adapt.slow_calls += slow;
        return;
    }
    adapt.slow_calls += slow;
    adapt.history = (adapt.history << 1 | (unsigned)slow) & 0xFu;
    if (popcount4(adapt.history) >= GDN_SLOW_OF_LAST_4) {
        adapt.cap = k / 2;
        adapt.history = 0;
        adapt.retry_at = now + adapt.backoff;
        adapt.reductions++;
    }
}

gdn_adapt_state gdn_adapt_get(void) { return adapt; }

void gdn_adapt_set(gdn_adapt_state s) { adapt = s; }

int gdn_adapt_step(int n, int slow, double now) {
    const int k = adapt_team(n, now);
    if (k > 1) adapt_record(k, n, slow, now);
    adapt.last_threads = k;
    return k;
}

double gdn_adapt_now(void) {
#ifdef _OPENMP
    return omp_get_wtime();
#else
    return 0.0;
#endif
}

gdn_team gdn_threads_for(int num_threads, int64_t units, int64_t bytes) {
    gdn_team team;
    team.adaptive = num_threads < 0;
    team.wanted = team.adaptive ? -num_threads : num_threads;
    if (team.wanted > units) team.wanted = (int)units;
    if (team.wanted > 1 && (bytes < parallel_min_bytes || forked())) team.wanted = 1;
    if (team.wanted < 1) team.wanted = 1;
    team.n = team.adaptive && team.wanted > 1 ? adapt_team(team.wanted, gdn_adapt_now()) : team.wanted;
    return team;
}

void gdn_parallel_for(gdn_team team, int64_t units, gdn_range_fn fn, void *ctx) {
    adapt.last_threads = team.n;
#ifdef _OPENMP
    if (team.n > 1) {
        /* contiguous ranges of units per thread: with one request, units are
         * neighbouring channel blocks, and interleaving them across threads measured
         * slower (B=8: 1.08x vs 1.58x from a second thread) */
        const double t0 = omp_get_wtime();
        double own = 0.0;
        int64_t own_units = 1;
#pragma omp parallel num_threads(team.n)
        {
            const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
            const int64_t u0 = units * t / n, u1 = units * (t + 1) / n;
            if (t == 0) {
                const double a = omp_get_wtime();
                fn(ctx, u0, u1);
                own = omp_get_wtime() - a;
                own_units = u1 - u0;
            } else {
                fn(ctx, u0, u1);
            }
        }
        if (team.adaptive) {
            const double now = omp_get_wtime();
            /* slow: the team took longer than the caller alone would have for all units */
            const int slow = own_units > 0 && now - t0 > own * (double)units / (double)own_units;
            adapt_record(team.n, team.wanted, slow, now);
        }
        return;
    }
#endif
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
