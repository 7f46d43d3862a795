/*
 * names.c - the names of operation kinds and group kinds in a progress
 * report (see mr_names.h).
 *
 * Non-goals: anything that needs a communicator.
 */
#include "mr_mesh.h"
#include "mr_names.h"

static const char *const op_names[MR_COMM_OP__COUNT] = {
	[MR_COMM_OP_NONE] = "none",
	[MR_COMM_OP_ALLREDUCE] = "allreduce",
	[MR_COMM_OP_REDUCE_SCATTER] = "reduce_scatter",
	[MR_COMM_OP_ALLGATHER] = "allgather",
	[MR_COMM_OP_ALLTOALL] = "alltoall",
	[MR_COMM_OP_BROADCAST] = "broadcast",
	[MR_COMM_OP_SEND] = "send",
	[MR_COMM_OP_RECV] = "recv",
	[MR_COMM_OP_SENDRECV] = "sendrecv",
	[MR_COMM_OP_BARRIER] = "barrier",
};

const char *mr_comm_op_name(int op)
{
	return op >= 0 && op < MR_COMM_OP__COUNT ? op_names[op] : "?";
}

int mr_comm_op_is_p2p(int op)
{
	return op == MR_COMM_OP_SEND || op == MR_COMM_OP_RECV || op == MR_COMM_OP_SENDRECV;
}

const char *mr_groups_kind_name(int kind)
{
	if (kind >= 0 && kind < MR_GROUP__COUNT)
		return mr_mesh_group_name((enum mr_mesh_group)kind);
	if (kind == MR_WORKER_GROUP_HSDP_SHARD)
		return "hsdp_shard";
	if (kind == MR_WORKER_GROUP_EMBED)
		return "embed";
	if (kind == MR_WORKER_GROUP_KV)
		return "kv";
	return kind == MR_WORKER_GROUP_HSDP_REPLICA ? "hsdp_replica" : NULL;
}
