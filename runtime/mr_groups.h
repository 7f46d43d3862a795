/*
 * mr_groups.h - the communicators of one rank's place in the mesh: the
 * world, its tensor-parallel group and its data-parallel group (split into
 * HSDP shard and replica groups when asked), built from struct
 * mr_worker_env through the job's bootstrap KV.
 *
 * Groups follow common/mr_mesh.h (Megatron order, tp fastest). HSDP cuts
 * the dp group (dp indices 0..D-1) into D/s shard groups of s consecutive
 * indices; replica group j holds the indices equal to j modulo s.
 *
 * A group of size 1 has no communicator (NULL): callers skip collectives.
 * Creation is collective over every rank of the job and can be cancelled
 * through the worker's abort flag; mr_groups_abort unblocks every pending
 * operation from another thread.
 *
 * Non-goals: pipeline, context and expert groups (the runtime refuses
 * pp, cp, ep > 1 until those modes land).
 */
#ifndef MR_GROUPS_H
#define MR_GROUPS_H

#include <stdatomic.h>

#include "comm/mr_comm.h"
#include "mr_mesh.h"
#include "mr_worker.h"

struct mr_groups {
	struct mr_mesh mesh;
	struct mr_mesh_coord me;
	int rank;
	int hsdp_shard;          /* s; 0 or dp: plain data parallel */
	struct mr_comm *world;   /* NULL when world_size == 1 */
	struct mr_comm *tp;      /* NULL when tp == 1 */
	struct mr_comm *dp;      /* NULL when dp == 1 */
	struct mr_comm *shard;   /* ZeRO sharding group: dp, or the HSDP shard */
	struct mr_comm *replica; /* HSDP replicas; NULL otherwise */
};

/* Checks the mesh for what the runtime supports (pp, cp, ep == 1) and that
 * hsdp_shard divides dp, before any communication; the message names the
 * field. */
int mr_groups_check(const struct mr_worker_env *env, int hsdp_shard, struct mr_errbuf *eb);
/* Creates the communicators (collective over the job). */
int mr_groups_create(struct mr_groups *g, const struct mr_worker_env *env, int hsdp_shard,
		     long timeout_ms, const _Atomic int *cancel, struct mr_errbuf *eb);
/* Thread-safe: every pending and future operation fails promptly. */
void mr_groups_abort(struct mr_groups *g);
void mr_groups_release(struct mr_groups *g);

#endif
