/*
 * plan_comm.c - the cost of a collective (alpha-beta, ring algorithms as
 * NCCL and the host backend run large messages) and whether a group of
 * the mesh crosses a node boundary (common/mr_mesh.h: the same groups
 * the agent and the runtime build; ranks of a node are consecutive).
 *
 * Bus-bandwidth convention (nccl-tests): a ring all-reduce of B bytes
 * over n ranks sends 2(n-1)/n B per rank in 2(n-1) steps; an all-gather,
 * a reduce-scatter or an all-to-all (n-1)/n B in n-1 steps. Each step
 * costs the link's latency, each byte 1/bandwidth of the link; a group
 * that spans nodes runs at the inter-node link (one NIC per GPU).
 *
 * Non-goals: tree or hierarchical algorithms, congestion, SHARP.
 */
#include "mr_mesh.h"
#include "plan_int.h"

double mr__plan_coll(const struct mr_plan_cluster *c, enum mr__plan_op op, int n, int inter,
		     double bytes, double *sent)
{
	double bw = inter ? c->bw_inter : c->bw_intra, a = inter ? c->lat_inter : c->lat_intra;

	if (inter > 1 && c->bw_cross > 0)
		bw = c->bw_cross;
	if (inter > 1 && c->lat_cross > 0)
		a = c->lat_cross;
	double steps, frac;

	*sent = 0;
	if (op == MR__OP_P2P) {
		*sent = bytes;
		return a + bytes / bw;
	}
	if (n <= 1 || bytes <= 0)
		return 0;
	steps = op == MR__OP_ALLREDUCE ? 2.0 * (n - 1) : (double)(n - 1);
	frac = steps / n;
	*sent = frac * bytes;
	return steps * a + frac * bytes / bw;
}

/* 1 when group id of kind g has members on different nodes: its members
 * ascend and a node's ranks are consecutive, so its first and last tell. */
static int spans(const struct mr_mesh *mesh, int g, int id, int n, int per_node)
{
	int lo = mr_mesh_group_member(mesh, (enum mr_mesh_group)g, id, 0);
	int hi = mr_mesh_group_member(mesh, (enum mr_mesh_group)g, id, n - 1);

	return lo < 0 || hi < 0 || lo / per_node != hi / per_node;
}

/* 2 when group id of kind g has members in different domains of the
 * topology, 1 on different nodes, else 0. */
static int tier(const struct mr_mesh *mesh, const struct mr_plan_topo *t, int g, int id, int n,
		int per_node)
{
	int first = mr_mesh_group_member(mesh, (enum mr_mesh_group)g, id, 0), worst = 0;

	for (int i = 1; i < n && worst < 2; i++) {
		int r = mr_mesh_group_member(mesh, (enum mr_mesh_group)g, id, i);

		if (r < 0 || first < 0 || r / per_node >= t->nodes)
			return 2;
		if (r / per_node != first / per_node)
			worst = t->domain[r / per_node] != t->domain[first / per_node] ? 2 : 1;
	}
	return worst;
}

int mr_plan_group_link(const struct mr_plan_input *in, const struct mr_plan_mesh *m, int g)
{
	struct mr_mesh mesh;
	int n, count;

	if (mr_mesh_init(&mesh, in->cluster.gpus, m->tp, m->pp, m->cp, m->ep, m->dp, NULL) < 0)
		return 1;
	n = mr_mesh_group_size(&mesh, (enum mr_mesh_group)g);
	count = mr_mesh_group_count(&mesh, (enum mr_mesh_group)g);
	if (n <= 1 || count < 1)
		return 0;
	/* the first and the last group: with nodes of a size the group
	 * strides do not divide, the last is where a boundary cuts first */
	if (in->topo) { /* every group of the kind: domains need not be alike */
		int worst = 0;

		for (int id = 0; id < count && worst < 2; id++) {
			int t = tier(&mesh, in->topo, g, id, n, in->cluster.gpus_per_node);

			worst = t > worst ? t : worst;
		}
		return worst;
	}
	return spans(&mesh, g, 0, n, in->cluster.gpus_per_node) ||
	       spans(&mesh, g, count - 1, n, in->cluster.gpus_per_node);
}
