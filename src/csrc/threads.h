/* The one place threads start (threads.c): an OpenMP loop over a call's units of
 * work, the size below which a call stays on the calling thread, the fork guard, and
 * each thread's scratch memory. */
#ifndef GDNCONV_THREADS_H
#define GDNCONV_THREADS_H

#include "common.h"

/* Work of one thread: units [u0, u1) of a call. */
typedef void (*gdn_range_fn)(void *ctx, int64_t u0, int64_t u1);

/* Threads for a call of `units` units that moves `bytes` bytes: at most num_threads
 * and units, and 1 below the size threshold or in a forked child. */
int gdn_threads_for(int num_threads, int64_t units, int64_t bytes);

/* fn(ctx, u0, u1) over contiguous ranges of [0, units), one per thread, on nthreads
 * threads (from gdn_threads_for); returns when all are done. */
void gdn_parallel_for(int nthreads, int64_t units, gdn_range_fn fn, void *ctx);

/* The calling thread's scratch of at least n floats (64-byte aligned), kept between
 * calls and freed when the thread ends, so no other thread and no module teardown
 * can free it while a kernel reads it; NULL when memory runs out. */
float *gdn_thread_scratch(int64_t n);

/* Calls moving fewer bytes run on the calling thread; returns the previous value. */
int64_t gdn_set_parallel_min_bytes(int64_t bytes);

/* Call once before any call (the extension does at import): from then on, a process
 * forked from this one runs every call on its calling thread. */
void gdn_fork_guard_init(void);

/* CPUs the process may use as the OpenMP runtime counts them (its count stays the
 * process's when OMP_PROC_BIND pins the calling thread to one CPU); 0 in a build
 * without OpenMP. */
int gdn_num_procs(void);

#endif
