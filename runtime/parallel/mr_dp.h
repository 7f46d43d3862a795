/*
 * mr_dp.h - data parallelism for a GPT rank: DDP with overlapped gradient
 * buckets, ZeRO-1/2/3 (FSDP-style) sharding and HSDP. It owns gradients
 * and optimizer state in every configuration; with one replica (no shard,
 * no replica communicator, zero 0) it is the identity: the model's own
 * gradients, plain AdamW, no copies. The step driver (mr_step.h) calls it.
 *
 * Semantics: gradients are averaged over the data-parallel ranks (shard x
 * replica), so dp ranks that each run `accum` micro-batches compute the
 * same step as one rank running accum*dp micro-batches with accumulation.
 * Then the global gradient norm (every parameter counted once across dp
 * replicas, ZeRO shards and tp), clipping, the scheduled LR and AdamW with
 * mr_adamw_update_range's arithmetic.
 *
 *   zero 0 (DDP): full params, grads and Adam state on every rank. Grads
 *     are cut into buckets of whole units (>= bucket_bytes, contiguous as
 *     units complete U-1, U-2, ..., 0; U = m->nunits, two per layer); on
 *     the final micro-batch each bucket is all-reduced (AVG, async) from
 *     post_bwd as soon as its last unit is done, overlapping the rest of
 *     backward. Earlier micro-batches only
 *     accumulate locally. overlap = 0: one blocking all-reduce after
 *     backward.
 *   zero 1: Adam state sharded: each rank owns 1/S of every unit (the unit
 *     padded to a multiple of S, padding kept zero). Full grads; on the
 *     final micro-batch each unit is reduce-scattered (AVG) into the grad
 *     shard from post_bwd (async; a unit is a bucket), AdamW runs on the
 *     shard, then the params are all-gathered.
 *   zero 2: grads sharded too: the model's grad views point at unit-sized
 *     scratch slots (unit 0 and unit U-1 have their own, held for the
 *     whole backward; layers alternate between two), each unit is
 *     reduce-scattered from post_bwd on EVERY micro-batch and the result
 *     is added into the shard accumulator; a slot is reused only after its
 *     reduce-scatter completed. Full grads never exist.
 *   zero 3 (FSDP): params sharded too: pre_fwd / pre_bwd all-gather the
 *     unit into a slot (same slot scheme as the grads) and prefetch the
 *     next one asynchronously; units 0 and U-1 stay gathered for the whole
 *     step (FSDP's root unit); a layer slot still holding the unit (the
 *     last layer between forward and backward) is reused without a second
 *     gather. Params are re-gathered after each optimizer step lazily.
 *   HSDP: with comms.replica, the shard (ZeRO) or full (DDP) gradients are
 *     all-reduced (AVG) across the replica group after the shard-group
 *     reduction.
 *   Expert parallel (comms.expert, the expert-data-parallel group): an
 *     expert's gradient already sums its ep ranks' micro-batches, so it
 *     averages over that group and is divided by ep. DDP: after the
 *     backward, the table's dense and expert ranges each all-reduced over
 *     their group. ZeRO: a MoE unit is two pieces - its dense tensors and
 *     its experts (last in the unit) - each padded and sharded over its
 *     own group (the shard group; the expert group), so every collective
 *     above runs per piece over the piece's group. Not with HSDP.
 *
 * Model flags: the caller creates the model with mr_dp_model_flags(zero)
 * (zero >= 1: MR_GPT_EXT_PARAMS and _GRADS - this module owns padded
 * buffers and binds the units; zero 0: the model allocates both).
 *
 * Memory per rank (all through mr_mem_alloc on m->mem; Np = sum over units
 * of the unit size rounded up to a multiple of S = shard size - with ep >
 * 1 each unit's experts separately to a multiple of the expert group's
 * size Se, their shard 1/Se; P_u = unit u's padded size; Pm = largest
 * padded layer unit; s_u, sm their shards = P_u / S, Pm / S without ep):
 *   zero 0: PARAMS 4N, GRADS 4N (the model's), OPTIM 8N
 *   zero 1: PARAMS 4Np, GRADS 4Np + 4Np/S (shard), OPTIM 8Np/S
 *   zero 2: PARAMS 4Np, GRADS 4Np/S + 4(P_0 + P_U-1 + 2Pm) (slots),
 *           OPTIM 8Np/S, WORKSPACE +4(s_0 + s_U-1 + 2sm) (scatter outputs)
 *   zero 3: PARAMS 4Np/S + 4(P_0 + P_U-1 + 2Pm) (gather slots), GRADS,
 *           OPTIM and WORKSPACE as zero 2
 * i.e. about 16, 8 + 8/S, 4 + 12/S and 16/S bytes per parameter plus the
 * named slots (the model's ACTS / WORKSPACE come on top).
 *
 * Failure: a failed collective breaks the step on this rank (others time
 * out). Non-finite losses / grad norms are detected after the world
 * reduction, so every rank returns MR_ENONFINITE together; the message
 * names the step and the first non-finite tensor this rank holds.
 *
 * Offload (ZeRO-Offload, Ren et al. 2021; cfg.offload): on a device whose
 * memory is not host memory (cuda), this rank's AdamW moments over its
 * owned range live in host memory (mr_dev_host_alloc: pinned on cuda)
 * beside host copies of its owned gradients and parameters - 16 bytes
 * per owned parameter under MR_MEM_HOST; the device's MR_MEM_OPTIM is 0.
 * mr_dp_update scales the owned gradients on the device,
 * downloads them, runs mr_adamw_update_range over the host shard segment
 * by segment (the arithmetic of the device's adamw, so the emulated
 * device gives the same bits) and sends the parameters back:
 *   OPTIM   the device's fp32 weights stay the master: downloaded, updated
 *           and uploaded each step, then refreshed and all-gathered as
 *           without offload;
 *   MASTER  the host copy is the master and the device holds no fp32
 *           weights at all (mr_dp_model_flags_on): the updated master is
 *           published in bf16 - uploaded a unit's shard at a time into an
 *           fp32 staging buffer (workspace) and converted there by the
 *           device (to_act, a refresh's rounding) - into the model's
 *           compute copy (zero 0), into this rank's bf16 shard then
 *           all-gathered in bf16 into a padded compute copy the model's
 *           views are bound to (zero 1/2), or into a bf16 shard the
 *           parameter gathers read straight into their slots (zero 3).
 *           The device saves its fp32 weights (zero 0: 4 bytes a
 *           parameter; zero 1/2: the padded fp32 copy and the whole bf16
 *           one become a padded bf16 copy; zero 3: half the shard and the
 *           slots' fp32 buffers). fp32 activations refuse it ("offload"):
 *           there the device's weights are the master.
 * The host AdamW runs over mr_dp_host_threads's pool (the worker's: its
 * CPUs over its local ranks). The step is synchronous: nothing overlaps
 * the next forward (that would need ZeRO-Offload's one-step delayed
 * update, which changes training).
 * On a device whose memory is host memory (cpu) the option changes
 * nothing (logged once).
 *
 * Ownership: struct mr_dp borrows the model and the communicators (they
 * must outlive it), sets m->hooks, and owns its buffers (mr_dp_free).
 * A pipeline stage (mr_pp.h) is a model like any other here; mr_pp_dp_config
 * says which config it runs. Non-goals: mixed precision.
 */
