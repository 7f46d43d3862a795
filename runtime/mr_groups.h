/*
 * mr_groups.h - the communicators of one rank's place in the mesh: one
 * per group kind of common/mr_mesh.h (world, tp, cp, dp, pp, ep, edp,
 * dp x cp, tp x cp, model parallel, expert model parallel), the ZeRO /
 * HSDP shard and replica groups, and the rank's struct mr_place; built
 * from struct mr_worker_env through the job's bootstrap KV.
 *
 * Groups follow common/mr_mesh.h (Megatron order, tp fastest). Kinds whose
 * members are the same (dp x cp is dp when cp = 1, ...) share one
 * communicator, so a mesh without cp, pp and ep creates only world, tp
 * and dp. HSDP cuts the dp group (dp indices 0..D-1) into D/s shard groups
 * of s consecutive indices; replica group j holds the indices equal to j
 * modulo s.
 *
 * A group of size 1 has no communicator (NULL): callers skip collectives.
 * Creation is collective over every rank of the job and can be cancelled
 * through the worker's abort flag; mr_groups_abort unblocks every pending
 * operation from another thread.
 *
 * Non-goals: deciding which modes the runtime implements (the gpt worker
 * checks that against the mesh).
 */
#ifndef MR_GROUPS_H
#define MR_GROUPS_H

#include <stdatomic.h>

#include "comm/mr_comm.h"
#include "core/mr_place.h"
#include "mr_mesh.h"
#include "mr_worker.h"

struct mr_gpt_config;

struct mr_groups {
	struct mr_mesh mesh;
	struct mr_mesh_coord me;
	int rank;
	int hsdp_shard;          /* s; 0 or dp: plain data parallel */
	struct mr_comm *group[MR_GROUP__COUNT]; /* NULL for one member; shared by kinds
						  * with the same members */
	struct mr_comm *shard;   /* ZeRO sharding group: dp, or the HSDP shard */
	struct mr_comm *replica; /* HSDP replicas; NULL otherwise */
	struct mr_comm *embed;   /* pp > 1, first and last stage: the tied embeddings'
				  * gradient sum (Megatron's embedding group); else NULL */
	struct mr_comm *kv;      /* replicated key/value heads: the rep consecutive tp
				  * ranks sharing one (mr_groups_kv); else NULL */
	struct mr_place place;   /* the model's view: axes, their groups, sp */
};

/* The mesh of env (world size, tp, pp, cp, ep; dp derived). */
int mr_groups_mesh(const struct mr_worker_env *env, struct mr_mesh *m, struct mr_errbuf *eb);
/* Checks that hsdp_shard divides dp, before any communication; the
 * message names the field. */
int mr_groups_check(const struct mr_worker_env *env, int hsdp_shard, struct mr_errbuf *eb);
/* The placement of env's rank without communicators: what the model is
 * checked against before any communication. */
int mr_groups_place_of(const struct mr_worker_env *env, int sp, struct mr_place *p,
		       struct mr_errbuf *eb);
/* How the communicators move data: the backend ("host" when NULL, or
 * "nccl" with the rank's GPU) and the device whose buffers they take
 * besides host memory (mr_dev_comm.h; NULL: host memory only). */
struct mr_groups_comm {
	const char *backend;
	int gpu;
	const struct mr_comm_device *dev;
};

/* The blocks each stage holds: the pipeline's split of mc at sequence
 * length T (explicit: n_layers counts, or NULL for the balanced split)
 * into p->chunks = v ranges of stage p->index[pp]; v = 1 without a
 * pipeline leaves the whole model (chunks 0). Fields "pp_layers",
 * "pp_virtual". */
int mr_groups_place_layers(struct mr_place *p, const struct mr_gpt_config *mc, int T, int v,
			   const int *layers, int n_layers, struct mr_errbuf *eb);
/* Creates the communicators (collective over the job) and the placement
 * (sp as given); comm NULL: the host backend on host memory. */
int mr_groups_create(struct mr_groups *g, const struct mr_worker_env *env, int hsdp_shard,
		     int sp, long timeout_ms, const _Atomic int *cancel,
		     const struct mr_groups_comm *comm, struct mr_errbuf *eb);
/* Replicated key/value heads (model/mr_gpt.h's mr_gpt_kv_rep, rep > 1):
 * cuts the tp group into groups of rep consecutive tp ranks, the ranks
 * sharing one key/value head, into g->kv and g->place.kv. Collective over
 * the tp group; rep 1 (or one rank) creates none. rep must divide tp. */
int mr_groups_kv(struct mr_groups *g, int rep, struct mr_errbuf *eb);
/* Thread-safe: every pending and future operation fails promptly. */
void mr_groups_abort(struct mr_groups *g);
/*
 * The progress of every distinct communicator of g (groups_progress.c),
 * at most cap: a communicator shared by several kinds is reported once,
 * under the most specific kind (tp, cp, dp, pp, ep, edp, then the
 * composite kinds, world last), so every member names it alike. Thread-
 * safe while operations run. *wait_s (may be NULL) gets the seconds
 * blocked on all of them. Returns how many were written.
 */
/* mr_groups_kind_name(), the name of a progress group kind, is in
 * common/mr_names.h. */
int mr_groups_progress(const struct mr_groups *g, struct mr_worker_group_progress *out, int cap,
		       double *wait_s);
void mr_groups_release(struct mr_groups *g);

#endif
