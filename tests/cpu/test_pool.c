/*
 * test_pool.c - runtime/cpu/mr_pool.h: every item of [0, n) handled once,
 * in the contiguous chunk per thread the header promises (chunk t is
 * [n*t/N, n*(t+1)/N), chunk 0 on the calling thread), the same split on
 * every run; small ranges and a NULL pool on the calling thread alone;
 * a pool reused for many runs.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/mr_pool.h"

#define NMAX 1000

struct seen {
	int count[NMAX];
	int tid[NMAX];
	pthread_t thread[NMAX];
};

static void mark(void *ctx, size_t i0, size_t i1, int tid)
{
	struct seen *s = ctx;

	for (size_t i = i0; i < i1; i++) {
		__atomic_add_fetch(&s->count[i], 1, __ATOMIC_RELAXED);
		s->tid[i] = tid;
		s->thread[i] = pthread_self();
	}
}

Test(pool, every_item_once_in_the_promised_chunks)
{
	struct mr_pool *pool;
	static struct seen s;

	cr_assert_eq(mr_pool_create(&pool, 4), 0);
	cr_assert_eq(mr_pool_threads(pool), 4);
	for (int run = 0; run < 200; run++) {
		size_t n = 8 + (size_t)(run * 37) % (NMAX - 8);
		memset(&s, 0, sizeof(s));
		mr_pool_run(pool, n, 1, mark, &s);
		for (size_t i = 0; i < n; i++) {
			int t = s.tid[i];
			cr_assert_eq(s.count[i], 1, "run %d: item %zu ran %d times", run, i,
				     s.count[i]);
			cr_assert(i >= n * (size_t)t / 4 && i < n * (size_t)(t + 1) / 4,
				  "run %d n %zu: item %zu in thread %d's chunk", run, n, i, t);
			if (t == 0)
				cr_assert(pthread_equal(s.thread[i], pthread_self()),
					  "chunk 0 not on the calling thread");
		}
		for (size_t i = n; i < NMAX; i++)
			cr_assert_eq(s.count[i], 0, "item %zu past n ran", i);
	}
	mr_pool_free(pool);
}

Test(pool, small_ranges_and_no_pool_stay_on_the_calling_thread)
{
	struct mr_pool *pool;
	static struct seen s;

	cr_assert_eq(mr_pool_create(&pool, 3), 0);
	memset(&s, 0, sizeof(s));
	mr_pool_run(pool, 15, 8, mark, &s); /* n < 2 * min_per_thread */
	for (int i = 0; i < 15; i++)
		cr_expect(s.count[i] == 1 && pthread_equal(s.thread[i], pthread_self()),
			  "item %d", i);
	mr_pool_free(pool);
	memset(&s, 0, sizeof(s));
	mr_pool_run(NULL, 100, 1, mark, &s);
	for (int i = 0; i < 100; i++)
		cr_expect(s.count[i] == 1 && s.tid[i] == 0 &&
				  pthread_equal(s.thread[i], pthread_self()),
			  "item %d", i);
}
