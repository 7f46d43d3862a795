/*
 * plan_int.h - what the planner's files share (see mr_plan.h): the
 * precision table, the implementations' rules, a stage's layers and
 * units, the schedules' in-flight counts, and the collective cost model.
 */
#ifndef MR_PLAN_INT_H
#define MR_PLAN_INT_H

#include <stddef.h>

#include "model/mr_gpt.h"
#include "mr_plan.h"
#include "parallel/mr_pp_sched.h"

/* ---- precision (plan_presets.c) -------------------------------------- */

/* A part's shard_from for a weight copy (bf16's): no ZeRO stage shards
 * it, and at ZeRO-3 it lives only in the four parameter slots. */
enum { MR__PLAN_SLOTS = 5 };

/* Bytes per parameter of one part of the model states, the ledger kind it
 * is counted under and the first ZeRO stage that shards it. */
struct mr__plan_part {
	double bytes;
	int kind;
	int shard_from;
};

struct mr__plan_prec {
	const char *name;
	double act;          /* bytes per activation element */
	double grad_comm;    /* bytes per gradient element reduced */
	double param_comm;   /* bytes per parameter element gathered */
	double optim_touch;  /* bytes the optimizer reads and writes per owned parameter */
	int nparts;
	struct mr__plan_part part[4];
	const char *what;    /* for --help and docs */
};

const struct mr__plan_prec *mr__plan_prec(int prec);

/* ---- collectives ----------------------------------------------------- */

enum mr__plan_op { MR__OP_ALLREDUCE, MR__OP_ALLGATHER, MR__OP_REDUCE_SCATTER,
		   MR__OP_ALLTOALL, MR__OP_P2P };

/* ---- context parallel's algorithms (plan_cp.c) ------------------------ */

/* A layer's shape on a cp rank: local tokens, query channels and heads
 * per tp rank, key/value channels per tp rank (NKV hs / tp: Cl without
 * grouped-query attention), cp, activation bytes, the whole sequence,
 * threads. */
struct mr__plan_cpx {
	double rows, Cl, NHl, KVl, cp, act, T, threads;
};

/* count collectives of bytes each (mr__plan_coll's convention) */
struct mr__plan_xfer {
	enum mr__plan_op op;
	double bytes, count;
};

struct mr__plan_cp {
	int algo;            /* enum mr_cp_algo */
	const char *name;
	int hides;           /* its transfers overlap the attention they feed */
	/* the field a mesh breaks the algorithm's rule by (n_head or
	 * n_kv_head), NULL when it does not */
	const char *(*refuses)(const struct mr_plan_input *in, const struct mr_plan_mesh *m);
	const char *why;     /* the rule refuses() checks */
	double (*workspace)(const struct mr__plan_cpx *x);
	/* a layer's forward (bwd 0) or backward transfers into out (room for
	 * 4); returns how many */
	int (*xfers)(const struct mr__plan_cpx *x, int bwd, struct mr__plan_xfer *out);
};

/* The row of algo; NULL if the runtime has none. */
const struct mr__plan_cp *mr__plan_cp(int algo);
/* A layer's shape on a rank of mesh m (mr_cp_create's: C, NH and NKV
 * over tp). */
void mr__plan_cpx(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
		  struct mr__plan_cpx *x);

/* ---- rules (plan_rules.c) -------------------------------------------- */

/* 0 or MR_ENOTSUP naming the field when impl refuses the mesh. */
int mr__plan_rules(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
		   struct mr_errbuf *eb);

/* ---- a stage (plan_stage.c) ------------------------------------------ */

struct mr__plan_stage {
	int first, last;     /* runs the embedding / the head */
	int chunks;          /* model chunks held (1 without a pipeline) */
	int lo[MR_PLACE_MAX_CHUNKS], hi[MR_PLACE_MAX_CHUNKS];
	int layers, moe_layers; /* blocks held, of which MoE */
	int rc_layers, rc_moe_layers; /* blocks that recompute (none without
				       * recompute), of which MoE */
	int nunits;
	size_t *unit;        /* (nunits) parameters of each local unit, table order */
	size_t *expert;      /* (nunits) of which experts split by ep (a MoE MLP
			      * half's, last in the unit); 0 elsewhere */
	size_t experts;      /* sum of expert[] */
	size_t params;       /* sum of unit[] */
	int slots;           /* micro-batches whose activations the runtime keeps at once */
	int pairs;           /* (micro-batch, chunk) pairs alive at once (Megatron frees
			      * a chunk's activations at its backward) */
};

