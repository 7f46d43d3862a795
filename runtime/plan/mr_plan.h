/*
 * mr_plan.h - the planner: which mesh (tp, cp, pp, dp, ep), ZeRO stage,
 * micro-batch split and pipeline schedule to run a model with on a
 * cluster, chosen before launch from a memory model and a time model.
 *
 * Memory (per rank, by the runtime's ledger kinds, enum mr_mem_kind):
 *   model states  parameters, gradients and optimizer state by precision
 *                 (a row of a table: bytes per parameter of each part and
 *                 the ZeRO stage from which it is sharded - fp32 and bf16
 *                 as meshrun holds them, "mixed" as the ZeRO paper counts
 *                 them: 2 + 2 + K=12 bytes, Rajbhandari et al. 2020);
 *   activations   per layer as Korthikanti et al. 2022 derive them (the
 *                 tensors a layer keeps for its backward, each split or not
 *                 by tp and sp, dropped by selective or full recompute),
 *                 times the micro-batches a pipeline stage keeps in flight
 *                 under its schedule (counted from the schedule's own
 *                 action lists, parallel/mr_pp_sched.h);
 *   workspace     backward scratch and communication buffers.
 * Two implementations are modelled (enum mr_plan_impl): MESHRUN, the
 * runtime of this repository, to the byte where it can be (parameters,
 * gradients and optimizer state equal its ledger exactly: unit padding to
 * the shard size, ZeRO-2/3 slots, the tied embedding's replica on the
 * last stage, a vocabulary padded for tp; activations as its model carves
 * them), and MEGATRON, Megatron-LM as its papers describe it (dropout
 * masks, materialised attention scores, recomputation), which is what the
 * published figures are checked against.
 *
 * Time (per optimizer step): compute at a stated fraction (mfu) of the
 * GPU's peak, FLOPs counted as the runtime counts them (6N + 6LCT per
 * token, + a forward under full recompute); the alpha-beta cost of every
 * collective each mode issues (ring all-reduce 2(n-1)(a + B/(n b)),
 * all-gather / reduce-scatter / all-to-all (n-1)(a + B/(n b)), p2p a +
 * B/b; b and a the intra-node link when the group's ranks share a node,
 * else the inter-node one); the pipeline's makespan under its schedule
 * (gpipe and 1F1B (m + p - 1)(F + B), interleaved with v chunks
 * m(F + B) + (p - 1)(F + B)/v, zb-h1 (Qi et al. 2024) m(F + B + W) +
 * (p - 1)(F + B - W)); the optimizer's pass over the parameters a
 * rank owns at its memory bandwidth; and overlap where the runtime overlaps (DDP
 * buckets and ZeRO-2 reduce-scatters with the backward, ZeRO-3 gathers
 * prefetched, ring attention's transfers with its blocks).
 *
 * Search: every mesh the model and cluster allow (tp divides the heads
 * and stays inside a node, pp <= layers, 2*cp divides seq_len, ep
 * divides the experts and dp*cp, micro-batches >= pp for 1F1B and zb-h1,
 * a multiple of pp for interleaved), evaluated and ranked by predicted
 * step time among those that fit in memory. Nothing fitting: the closest
 * plan and what limits it.
 *
 * What an implementation refuses is a table of rules (plan_rules.c), one
 * row per combination, and context parallel's algorithms are rows too
 * (plan_cp.c), so a mode landing in the runtime is a row removed or added
 * (expert parallel with ZeRO and Ulysses attention came that way).
 *
 * Ownership: every struct is the caller's; mr_plan_search allocates the
 * result's array (mr_plan_result_release). Non-goals: measuring the
 * cluster (the caller gives its figures or a preset), heterogeneous
 * clusters, activation offload.
 */
#ifndef MR_PLAN_H
#define MR_PLAN_H

#include <stddef.h>
#include <stdio.h>

#include "core/mr_mem.h"
#include "core/mr_place.h"
#include "mr_err.h"

struct json_t;

enum mr_plan_impl { MR_PLAN_MESHRUN, MR_PLAN_MEGATRON, MR_PLAN__IMPLS };

/* Rows of the precision table (plan_presets.c). */
enum mr_plan_prec { MR_PLAN_FP32, MR_PLAN_BF16, MR_PLAN_MIXED, MR_PLAN__PRECS };

enum mr_plan_recompute { MR_PLAN_RC_NONE, MR_PLAN_RC_SELECTIVE, MR_PLAN_RC_FULL,
			 MR_PLAN__RCS };

