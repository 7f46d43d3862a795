/*
 * harness.h - runs a function on every rank of a communicator, ranks as
 * threads of this process (kv_mem) or as forked processes (kv_dir), and
 * the deterministic inputs/reference values the comm tests check against.
 *
 * Host ids decide the transport: HOSTS_SAME gives every rank one id
 * (shared memory), HOSTS_DISTINCT one id per rank (TCP), HOSTS_HALF two
 * "hosts" (shm inside, TCP across). Rank functions run off the Criterion
 * main thread, so they report failures by return code and stderr.
 *
 * Non-goals: being a general launcher (the agent is).
 */
#ifndef MR_TEST_COMM_HARNESS_H
#define MR_TEST_COMM_HARNESS_H

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/mr_comm.h"
#include "kv_mem.h"

enum { HOSTS_SAME, HOSTS_DISTINCT, HOSTS_HALF };

typedef int (*rank_fn)(struct mr_comm *world, void *arg);

struct rank_ctx {
	int rank, n, hosts;
	long timeout_ms;
	const struct mr_kv *kv;
	rank_fn fn;
	void *arg;
	int rc;
};

static inline void host_of(int rank, int n, int hosts, char *buf, size_t cap)
{
	int h = hosts == HOSTS_SAME ? 0 : hosts == HOSTS_DISTINCT ? rank : rank * 2 / n;

	snprintf(buf, cap, "test-host-%d", h);
}

/* The backend every rank opens ("nccl" in tests/gpu; NULL: host), set
 * before the ranks start. A rank r of the nccl backend uses device r. */
static const char *run_backend;

static inline int rank_main(struct rank_ctx *c)
{
	struct mr_comm *w;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	char hid[64];
	int rc;

	host_of(c->rank, c->n, c->hosts, hid, sizeof(hid));
	struct mr_comm_config cfg = { .backend = run_backend, .id = "w", .rank = c->rank,
				      .world_size = c->n, .device = c->rank,
				      .host_id = hid, .kv = c->kv,
				      .timeout_ms = c->timeout_ms ? c->timeout_ms : 20000 };
	rc = mr_comm_init(&w, &cfg, &eb);
	if (rc < 0) {
		fprintf(stderr, "rank %d: init: %s: %s\n", c->rank, mr_err_name(rc), eb.msg);
		return rc;
	}
	rc = c->fn(w, c->arg);
	if (rc)
		fprintf(stderr, "rank %d: failed: %d (%s)\n", c->rank, rc, mr_err_name(rc));
	mr_comm_free(w);
	return rc;
}

static inline void *rank_thread(void *p)
{
	struct rank_ctx *c = p;

	c->rc = rank_main(c);
	return NULL;
}

/* 0 when every rank returned 0, else the first failure. */
static inline int run_threads_t(int n, int hosts, long timeout_ms, rank_fn fn, void *arg)
{
	struct mr_kv kv;
	struct kv_mem *m = kv_mem_new(&kv);
	struct rank_ctx ctx[16];
	pthread_t t[16];
	int rc = 0;

	for (int i = 0; i < n; i++) {
		ctx[i] = (struct rank_ctx){ .rank = i, .n = n, .hosts = hosts, .kv = &kv,
					    .fn = fn, .arg = arg, .timeout_ms = timeout_ms };
		pthread_create(&t[i], NULL, rank_thread, &ctx[i]);
	}
	for (int i = 0; i < n; i++) {
		pthread_join(t[i], NULL);
		if (ctx[i].rc && !rc)
			rc = ctx[i].rc;
	}
	kv_mem_free(m);
	return rc;
}

static inline int run_threads(int n, int hosts, rank_fn fn, void *arg)
{
	return run_threads_t(n, hosts, 0, fn, arg);
}

/* Forks n ranks; returns the number of ranks that exited non-zero (a rank
 * killed by a signal counts unless it is `expect_killed`). */
static inline int run_procs(int n, int hosts, long timeout_ms, rank_fn fn, void *arg, int expect_killed)
{
	struct kv_dir d = { { 0 } };
	struct mr_kv kv;
	pid_t pid[16];
	int bad = 0;

	if (kv_dir_init(&d, &kv) < 0)
		return n;
	for (int i = 0; i < n; i++) {
		pid[i] = fork();
		if (pid[i] == 0) {
			struct rank_ctx c = { .rank = i, .n = n, .hosts = hosts, .kv = &kv,
					      .fn = fn, .arg = arg, .timeout_ms = timeout_ms };
			alarm(60);
			_exit(rank_main(&c) ? 1 : 0);
		}
	}
	for (int i = 0; i < n; i++) {
		int st = 0;

		waitpid(pid[i], &st, 0);
		if (i == expect_killed && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
			continue;
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			fprintf(stderr, "rank %d: status %#x\n", i, st);
			bad++;
		}
	}
	kv_dir_remove(&d);
	return bad;
}

/* ---- deterministic data ---- */

/* Small integers: sums over <= 16 ranks are exact in fp32 and bf16. */
static inline double val(int rank, size_t i, int salt)
{
	return (double)((int)(((size_t)rank * 31 + i * 7 + (size_t)salt) % 19) - 9);
}

static inline void put_el(void *buf, int dt, size_t i, double v)
{
	switch (dt) {
	case MR_COMM_F32: ((float *)buf)[i] = (float)v; break;
	case MR_COMM_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
	case MR_COMM_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
	case MR_COMM_BF16: {
		float f = (float)v;
		uint32_t u;
		memcpy(&u, &f, 4);
		((uint16_t *)buf)[i] = (uint16_t)(u >> 16); /* exact for small ints */
		break;
	}
	}
}

static inline double get_el(const void *buf, int dt, size_t i)
{
	switch (dt) {
	case MR_COMM_F32: return ((const float *)buf)[i];
	case MR_COMM_I32: return ((const int32_t *)buf)[i];
	case MR_COMM_I64: return (double)((const int64_t *)buf)[i];
	case MR_COMM_BF16: {
		uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
		float f;
		memcpy(&f, &u, 4);
		return f;
	}
	}
	return NAN;
}

/* Reference reduction of val(r, i, salt) over n ranks. */
static inline double ref_red(int n, size_t i, int salt, int op, int dt)
{
	double acc = op == MR_COMM_MAX ? -1e300 : 0;

	for (int r = 0; r < n; r++) {
		double v = val(r, i, salt);

		acc = op == MR_COMM_MAX ? (v > acc ? v : acc) : acc + v;
	}
	if (op == MR_COMM_AVG) {
		if (dt == MR_COMM_I32 || dt == MR_COMM_I64)
			acc = (double)((long long)acc / n);
		else
			acc = (double)((float)acc / (float)n);
	}
	return acc;
}

static inline int close_enough(double got, double want, int dt)
{
	double tol = dt == MR_COMM_BF16 ? 1e-2 * fabs(want) + 1e-6 : 1e-6 * fabs(want);

	return fabs(got - want) <= tol;
}

#endif
