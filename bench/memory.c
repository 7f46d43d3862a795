/*
 * memory.c - what activation recomputation saves and costs on this
 * machine, next to the planner's prediction (make bench-memory).
 *
 *   build/bench/memory [-s steps] [-j job] [-q]
 *
 * Each job runs through the worker interface (every rank a thread of
 * this process with its own pool threads, real host communicators over an
 * in-memory KV) three times: "recompute" none, selective and full. Jobs:
 * the L6 d512 h8 model of bench-train (vocab 256) at T 256 (B 8) and at
 * T 1024 (B 2: the same tokens a step; selective's saving grows with T
 * only where attention scores are kept, which meshrun never does), then
 * a pp 2 job (1f1b, 4 micro-batches of B 2) and a tp 2 job with sequence
 * parallelism, one thread per rank. Per mode one row:
 *
 *   act_MiB      the MR_MEM_ACTS ledger of the rank keeping the most
 *                (pp: stage 0, which holds the most micro-batches)
 *   plan_MiB     the planner's figure for that rank's stage
 *                (mr_plan_mem_stage over the job's own workload config)
 *   ratio        act_MiB over the none row's
 *   tokens/s     the job's, from the fastest of the timed steps (after
 *                one warm-up step)
 *   slowdown     the none row's tokens/s over this row's
 *   plan_slow    the planner's step time over its none step time
 *
 * -j k runs job k alone (0 the one-rank T 256 job, 1 T 1024, 2 pp 2, 3
 * tp 2). The last line is the first job run's (by default the L6 T 256
 * one-rank job):
 *   memory act_ratio_full=<x> act_ratio_selective=<x> slowdown_full=<x>
 * (issue targets: full <= 0.25, selective <= 0.75, slowdown <= 1.40).
 *
 * Non-goals: the GPU (bench-gpu's), offload (a cpu rank's state is in
 * host memory already).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tests/comm/kv_mem.h"
#include "mr_gpt_worker.h"
#include "mr_mesh.h"
#include "plan/mr_plan.h"

#define MAXR 2

static const char *const modes[] = { "none", "selective", "full" };

struct job {
	const char *name;
	int T, B, accum, tp, pp, threads;
	int world;
};

struct run {
	const struct job *j;
	const char *mode;
	int steps;
	char cfg[1024];
	json_t *json;
	struct mr_kv kv;
	double best_s[MAXR];
	size_t acts[MAXR];
	int rc[MAXR];
	char why[MAXR][256];
};

struct rank_arg {
	struct run *r;
	int rank;
};

static void *rank_main(void *p)
{
	struct rank_arg *a = p;
	struct run *r = a->r;
	struct mr_worker_env env = { 0 };
	struct mr_errbuf eb = { "", "" };
	struct mr_worker_stats st;
	void *w = NULL;
	int rc, s;

	env.job = "bench/memory";
	env.rank = env.local_rank = a->rank;
	env.world_size = env.local_world_size = r->j->world;
	env.tp = r->j->tp;
	env.pp = r->j->pp;
	env.cp = env.ep = 1;
	env.kv = &r->kv;
	env.host = "127.0.0.1";
	env.host_id = "bench";
	env.config = r->json;
	r->best_s[a->rank] = INFINITY;
	rc = mr_gpt_worker.create(&w, &env, &eb);
	for (s = 0; rc >= 0 && s < r->steps + 1; s++) {
		rc = mr_gpt_worker.step(w, &st, &eb);
		if (rc >= 0 && s > 0 && st.step_seconds < r->best_s[a->rank])
			r->best_s[a->rank] = st.step_seconds;
		if (rc >= 0)
			r->acts[a->rank] = st.mem_bytes[MR_MEM_ACTS];
	}
	if (rc < 0)
		snprintf(r->why[a->rank], sizeof(r->why[0]), "%.250s", eb.msg);
	r->rc[a->rank] = rc < 0 ? rc : 0;
	if (w)
		mr_gpt_worker.destroy(w);
	return NULL;
}

/* The planner on the job's own config: the activation bytes of stage 0
 * and the step time. */
static int planned(const struct run *r, double *acts, double *step_s)
{
	struct mr_plan_input in;
	struct mr_plan_mesh mesh;
	struct mr_plan_mem pm;
	struct mr_plan p;
	struct mr_errbuf eb = { "", "" };
	const struct job *j = r->j;
	int rc;

	if ((rc = mr_plan_cluster_local(j->world, j->threads, &in.cluster, &eb)) < 0 ||
	    (rc = mr_plan_from_workload(r->json, j->world, &in, &eb)) < 0)
		goto fail;
	mesh = in.fix;
	mesh.tp = j->tp;
	mesh.pp = j->pp;
	mesh.cp = mesh.ep = 1;
	mesh.dp = j->world / (j->tp * j->pp);
	mr_plan_mesh_worker_defaults(&mesh);
	in.global_batch = mesh.dp * j->accum * j->B;
	if ((rc = mr_plan_mesh_check(&in, &mesh, &eb)) < 0 ||
	    (rc = mr_plan_mem_stage(&in, &mesh, 0, &pm, &eb)) < 0 ||
	    (rc = mr_plan_eval(&in, &mesh, &p, &eb)) < 0)
		goto fail;
	*acts = pm.bytes[MR_MEM_ACTS];
	*step_s = p.time.step_s;
	return 0;
fail:
	fprintf(stderr, "bench memory: %s %s: planner: %s\n", j->name, r->mode, eb.msg);
	*acts = *step_s = NAN;
	return rc;
}

