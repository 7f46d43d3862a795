/*
 * plan_jobs.h - for the planner's tests against the runtime: a job of real
 * gpt workers (every rank a thread, real host communicators bootstrapped
 * through the in-memory KV of tests/comm/kv_mem.h) run for a few steps,
 * and the planner's inputs for the same job (its workload config, its
 * mesh). Include from one test file.
 */
#ifndef MR_TEST_PLAN_JOBS_H
#define MR_TEST_PLAN_JOBS_H

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "../comm/kv_mem.h"
#include "mr_gpt_worker.h"
#include "mr_mesh.h"
#include "plan/mr_plan.h"

#define MAXW 8

struct job {
	const char *cfg;       /* workload config */
	int world, tp, pp, cp, ep;
	int steps;
	json_t *json;
	struct mr_kv kv;
	struct mr_worker_stats st[MAXW];
	double best_s[MAXW];   /* fastest step after the first */
	int rc[MAXW];
	char why[MAXW][256];
};

struct arg {
	struct job *j;
	int rank;
};

static void *rank_main(void *p)
{
	struct arg *a = p;
	struct job *j = a->j;
	struct mr_worker_env env = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_worker_stats st;
	void *w = NULL;
	int rc, s;

	env.job = "test/plan";
	env.rank = a->rank;
	env.world_size = j->world;
	env.local_rank = a->rank;
	env.local_world_size = j->world;
	env.tp = j->tp;
	env.pp = j->pp;
	env.cp = j->cp;
	env.ep = j->ep;
	env.kv = &j->kv;
	env.host = "127.0.0.1";
	env.host_id = "test-host";
	env.config = j->json;
	j->best_s[a->rank] = INFINITY;
	rc = mr_gpt_worker.create(&w, &env, &eb);
	for (s = 0; rc == 0 && s < j->steps; s++) {
		rc = mr_gpt_worker.step(w, &st, &eb);
		if (rc >= 0) {
			j->st[a->rank] = st;
			if (s > 0 && st.step_seconds < j->best_s[a->rank])
				j->best_s[a->rank] = st.step_seconds;
			rc = 0;
		}
	}
	if (rc < 0)
		snprintf(j->why[a->rank], sizeof(j->why[0]), "%.250s", eb.msg);
	j->rc[a->rank] = rc;
	if (w)
		mr_gpt_worker.destroy(w);
	return NULL;
}

static void run_job(struct job *j)
{
	struct kv_mem *m = kv_mem_new(&j->kv);
	json_error_t je;
	pthread_t t[MAXW];
	struct arg a[MAXW];
	int r;

	cr_assert(j->world <= MAXW);
	j->json = json_loads(j->cfg, 0, &je);
	cr_assert_not_null(j->json, "bad test json: %s", je.text);
	for (r = 0; r < j->world; r++) {
		a[r] = (struct arg){ j, r };
		cr_assert_eq(pthread_create(&t[r], NULL, rank_main, &a[r]), 0);
	}
	for (r = 0; r < j->world; r++)
		pthread_join(t[r], NULL);
	for (r = 0; r < j->world; r++)
		cr_assert_eq(j->rc[r], 0, "%s rank %d: %s", j->cfg, r, j->why[r]);
	kv_mem_free(m);
}

/* The planner's inputs for the job: its workload config on its world,
 * the mesh fixed to the job's. */
static void plan_of(const struct job *j, struct mr_plan_input *in, struct mr_plan_mesh *mesh)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	json_t *c = j->json;
	int B = (int)json_integer_value(json_object_get(c, "batch_size"));
	int accum = json_object_get(c, "grad_accum")
			    ? (int)json_integer_value(json_object_get(c, "grad_accum"))
			    : 1;

	cr_assert_eq(mr_plan_cluster_local(j->world, 1, &in->cluster, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_plan_from_workload(c, j->world, in, &eb), 0, "%s", eb.msg);
	if (json_string_value(json_object_get(c, "device")) &&
	    !strcmp(json_string_value(json_object_get(c, "device")), "cuda")) {
		/* (emulated) GPU ranks: offload moves their state */
		in->cluster.cpu = 0;
		in->cluster.host_bw = in->cluster.pcie_bw = 1e10;
	}
	*mesh = in->fix;
	mesh->tp = j->tp;
	mesh->pp = j->pp;
	mesh->cp = j->cp;
	mesh->ep = j->ep;
	mesh->dp = j->world / (j->tp * j->pp * j->cp);
	mr_plan_mesh_worker_defaults(mesh);
	in->global_batch = mesh->dp * accum * B;
	cr_assert_eq(mr_plan_mesh_check(in, mesh, &eb), 0, "%s: %s", j->cfg, eb.msg);
}

#endif
