/* The one place threads start (threads.c): an OpenMP loop over a call's units of
 * work, the size below which a call stays on the calling thread, the fork guard, and
 * each thread's scratch memory. */
#ifndef GDNCONV_THREADS_H
#define GDNCONV_THREADS_H

#include "common.h"

/* Work of one thread: units [u0, u1) of a call. */
typedef void (*gdn_range_fn)(void *ctx, int64_t u0, int64_t u1);

/* A call's team: n threads of the wanted (at most num_threads and units, 1 below the
 * size threshold or in a forked child); adaptive for a default call, whose team is
 * smaller while this calling thread's team calls stall (threads.c). */
typedef struct {
    int n, wanted, adaptive;
} gdn_team;

/* The team of a call of `units` units that moves `bytes` bytes. num_threads > 0 asks
 * for that many threads exactly (an explicit request); num_threads < 0 is a default
 * call that may use up to -num_threads. */
gdn_team gdn_threads_for(int num_threads, int64_t units, int64_t bytes);

/* fn(ctx, u0, u1) over contiguous ranges of [0, units), one per thread of the team
 * (from gdn_threads_for); returns when all are done. Times an adaptive team call. */
void gdn_parallel_for(gdn_team team, int64_t units, gdn_range_fn fn, void *ctx);

/* The calling thread's adaptive state: the team cap of its default calls
 * (GDN_NO_CAP: none), the last four team calls at that cap (bit 0 the latest, 1 =
 * slow), when the next probe may run and the backoff after a slow one (seconds on
 * omp_get_wtime's clock), counters (capped_calls: default calls that ran on fewer
 * threads than they would have without the cap), and the team of its last call. */
#define GDN_NO_CAP 0x7fffffff
typedef struct {
    int cap;
    unsigned history;
    int last_threads;
    double retry_at, backoff;
    int64_t slow_calls, probes, reductions, capped_calls;
} gdn_adapt_state;

gdn_adapt_state gdn_adapt_get(void);
void gdn_adapt_set(gdn_adapt_state s);

/* One default call of up to n threads at time now, recorded as slow or not when it
 * gets a team (tests drive the state machine with it); returns its team size. */
int gdn_adapt_step(int n, int slow, double now);

/* Seconds on the clock gdn_adapt_state uses (omp_get_wtime; 0 without OpenMP). */
double gdn_adapt_now(void);

/* The calling thread's scratch of at least n floats (64-byte aligned), kept between
 * calls and freed when the thread ends, so no other thread and no module teardown
 * can free it while a kernel reads it; NULL when memory runs out. */
float *gdn_thread_scratch(int64_t n);

/* Calls moving fewer bytes run on the calling thread; returns the previous value. */
int64_t gdn_set_parallel_min_bytes(int64_t bytes);

/* Arms the fork guard (once; the code's load does too, where the compiler has
 * constructors, and the extension calls it at import): from then on, a process forked
 * from this one runs every call on its calling thread. */
void gdn_fork_guard_init(void);

/* CPUs the process may use as the OpenMP runtime counts them (its count stays the
 * process's when OMP_PROC_BIND pins the calling thread to one CPU); 0 in a build
 * without OpenMP. */
int gdn_num_procs(void);

#endif