/* The runtime's config of the plan's model (mr_gpt_config). */
void mr__plan_gpt_config(const struct mr_plan_model *m, struct mr_gpt_config *gc);

/* The family's shapes, as the runtime derives them (model/mr_gpt.h), per
 * token of the whole model: qkv the attention's input GEMM's columns
 * ((NH + 2 NKV) hs: 3C for gpt2), fc the MLP's first GEMM's (gpt2 4C,
 * llama's gate | up 2F), ffn its hidden size (4C, F); tied: the head is
 * the token embedding. */
struct mr__plan_dims {
	int llama;
	double qkv, fc, ffn;
	int kv_heads, tied;
};

void mr__plan_dims(const struct mr_plan_model *m, struct mr__plan_dims *d);
/* The attention's input GEMM's columns on a tp rank: (NH/tp + 2
 * mr_gpt_kv_local) hs - qkv / tp, or more when tp above n_kv_head
 * replicates the key/value heads (one whole head a rank) - and the key/
 * value heads a rank holds. */
double mr__plan_qkv_local(const struct mr_plan_model *m, int tp);
int mr__plan_kv_local(const struct mr_plan_model *m, int tp);
/* A MoE layer's shape on a rank of mesh m, as mr_gpt_moe_shape builds it
 * (the family's experts: H = the MLP's hidden size / tp, SwiGLU for
 * llama); zeroed for a dense model. */
struct mr_moe_shape;
void mr__plan_moe_shape(const struct mr_plan_model *md, const struct mr_plan_mesh *m,
			struct mr_moe_shape *s);
/* The schedule of mesh m as parallel/mr_pp_sched.h describes it (the
 * runtime's own description: in-flight counts, makespan, checks). */
void mr__plan_pp_spec(const struct mr_plan_mesh *m, struct mr_pp_spec *sp);
/* The runtime's split of the blocks over pp * v virtual stages (NULL
 * with pp 1; malloc'd, the caller frees); 0 or an error naming a field. */
int mr__plan_split(const struct mr_plan_input *in, const struct mr_plan_mesh *m, int **split,
		   struct mr_errbuf *eb);
/* Stage `stage` of mesh under split (mr__plan_split's): its layers, units
 * and, with flight set, its in-flight micro-batches (else slots and pairs
 * are 1). Release with mr__plan_stage_release. */
int mr__plan_stage(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
		   const int *split, int stage, int flight, struct mr__plan_stage *st,
		   struct mr_errbuf *eb);
void mr__plan_stage_release(struct mr__plan_stage *st);
/* The ZeRO stage the runtime runs (a pipeline stage runs 2 and 3 as 1,
 * parallel/mr_pp.h) and its shard group's size. */
int mr__plan_zero(const struct mr_plan_input *in, const struct mr_plan_mesh *m);
int mr__plan_shard(const struct mr_plan_mesh *m);

/* ---- memory (plan_mem.c, plan_act.c) --------------------------------- */

/* Activations of one micro-batch slot of stage st (meshrun: as the model
 * carves them, 256-byte pieces) and the slots' total; workspace. */
double mr__plan_acts(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
		     const struct mr__plan_stage *st);
double mr__plan_workspace(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
			  const struct mr__plan_stage *st);

/* The cpu attention kernels' workspace (kernels/mr_attention.h): per
 * thread the larger tile's scratch and a row of T; at least LayerNorm's
 * 2C floats per thread. Bytes. */
double mr__plan_attn_ws(int threads, double T, double hs, double C);

/* ---- time (plan_time.c, plan_comm.c) --------------------------------- */

/* Time of one collective of `bytes` (the whole buffer: all-reduce input,
 * all-gather output, reduce-scatter input, all-to-all send buffer, p2p
 * message) over n ranks on the link inter (0 intra-node); *sent gets the
 * bytes this rank sends. */
double mr__plan_coll(const struct mr_plan_cluster *c, enum mr__plan_op op, int n, int inter,
		     double bytes, double *sent);

/* Training FLOPs of one micro-batch's forward on a rank of stage st. */
double mr__plan_fwd_flops(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
			  const struct mr__plan_stage *st);
/* The step of mesh m under split; 0 or an error. */
int mr__plan_time(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
		  const int *split, struct mr_plan_time *t, struct mr_errbuf *eb);
/* Memory of stage `stage` under split. */
int mr__plan_mem(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
		 const int *split, int stage, struct mr_plan_mem *out, struct mr_errbuf *eb);

#endif