#ifndef MR_DP_H
#define MR_DP_H

#include <stddef.h>
#include <stdint.h>

#include "model/mr_gpt.h"
#include "optim/mr_adamw.h"

struct mr_comm;
struct mr_dp;

/* Where the optimizer state lives (ZeRO-Offload): on the device (NONE),
 * or this rank's AdamW moments (OPTIM), with its fp32 master shard too
 * (MASTER), in host memory, the step run there by the cpu AdamW. */
enum mr_dp_offload { MR_DP_OFFLOAD_NONE, MR_DP_OFFLOAD_OPTIM, MR_DP_OFFLOAD_MASTER };

struct mr_dp_config {
	int zero;            /* 0 DDP, 1, 2, 3 */
	size_t bucket_bytes; /* DDP bucket size; 0: 1 MiB (the last bucket to start is
			      * exposed: small buckets keep it short) */
	int overlap;         /* 1: reduce from the backward hooks; 0: after backward */
	int offload;         /* enum mr_dp_offload (0: none) */
};

struct mr_dp_comms {
	struct mr_comm *shard;   /* grads averaged, ZeRO state sharded; NULL = 1 rank */
	struct mr_comm *replica; /* HSDP replica group (grads averaged too); NULL = none */
	struct mr_comm *world;   /* every rank: grad norm and loss; NULL = single rank */
	struct mr_comm *expert;  /* expert parallel (ep > 1): the expert-data-parallel
				  * group (dp / ep ranks holding the same experts),
				  * which averages the experts' grads; NULL = 1 rank */
};

