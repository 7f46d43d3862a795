/*
 * mesh_auto.c - --mesh auto (see mesh_auto.h): the top plan for the world
 * the job gets. A job of fixed size plans once, at config load (so the job
 * spec carries the mesh); an elastic one plans each round (workers.c).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mesh_auto.h"
#include "mr_gpt_worker.h"
#include "mr_log.h"
#include "plan/mr_plan.h"

/* The cluster the plan is for: a preset of `world` GPUs, nproc_per_node
 * to a node, or this machine's CPU ranks with the runtime's threads. */
static int cluster_of(const struct mr_agent_config *cfg, int world, struct mr_plan_cluster *c,
		      struct mr_errbuf *eb)
{
	struct mr_errbuf pe = { { 0 }, { 0 } };
	int rc;

	if (!strcmp(cfg->plan_cluster, "local")) {
		json_t *t = cfg->workload_json ? json_object_get(cfg->workload_json, "threads")
					       : NULL;
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		int threads = t && json_integer_value(t) > 0 ? (int)json_integer_value(t)
			      : cpus > cfg->nproc_per_node ? (int)(cpus / cfg->nproc_per_node)
							   : 1;
		rc = mr_plan_cluster_local(world, threads, c, &pe);
	} else {
		rc = mr_plan_cluster_preset(cfg->plan_cluster, world, c, &pe);
	}
	if (rc < 0)
		return mr_errf_field(eb, rc, "plan_cluster", "plan_cluster: '%s' is not a preset "
							     "(local, h100, h200, a100-80g, a100-40g, "
							     "v100-32g)",
				     cfg->plan_cluster);
	c->gpus_per_node = cfg->nproc_per_node;
	return 0;
}

int mr_agent_mesh_auto(const struct mr_agent_config *cfg, int world, struct mr_agent_mesh *mesh,
		       json_t **workload, struct mr_errbuf *eb)
{
	struct mr_plan_input in;
	struct mr_plan_result r = { 0 };
	struct mr_errbuf pe = { { 0 }, { 0 } };
	const struct mr_plan *p;
	char line[160], why[512];
	int rc;

	*workload = NULL;
	if ((rc = cluster_of(cfg, world, &in.cluster, eb)) < 0)
		return rc;
	if ((rc = mr_plan_from_workload(cfg->workload_json, world, &in, &pe)) < 0)
		return mr_errf_field(eb, rc, "mesh", "mesh: auto: %s", pe.msg);
	in.fix.tp = cfg->fix_tp;
	in.fix.pp = cfg->fix_pp;
	in.fix.cp = cfg->fix_cp;
	in.fix.ep = cfg->fix_ep;
	if ((rc = mr_plan_search(&in, &r, &pe)) < 0)
		return mr_errf_field(eb, rc, "mesh", "mesh: auto: %s", pe.msg);
	if (r.n == 0 || !r.fitting) {
		if (r.n)
			mr_plan_limit(&in, &r.plan[0], why, sizeof(why));
		rc = mr_errf_field(eb, MR_EINVAL, "mesh", "mesh: auto: %s for %d ranks: %s",
				   r.n ? "nothing fits" : "no valid mesh", world,
				   r.n ? why : r.refused);
		mr_plan_result_release(&r);
		return rc;
	}
	p = &r.plan[0];
	*mesh = (struct mr_agent_mesh){ p->mesh.tp, p->mesh.pp, p->mesh.cp, p->mesh.ep,
					p->mesh.dp };
	*workload = cfg->workload_json ? json_deep_copy(cfg->workload_json) : json_object();
	if (!*workload || mr_plan_to_workload(&p->mesh, *workload) < 0) {
		json_decref(*workload);
		*workload = NULL;
		mr_plan_result_release(&r);
		return mr_errf(eb, MR_ENOMEM, "mesh: auto: out of memory");
	}
	mr_plan_mesh_format(&p->mesh, line, sizeof(line));
	mr_log_info("mesh_auto",
		    "world=%d cluster=%s plan=\"%s\" mem_gb=%.3f step_s=%.4g valid=%d fit=%d", world,
		    in.cluster.name, line, p->mem.total / 1e9, p->time.step_s, r.n, r.fitting);
	mr_plan_result_release(&r);
	return 0;
}
