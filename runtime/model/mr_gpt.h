/*
 * mr_gpt.h - the model: GPT-2 (llm.c layout) with optional MoE MLP layers,
 * or the llama family ("arch"; a family's block and table are one file,
 * model/gpt2.c and model/llama.c; below, what differs is said
 * where it matters); parameters, activations, hand-written forward and
 * backward.
 *
 * Architecture: token + learned position embedding, n_layer pre-LayerNorm
 * blocks (causal multi-head attention, then a GELU(tanh) 4x MLP, or a MoE
 * MLP on every moe_every-th layer: layers moe_every-1, 2*moe_every-1, ...),
 * a final LayerNorm, and an LM head tied to the token embedding. Loss is the
 * mean token cross-entropy plus aux_coef times the sum over MoE layers of
 * their load-balancing loss (see mr_moe.h).
 *
 * Memory: ONE allocation holds every parameter, one every gradient (same
 * layout), one every activation; struct mr_gpt_weights gives pointer views
 * into them. The parameter order is a fixed table (mr_gpt.tensors) -
 * embeddings, then each layer contiguously, then the final LayerNorm - used
 * by the weights file, the optimizer and the reference test alike, so a
 * pipeline stage owns a contiguous range and any tensor can be sharded by
 * offset.
 *
 * Ownership: the caller owns struct mr_gpt (mr_gpt_create / mr_gpt_release)
 * and the pool it passes (borrowed until release).
 *
 * Placement (core/mr_place.h): the model is cut by where its rank sits - each
 * table entry says which dim is split along each axis. Tensor parallel
 * (Megatron-LM): with tp > 1 every rank holds its slice of the tensors
 * split along tp: QKV and MLP fc column-parallel (heads split), attention
 * and MLP projections row-parallel, the token embedding / LM head
 * vocab-parallel; everything else replicated. Forward and backward call
 * the tp layers of layers/mr_tp.h on the placement's tp communicator;
 * with sp the residual stream is sharded along the sequence. Context
 * parallel (layers/mr_cp.h) splits each sequence over the cp ranks in
 * load-balanced chunks, expert parallel (layers/mr_ep.h) the experts over
 * the ep ranks; mr_gpt_check_placement checks what each needs.
 *
 * Pipeline stage (pp > 1, or place->chunks set): the model holds only its
 * chunks' blocks, the embeddings on the first stage, the final LayerNorm
 * on the last; the last stage also holds a replica of the embeddings for
 * the tied LM head (wte, and wpe with it so the unit has the same layout
 * on both stages: the pipeline sums their gradients, so both copies stay
 * equal). The table lists the held tensors only, in the whole model's
 * order (t->id, t->full_off place each in the whole model); units are
 * numbered locally (layer_unit). Passes run a chunk at a time
 * (mr_gpt_chunk_fwd/bwd); parallel/mr_pp_sched.h says in which order.
 *
 * Units and hooks (data parallel, ZeRO): the parameter table is cut into
 * units - unit 0 the embeddings (wte, wpe), units 1+2l and 2+2l the
 * attention half (ln1, qkv, attn.proj) and the MLP half (ln2, MLP or MoE)
 * of layer l, unit 2L+1 the final LayerNorm - each a contiguous range
 * [off, off+n) of the table. Half layers let gradient reduction start
 * while the other half of the same layer is still in backward.
 * Forward and backward call struct mr_gpt_hooks at unit boundaries, so a
 * data-parallel wrapper can reduce a unit's gradients as soon as backward
 * has produced them and ZeRO-3 can gather a unit's parameters just before
 * use. With par.ext_params / par.ext_grads the model does not allocate
 * that buffer: the caller points each unit's views at its own storage with
 * mr_gpt_bind_unit (in a hook, before the unit is used).
 *
 * Precision: the master weights, gradients and losses are fp32 on every
 * device; activations are in the device's activation type (mr_act). On a
 * device whose activation type is not fp32 (cuda, "precision" "bf16") the
 * kernels read a COMPUTE COPY of the weights in that type (params_c,
 * table order, always allocated by the model): the optimizer refreshes
 * it through the device's adamw (pc = mr_gpt_compute_at), and whoever
 * changes master weights otherwise (init, a load, a ZeRO-3 gather) calls
 * mr_gpt_refresh_unit. On an fp32 device the kernels read the master
 * itself and both are no-ops. With MR_GPT_EXT_COMPUTE (ZeRO-3) there is
 * no whole copy: a unit's compute views are bound to the caller's buffer
 * when its parameters are (mr_gpt_bind_compute_unit), and refreshed there.
 *
 * Non-goals: dropout, generation/sampling (infer/mr_generate.h decodes
 * with a key/value cache over this model's weights).
 */
