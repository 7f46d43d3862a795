/*
 * mr_moe.h - mixture-of-experts MLP: router, top-k gating, capacity,
 * dispatch/exchange/combine, load-balancing loss; forward and backward.
 *
 * Choices (documented here, mirrored by tests/reference/gen_reference.py):
 *  - router: logits = x @ Wr^T, Wr (E,C), fp32, no bias; probs = softmax.
 *  - top-k (k = 1 or 2): the k largest probabilities, ties to the lower
 *    expert index. Gates: by default k = 1 uses g = p (Switch Transformer;
 *    a renormalised single gate would be 1 and the router would get no
 *    gradient from it); k = 2 renormalises g_j = p_j / (p_a + p_b) over
 *    the chosen pair (GShard/Mixtral), also when one of the pair is
 *    dropped. norm_topk (the moe_norm_topk key, Hugging Face's
 *    norm_topk_prob) chooses either for any k.
 *  - capacity per expert: cap = ceil(capacity_factor * N * k / E), clamped
 *    to [1, N], N = tokens of the micro-batch on this rank; the dropless
 *    policy (mr_gpt_config.moe_dropless) uses cap = N, which no expert
 *    can exceed (a token's k choices are distinct experts).
 *  - dropping by position: assignments are taken in token order (flattened
 *    b*T + t), and within a token in choice order (best first); an expert
 *    accepts the first cap of them. A dropped assignment contributes zero;
 *    the residual stream carries the token through unchanged.
 *  - aux loss (Switch / Megatron form): aux = E * sum_e f_e * P_e with
 *    f_e = (assignments routed to e before dropping) / (N * k) and
 *    P_e = mean over tokens of probs[:, e]; f is a constant for autograd.
 *    The model adds aux_coef * aux to the loss.
 *  - experts run as one GEMM per expert over their packed rows (E, cap, C).
 *  - the cpu device runs each expert over its counts[e] kept rows. The
 *    cuda device with capacity routing is sync-free (Megatron-Core's
 *    drop-and-pad): the counts never reach the host - padded rows of each
 *    cap block are zeroed (xin before the dispatch, dyo before the
 *    combine's backward), every expert GEMM runs over the whole block in
 *    one strided-batched call, the exchange moves whole blocks, and the aux
 *    loss and dropped count stay in `stat` for the model to read once per
 *    micro-batch (context parallel: count_reduce sums routed in device
 *    memory and the aux loss is formed there). Dropless routing (cap = N:
 *    padding would cost E / k times the expert work) keeps the host path
 *    (counted in mr_dev.moe_host_counts, logged once).
 *
 * Dispatch and combine go through ONE exchange function (struct
 * mr_moe_xchg): the identity on one rank; expert parallel replaces it with
 * an all-to-all.
 *
 * Here in kernels/: mr_moe_fwd/bwd are the cpu device's moe_fwd/moe_bwd
 * (device/cpu.c) and the pieces below the CPU twins of cuda/moe.cu; the
 * model reaches them only through the device table.
 *
 * Non-goals: expert choice routing, shared experts, router z-loss, noise.
 */
#ifndef MR_MOE_H
#define MR_MOE_H

#include <stddef.h>

#include "cpu/mr_pool.h"

enum mr_moe_phase {
	MR_MOE_DISPATCH,      /* tokens -> experts (forward) */
	MR_MOE_COMBINE,       /* expert outputs -> tokens (forward) */
	MR_MOE_DISPATCH_GRAD, /* grads of expert outputs -> experts (backward) */
	MR_MOE_COMBINE_GRAD,  /* grads of expert inputs -> tokens (backward) */
};

/* Moves expert-major rows (E, cap, row) between ranks. counts[e] rows of
 * expert e are valid; counts NULL: the counts stayed on the device, every
 * row of each cap block travels (padded rows are zero) and the view has
 * cap rows from each rank per local expert. fn NULL = identity (one rank,
 * in place).
 * Expert parallel (layers/mr_ep.h): this rank runs local_experts of the
 * E experts. DISPATCH and DISPATCH_GRAD turn the buffer into its expert
 * view, (local_experts, E * cap / local_experts, row): each local expert's
 * rows from every rank, packed, view_counts[e] of them; COMBINE and
 * COMBINE_GRAD turn a view back into (E, cap, row) at the source. The
 * experts' weights are then the local ones, local_experts of them.
 * Under tensor parallelism each rank holds a slice of every expert's
 * hidden units, so expert outputs are partial sums: reduce (NULL = none)
 * sums the (N,k) partial gate gradients <dy, yo> across the tp ranks, and
 * ranks with router_dx_off set leave the router's (replicated, complete)
 * share out of their partial dx, so the tp sum counts it once. */