/* Where a GPU rank keeps its optimizer state (parallel/mr_dp.h's enum
 * mr_dp_offload, ZeRO-Offload): on the GPU; its AdamW moments in host
 * memory; the moments and its fp32 master shard. The step then runs on
 * the host's cores. On cpu ranks (struct mr_plan_cluster's cpu) it
 * changes nothing. */
enum mr_plan_offload { MR_PLAN_OFF_NONE, MR_PLAN_OFF_OPTIM, MR_PLAN_OFF_MASTER,
		       MR_PLAN__OFFS };

/* The model, one of the runtime's families (model/mr_gpt.h): GPT-2
 * blocks (4x GELU MLP with biases, learned positions, tied head), MoE MLP
 * on every moe_every-th layer as the runtime defines it; or Llama blocks
 * (RMSNorm, grouped-query attention with n_kv_head key/value heads, a
 * SwiGLU MLP of ffn_hidden, no biases, rotary positions, an untied head
 * unless tie_embeddings; MoE layers of SwiGLU experts). 0 in arch and the Llama fields
 * picks the runtime's defaults (mr_gpt_kv_heads, mr_gpt_ffn). */
struct mr_plan_model {
	char name[32];        /* preset name, or "custom" */
	int n_layer, d_model, n_head, vocab, seq_len;
	int max_seq;          /* rows of the position table (0: seq_len) */
	int moe_every, n_experts, top_k;
	double capacity_factor;
	int dropless;         /* MoE: every expert takes all of a micro-batch's rows */
	int arch;             /* enum mr_gpt_arch */
	int n_kv_head;        /* llama: key/value heads (0: n_head) */
	int ffn_hidden;       /* llama: SwiGLU hidden size (0: Llama's rule) */
	int tie_embeddings;   /* llama: the head is the token embedding */
	double rope_theta;    /* llama: rotary base (no memory or time; for
			       * the config written back) */
};

/* The cluster: identical GPUs, gpus_per_node to a node (ranks of a node are
 * consecutive, as the agent numbers them). Bandwidths are what a ring
 * collective achieves per GPU (bytes/s), latencies per step (s). */
struct mr_plan_cluster {
	char name[32];
	int gpus, gpus_per_node;
	double mem_bytes;     /* per GPU */
	double reserve_bytes; /* per GPU, not for the model (context, allocator) */
	double peak_flops;    /* per GPU, dense, at the activations' precision */
	double mfu;           /* the fraction of peak a GEMM-bound step reaches */
	double mem_bw;        /* per GPU, bytes/s of its memory (the optimizer's pace) */
	double overlap;       /* 0..1: how much of the overlappable communication
			       * compute hides (1 on GPUs; 0 on CPU ranks, whose
			       * cores do the copies themselves) */
	double bw_intra, lat_intra;
	double bw_inter, lat_inter;
	double bw_cross, lat_cross; /* between narrowest domains of a topology
				     * (struct mr_plan_topo); 0: inter's */
	int cpu;              /* the ranks are the host's cores (the cpu device):
			       * offload changes nothing */
	double host_bw;       /* per GPU, bytes/s of the host memory its share of
			       * the host's cores reach (an offloaded step's pace) */
	double pcie_bw;       /* per GPU, bytes/s each way between it and the host */
};

/* Where the nodes sit (plan_topo.c): node rank r is the node of line
 * order[r] of the topology (its pod index), in the narrowest domain
 * domain[r]; the order is the controller's under rank_order "topology". */
struct mr_plan_topo {
	int nodes, domains;
	char **paths; /* per line */
	int *order;   /* node rank -> line */
	int *domain;  /* node rank -> narrowest domain, 0..domains-1 */
};

int mr_plan_topo_init(struct mr_plan_topo *t, const char *const *paths, int n,
		      struct mr_errbuf *eb);
/* One path per line (pod-index order) or "LEVEL COUNT" lines, widest first. */
int mr_plan_topo_read(const char *file, struct mr_plan_topo *t, struct mr_errbuf *eb);
void mr_plan_topo_release(struct mr_plan_topo *t);

/*
 * A plan: the mesh and how it runs. As a constraint (struct mr_plan_input's
 * fix), 0 means "any" for tp, cp, pp, dp, ep, micro_batch and v, -1 for sp,
 * zero, schedule, recompute and offload; hsdp_shard, cp_algo and
 * recompute_layers are fixed as given.
 */