#ifndef MR_GPT_H
#define MR_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/mr_pool.h"
#include "device/mr_device.h"
#include "kernels/mr_kernels.h"
#include "mr_err.h"
#include "core/mr_mem.h"
#include "core/mr_place.h"
#include "layers/mr_layers.h"

struct mr_gpt_config {
	int vocab;        /* V, vocabulary size */
	int max_seq;      /* maxT, rows of the position embedding */
	int n_layer;      /* L */
	int d_model;      /* C */
	int n_head;       /* NH, divides C */
	int moe_every;    /* 0: dense; k: layers k-1, 2k-1, ... are MoE */
	int n_experts;    /* E (MoE only) */
	int top_k;        /* 1 or 2 (MoE only) */
	float capacity_factor; /* > 0 (MoE only, policy capacity) */
	float aux_coef;   /* load-balancing loss coefficient (MoE only) */
	int moe_dropless; /* MoE policy: 0 capacity (drops past capacity_factor),
			   * 1 dropless (every expert takes all N of its rows) */
	/* the family (enum mr_gpt_arch) and the Llama keys; 0 picks each
	 * one's default, and gpt2 ignores them */
	int arch;
	int n_kv_head;    /* key/value heads, dividing n_head (0: n_head) */
	int ffn_hidden;   /* SwiGLU hidden size (0: Llama's rule, mr_gpt_ffn) */
	float norm_eps;   /* RMSNorm epsilon (0: 1e-5) */
	float rope_theta; /* rotary base (0: 500000) */
	struct mr_rope_scaling rope_scaling; /* Llama 3.1's long-context
					      * scaling; factor 0: none */
	int tie_embeddings; /* llama: the LM head is the token embedding
			     * (gpt2: always) */
	int moe_norm_topk; /* MoE gates renormalised over the chosen experts:
			    * 1 yes, -1 no, 0 the default (top_k 2 yes, 1 no) */
};

/* The model families. gpt2: LayerNorm with bias, learned positions, GELU
 * MLP of 4 d_model, biases, LM head tied to the token embedding. llama:
 * RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, no
 * biases, an untied head unless tie_embeddings (model/llama.c). */
enum mr_gpt_arch { MR_ARCH_GPT2, MR_ARCH_LLAMA };

/* Derived shapes: key/value heads, the MLP's hidden size (gpt2: 4C;
 * llama: ffn_hidden, or 2/3 of 4C rounded up to a multiple of 256 as
 * Llama computes it), RMSNorm epsilon and rotary base with their
 * defaults, and whether the LM head is the token embedding. */
int mr_gpt_kv_heads(const struct mr_gpt_config *c);
/*
 * Key/value heads under tensor parallelism (Megatron-Core's rule): tp
 * dividing mr_gpt_kv_heads splits them, kv_heads / tp per rank; tp a
 * multiple of it (tp > kv_heads) REPLICATES them, each rank holding the one
 * head its query heads attend to - rank r holds head r / rep, rep = tp /
 * kv_heads ranks sharing each: query head h uses kv head h / (NH / NKV),
 * rank r holds query heads [r NH/tp, (r+1) NH/tp), and NH/NKV = rep NH/tp,
 * so all of them map to (r NH/tp) / (rep NH/tp) = r / rep. Any other tp is
 * refused (mr_gpt_check_placement). mr_gpt_kv_local: heads per rank;
 * mr_gpt_kv_rep: ranks sharing each (1 when split).
 */
int mr_gpt_kv_local(const struct mr_gpt_config *c, int tp);
int mr_gpt_kv_rep(const struct mr_gpt_config *c, int tp);
int mr_gpt_ffn(const struct mr_gpt_config *c);
float mr_gpt_norm_eps(const struct mr_gpt_config *c);
float mr_gpt_rope_theta(const struct mr_gpt_config *c);
int mr_gpt_tied(const struct mr_gpt_config *c);
/* 1 when MoE gates are renormalised over the chosen experts (mr_moe.h). */
int mr_gpt_moe_norm_topk(const struct mr_gpt_config *c);

/* Checks the config; the message names the offending field. */
int mr_gpt_config_check(const struct mr_gpt_config *c, struct mr_errbuf *eb);
/* 1 if layer l has a MoE MLP. */
int mr_gpt_layer_is_moe(const struct mr_gpt_config *c, int l);

