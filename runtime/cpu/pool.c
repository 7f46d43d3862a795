/*
 * pool.c - fork/join thread pool (see mr_pool.h).
 *
 * A job is published by bumping an atomic generation counter (and
 * broadcasting, for helpers already asleep). Helpers and the caller spin
 * briefly (SPIN pause iterations, tens of microseconds) before sleeping on a condition
 * variable: a training step is hundreds of short parallel regions, and a
 * wake-up through the scheduler for each would dominate small models.
 * Every check before sleeping is made under the mutex, so no wake-up is
 * lost. Non-goals: see the header.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "mr_err.h"
#include "mr_pool.h"

struct mr_pool {
	int n;                  /* threads including the caller */
	pthread_t *tids;        /* n - 1 helpers */
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	atomic_ulong gen;       /* bumped per job */
	atomic_int pending;     /* helpers still running the current job */
	int active;             /* threads taking part in the current job */
	atomic_int quit;
	mr_pool_fn fn;
	void *ctx;
	size_t items;
};

#define SPIN 1000

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

struct helper_arg {
	struct mr_pool *pool;
	int tid;
};

static void run_chunk(struct mr_pool *p, int tid)
{
	size_t i0 = p->items * (size_t)tid / (size_t)p->active;
	size_t i1 = p->items * (size_t)(tid + 1) / (size_t)p->active;
	if (i1 > i0)
		p->fn(p->ctx, i0, i1, tid);
}

static void *helper(void *argp)
{
	struct helper_arg *arg = argp;
	struct mr_pool *p = arg->pool;
	int tid = arg->tid, i;
	unsigned long seen = 0;

	free(arg);
	for (;;) {
		for (i = 0; i < SPIN && atomic_load(&p->gen) == seen; i++)
			cpu_relax();
		if (atomic_load(&p->gen) == seen) {
			pthread_mutex_lock(&p->mu);
			while (!atomic_load(&p->quit) && atomic_load(&p->gen) == seen)
				pthread_cond_wait(&p->go, &p->mu);
			pthread_mutex_unlock(&p->mu);
		}
		if (atomic_load(&p->quit))
			break;
		seen = atomic_load(&p->gen);
		if (tid < p->active)
			run_chunk(p, tid);
		if (atomic_fetch_sub(&p->pending, 1) == 1) {
			pthread_mutex_lock(&p->mu);
			pthread_cond_signal(&p->done);
			pthread_mutex_unlock(&p->mu);
		}
	}
	return NULL;
}

int mr_pool_create(struct mr_pool **out, int nthreads)
{
	struct mr_pool *p;
	int i;

	*out = NULL;
	if (nthreads < 1)
		return MR_EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return MR_ENOMEM;
	p->n = 1;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->go, NULL);
	pthread_cond_init(&p->done, NULL);
	if (nthreads > 1) {
		p->tids = calloc((size_t)nthreads - 1, sizeof(*p->tids));
		if (!p->tids) {
			mr_pool_free(p);
			return MR_ENOMEM;
		}
	}
	for (i = 1; i < nthreads; i++) {
		struct helper_arg *arg = malloc(sizeof(*arg));
		if (!arg) {
			mr_pool_free(p);
			return MR_ENOMEM;
		}
		arg->pool = p;
		arg->tid = i;
		if (pthread_create(&p->tids[i - 1], NULL, helper, arg) != 0) {
			free(arg);
			mr_pool_free(p);
			return MR_ESYS;
		}
		p->n++;
	}
	*out = p;
	return 0;
}

void mr_pool_free(struct mr_pool *p)
{
	int i;

	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	atomic_store(&p->quit, 1);
	atomic_fetch_add(&p->gen, 1);
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	for (i = 0; i < p->n - 1; i++)
		pthread_join(p->tids[i], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->go);
	pthread_cond_destroy(&p->done);
	free(p->tids);
	free(p);
}

int mr_pool_threads(const struct mr_pool *p)
{
	return p ? p->n : 1;
}

void mr_pool_run(struct mr_pool *p, size_t n, size_t min_per_thread, mr_pool_fn fn, void *ctx)
{
	int active, i;

	if (n == 0)
		return;
	active = p ? p->n : 1;
	if (min_per_thread < 1)
		min_per_thread = 1;
	while (active > 1 && n / (size_t)active < min_per_thread)
		active--;
	if (active <= 1) {
		fn(ctx, 0, n, 0);
		return;
	}
	p->fn = fn;
	p->ctx = ctx;
	p->items = n;
	p->active = active;
	/* every helper reports, active or not, so none can lag a job behind */
	atomic_store(&p->pending, p->n - 1);
	pthread_mutex_lock(&p->mu);
	atomic_fetch_add(&p->gen, 1);
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	run_chunk(p, 0);
	for (i = 0; i < SPIN && atomic_load(&p->pending) > 0; i++)
		cpu_relax();
	if (atomic_load(&p->pending) > 0) {
		pthread_mutex_lock(&p->mu);
		while (atomic_load(&p->pending) > 0)
			pthread_cond_wait(&p->done, &p->mu);
		pthread_mutex_unlock(&p->mu);
	}
}