struct mr_plan_mesh {
	int tp, cp, pp, dp, ep;
	int sp;               /* sequence parallel (tp > 1) */
	int zero;             /* ZeRO stage 0..3 */
	int hsdp_shard;       /* 0: no HSDP; else the shard group's size */
	int micro_batch;      /* b: sequences per micro-batch on a rank */
	int micro_batches;    /* m: per step; dp * m * b = the global batch */
	int schedule;         /* enum mr_pp_kind (pp > 1) */
	int v;                /* model chunks per stage (interleaved: >= 2) */
	int cp_algo;          /* enum mr_cp_algo */
	int recompute;        /* enum mr_plan_recompute */
	int recompute_layers; /* meshrun: with recompute, the first this many blocks
			       * of each pipeline chunk recompute (0: every block) */
	int offload;          /* enum mr_plan_offload */
};

struct mr_plan_input {
	struct mr_plan_model model;
	struct mr_plan_cluster cluster;
	int global_batch;     /* sequences per optimizer step */
	enum mr_plan_impl impl;
	enum mr_plan_prec prec;
	int threads;          /* meshrun on cpu: threads per rank (kernel workspace) */
	struct mr_plan_mesh fix; /* constraints; mr_plan_input_init: all "any" */
	const struct mr_plan_topo *topo; /* NULL: one domain (borrowed) */
};

/* Sent per rank per step by one mode's collectives, and what it costs. */
struct mr_plan_comm {
	double bytes;         /* bytes this rank sends */
	double time_s;        /* alpha-beta time of its collectives */
	double exposed_s;     /* the part compute does not hide */
	long ops;             /* collectives and transfers */
	int inter;            /* 1: its group spans nodes, 2: domains too */
};

struct mr_plan_time {
	double step_s;        /* predicted optimizer step */
	double compute_s;     /* the busiest stage's passes, at mfu */
	double bubble_s;      /* pipeline idle time on the critical path */
	double exposed_s;     /* communication not hidden */
	double optim_s;       /* the optimizer step on the owned parameters */
	double tokens_per_s;
	struct mr_plan_comm comm[MR_AXIS__COUNT]; /* by mode (enum mr_axis) */
};

struct mr_plan_mem {
	double bytes[MR_MEM_KINDS]; /* by ledger kind */
	double total;
	int stage;            /* the pipeline stage (worst rank's, in mr_plan) */
};

struct mr_plan {
	struct mr_plan_mesh mesh;
	struct mr_plan_mem mem;   /* the rank that needs the most */
	struct mr_plan_time time;
	int fits;                 /* mem.total <= cluster memory - reserve */
};

struct mr_plan_result {
	struct mr_plan *plan;     /* fitting ones first by step time, then the
				   * others by memory */
	int n, cap;
	int fitting;              /* how many fit */
	long considered;          /* candidates generated */
	char refused[256];        /* a sample reason a candidate was invalid */
};

/* ---- inputs ---------------------------------------------------------- */

/* Defaults: no model, the "h100" cluster of 8 GPUs, global batch 0,
 * meshrun bf16, threads 1, every constraint "any" (cp_algo ring). */
void mr_plan_input_init(struct mr_plan_input *in);
/* A named model (gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, llama-7b-like,
 * gpt3-175b, the Megatron-LM 2021 Table 1 sizes megatron-1.7b ...
 * megatron-1t, moe-tiny, and the llama family's llama3-8b, llama3-70b,
 * llama3-405b, llama-tiny, mixtral-8x7b); MR_ENOTFOUND naming "model" with the
 * list. */
int mr_plan_model_preset(const char *name, struct mr_plan_model *out, struct mr_errbuf *eb);
/* A named cluster of gpus GPUs (h100, h200, a100-80g, a100-40g, v100-32g,
 * local); MR_ENOTFOUND naming "cluster" with the list. */
int mr_plan_cluster_preset(const char *name, int gpus, struct mr_plan_cluster *out,
			   struct mr_errbuf *eb);
/* This machine as a cluster of `ranks` CPU ranks in one node, each with
 * `threads` threads: memory MemTotal / ranks, peak the sgemm peak x
 * threads (device/mr_peak.h), shared-memory links. */
int mr_plan_cluster_local(int ranks, int threads, struct mr_plan_cluster *out,
			  struct mr_errbuf *eb);
/* Prints the presets, one per line. */
void mr_plan_presets_print(FILE *out);
/* Names: "meshrun"/"megatron", "fp32"/"bf16"/"mixed",
 * "none"/"selective"/"full" (field "recompute"), "none"/"optimizer"/
 * "optimizer+master" (field "offload"); parse returns MR_EINVAL naming
 * field. */