enum mr_gpt_init { MR_INIT_ZERO, MR_INIT_ONE, MR_INIT_NORMAL };

struct mr_gpt_tensor {
	char name[32];     /* "h.0.attn.qkv.w" */
	int ndim, shape[3]; /* this rank's (local) shape */
	int full[3];       /* shape of the whole tensor (== shape when tp = 1) */
	int split[MR_AXIS__COUNT]; /* per axis: -1 replicated, else the dim split */
	int tp_dim;        /* the dim tensor parallelism splits (-1: replicated),
			    * whatever this model's tp degree */
	int expert;        /* holds a MoE layer's experts on dim 0 (split by ep
			    * when ep > 1) */
	int split_parts;   /* the tp split dim viewed as this many blocks, each
			    * split (3 for QKV: q, k and v rows; 1 otherwise) */
	int tp_rep;        /* tp ranks holding the same slice: replicated key/value
			    * heads (mr_gpt_kv_rep; the tensor is then cut into
			    * tp / tp_rep slices, rank r holding slice r / tp_rep,
			    * and is not split at all when tp_rep == tp); 0 or 1
			    * otherwise */
	int layer;         /* the block it belongs to, -1 for the model's own */
	size_t view;       /* offset of its view pointer in struct
			    * mr_gpt_layer_w (layer >= 0) or mr_gpt_weights */
	size_t off, n;     /* offset into params/grads, element count */
	int id;            /* index in the whole model's table (init stream) */
	size_t full_off;   /* offset in the whole (unsliced, all-stage) model */
	int decay;         /* 1: weight decay applies (matrices, embeddings) */
	enum mr_gpt_init init;
	float std;         /* MR_INIT_NORMAL only */
};

/* Pointer views; for MoE layers fcw..fcprojb hold E experts. llama
 * (no biases): qkvw is the query projection (NH*hs, C), kw and vw the
 * key and value ones (NKV*hs, C) right behind it, so the three are one
 * GEMM's weight; fcw is the SwiGLU gate (F, C) with upw (F, C) behind
 * it, fcprojw the down projection (C, F). */
struct mr_gpt_layer_w {
	float *ln1w, *ln1b;     /* (C) */
	float *qkvw, *qkvb;     /* (3C, C), (3C) */
	float *kw, *vw;         /* llama */
	float *attprojw, *attprojb; /* (C, C), (C) */
	float *ln2w, *ln2b;     /* (C) */
	float *routerw;         /* (E, C), MoE only */
	float *fcw, *fcb;       /* ([E,] 4C, C), ([E,] 4C) */
	float *upw;             /* llama */
	float *fcprojw, *fcprojb; /* ([E,] C, 4C), ([E,] C) */
};

struct mr_gpt_weights {
	float *wte;             /* (V, C) also the LM head when tied */
	float *wpe;             /* (maxT, C); NULL for llama */
	struct mr_gpt_layer_w *layer; /* (L) */
	float *lnfw, *lnfb;     /* (C) */
	float *head;            /* (V, C) an untied LM head, else NULL */
};

/* Device memory: mr_act in the device's activation type, float fp32. */
struct mr_gpt_layer_acts {
	mr_act *ln1;            /* (N,C) (llama: mean unused; qkv's q and k
				 * rotated in place; fch is [gate | up] (N,2F),
				 * fch_gelu the SwiGLU output (N,F)) */
	float *ln1_mean, *ln1_rstd; /* (N), (N) */
	mr_act *qkv;            /* (N,3C) */
	mr_act *atty;           /* (N,C) attention output before projection */
	float *att_lse;         /* (B,NH,T) per-row logsumexp */
	mr_act *res2;           /* (N,C) residual after attention */
	mr_act *ln2;
	float *ln2_mean, *ln2_rstd;
	mr_act *fch, *fch_gelu; /* (N,4C) dense MLP only */
	struct mr_moe_acts moe; /* MoE only (host memory: the cpu device) */
	mr_act *res3;           /* (N,C) residual after the MLP */
};

/* Output gradients of a dense layer's four GEMMs, kept between the input
 * and the weight phase of a split backward (mr_gpt_split_bwd). */
struct mr_gpt_layer_stash {
	mr_act *dqkv;           /* (N,3C/tp) */
	mr_act *dproj1;         /* (N,C) into the attention projection */
	mr_act *dfc;            /* (N,4C/tp) into the MLP fc (after GELU's backward) */
	mr_act *dproj2;         /* (N,C) into the MLP projection */
};

