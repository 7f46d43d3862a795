/*
 * mr_ckpt.h - sharded checkpoints: every rank writes what it owns, one
 * manifest describes the whole, a job resumes exactly or on another mesh.
 *
 * On disk (docs/CHECKPOINTS.md has the full format):
 *
 *   <dir>/step-00000120/manifest.json   the step, mesh, model and training
 *                                        config, data position, tensors and
 *                                        every shard's records
 *   <dir>/step-00000120/rank-00003.bin   rank 3's records: raw little-endian
 *                                        float32, each with its CRC-32C
 *   <dir>/step-00000120/rank-00003.json  rank 3's index (merged into the
 *                                        manifest; kept for inspection)
 *
 * A record is elements [at, at+n) of one kind (param, AdamW m, AdamW v) of
 * one tensor's slice: the slice of tp rank tp_rank of tp (-1: the tensor
 * is not tp-split) and ep rank ep_rank of ep (-1: not an expert tensor).
 * Each element of the model is written once, by its owner (mr_dp.h's
 * struct mr_dp_slice).
 *
 * Writing: each rank snapshots its owned slices into host memory (the
 * step's only cost) and a writer thread writes them into
 * <dir>/.tmp-step-N.<nonce>/ (file to a temporary name, fsync, rename);
 * rank 0's writer waits for every rank's index there, writes the manifest
 * the same way and publishes the directory by renaming it to step-N, then
 * fsyncs <dir> and removes all but the newest `keep` steps. A checkpoint
 * is therefore either published whole or not at all; nothing is ever
 * overwritten in place. The next save waits for the previous one. <dir>
 * must be one filesystem every rank sees (a shared volume on a cluster).
 *
 * Resuming: every rank lists the published steps, newest first, checks
 * the manifest (the model config must equal the job's: a difference is
 * refused naming the field) and reads the records covering what it owns
 * now - each verified against its CRC, only the byte ranges that hold its
 * tensors - reassembling a tensor from another mesh's slices when tp or
 * ep differ (pp, dp, cp and the ZeRO stage never matter: records are by
 * tensor name and element). The ranks agree (an all-reduce over the
 * world) on the newest checkpoint every one of them could load; a
 * truncated, corrupt or inconsistent one is logged naming the file and
 * the reason and the next older one is tried.
 *
 * Ownership: struct mr_ckpt borrows the model, the data-parallel state
 * and the world communicator (they must outlive it) and owns its writer
 * thread and snapshot; mr_ckpt_free waits for a write in flight.
 * Non-goals: compression, object stores, writing fewer bytes than owned.
 */
#ifndef MR_CKPT_H
#define MR_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "model/mr_gpt.h"
#include "optim/mr_adamw.h"
#include "parallel/mr_dp.h"

struct mr_comm;
struct mr_ckpt;

#define MR_CKPT_VERSION 1

enum mr_ckpt_kind { MR_CKPT_PARAM, MR_CKPT_ADAM_M, MR_CKPT_ADAM_V, MR_CKPT_KINDS };
/* a kind is read and written as mr_dp_slice_read/_write's `what` */
_Static_assert((int)MR_CKPT_PARAM == (int)MR_DP_PARAM && (int)MR_CKPT_ADAM_M == (int)MR_DP_ADAM_M &&
		       (int)MR_CKPT_ADAM_V == (int)MR_DP_ADAM_V,
	       "checkpoint kinds follow enum mr_dp_state");

/* The job around the rank: what a manifest records and a resume checks. */
struct mr_ckpt_job {
	int rank, world;
	int tp, cp, dp, pp, ep, zero; /* the mesh */
	int batch_size, seq_len, grad_accum;
	uint64_t seed;
	long total_steps;
	const struct mr_adamw_config *opt;
	struct mr_gpt *m;             /* the rank's model (its table) */
	struct mr_dp *dp_state;       /* its data-parallel state (owned slices) */
	struct mr_comm *world_comm;   /* every rank; NULL: one rank */
	const char *train_data;       /* recorded for inspection; NULL: synthetic */
	const char *job_name;         /* "namespace/name", names the lock's holder; may be NULL */
	const char *run_id;           /* stable across the job's restarts; may be NULL */
};