struct mr_dp_stats {
	double comm_wait_s; /* last step: blocked on grad/param communication */
	double comm_s;      /* last step: first grad collective issued to last one done */
	long grad_colls;    /* last step: gradient collectives issued (all groups) */
	long param_colls;   /* last step: parameter all-gathers issued */
};

/* Offload: the threads the host's AdamW runs on (borrowed; NULL: the
 * calling thread alone). */
void mr_dp_host_threads(struct mr_dp *d, struct mr_pool *pool);

/* The MR_GPT_EXT_* flags of a model used with this zero stage. */
unsigned mr_dp_model_flags(int zero);
/* The same with offload on dev: optimizer+master on a device whose memory
 * is not host memory keeps no fp32 weights there (see Offload above). */
unsigned mr_dp_model_flags_on(const struct mr_dev *dev, int zero, int offload);

/* Initialises the parameters from seed (as mr_gpt_init_params would, each
 * rank keeping its shard under zero 3). oc is copied. MR_EINVAL with field
 * "zero" for an unknown stage, "ext_params"/"ext_grads" when the model was
 * not created with mr_dp_model_flags. */
int mr_dp_create(struct mr_dp **out, struct mr_gpt *m, const struct mr_adamw_config *oc,
		 const struct mr_dp_config *cfg, const struct mr_dp_comms *c, uint64_t seed,
		 struct mr_errbuf *eb);
/* ---- what the step driver (mr_step.h) calls, in this order ---- */

/* Starts a step: zeroes the gradients this rank owns, resets the stats. */
void mr_dp_begin(struct mr_dp *d);
/* Before each micro-batch's forward: final = 1 for the step's last one
 * (DDP and ZeRO-1 reduce only then). */
void mr_dp_micro_batch(struct mr_dp *d, int final);
/* After the last backward (Megatron's finalize_model_grads): issues what
 * overlap = 0 left, waits for every gradient reduction of the step, then
 * the HSDP replica all-reduce. */
int mr_dp_finish_grads(struct mr_dp *d);
/* In: v[1], v[2] this rank's mean loss and aux loss over its micro-batches,
 * v[3] a flag of this rank (0 or 1: the step driver's request).
 * Out: v[0] the sum of squares of every gradient of the job (each counted
 * once), v[1], v[2] the means over every rank, v[3] the flags' sum;
 * identical on every rank. */
#define MR_DP_NSTATS 4
int mr_dp_reduce_stats(struct mr_dp *d, double v[MR_DP_NSTATS]);
/* Name of the first tensor with a non-finite value in this rank's owned
 * params (grads = 0) or grads (grads = 1), or NULL. */