/*
 * Activation recomputation (mr_gpt_set_recompute). SELECTIVE: a block
 * keeps its GEMM outputs (qkv, fc), the attention's output and
 * log-sum-exp and its residuals; its two norms (with their statistics)
 * and the MLP's activation function (GELU / SwiGLU) are recomputed in
 * its backward - element-wise work, plus under sp the norm's all-gather.
 * (Korthikanti et al.'s selective recompute drops the attention core;
 * meshrun never keeps it: the block-wise attention's backward recomputes
 * the scores from q, k, v and the log-sum-exp.) FULL: a block keeps its
 * output only (the next block's input) and re-runs its forward inside
 * its backward, collectives and MoE routing included.
 */
enum mr_gpt_recompute { MR_GPT_RC_NONE, MR_GPT_RC_SELECTIVE, MR_GPT_RC_FULL };

/* Phases of a block range's backward (mr_gpt_blocks_bwd). */
enum { MR_GPT_BWD_ALL, MR_GPT_BWD_INPUT, MR_GPT_BWD_WEIGHT };

/*
 * One micro-batch's state between its forward and its backward: the
 * activations (an arena accounted as MR_MEM_ACTS), the batch on the host
 * and the device, the loss, and the split backward's stash. The model
 * holds one in its fields of the same names, the one every pass reads
 * and writes; whoever keeps more micro-batches in flight (a pipeline
 * stage's slots, parallel/mr_pp_slots.h) carves them with
 * mr_gpt_slot_alloc and swaps them in with mr_gpt_slot_swap. Workspace
 * (backward scratch, kernel workspace) is shared: one pass runs at a time.
 */
struct mr_gpt_slot {
	void *acts;
	struct mr_gpt_layer_acts *la;
	mr_act *encoded, *lnf, *logits;
	float *lnf_mean, *lnf_rstd, *ce_lse, *losses;
	int *tok_dev, *tgt_dev;
	int *inputs, *targets, *tok_tp, *tgt_tp;
	const int *tok_local;
	float *losses_host;
	int has_targets;
	float loss, aux_loss;
	struct mr_gpt_layer_stash *stash;
	void *stash_mem;
	mr_act **xin, **xgrad;
};

struct mr_comm;

/* mr_gpt_create_placed flags: who holds the parameters and gradients. */
enum {
	MR_GPT_EXT_PARAMS = 1, /* params not allocated: the caller binds units */
	MR_GPT_EXT_GRADS = 2,  /* grads not allocated: the caller binds units */
	/* no whole compute copy (a bf16 device): the caller binds each unit's
	 * compute views with its parameters (mr_gpt_bind_compute_unit) */
	MR_GPT_EXT_COMPUTE = 4,
};

/*
 * Called at unit boundaries (NULL members are skipped). Use of unit u by
 * forward starts at pre_fwd(u), in order 0, 1, ..., U-1 (U = nunits);
 * unit 0 (wte, also the LM head) and unit U-1 stay in use until the end of
 * backward. Backward calls pre_bwd(u) before it reads u's parameters or
 * adds to u's gradients and post_bwd(u) when u's gradients for this
 * micro-batch are complete, in the order U-1 (LM head and final LN; also
 * adds to unit 0's wte gradient), U-2, ..., 1, 0 (embeddings). A non-zero
 * return aborts the pass with that code.
 */
struct mr_gpt_hooks {
	void *ctx;
	int (*pre_fwd)(void *ctx, int unit);
	int (*pre_bwd)(void *ctx, int unit);
	int (*post_bwd)(void *ctx, int unit);
	/* a recomputation (mr_gpt_set_recompute) is about to read unit u's
	 * parameters again, inside backward, before its pre_bwd: ZeRO-3
	 * gathers them again if they left; gradients are not touched */
	int (*pre_recompute)(void *ctx, int unit);
};

struct mr__gpt_family;

struct mr_gpt {
	struct mr_gpt_config cfg;
	const struct mr__gpt_family *family; /* cfg.arch's blocks and table (gpt_family.h) */
	struct mr_place place;  /* where this rank sits (copied at create) */
	unsigned flags;         /* MR_GPT_EXT_* */
	struct mr_layers par;   /* the parallel layers in the blocks: tp (+sp), cp, ep
				 * and the MoE exchange (layers/mr_layers.h) */
	const struct mr_gpt_hooks *hooks; /* may be NULL; set by the caller */
	int B, T;               /* micro-batch shape the activations hold */
	struct mr_dev *dev;     /* the device everything below lives on */
	struct mr_dev own_dev;  /* the cpu device of mr_gpt_create[_placed] */
	struct mr_pool *pool;   /* borrowed: the device's threads */
	struct mr_mem mem;      /* accounting of everything below */