struct mr_ckpt_opts {
	const char *dir;  /* the checkpoint directory (created if missing) */
	int every;        /* save after every this many steps; 0 = never */
	int keep;         /* published steps kept (>= 1) */
	int async;        /* 1: write in the background; 0: wait for each save */
	long timeout_ms;  /* rank 0 waits this long for every rank's index */
	/* testing: this rank's part of the save at step fail_step fails as on
	 * a full disk (0: never), leaving no marker with fail_unmarked */
	long fail_step;
	int fail_unmarked;
	/* Fencing: rank 0 calls fence(fence_arg) right before it publishes a
	 * step (the rename that makes it visible); a negative return (the
	 * job's generation moved on: this rank is stale, cut off while the
	 * job went on without it) refuses the publish - the step's files are
	 * removed, `checkpoint_fenced` logged - so a stale rank never
	 * publishes over the new generation's checkpoints. NULL: no fence.
	 * Called from the writer thread. */
	int (*fence)(void *fence_arg, struct mr_errbuf *eb);
	void *fence_arg;
	long publish_delay_ms; /* testing: rank 0 sleeps this long before its first fence */
};

struct mr_ckpt_stats {
	long last_step;        /* last checkpoint published (rank 0) or written (others) */
	double last_seconds;   /* its snapshot + write time */
	double stall_seconds;  /* training time the last save took (snapshot, waiting) */
	uint64_t last_bytes;   /* bytes this rank wrote for it */
	long saves;            /* checkpoints written so far */
	long failures;         /* checkpoints that failed (this rank's part; rank 0: any) */
	long resumed_step;     /* step resumed from; 0 = none */
};

int mr_ckpt_create(struct mr_ckpt **out, const struct mr_ckpt_opts *o,
		   const struct mr_ckpt_job *job, struct mr_errbuf *eb);
/* Collective over the world: loads the newest checkpoint every rank can
 * load into the model and data-parallel state; *step its step (0 when
 * there is none: nothing changed). A config mismatch fails naming the
 * field (MR_EINVAL); when checkpoints exist but none is loadable,
 * MR_ECORRUPT naming the newest's reason. */
int mr_ckpt_resume(struct mr_ckpt *c, long *step, struct mr_errbuf *eb);
/* After mr_ckpt_wait on a rank other than 0: waits (timeout_ms at most)
 * until rank 0 has published `step`. A rank that stops after a save (a
 * preemption) waits for it, so its leaving - which ends the job's
 * generation - cannot come before the publish, which the fence would
 * then refuse. 0 on rank 0 at once; MR_ETIMEDOUT, MR_EABORTED. */
int mr_ckpt_wait_published(struct mr_ckpt *c, long step, long timeout_ms, struct mr_errbuf *eb);
/* 1 when a checkpoint is due after `step` steps (every > 0). */
int mr_ckpt_due(const struct mr_ckpt *c, long step);
/* Collective: saves the state after `step` optimizer steps: waits for
 * the previous save (the ranks agree whether all its parts were written),
 * snapshots, then writes (async or here). A failed write is logged
 * (checkpoint_failed) by the ranks whose part failed and by rank 0, and
 * returned to them; the previous step stays the newest and the training
 * state is never touched. */
int mr_ckpt_save(struct mr_ckpt *c, long step, struct mr_errbuf *eb);
/* Collective: waits for the write in flight; its result on every rank
 * (a part that failed on any rank fails it everywhere). */
int mr_ckpt_wait(struct mr_ckpt *c, struct mr_errbuf *eb);
/* Any thread: the job stops - a write in flight stops waiting for other
 * ranks' parts (mr_worker.h's abort). NULL is a no-op. */
void mr_ckpt_abort(struct mr_ckpt *c);
void mr_ckpt_stats(struct mr_ckpt *c, struct mr_ckpt_stats *st);
/* Waits for a write in flight. NULL is a no-op. */
void mr_ckpt_free(struct mr_ckpt *c);