const char *mr_dp_first_nonfinite(struct mr_dp *d, int grads);
/* Optimizer steps taken so far, and the optimizer's config. */
long mr_dp_steps(const struct mr_dp *d);
const struct mr_adamw_config *mr_dp_adamw(const struct mr_dp *d);
/* Clips the owned gradients to the global norm, runs AdamW at lr on the
 * owned range and shares the updated parameters (ZeRO): mr_dp_update_args
 * (the step's scalars: the step count, clip factor and rate, given to the
 * device's adamw_args - the clipping rides in AdamW, the gradients stay
 * as they are) then mr_dp_update_apply (the device work, which a device
 * graph can capture where mr_dp_graph_safe). */
int mr_dp_update(struct mr_dp *d, double norm, float lr);
int mr_dp_update_args(struct mr_dp *d, double norm, float lr);
int mr_dp_update_apply(struct mr_dp *d);
/* Whether data parallelism issues nothing from the model's hooks and
 * nothing host-side in mr_dp_update_apply (one replica, no ZeRO, no
 * offload), so a step's passes and update can be device graphs; *why
 * says what does otherwise. */
int mr_dp_graph_safe(const struct mr_dp *d, const char **why);

/* The gradients of unit u this rank holds after mr_dp_finish_grads: the
 * whole unit (zero 0) or its shard (zero >= 1); device memory. The same
 * unit layout gives the same shard on every rank of the same shard index
 * (the pipeline sums the tied embeddings' this way). */
void mr_dp_unit_grads(struct mr_dp *d, int u, float **g, size_t *n);
/* This rank's full (tp-local) parameters into dst (m->nparams floats).
 * Collective over the shard group under zero 3. */
int mr_dp_gather_params(struct mr_dp *d, float *dst);
void mr_dp_stats(const struct mr_dp *d, struct mr_dp_stats *st);

/* What this rank holds and updates of one tensor: elements [at, at+n) of
 * the rank's (tp, ep) slice of table tensor `tensor`, its parameters and
 * AdamW moments (n floats each where they live: device memory, or host
 * memory with offload - the moments, and the parameters under MASTER;
 * mr_dp_slice_read and _write copy any of them from wherever it lives). owner: this rank holds
 * the one copy of those elements a checkpoint writes (DDP: data-parallel
 * rank 0, experts: expert-data-parallel rank 0; ZeRO: the shard's holder;
 * of a tensor tp replicates, tp rank 0; never the tied embedding's replica
 * on the last pipeline stage). Valid until mr_dp_free. */
struct mr_dp_slice {
	int tensor;
	size_t at, n;
	int owner;
	float *param, *m, *v;
};
int mr_dp_nslices(const struct mr_dp *d);
void mr_dp_slice(struct mr_dp *d, int i, struct mr_dp_slice *out);
/* What of a slice: its parameters (the master copy: on the host under
 * MR_DP_OFFLOAD_MASTER), AdamW m, AdamW v (mr_ckpt.h's kinds' order). */
enum mr_dp_state { MR_DP_PARAM, MR_DP_ADAM_M, MR_DP_ADAM_V };
/* Slice i's `what` (enum mr_dp_state) into host memory dst (n floats), or
 * from host memory src into it (with MASTER, a parameter write reaches
 * the device at mr_dp_restore); 0 or the device's error. */
int mr_dp_slice_read(struct mr_dp *d, int i, int what, float *dst);
int mr_dp_slice_write(struct mr_dp *d, int i, int what, const float *src);
/* After the caller wrote every slice's param, m and v (a checkpoint
 * loaded): t optimizer steps taken, the parameters shared again (ZeRO-1/2
 * all-gather the shards into the full copy; ZeRO-3 gathers afresh on
 * next use), the compute copy refreshed. Collective over the shard and
 * expert groups. */
int mr_dp_restore(struct mr_dp *d, long t);
/* NULL is a no-op; clears m->hooks. */
void mr_dp_free(struct mr_dp *d);

#endif
