/*
 * mr_pp.h - a pipeline stage at run time: the step's micro-batches
 * through the stage's chunks in the order of its schedule
 * (parallel/mr_pp_sched.h), activations forward and their gradients
 * backward between neighbour stages with tagged point-to-point operations
 * on the pp communicator, and the tied embeddings' gradient summed
 * between the first and the last stage (Megatron's embedding group).
 *
 * Transfers: every receive is posted as soon as its buffer is free (the
 * micro-batch slot it lands in has no earlier occupant left), so it
 * overlaps the passes before it; every send is posted right after the pass
 * that produced it - and kicked (mr_comm_kick), so a neighbour already
 * waiting for it does not wait for this rank's progress thread to get a
 * busy core - and waited only when its slot is reused or at the end of
 * the step. What crosses a stage boundary is the residual stream of the
 * micro-batch, (Nl, C) rows in the activation type: with sequence
 * parallelism only the rank's sequence shard. Sends rely on the
 * communicator buffering them (the host backend does; see mr_comm.h).
 * A backend that runs send/recv in issue order on one stream (NCCL) would
 * stall behind a receive posted ahead: there the runner posts each
 * receive at its action, grouped (mr_comm_group_start/end) with the send
 * of the action before - Megatron-Core's batched p2p pattern
 * (mr_pp_config.paired; "pp_p2p" in the worker's config).
 *
 * Micro-batch slots: the stage owns them (parallel/mr_pp_slots.h; the
 * model carves each one's state and knows only the one in use). A slot
 * holds a micro-batch's activations from its first forward on the stage
 * to its last backward (W for zb-h1); slots are assigned in order of
 * first use, lowest free first, so a stage allocates exactly as many as
 * its schedule keeps in flight: m for gpipe, min(p - s, m) for 1f1b on
 * stage s. Freed with the stage, they leave the model its one state.
 *
 * Data parallelism under a pipeline (mr_pp_dp_config): gradients are
 * accumulated unsharded over the step's micro-batches and reduced once,
 * when the stage's last backward is done (which overlaps the other
 * stages' cool-down); ZeRO-2 and ZeRO-3 run as ZeRO-1 on each stage:
 * parameters stay gathered for the step and gradients are reduce-scattered
 * once per step. That is torchtitan's FSDP + pipeline setting
 * (reshard_after_forward off, gradient sync on the last backward only),
 * whose peak - full parameters and gradients of the stage during the step,
 * sharded optimizer state - it equals; the stage itself is the memory
 * saving.
 *
 * Stats (mr_pp_stats): the stage's compute time, its time blocked on
 * transfers, the schedule's wall time, and the bubble as Megatron defines
 * it: (makespan - busy) / busy, makespan the longest schedule of any
 * stage in the step (mr_pp_finish shares it over the pp group).
 *
 * Ownership: borrows the model (freed before it) and the communicators;
 * owns its plans and slots (mr_pp_free). Non-goals: choosing the split
 * (mr_pp_split.h).
 */
#ifndef MR_PP_H
#define MR_PP_H

#ifndef __cplusplus
#include <stdatomic.h>
#endif

#include "model/mr_gpt.h"
#include "parallel/mr_dp.h"
#include "parallel/mr_pp_sched.h"

struct mr_comm;

struct mr_pp_config {
	enum mr_pp_kind kind;
	int v;                 /* chunks per stage (the model's place.chunks) */
	struct mr_comm *pp;    /* the stages of this pipeline, rank = stage */
	struct mr_comm *embed; /* first and last stage (tied embeddings); NULL: p = 1 */
	int paired;            /* 1: each send goes out grouped with the next receive,
				* receives are not posted ahead (an in-order
				* backend, mr_comm_p2p_in_order); 0: ahead */
};

struct mr_pp_stats {
	double busy_s;     /* last step: this stage computing its passes */
	double wait_s;     /* last step: blocked on receives and sends */
	double wall_s;     /* last step: this stage's schedule, first to last pass */
	double makespan_s; /* last step: the longest wall_s of any stage */
	double bubble;     /* (makespan_s - busy_s) / busy_s */
	int slots;         /* micro-batches whose activations the stage holds at once */
	long sends, recvs; /* last step */
};

struct mr_pp;

/* The data-parallel config a pipeline stage runs (the rule above). */
void mr_pp_dp_config(struct mr_dp_config *dc);

/* A stage of model m (placed with pp > 1, or chunks on one rank); checks
 * the schedule against the model's chunks (field "pp_virtual"). Set the
 * model's recompute mode before (mr_gpt_set_recompute): the stage's
 * slots are carved to it. */
int mr_pp_create(struct mr_pp **out, struct mr_gpt *m, const struct mr_pp_config *c,
		 struct mr_errbuf *eb);
/*
 * Runs the step's accum micro-batches (inputs/targets: accum consecutive
 * (B,T) blocks) through the stage's schedule, gradients scaled by
 * 1/accum. Adds to loss[0] the micro-batches' losses (last stage) and to
 * loss[1] the aux losses of the stage's MoE layers. micro (may be NULL)
 * gets the micro-batch being run.
 */
int mr_pp_run(struct mr_pp *pp, struct mr_dp *dp, const int *inputs, const int *targets,
	      int accum, double loss[2], _Atomic int *micro, struct mr_errbuf *eb);
/* After mr_dp_finish_grads: sums the embeddings' gradients of the first
 * and the last stage, and shares the step's makespan over the stages. */
int mr_pp_finish(struct mr_pp *pp, struct mr_dp *dp, struct mr_errbuf *eb);
/* Forward only, n (B,T) batches: the mean loss, on every stage. */
int mr_pp_eval(struct mr_pp *pp, const int *inputs, const int *targets, int n, double *loss,
	       struct mr_errbuf *eb);
void mr_pp_stats(const struct mr_pp *pp, struct mr_pp_stats *st);
/* NULL is a no-op. */
void mr_pp_free(struct mr_pp *pp);

#endif