struct mr_moe_xchg {
	int (*fn)(void *ctx, enum mr_moe_phase phase, float *buf, const int *counts,
		  int E, int cap, size_t row);
	int (*reduce)(void *ctx, float *buf, size_t n);
	void *ctx;          /* fn's */
	void *reduce_ctx;   /* reduce's */
	int router_dx_off;
	int local_experts;  /* 0: every expert runs here (no expert parallel) */
	/* context parallel: the micro-batch's tokens are split over
	 * count_ranks ranks, and the aux loss's f_e counts every rank's
	 * assignments (Megatron-Core sums them over the sequence split too):
	 * count_reduce sums routed (E ints, host or the device's memory: its
	 * communicator takes both) over those ranks after routing */
	int (*count_reduce)(void *ctx, int *routed, int E);
	void *count_ctx;
	int count_ranks;
	const int *view_counts; /* (local_experts) set by DISPATCH(_GRAD) with
				 * host counts */
};


/* N tokens, C channels, H hidden units per expert on this rank (gpt2 4C /
 * tp; llama ffn_hidden / tp), E experts, top-k, capacity per expert.
 * swiglu: the experts are SwiGLU MLPs without biases (llama: fc holds
 * [gate | up], (E, 2H, C); h is (E,cap,2H), hg = silu(gate) * up), else
 * GELU MLPs with biases (gpt2). */
struct mr_moe_shape {
	int N, C, H, E, k, cap;
	int swiglu;
	int norm_topk; /* gates renormalised over the k chosen: 1 yes, -1 no,
			* 0 the default (k = 2 yes, k = 1 no) */
	int dropless;  /* cap = N by the dropless policy (the cuda device's
			* host path; 0: capacity routing) */
};

/* 1 when the gates are renormalised over the chosen experts. */
static inline int mr_moe_norm_topk(const struct mr_moe_shape *s)
{
	return s->norm_topk ? s->norm_topk > 0 : s->k == 2;
}

/* Columns of the experts' first GEMM: 2H for SwiGLU, else H. */
static inline int mr_moe_fc_cols(const struct mr_moe_shape *s)
{
	return s->swiglu ? 2 * s->H : s->H;
}

/* The experts a rank runs after a dispatch, and its rows: all E at cap
 * and counts without expert parallelism, else xg's view. */
struct mr_moe_view {
	int E, cap;
	const int *counts;
};

static inline struct mr_moe_view mr_moe_view_of(const struct mr_moe_xchg *xg,
						 const struct mr_moe_shape *s, const int *counts)
{
	struct mr_moe_view v = { s->E, s->cap, counts };

	if (xg && xg->local_experts > 0) {
		v.E = xg->local_experts;
		v.cap = s->E * s->cap / xg->local_experts;
		v.counts = xg->view_counts;
	}
	return v;
}

struct mr_moe_acts {
	float *probs;      /* (N,E) router softmax */
	int *topi;         /* (N,k) chosen experts */
	float *gate;       /* (N,k) gates */
	int *slot;         /* (N,k) row in the expert buffer, -1 if dropped */
	int *count;        /* (E) kept rows per expert */
	int *routed;       /* (E) assignments before dropping */
	float *xin;        /* (E,cap,C) dispatched inputs */
	float *h, *hg;     /* (E,cap,fc cols) expert hidden, (E,cap,H) after
			    * GELU / SwiGLU */
	float *yo;         /* (E,cap,C) expert outputs */
	float aux;         /* E * sum f_e P_e of the last forward */
	int dropped;       /* assignments dropped in the last forward */
	/* Set by the caller, not carved (layers sharing acts keep their
	 * own): (2) ints of device memory where a device that keeps them
	 * there (sync-free MoE) writes aux's float bits and dropped; NULL:
	 * none, the device sets aux and dropped on the host. */
	int *stat;
	int stat_on_dev;   /* set by moe_fwd: 1 aux and dropped are in stat,
			    * 0 they are in aux and dropped */
};

/* The aux loss E * sum_e f_e P_e of probs (N,E) with f_e = routed[e] /
 * (N * ranks * k): routed summed over `ranks` ranks' N tokens each. */
float mr_moe_aux(const struct mr_moe_shape *s, const float *probs, const int *routed,
		 int ranks);
/* The aux loss gradient's weight for the router backward: with routed
 * summed over count_ranks ranks, each rank's share (its gradients are
 * averaged over them later) is aux_scale / count_ranks of the sums. */