	int ntensors;
	struct mr_gpt_tensor *tensors;
	size_t nparams;         /* this rank's (local) parameter count */
	int ntensors_full;      /* tensors of the whole model (every stage) */
	size_t nparams_full;    /* its parameters (unsliced) */
	int first_stage;        /* runs the embedding (1 without pipeline) */
	int last_stage;         /* runs the final LayerNorm, LM head and loss */
	int tied_replica;       /* holds the embeddings only for the LM head */
	int *layer_unit;        /* (L) local unit of block l's attention half;
				 * -1: another stage's block */
	float *params, *grads;  /* NULL when ext_params / ext_grads */
	int nunits;             /* 2L + 2 */
	int *unit_first;        /* (nunits + 1) first tensor of each unit */
	struct mr_gpt_weights w, g;
	/* the weights' compute copy (see the header) and its views: mr_act
	 * data behind float * fields, read through gpt.c's weight views;
	 * NULL / unused on an fp32 device */
	mr_act *params_c;
	struct mr_gpt_weights wc;

	/* the micro-batch state in use is in the fields struct mr_gpt_slot
	 * names (acts ... aux_loss); states carved by mr_gpt_slot_alloc and
	 * not freed yet are out */
	int slots_out;
	int split;              /* mr_gpt_split_bwd was called: every state has a stash */
	size_t nacts, nws;      /* bytes of a state's arena and of the workspace */
	void *acts, *ws;
	struct mr_gpt_layer_acts *la;
	struct mr_gpt_layer_stash *stash; /* (L) after mr_gpt_split_bwd, else NULL */
	void *stash_mem;        /* their allocation (MR_MEM_ACTS) */
	/* pipeline (place.chunks > 0): per chunk, the (Nl,C) rows received
	 * from the previous virtual stage (its input; after its backward, the
	 * gradient sent back) and the gradient received from the next */
	mr_act **xin, **xgrad;
	size_t nstash;          /* bytes */
	/* host: the current batch (N each) and the ids in this rank's vocab
	 * slice (tp > 1), one allocation */
	int *inputs, *targets, *tok_tp, *tgt_tp;
	const int *tok_local;   /* the ids the passes use (inputs itself at tp 1) */
	float *losses_host;     /* (N) the losses read back */
	int has_targets;        /* the batch has targets: head_fwd computes the loss */
	/* device */
	int *tok_dev, *tgt_dev; /* (N) the local ids */
	mr_act *encoded;        /* (N,C) */
	mr_act *lnf;
	float *lnf_mean, *lnf_rstd;
	mr_act *logits;         /* (N,V); dlogits in place after backward */
	float *ce_lse, *losses; /* (N) */
	/* workspace */
	mr_act *ones;           /* (N) all 1, for bias gradients */
	mr_act *dres, *dln, *datty, *dqkv, *dfch, *dtmp; /* backward scratch */
	mr_act *sp_full;        /* (N,C) sequence-parallel gather target */
	void *k_ws;             /* kernel workspace (attention, layernorm, MoE) */
	/* (2 n_layer) each MoE layer's aux loss (float bits) and dropped
	 * count where the device keeps them (mr_moe_acts.stat): in the
	 * workspace, and the host copy read after the forward
	 * (mr_gpt_read_results; a pipeline chunk's at its end) */
	int *moe_stat, *moe_stat_host;
	int moe_stat_unread;   /* a forward left some there, not read yet */

	float loss;             /* mean cross-entropy of the last forward */
	float aux_loss;         /* sum over MoE layers (before aux_coef) */
	/* activation recomputation (mr_gpt_set_recompute): the mode, the
	 * blocks per chunk that use it (0: all), one block's scratch for what
	 * recomputing blocks do not keep, and under full the output a
	 * recomputed forward writes; recomputing is set while it runs */
	int rc_mode, rc_layers;
	struct mr_gpt_layer_acts rc_la;
	mr_act *rc_out;
	void *rc_mem;
	size_t nrc;
	int recomputing;
	/* dense blocks' fc GEMM and GELU in one call where the device has it
	 * (mr_dev_ops.matmul_gelu_fwd), except in blocks whose selective
	 * recomputation runs the GELU again (gpt2.c); MESHRUN_FUSED_GELU=0
	 * turns it off */
	int fuse_gelu;
	/* llama: every local row's sequence position (B*T device ints) and
	 * the rotary inverse frequencies (hs/2 device floats) */
	int *rope_pos;
	float *rope_freq;
};