/* ---- offline: inspecting, verifying, exporting (no job) ---- */

/* One tensor as the manifest describes it. */
struct mr_ckpt_tensor {
	char name[32];
	int ndim, full[3];
	int tp_dim, parts, expert;
};

/* One record of a shard. */
struct mr_ckpt_rec {
	int tensor, kind, tp_rank, tp, ep_rank, ep;
	uint64_t at, n, offset;
	uint32_t crc;
	int shard;
};

struct mr_ckpt_shard {
	char file[32];
	int rank;
	uint64_t bytes;
};

/* A parsed manifest. */
struct mr_ckpt_manifest {
	char dir[4096];
	long step, opt_steps;
	struct mr_gpt_config model;
	int tp, cp, dp, pp, ep, zero, world;
	int batch_size, seq_len, grad_accum;
	uint64_t seed;
	long total_steps;
	struct mr_adamw_config opt;
	uint64_t micro_batches;      /* consumed: the data position */
	char *train_data;            /* the token shard trained on; NULL: synthetic */
	int ntensors, nrecs, nshards;
	struct mr_ckpt_tensor *tensors;
	struct mr_ckpt_rec *recs;
	struct mr_ckpt_shard *shards;
};

/* Parses <dir>/manifest.json and checks it against itself: its seal
 * (the CRC-32C of the whole text), every record inside its tensor and
 * its shard's bytes, no two records of a shard overlapping in the file,
 * every tensor's params covered once. The message names the file and
 * the reason; a damaged manifest is MR_ECORRUPT. */
int mr_ckpt_manifest_read(struct mr_ckpt_manifest *mf, const char *dir, struct mr_errbuf *eb);
void mr_ckpt_manifest_release(struct mr_ckpt_manifest *mf);
/* The first model field (the workload key) that differs between a and b,
 * or NULL when they are the same model. */
const char *mr_ckpt_model_diff(const struct mr_gpt_config *a, const struct mr_gpt_config *b);
/* Index of tensor `name`, or -1. */
int mr_ckpt_manifest_find(const struct mr_ckpt_manifest *mf, const char *name);
/* The published step directories of ckpt_dir, newest first: *dirs is a
 * malloc'd array of malloc'd paths (mr_ckpt_list_free); 0 when none. */
int mr_ckpt_list(const char *ckpt_dir, char ***dirs, int *n, struct mr_errbuf *eb);
void mr_ckpt_list_free(char **dirs, int n);
/* The whole (unsliced) tensor i of kind into full (its full element
 * count), every record read verified against its CRC. MR_ENOTFOUND when
 * the checkpoint has no such kind (parameters only, e.g. imported). */
int mr_ckpt_read_full(const struct mr_ckpt_manifest *mf, int i, int kind, float *full,
		      struct mr_errbuf *eb);
/* Every parameter of m (a one-rank model of mf's config; m's tensors are
 * read, nothing else of it) from mf into dst at the table's offsets
 * (m->nparams floats), each reassembled from its mesh and verified: 0,
 * or MR_ECORRUPT naming a tensor missing or shaped otherwise. */
int mr_ckpt_read_model(const struct mr_ckpt_manifest *mf, const struct mr_gpt *m, float *dst,
		       struct mr_errbuf *eb);
/* Reads every record of every shard and checks its CRC and each shard's
 * size; 0 or the first problem (named in eb). *bytes (may be NULL): bytes
 * verified. */
int mr_ckpt_verify(const struct mr_ckpt_manifest *mf, uint64_t *bytes, struct mr_errbuf *eb);
/* Writes a one-rank checkpoint of a whole model's parameters (Adam state
 * absent, as `meshrun ckpt import` makes from safetensors) at step `step`
 * into ckpt_dir, published as any other: full[i] are tensor i's values
 * in the order of a one-rank model's table for cfg. */
int mr_ckpt_write_params(const char *ckpt_dir, const struct mr_gpt_config *cfg, long step,
			 const float *params, struct mr_errbuf *eb);

#endif
