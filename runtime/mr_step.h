/*
 * mr_step.h - the step driver: one optimizer step of a GPT rank, written
 * once for every placement (Megatron-Core's forward_backward_func +
 * finalize_model_grads + optimizer.step, in one place).
 *
 *   1. data parallelism begins the step (zeroes the gradients it owns);
 *   2. the schedule runs forward and backward of the step's micro-batches
 *      (mr_sched_sequential: one after the other; mr_sched_pipeline: the
 *      stage's pipeline schedule, parallel/mr_pp.h), telling data
 *      parallelism which one is the last;
 *   3. data parallelism finishes the gradients (waits for the bucket
 *      reductions, the HSDP replica reduction); a pipeline then sums the
 *      tied embeddings' gradients of its first and last stage;
 *   4. the gradient norm over the whole job (every parameter counted once
 *      across tp, pp, dp replicas and ZeRO shards) and the mean loss, summed
 *      exactly so every rank sees the same values; non-finite losses and
 *      norms fail the step on every rank together, naming the step and the
 *      first non-finite tensor;
 *   5. clipping, the scheduled LR and AdamW on the range this rank owns,
 *      then the updated parameters are shared again (ZeRO).
 *
 * Device graphs (CUDA graphs; a device with graph_run, mr_device.h):
 * after MR_STEP_WARMUP eager steps, each micro-batch's forward and
 * backward (the sequential schedule) and the AdamW update run as two
 * graphs - where nothing inside them talks to another rank: no pipeline,
 * tp, cp or ep, and data parallelism that issues nothing from the passes
 * (mr_dp_graph_safe). Elsewhere, or when a capture fails (something needs
 * the host, as a MoE layer's routing counts do), graphs are off for the
 * job, logged once with the reason (event cuda_graph_off).
 * MESHRUN_CUDA_GRAPHS=0 turns them off; the device counts the launches
 * (mr_dev.graph_launches).
 *
 * Data parallelism (parallel/mr_dp.h) owns gradients and optimizer state
 * in every configuration; with one replica it is the identity (no
 * communicator, no copies), so one rank runs exactly this code too.
 *
 * Ownership: struct mr_step is the caller's; it borrows the model and the
 * communicators, owns the data-parallel state (mr_step_release). The model
 * must be created with mr_dp_model_flags(dc->zero).
 * Non-goals: data loading (the worker).
 */
#ifndef MR_STEP_H
#define MR_STEP_H

#include <stdint.h>
#ifndef __cplusplus
#include <stdatomic.h>
#endif

#include "model/mr_gpt.h"
#include "optim/mr_adamw.h"
#include "parallel/mr_dp.h"
#include "parallel/mr_pp.h"

struct mr_step_result {
	float loss;      /* mean cross-entropy over the step's micro-batches, all ranks */
	float aux_loss;  /* mean MoE aux loss (before aux_coef) */
	float grad_norm; /* global, before clipping */
	float lr;
	int requested;   /* some rank set its request flag for this step */
};

struct mr_step;

/* Eager steps before the first capture: the warm-up that allocates every
 * buffer, workspace and plan a graph then uses. */
#define MR_STEP_WARMUP 2

/* struct mr_step's graphs. */
enum mr_step_graphs {
	MR_STEP_GRAPHS_OFF,    /* MESHRUN_CUDA_GRAPHS=0, not eligible, or a capture failed */
	MR_STEP_GRAPHS_WANTED, /* not yet checked for eligibility */
	MR_STEP_GRAPHS_ON
};

/* A micro-batch schedule: runs forward and backward of the step's accum
 * micro-batches (inputs/targets: accum consecutive (B,T) blocks), calling
 * mr_dp_micro_batch before each, and adds each micro-batch's loss and aux
 * loss to loss[0] and loss[1]. */
struct mr_step_sched {
	const char *name;
	int (*run)(struct mr_step *s, const int *inputs, const int *targets, int accum,
		   double loss[2], struct mr_errbuf *eb);
};

/* Forward then backward, micro-batch after micro-batch. */
extern const struct mr_step_sched mr_sched_sequential;
/* The pipeline stage's schedule (mr_step_pipeline). */
extern const struct mr_step_sched mr_sched_pipeline;

struct mr_step {
	struct mr_gpt *m;                  /* borrowed */
	struct mr_dp *dp;                  /* owned */
	struct mr_pp *pp;                  /* owned; NULL without a pipeline */
	const struct mr_step_sched *sched; /* mr_sched_sequential after init */
	enum mr_step_graphs graphs;        /* device graphs (see the header) */
	int eager;                         /* this step without graphs (a profiled
					    * step times each operation) */
	int warm;                          /* steps run, up to MR_STEP_WARMUP */
#ifndef __cplusplus /* CUDA sources use only struct mr_step_result */
	atomic_int micro;                  /* micro-batch being run, -1 outside the
					    * schedule (progress reports) */
	atomic_int request;                /* any thread: ask every rank (a flag agreed
					    * on in the step's statistics; the
					    * result's `requested`), e.g. a checkpoint */
#endif
};

/*
 * Sets up the step for model m: data parallelism from dc (NULL: DDP with
 * the default bucket and overlap) over the communicators c (NULL: one
 * replica; with tp > 1 the norm and loss are then summed over the model's
 * tp group), AdamW from oc, parameters initialised from seed.
 */
int mr_step_init(struct mr_step *s, struct mr_gpt *m, const struct mr_adamw_config *oc,
		 const struct mr_dp_config *dc, const struct mr_dp_comms *c, uint64_t seed,
		 struct mr_errbuf *eb);
/* Makes the step a pipeline stage's (mr_pp_create; dc given to init must
 * have passed mr_pp_dp_config). */
int mr_step_pipeline(struct mr_step *s, const struct mr_pp_config *c, struct mr_errbuf *eb);
/* One optimizer step; see the header. */
int mr_step_run(struct mr_step *s, const int *inputs, const int *targets, int accum,
		struct mr_step_result *r, struct mr_errbuf *eb);
/* The mean loss of n (B,T) batches, forward only (a pipeline: through its
 * stages; every rank gets it). */
int mr_step_eval(struct mr_step *s, const int *inputs, const int *targets, int n, double *loss,
		 struct mr_errbuf *eb);
/* Safe on a zeroed or released struct. */
void mr_step_release(struct mr_step *s);

#endif