int mr_gpt_create(struct mr_gpt *m, const struct mr_gpt_config *cfg, int B, int T,
		  struct mr_pool *pool, struct mr_errbuf *eb);
/* As mr_gpt_create, placed by place (NULL: one rank) with MR_GPT_EXT_*
 * flags. Checks that tp divides the heads (and so d_model), that tp
 * divides llama's key/value heads or is a multiple of them (replicated:
 * then place->kv, mr_groups_kv's group, is needed; field "n_kv_head") and
 * that sp has T divisible by tp (a vocabulary tp does not divide is
 * padded to ceil(V/tp) rows per rank); the message names the field. */
int mr_gpt_create_placed(struct mr_gpt *m, const struct mr_gpt_config *cfg, int B, int T,
			 struct mr_pool *pool, const struct mr_place *place, unsigned flags,
			 struct mr_errbuf *eb);
/* As mr_gpt_create_placed on device dev (borrowed; must outlive m). The
 * cpu device is what the two above open over pool. */
int mr_gpt_create_on(struct mr_gpt *m, const struct mr_gpt_config *cfg, int B, int T,
		     struct mr_dev *dev, const struct mr_place *place, unsigned flags,
		     struct mr_errbuf *eb);
/* The config and placement checks of mr_gpt_create_placed alone (no
 * communicator needed): run before bootstrapping so bad input fails first.
 * cp > 1 needs seq_len divisible by 2 * cp (and seq_len / cp by tp under
 * sp), ep > 1 a MoE model whose n_experts it divides; a pipeline stage's
 * chunks must be ascending, disjoint, non-empty ranges
 * (field "pp_layers"). */
int mr_gpt_check_placement(const struct mr_gpt_config *cfg, int T, const struct mr_place *place,
			   struct mr_errbuf *eb);
void mr_gpt_release(struct mr_gpt *m);
/* Recomputes activations (enum mr_gpt_recompute) in the first `layers`
 * blocks of each chunk (0: every block; Megatron's block method): the
 * model's state is carved anew, the scratch allocated once (MR_MEM_ACTS).
 * Call between passes and before any state is out (mr_gpt_slot_alloc: a
 * pipeline's slots): a change then is MR_ESTATE naming "recompute".
 * MR_EINVAL naming "recompute" or "recompute_layers", MR_ENOMEM. */
int mr_gpt_set_recompute(struct mr_gpt *m, int mode, int layers, struct mr_errbuf *eb);
/* The recompute mode block l runs under. */
int mr_gpt_layer_recompute(const struct mr_gpt *m, int l);
/* Carves a fresh micro-batch state into s (activations, batch, loss; a
 * stash after mr_gpt_split_bwd), accounted in m->mem, as the model's
 * own is carved; the state in m's fields is not touched. 0 or MR_ENOMEM
 * (s empty). The caller frees it with mr_gpt_slot_free before
 * mr_gpt_release. */
int mr_gpt_slot_alloc(struct mr_gpt *m, struct mr_gpt_slot *s);
/* Frees a state of m (s empty after); an empty s is a no-op. Any state
 * of m will do, the one the model held at create included. */
void mr_gpt_slot_free(struct mr_gpt *m, struct mr_gpt_slot *s);
/* Exchanges the state in m's fields with s: the passes then read and
 * write what s held, and s holds the state m's fields held. */
void mr_gpt_slot_swap(struct mr_gpt *m, struct mr_gpt_slot *s);
/* GPT-2 init from (seed, tensor index) streams; see gpt_params.c. The
 * values are those of the single-rank model, sliced for this tp rank,
 * made on the host and uploaded to m->params (and the compute copy
 * refreshed); 0, MR_ENOMEM or the device's error. */
int mr_gpt_init_params(struct mr_gpt *m, uint64_t seed);
/* Initialises tensor i (local slice) into host memory dst (t->n floats);
 * 0 or MR_ENOMEM (a split tensor is generated whole, then sliced). */
int mr_gpt_init_tensor(const struct mr_gpt *m, uint64_t seed, int i, float *dst);

