/*
 * mr_pool.h - a tiny fork/join thread pool for the CPU kernels.
 *
 * mr_pool_run(pool, n, fn, ctx) splits [0, n) into one contiguous chunk per
 * thread (chunk t is [n*t/N, n*(t+1)/N)), runs chunk 0 on the calling thread
 * and the rest on the pool's helpers, and returns when all are done. The
 * split depends only on n and the thread count, so results are
 * deterministic for a given thread count.
 *
 * Coordination with OpenBLAS: the runtime calls sgemm and mr_pool_run from
 * the same (rank) thread, one after the other, never concurrently, so N pool
 * threads and N OpenBLAS threads never compete for the cores.
 *
 * Ownership: the caller owns the pool (mr_pool_create / mr_pool_free).
 * A NULL pool runs everything on the calling thread.
 *
 * Non-goals: work stealing, nested parallelism, task queues.
 */
#ifndef MR_POOL_H
#define MR_POOL_H

#include <stddef.h>

struct mr_pool;

/* fn handles items [i0, i1) as thread tid (0 <= tid < mr_pool_threads). */
typedef void (*mr_pool_fn)(void *ctx, size_t i0, size_t i1, int tid);

/* nthreads >= 1; returns MR_ENOMEM / MR_ESYS on failure. */
int mr_pool_create(struct mr_pool **out, int nthreads);
void mr_pool_free(struct mr_pool *pool);
int mr_pool_threads(const struct mr_pool *pool);
/* Runs fn over [0, n); uses only the calling thread when n < min_per_thread*2. */
void mr_pool_run(struct mr_pool *pool, size_t n, size_t min_per_thread, mr_pool_fn fn,
		 void *ctx);

#endif