static inline float mr_moe_aux_scale(const struct mr_moe_xchg *xg, float aux_scale)
{
	return xg && xg->count_reduce && xg->count_ranks > 1 ? aux_scale / (float)xg->count_ranks
							      : aux_scale;
}

/* Capacity for a shape (see above). */
int mr_moe_capacity(int N, int E, int k, float capacity_factor);
/* Floats of activations (probs, gate, xin, h, hg, yo) and ints (topi, slot,
 * count, routed) one MoE layer needs. */
size_t mr_moe_act_floats(const struct mr_moe_shape *s);
size_t mr_moe_act_ints(const struct mr_moe_shape *s);
/* Carves the acts out of fbuf/ibuf (sizes as above); stat NULL. */
void mr_moe_acts_bind(struct mr_moe_acts *a, const struct mr_moe_shape *s, float *fbuf,
		      int *ibuf);
/* Scratch floats the backward needs: dprobs (N,E) + dyo (E,cap,C) +
 * dh (E,cap,fc cols; SwiGLU: then dhg (E,cap,H)) + dxin (E,cap,C) + dgate
 * (N,k). */
size_t mr_moe_ws_floats(const struct mr_moe_shape *s);
/* Those pieces carved out of ws (mr_moe_ws_floats floats); a device
 * keeping other element types in them has each piece's room. */
struct mr_moe_ws {
	float *dprobs, *dyo, *dxin, *dh, *dgate;
	float *dhg; /* SwiGLU: the hidden output's gradient (E,cap,H) */
};
void mr_moe_ws_bind(struct mr_moe_ws *w, const struct mr_moe_shape *s, float *ws);

/*
 * The pieces mr_moe_fwd and mr_moe_bwd are made of, in their order; each
 * is also the CPU twin of a CUDA MoE kernel (cuda/mr_cuda.h).
 */
/* From the router logits in a->probs (N,E): the softmax in place, topi,
 * gate, slot, count, routed, aux and dropped (the choices above). */
void mr_moe_route(const struct mr_moe_shape *s, struct mr_moe_acts *a);
/* xin (E,cap,C) rows of the kept assignments = their tokens' x rows. */
void mr_moe_dispatch(const struct mr_moe_shape *s, const struct mr_moe_acts *a, float *xin,
		     const float *x);
/* y (N,C) = sum over each token's kept assignments of gate (gated; else
 * 1) * its row of rows (E,cap,C): the combine, and dx from dxin. */
void mr_moe_combine(const struct mr_moe_shape *s, const struct mr_moe_acts *a, int gated,
		    float *y, const float *rows);
/* The combine's backward: dyo rows of kept assignments = gate * dy (=),
 * dgate (N,k) = <dy, yo row> (=; 0 when dropped). */
void mr_moe_combine_bwd(const struct mr_moe_shape *s, const struct mr_moe_acts *a, float *dyo,
			float *dgate, const float *dy, const float *yo);
/* dlogits (N,E) (=) of the router: the gates' backward of dgate plus
 * aux_scale times the aux loss's gradient, through the softmax. */
void mr_moe_router_bwd(const struct mr_moe_shape *s, const struct mr_moe_acts *a,
		       float *dlogits, const float *dgate, float aux_scale);

/* y (N,C) = MoE(x (N,C)); weights as in struct mr_gpt_layer_w. fcprojb
 * may be NULL (tp ranks other than 0 add no output bias: their y is a
 * partial sum); SwiGLU experts have no biases (fcb, fcprojb, dfcb and
 * dfcprojb NULL). */
int mr_moe_fwd(struct mr_pool *p, const struct mr_moe_shape *s, struct mr_moe_acts *a,
	       const struct mr_moe_xchg *xg, float *y, const float *x, const float *routerw,
	       const float *fcw, const float *fcb, const float *fcprojw,
	       const float *fcprojb);
/* dx (N,C) written (=); parameter grads +=; aux_scale = aux_coef * dscale
 * is the weight of this layer's aux loss in the total loss. ws as above;
 * ones has max(N, E * cap / xg->local_experts) floats equal to 1: the
 * most rows an expert gets (N without expert parallelism). */
int mr_moe_bwd(struct mr_pool *p, const struct mr_moe_shape *s, const struct mr_moe_acts *a,
	       const struct mr_moe_xchg *xg, float *dx, const float *dy, const float *x,
	       const float *routerw, const float *fcw, const float *fcprojw, float *drouterw,
	       float *dfcw, float *dfcb, float *dfcprojw, float *dfcprojb, float aux_scale,
	       float *ws, const float *ones);

#endif
