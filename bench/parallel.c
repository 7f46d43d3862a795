/*
 * parallel.c - data- and tensor-parallel scaling of the GPT runtime on this
 * machine (make bench-parallel).
 *
 *   build/bench/parallel [-L layers] [-C d_model] [-H heads] [-T seq]
 *                        [-B batch per rank] [-s steps]
 *
 * Ranks are threads of this process with one pool thread each and real
 * host communicators (shared memory), bootstrapped through an in-memory
 * KV. Default config: the L4/d256/h4, T256, B8, vocab 256. Runs:
 *
 *   1 rank                 tokens/s of one rank (one thread): X1
 *   dp2, overlap on / off  total tokens/s: X2; per step, the time a rank
 *                          waited on gradient communication outside
 *                          backward (mr_dp_stats.comm_wait_s)
 *   tp2 (and tp2 + sp)     tokens/s of the tp pair
 *
 * and prints
 *   dp2_efficiency = X2 / (2 X1)            (weak scaling, same batch/rank)
 *   overlap_hidden = 1 - wait_on / wait_off  (wait_off = the whole
 *                    gradient reduction, blocking after backward)
 * Last line: `parallel dp2_efficiency=<x> overlap_hidden=<y>`.
 * Timing: mean over steps after 2 warm-up steps; tokens/s from the slowest
 * rank; waits per step from the rank that waited least (the others' waits
 * include the skew between ranks, not communication).
 *
 * Non-goals: validation (tests/parity), multi-host runs.
 */
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/mr_comm.h"
#include "cpu/mr_pool.h"
#include "data/mr_synth.h"
#include "mr_step.h"
#include "parallel/mr_dp.h"
#include "../tests/comm/kv_mem.h"

#define WARMUP 2
#define MAX_STEPS 256

struct bench {
	struct mr_gpt_config cfg;
	int B, T, steps;
	int ranks, tp, sp, dp, overlap;
	struct mr_kv kv;
	char id[32];
	/* results, per rank */
	double secs[8], comm[8];
	double wait[8][MAX_STEPS]; /* per rank and measured step */
	int rc[8];
};