/* One job under one mode: the ranks' ledgers and best step times. */
static int run(struct run *r)
{
	const struct job *j = r->j;
	struct rank_arg args[MAXR];
	pthread_t th[MAXR];
	struct kv_mem *kv;
	json_error_t je;
	int i, rc = 0;

	snprintf(r->cfg, sizeof(r->cfg),
		 "{\"n_layer\":6,\"d_model\":512,\"n_head\":8,\"vocab_size\":256,\"seq_len\":%d,"
		 "\"batch_size\":%d,\"grad_accum\":%d,\"steps\":%d,\"threads\":%d,"
		 "\"log_every\":1000,\"recompute\":\"%s\"%s}",
		 j->T, j->B, j->accum, r->steps + 1, j->threads, r->mode,
		 j->tp > 1 ? ",\"sequence_parallel\":true" : "");
	if (!(r->json = json_loads(r->cfg, 0, &je)))
		return -1;
	kv = kv_mem_new(&r->kv);
	for (i = 0; i < j->world; i++) {
		args[i] = (struct rank_arg){ r, i };
		if (pthread_create(&th[i], NULL, rank_main, &args[i]) != 0) {
			fprintf(stderr, "bench memory: unable to start rank %d\n", i);
			exit(1); /* the others wait for it */
		}
	}
	for (i = 0; i < j->world; i++)
		pthread_join(th[i], NULL);
	kv_mem_free(kv);
	for (i = 0; i < j->world; i++)
		if (r->rc[i] < 0) {
			fprintf(stderr, "bench memory: %s %s rank %d: %s\n", j->name, r->mode, i,
				r->why[i]);
			rc = -1;
		}
	return rc;
}

/* The three modes of job j; ratios[] of the full / selective acts and the
 * full slowdown. */
static int job(const struct job *j, int steps, int quiet, double out[3])
{
	double acts[3], tps[3], plan_acts[3], plan_s[3];

	if (!quiet)
		printf("\n%s (T %d, B %d, %d micro-batches, tp %d, pp %d, %d thread%s a rank)\n"
		       "  %-9s %9s %9s %6s %9s %8s %9s\n",
		       j->name, j->T, j->B, j->accum, j->tp, j->pp, j->threads,
		       j->threads > 1 ? "s" : "", "recompute", "act_MiB", "plan_MiB", "ratio",
		       "tokens/s", "slowdown", "plan_slow");
	for (int k = 0; k < 3; k++) {
		struct run *r = calloc(1, sizeof(*r));
		double worst = 0.0;
		size_t most = 0;

		if (!r)
			return -1;
		r->j = j;
		r->mode = modes[k];
		r->steps = steps;
		if (run(r) < 0) {
			json_decref(r->json);
			free(r);
			return -1;
		}
		for (int i = 0; i < j->world; i++) {
			most = r->acts[i] > most ? r->acts[i] : most;
			worst = r->best_s[i] > worst ? r->best_s[i] : worst;
		}
		acts[k] = (double)most;
		tps[k] = (double)j->T * j->B * j->accum * (j->world / (j->tp * j->pp)) / worst;
		planned(r, &plan_acts[k], &plan_s[k]);
		if (!quiet)
			printf("  %-9s %9.2f %9.2f %6.3f %9.0f %8.3f %9.3f\n", modes[k],
			       acts[k] / 1048576.0, plan_acts[k] / 1048576.0, acts[k] / acts[0],
			       tps[k], tps[0] / tps[k], plan_s[k] / plan_s[0]);
		fflush(stdout);
		json_decref(r->json);
		free(r);
	}
	out[0] = acts[2] / acts[0];
	out[1] = acts[1] / acts[0];
	out[2] = tps[0] / tps[2];
	return 0;
}

int main(int argc, char **argv)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int threads = ncpu >= 2 ? 2 : 1, steps = 3, quiet = 0, only = -1, opt;
	struct job jobs[] = {
		{ "L6 d512 h8, one rank", 256, 8, 1, 1, 1, threads, 1 },
		{ "L6 d512 h8, one rank, long sequences", 1024, 2, 1, 1, 1, threads, 1 },
		{ "L6 d512 h8, pp 2 (1f1b)", 256, 2, 4, 1, 2, 1, 2 },
		{ "L6 d512 h8, tp 2 with sp", 256, 8, 1, 2, 1, 1, 2 },
	};
	double first[3] = { 0 }, r[3];

	while ((opt = getopt(argc, argv, "s:j:q")) != -1) {
		if (opt == 's')
			steps = atoi(optarg);
		else if (opt == 'j')
			only = atoi(optarg);
		else if (opt == 'q')
			quiet = 1;
		else {
			fprintf(stderr, "usage: memory [-s steps] [-j job] [-q]\n");
			return 2;
		}
	}
	if (steps < 1)
		steps = 1;
	for (size_t i = 0, ran = 0; i < sizeof(jobs) / sizeof(jobs[0]); i++) {
		if (only >= 0 && (size_t)only != i)
			continue;
		if (job(&jobs[i], steps, quiet, r) < 0)
			return 1;
		if (ran++ == 0)
			memcpy(first, r, sizeof(r));
	}
	printf("memory act_ratio_full=%.3f act_ratio_selective=%.3f slowdown_full=%.3f\n", first[0],
	       first[1], first[2]);
	return 0;
}
