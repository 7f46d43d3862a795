/*
 * mesh_auto.h - the agent's --mesh auto: the mesh of the top plan of
 * runtime/plan/mr_plan.h for the world size the job gets, and the
 * workload config that runs it.
 *
 * The inputs are the job's workload config (the model, micro-batch,
 * precision and what it fixes; mr_plan_from_workload), the world, the
 * --tp/--pp/--cp/--ep the user fixed, and the cluster: --plan-cluster, a
 * preset of identical GPUs with nproc_per_node to a node, or "local" (this
 * machine's CPU ranks). Every agent computes the same plan from the same
 * inputs, so no agent tells the others: name a preset when the agents run
 * on machines that differ ("local" reads this machine).
 *
 * Non-goals: exec mode (there is no model to plan for).
 */
#ifndef MR_AGENT_MESH_AUTO_H
#define MR_AGENT_MESH_AUTO_H

#include <jansson.h>

#include "config.h"
#include "mr_err.h"

struct mr_agent_mesh {
	int tp, pp, cp, ep, dp;
};

/*
 * Plans cfg's job on world ranks: *mesh gets the top plan's sizes and
 * *workload (the caller's reference) cfg's workload config with the plan's
 * keys (batch_size, grad_accum, zero, sequence_parallel, pp_schedule,
 * pp_virtual). MR_EINVAL with field "mesh" and the planner's reason when no
 * mesh is valid or none fits; MR_ENOMEM.
 */
int mr_agent_mesh_auto(const struct mr_agent_config *cfg, int world, struct mr_agent_mesh *mesh,
		       json_t **workload, struct mr_errbuf *eb);

#endif