/* The compute copy of table element off: adamw's pc for the range at off;
 * NULL on an fp32 device (the kernels read the master there). */
mr_act *mr_gpt_compute_at(const struct mr_gpt *m, size_t off);
/* Converts unit u's master weights (as bound) into the compute copy, on
 * the device; 0 or the device's error. A no-op on an fp32 device. */
int mr_gpt_refresh_unit(struct mr_gpt *m, int u);
/* Every unit. */
int mr_gpt_refresh_compute(struct mr_gpt *m);
/* MR_GPT_EXT_COMPUTE: points unit u's compute views at cbase (element 0 =
 * the unit's first element; room for its whole range in the activation
 * type). */
void mr_gpt_bind_compute_unit(struct mr_gpt *m, int u, mr_act *cbase);

/* Unit u's range of the (local) table: first element and element count. */
void mr_gpt_unit_range(const struct mr_gpt *m, int u, size_t *off, size_t *n);
/* Points unit u's parameter views at pbase and gradient views at gbase
 * (element 0 = the unit's first element; NULL leaves that side alone). */
void mr_gpt_bind_unit(struct mr_gpt *m, int u, float *pbase, float *gbase);
/* The same for tensors [t0, t1) of the table (element 0 = tensor t0's
 * first): a unit bound in pieces, each in its own buffer. */
void mr_gpt_bind_tensors(struct mr_gpt *m, int t0, int t1, float *pbase, float *gbase);

/* Copies between a tensor's whole (full-shape) values and the slice of
 * tp rank tp_rank and ep rank ep_rank (an expert tensor holds experts
 * [ep_rank * shape[0], ...) of the full[0]): to_full = 0 extracts local
 * from full, 1 writes local into full. A replicated key/value tensor
 * (t->tp_rep > 1) is cut into tp / tp_rep slices: tp rank r holds slice
 * r / tp_rep, the rows of key/value head r / tp_rep. */
void mr_gpt_tensor_slice(const struct mr_gpt_tensor *t, int tp, int tp_rank, int ep_rank,
			 float *full, float *local, int to_full);
/* 1 if this rank counts tensor t in a sum over the model-parallel group
 * (a grad norm) and writes it to a checkpoint: a tensor replicated across
 * tp is counted by tp rank 0 only, a replicated key/value slice by the
 * first of the tp_rep ranks sharing it, the embeddings by the first
 * pipeline stage only. */
int mr_gpt_norm_counts(const struct mr_gpt *m, const struct mr_gpt_tensor *t);
/* The distinct tp slices of t in a model of tp ranks (tp / t->tp_rep; 1
 * for a tensor not split, every rank holding it whole), and the slice tp
 * rank r holds (-1 with one slice): what a checkpoint record names. */
int mr_gpt_tensor_tp_slices(const struct mr_gpt_tensor *t, int tp);
int mr_gpt_tensor_tp_slice(const struct mr_gpt_tensor *t, int tp, int r);
/* Elements of the whole tensor (product of full[]). */
size_t mr_gpt_tensor_full_n(const struct mr_gpt_tensor *t);
/* Parameters of the whole (unsliced, every stage's) model. */
size_t mr_gpt_full_nparams(const struct mr_gpt *m);
/*
 * Collective over the tp group: every tp rank passes its local parameters
 * in host memory (table order, m->nparams floats; a device model's come
 * from mr_dp_gather_params); on tp rank 0 *full gets a malloc'd
 * copy of the whole model's parameters in single-rank table order
 * (mr_gpt_full_nparams floats; a pipeline stage's tensors in place, the
 * other stages' zero), NULL elsewhere. Caller frees.
 */
int mr_gpt_gather_full(const struct mr_gpt *m, const float *local, float **full);
/* The MoE layer shape of this model (N = B*T rows, H = 4C/tp). */
struct mr_moe_shape mr_gpt_moe_shape(const struct mr_gpt *m);
/* Finds a tensor by name; NULL if absent. */
const struct mr_gpt_tensor *mr_gpt_find(const struct mr_gpt *m, const char *name);
/* Training FLOPs per token on this rank: 6N + 6LCT over the local slice. */
size_t mr_gpt_flops_per_token(const struct mr_gpt *m);

/* MR_ERANGE naming `what` ("input"/"target") and the first of the n ids
 * outside [0, V); 0 when all are in range. */