const char *mr_plan_impl_name(int impl);
const char *mr_plan_prec_name(int prec);
const char *mr_plan_rc_name(int rc);
const char *mr_plan_offload_name(int off);
int mr_plan_name_parse(const char *field, const char *s, int *out, struct mr_errbuf *eb);

/* "ring", "allgather", "ulysses" (enum mr_cp_algo); parse: MR_EINVAL
 * naming "cp_algo". */
const char *mr_plan_cp_algo_name(int algo);
int mr_plan_cp_algo_parse(const char *s, int *out, struct mr_errbuf *eb);

/* Checks the inputs, naming the field ("n_head", "global_batch",
 * "gpus_per_node", ...). */
int mr_plan_check(const struct mr_plan_input *in, struct mr_errbuf *eb);

/* "tp=8,pp=16,dp=12,mb=1,zero=1,schedule=1f1b,sp=1,v=2,cp=1,ep=1,
 * recompute=full,recompute_layers=2,offload=optimizer,hsdp=2,cp_algo=ring":
 * every key optional (as "any"), into out (initialised to "any" first).
 * MR_EINVAL naming the key. */
int mr_plan_mesh_parse(const char *text, struct mr_plan_mesh *out, struct mr_errbuf *eb);
/* "tp=8 cp=1 pp=16 dp=12 ep=1 sp zero=1 mb=1x128 1f1b"; snprintf's result. */
int mr_plan_mesh_format(const struct mr_plan_mesh *m, char *buf, size_t cap);

/* ---- the models ------------------------------------------------------ */

/* Parameters of the whole model. */
double mr_plan_params(const struct mr_plan_model *m);
/*
 * Model-state bytes per GPU for psi parameters at precision prec under
 * ZeRO stage zero over nd data-parallel ranks, by ledger kind (PARAMS,
 * GRADS, OPTIM into out[0..2]): the ZeRO paper's (2 + 2 + K) psi with
 * each part divided by nd from its stage on.
 */
void mr_plan_states(double psi, int prec, int zero, int nd, double out[3]);
/*
 * Activation bytes one transformer layer keeps for its backward (one
 * micro-batch: s tokens, b sequences, h hidden, a heads) under tp t, sp
 * and recompute, for impl at prec. MEGATRON at 2 bytes is Korthikanti et
 * al. 2022: sbh(34 + 5as/h), sbh(10 + 24/t + 5as/(ht)), sbh(34/t +
 * 5as/(ht)), selective sbh(10 + 24/t) / 34sbh/t, full 2sbh.
 */
double mr_plan_act_layer(int impl, int prec, double s, double b, double h, double a, int t,
			 int sp, int recompute);

/* Is mesh valid for the inputs (the search's rules and the
 * implementation's); MR_EINVAL / MR_ENOTSUP naming the field. dp is
 * derived from the cluster's GPUs when 0, and micro_batches from the
 * global batch. */
int mr_plan_mesh_check(const struct mr_plan_input *in, struct mr_plan_mesh *mesh,
		       struct mr_errbuf *eb);
/* Memory of the ranks of pipeline stage `stage` (every rank of a stage
 * needs the same). mesh must have passed mr_plan_mesh_check. */
int mr_plan_mem_stage(const struct mr_plan_input *in, const struct mr_plan_mesh *mesh,
		      int stage, struct mr_plan_mem *out, struct mr_errbuf *eb);
/* The whole plan of a checked mesh: the worst stage's memory, the step. */
int mr_plan_eval(const struct mr_plan_input *in, const struct mr_plan_mesh *mesh,
		 struct mr_plan *out, struct mr_errbuf *eb);

/* ---- search ---------------------------------------------------------- */

/* Every valid mesh within in->fix, evaluated and sorted. 0 (also when
 * nothing fits: res->fitting == 0; res->n == 0 when no mesh is valid),
 * or an error naming the field. */
int mr_plan_search(const struct mr_plan_input *in, struct mr_plan_result *res,
		   struct mr_errbuf *eb);
void mr_plan_result_release(struct mr_plan_result *res);
/* What keeps p from fitting, for people: "needs 93.1 GB per GPU, 78.0
 * available: raise pp or the ZeRO stage" (or "fits"). */
void mr_plan_limit(const struct mr_plan_input *in, const struct mr_plan *p, char *buf,
		   size_t cap);

/* The link the groups of kind g (enum mr_mesh_group) of mesh m run on:
 * 0 inside a node, 1 between nodes, 2 between narrowest domains of
 * in->topo (plan_comm.c). */
int mr_plan_group_link(const struct mr_plan_input *in, const struct mr_plan_mesh *m, int g);

#endif
