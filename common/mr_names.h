/*
 * mr_names.h - the names in a rank's progress report (docs/API.md,
 * "Progress"): the kinds of communication operation and the group kinds
 * beyond common/mr_mesh.h's. The runtime reports these numbers (comm/,
 * mr_groups.h) and the agent forwards them; the controller's diagnosis
 * names them. Numbers travel in heartbeats: append-only.
 *
 * Non-goals: the operations themselves (runtime/comm/mr_comm.h), the
 * groups (runtime/mr_groups.h).
 */
#ifndef MR_NAMES_H
#define MR_NAMES_H

/* Kinds of operation, as progress reports them. Append-only: the numbers
 * travel in heartbeats (docs/API.md). */
enum mr_comm_op {
	MR_COMM_OP_NONE = 0,
	MR_COMM_OP_ALLREDUCE = 1,
	MR_COMM_OP_REDUCE_SCATTER = 2,
	MR_COMM_OP_ALLGATHER = 3, /* and allgatherv */
	MR_COMM_OP_ALLTOALL = 4,  /* and alltoallv */
	MR_COMM_OP_BROADCAST = 5,
	MR_COMM_OP_SEND = 6,
	MR_COMM_OP_RECV = 7,
	MR_COMM_OP_SENDRECV = 8,
	MR_COMM_OP_BARRIER = 9,
	MR_COMM_OP__COUNT
};

/* "allreduce", "reduce_scatter", ..., "none"; "?" when unknown. */
const char *mr_comm_op_name(int op);
/* 1 for send, recv and sendrecv. */
int mr_comm_op_is_p2p(int op);

/* Group kinds of a progress report: common/mr_mesh.h's enum mr_mesh_group,
 * or one of these for groups the mesh function does not define. */
enum {
	MR_WORKER_GROUP_HSDP_SHARD = 64,   /* id: the group's lowest world rank */
	MR_WORKER_GROUP_HSDP_REPLICA = 65,
	MR_WORKER_GROUP_EMBED = 66,        /* pipeline's first + last stage; id: the first's */
	MR_WORKER_GROUP_KV = 67,           /* tp ranks sharing a replicated key/value head;
					    * id: the group's lowest world rank */
};

/* The name of a progress group kind (enum mr_mesh_group or
 * MR_WORKER_GROUP_*): "tp", "dp", ..., "hsdp_shard", "hsdp_replica"; NULL
 * for an unknown kind. */
const char *mr_groups_kind_name(int kind);

#endif