struct rank_arg {
	struct bench *b;
	int rank;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const struct mr_adamw_config ocfg = { 1e-3f, 0.1f, 2, 100, 0.9f, 0.95f, 1e-8f,
					     0.1f, 1.0f, MR_LR_COSINE, 0.0f };

/* One rank: tp ranks share a batch, dp ranks take their own rows. */
static int rank_run(struct bench *b, int rank, struct mr_comm *world)
{
	struct mr_place where;
	struct mr_errbuf eb = { "", "" };
	struct mr_pool *pool = NULL;
	struct mr_gpt m;
	struct mr_step drv = { 0 };
	struct mr_step_result r;
	size_t N = (size_t)b->B * b->T;
	int *in = malloc(N * sizeof(int)), *tg = malloc(N * sizeof(int)), s, rc;
	double t0 = 0.0, comm = 0.0;

	if (!in || !tg || (rc = mr_pool_create(&pool, 1)) < 0)
		return MR_ENOMEM;
	mr_place_tp(&where, b->tp, rank % b->tp, world, b->sp);
	if ((rc = mr_gpt_create_placed(&m, &b->cfg, b->B, b->T, pool, &where, 0, &eb)) < 0)
		goto out;
	{
		struct mr_dp_config dc = { 0, 0, b->overlap, MR_DP_OFFLOAD_NONE };
		struct mr_dp_comms cc = { b->dp > 1 ? world : NULL, NULL, world, NULL };
		rc = mr_step_init(&drv, &m, &ocfg, &dc, &cc, 1, &eb);
	}
	if (rc < 0)
		goto out;
	for (s = 0; s < WARMUP + b->steps && rc == 0; s++) {
		int d = b->dp > 1 ? rank : 0;
		if (s == WARMUP)
			t0 = now_s();
		mr_synth_batch(1, 0, ((uint64_t)s * b->dp + d) * b->B, b->cfg.vocab, b->B, b->T,
			       in, tg);
		{
			struct mr_dp_stats st;
			rc = mr_step_run(&drv, in, tg, 1, &r, &eb);
			mr_dp_stats(drv.dp, &st);
			if (s >= WARMUP && b->dp > 1) {
				b->wait[rank][s - WARMUP] = st.comm_wait_s;
				comm += st.comm_s;
			}
		}
	}
	b->secs[rank] = (now_s() - t0) / b->steps;
	b->comm[rank] = comm / b->steps;
	mr_step_release(&drv);
	mr_gpt_release(&m);
out:
	if (rc < 0)
		fprintf(stderr, "bench parallel: rank %d: %s\n", rank, eb.msg);
	mr_pool_free(pool);
	free(in);
	free(tg);
	return rc;
}

static void *rank_thread(void *p)
{
	struct rank_arg *a = p;
	struct bench *b = a->b;
	struct mr_comm *w = NULL;
	struct mr_errbuf eb = { "", "" };
	struct mr_comm_config cc = { .id = b->id, .rank = a->rank, .world_size = b->ranks,
				     .host_id = "bench", .kv = &b->kv, .timeout_ms = 120000 };

	if (b->ranks > 1 && (b->rc[a->rank] = mr_comm_init(&w, &cc, &eb)) < 0) {
		fprintf(stderr, "bench parallel: rank %d: %s\n", a->rank, eb.msg);
		return NULL;
	}
	b->rc[a->rank] = rank_run(b, a->rank, w);
	mr_comm_free(w);
	return NULL;
}

/* Runs one configuration; returns tokens/s of the whole job (slowest rank). */
static double run(struct bench *b, int ranks, int tp, int sp, int overlap, double *wait,
		  double *comm)
{
	static int seq;
	pthread_t th[8];
	struct rank_arg args[8];
	double worst = 0.0;
	int i, s;

	b->ranks = ranks;
	b->tp = tp;
	b->sp = sp;
	b->dp = ranks / tp;
	b->overlap = overlap;
	snprintf(b->id, sizeof(b->id), "bench%d", seq++);
	for (i = 0; i < ranks; i++) {
		args[i].b = b;
		args[i].rank = i;
		pthread_create(&th[i], NULL, rank_thread, &args[i]);
	}
	for (i = 0; i < ranks; i++)
		pthread_join(th[i], NULL);
	*wait = *comm = 0.0;
	for (i = 0; i < ranks; i++) {
		if (b->rc[i] < 0)
			exit(1);
		if (b->secs[i] > worst)
			worst = b->secs[i];
		if (b->comm[i] > *comm)
			*comm = b->comm[i];
	}
	/* per step, the rank that waited least is the one the others waited
	 * for: its wait is communication alone, without the skew between ranks */
	for (s = 0; s < b->steps; s++) {
		double least = b->wait[0][s];
		for (i = 1; i < ranks; i++)
			if (b->wait[i][s] < least)
				least = b->wait[i][s];
		*wait += least / b->steps;
	}
	return (double)b->B * b->T * b->dp / worst;
}

int main(int argc, char **argv)
{
	struct bench b;
	double x1, x2, x2off, xtp, xsp, w_on, w_off, c_on, c_off, w, c, eff, hidden;
	int opt;

	memset(&b, 0, sizeof(b));
	b.cfg = (struct mr_gpt_config){ .vocab = 256, .max_seq = 256, .n_layer = 4, .d_model = 256,
					.n_head = 4 };
	b.B = 8;
	b.T = 256;
	b.steps = 8;
	while ((opt = getopt(argc, argv, "L:C:H:T:B:s:")) != -1) {
		switch (opt) {
		case 'L': b.cfg.n_layer = atoi(optarg); break;
		case 'C': b.cfg.d_model = atoi(optarg); break;
		case 'H': b.cfg.n_head = atoi(optarg); break;
		case 'T': b.T = b.cfg.max_seq = atoi(optarg); break;
		case 'B': b.B = atoi(optarg); break;
		case 's': b.steps = atoi(optarg); break; /* 1..MAX_STEPS */
		default:
			fprintf(stderr, "usage: %s [-L n] [-C d] [-H h] [-T seq] [-B batch] "
					"[-s steps]\n", argv[0]);
			return 2;
		}
	}
	/* one compute thread per rank: the pool splits GEMMs itself, as the
	 * gpt worker does (runtime/gpt_worker.c) */
	openblas_set_num_threads(1);
	if (b.steps < 1 || b.steps > MAX_STEPS) {
		fprintf(stderr, "bench parallel: -s must be in [1, %d]\n", MAX_STEPS);
		return 2;
	}
	kv_mem_new(&b.kv);
	printf("parallel config L%d d%d h%d T%d B%d/rank vocab %d, %d steps, 1 thread/rank\n",
	       b.cfg.n_layer, b.cfg.d_model, b.cfg.n_head, b.T, b.B, b.cfg.vocab, b.steps);
	x1 = run(&b, 1, 1, 0, 0, &w, &c);
	printf("parallel 1rank        tokens/s %9.0f\n", x1);
	x2 = run(&b, 2, 1, 0, 1, &w_on, &c_on);
	printf("parallel dp2 overlap  tokens/s %9.0f  comm %.1f ms/step, waited %.1f ms/step\n",
	       x2, c_on * 1e3, w_on * 1e3);
	x2off = run(&b, 2, 1, 0, 0, &w_off, &c_off);
	printf("parallel dp2 blocking tokens/s %9.0f  comm %.1f ms/step, waited %.1f ms/step\n",
	       x2off, c_off * 1e3, w_off * 1e3);
	xtp = run(&b, 2, 2, 0, 0, &w, &c);
	printf("parallel tp2          tokens/s %9.0f  (%.2fx one rank)\n", xtp, xtp / x1);
	xsp = run(&b, 2, 2, 1, 0, &w, &c);
	printf("parallel tp2+sp       tokens/s %9.0f  (%.2fx one rank)\n", xsp, xsp / x1);
	eff = x2 / (2.0 * x1);
	hidden = w_off > 0 ? 1.0 - w_on / w_off : 0.0;
	printf("parallel dp2_efficiency=%.3f overlap_hidden=%.3f\n", eff, hidden);
	return 0;
}