int mr_gpt_check_tokens(const int *tok, int n, int V, const char *what, struct mr_errbuf *eb);
/* inputs/targets (B,T) token ids, checked to be in [0, V): MR_ERANGE names
 * the first bad one. targets may be NULL (no loss). The whole model:
 * mr_gpt_set_batch, mr_gpt_forward_passes, mr_gpt_read_results. */
int mr_gpt_forward(struct mr_gpt *m, const int *inputs, const int *targets,
		   struct mr_errbuf *eb);
/* The forward's device work over the batch mr_gpt_set_batch put on the
 * device, reading nothing back (what a device graph captures); the whole
 * model only (MR_ESTATE on a pipeline stage). */
int mr_gpt_forward_passes(struct mr_gpt *m);
/* The micro-batch's results the host needs, read back from the device
 * after its forward: m->loss, the mean of the per-token losses (0
 * without targets). */
int mr_gpt_read_results(struct mr_gpt *m);
void mr_gpt_zero_grad(struct mr_gpt *m);
/* Adds d(loss * dscale)/dparams into grads; after a forward with targets.
 * Use dscale = 1/micro_batches for gradient accumulation. Fails only when
 * a hook or a tensor-parallel collective fails. */
int mr_gpt_backward(struct mr_gpt *m, float dscale);

/*
 * The model in pieces, so a pipeline stage runs a range of them: the
 * embedding (first stage), a range of blocks, the final LayerNorm + LM head
 * + loss (last stage). Rows between pieces are the residual stream, (Nl,C)
 * local rows: a stage's input `in` (m->encoded after the embedding, a
 * block's output m->la[l].res3, or rows received from the previous stage)
 * and, backward, the gradient m->dres (set by head_bwd, updated by each
 * block, consumed by embed_bwd; a stage receiving it writes m->dres).
 * Each returns 0 or the code of a failed hook or collective.
 */
/* Checks and keeps the micro-batch's tokens: inputs for the embedding
 * (NULL: not needed here), targets for the loss (NULL: no loss). */
int mr_gpt_set_batch(struct mr_gpt *m, const int *inputs, const int *targets,
		     struct mr_errbuf *eb);
int mr_gpt_embed_fwd(struct mr_gpt *m);
/* Blocks [lo, hi) from in; the output is m->la[hi-1].res3. */
int mr_gpt_blocks_fwd(struct mr_gpt *m, int lo, int hi, const mr_act *in);
/* From in (the last block's output): logits, and m->loss when targets were
 * set (m->loss 0 otherwise). */
int mr_gpt_head_fwd(struct mr_gpt *m, const mr_act *in);
int mr_gpt_head_bwd(struct mr_gpt *m, const mr_act *in, float dscale);
/* Blocks hi-1 down to lo (in: the range's input). phase MR_GPT_BWD_ALL,
 * or the input then the weight phase of a split backward (see gpt.c;
 * needs mr_gpt_split_bwd, else MR_ESTATE). */
int mr_gpt_blocks_bwd(struct mr_gpt *m, int lo, int hi, const mr_act *in, float dscale,
		      int phase);
int mr_gpt_embed_bwd(struct mr_gpt *m);
/* Allocates the per-layer stash a split backward needs (MR_MEM_ACTS) to
 * the model's state and every state carved after; 0, MR_ENOMEM, or
 * MR_ESTATE while states are out (mr_gpt_slot_alloc), which it could not
 * reach. Idempotent. */
int mr_gpt_split_bwd(struct mr_gpt *m);

/*
 * A pipeline stage's passes over its chunk c (blocks of place chunk c):
 * forward from in (the (Nl,C) rows the previous virtual stage sent; NULL
 * on virtual stage 0, which runs the embedding of the batch set with
 * mr_gpt_set_batch), its output in mr_gpt_chunk_out; on the last virtual
 * stage also the head and the loss. Backward: on the last virtual stage
 * from the loss, elsewhere from the gradient in m->dres; afterwards
 * m->dres holds the gradient of in (virtual stage 0: the embedding's
 * backward ran instead). phase as mr_gpt_blocks_bwd (the input phase also
 * runs the head's and the embedding's backward; the weight phase only the
 * blocks' weight gradients). The micro-batch's state is the slot in use.
 */
int mr_gpt_chunk_fwd(struct mr_gpt *m, int c, const mr_act *in);
int mr_gpt_chunk_bwd(struct mr_gpt *m, int c, const mr_act *in, float dscale, int phase);
/* The rows chunk c's forward produced (its last block's output). */
mr_act *mr_gpt_chunk_out(const struct mr_gpt *m, int c);

#endif
