/*
 * gpt_train.cu - forward, backward and the optimizer step of the device
 * GPT (see mr_cuda_gpt.h). Each pass is model/gpt.c's tp = 1 path call for
 * call, with the mr_cuda.h twin of each CPU kernel:
 *
 *   forward  encoder; per layer: LN1, QKV GEMM (+bias), attention, proj
 *            GEMM (+bias), residual; LN2, fc GEMM (+bias), GELU, proj GEMM
 *            (+bias), residual; final LN; LM head GEMM against wte;
 *            fused softmax cross-entropy. Activations bf16 (N = B*T rows).
 *   backward dlogits in place (scaled by dscale/N), LM head GEMM backward
 *            (dwte +=), final LN backward into dres (zeroed first), then
 *            per layer in reverse: MLP branch, LN2 (dres += : the residual
 *            gradient passes through), attention branch (dqkv zeroed, delta,
 *            flash backward), LN1; encoder backward (dwte, dwpe +=).
 *            Parameter gradients are fp32 and accumulate over micro-batches.
 *
 * The step is the step driver's (mr_step.h) for one replica; see mr_cuda_gpt.h for the
 * mapping. AdamW runs over runs of consecutive tensors with the same decay
 * flag (one launch per run instead of per tensor).
 *
 * Non-goals: overlapping host work with the device (the loss is read back
 * per micro-batch), CUDA graphs, fused kernels beyond mr_cuda.h's.
 */
#include <math.h>
#include <stdlib.h>

#include "gpt_int.cuh"

#define CK(call)                         \
	do {                             \
		if ((rc = (call)) < 0)   \
			return rc;       \
	} while (0)

/* The packed qkv (B,T,3C) of one layer as the attention kernels see it. */
static struct mr_cuda_attn attn_desc(const struct mr_cuda_gpt *g, const mr_bf16 *qkv)
{
	struct mr_cuda_attn a;
	int C = g->tbl.cfg.d_model, NH = g->tbl.cfg.n_head;

	memset(&a, 0, sizeof(a));
	a.q = qkv;
	a.k = qkv + C;
	a.v = qkv + 2 * C;
	a.q_row = a.kv_row = 3 * (size_t)C;
	a.q_batch = a.kv_batch = (size_t)g->T * 3 * C;
	a.B = g->B;
	a.NH = NH;
	a.hs = C / NH;
	a.tq = a.tk = g->T;
	a.q_pos0 = a.k_pos0 = 0;
	a.causal = 1;
	a.scale = 1.0f / sqrtf((float)a.hs);
	return a;
}

#define W(off) (g->p16 + (off))
#define G(off) (g->grads + (off))

/* One block: res (N,C) in, la[l].res3 (N,C) out. */
static int block_fwd(struct mr_cuda_gpt *g, int l, const mr_bf16 *res)
{
	struct mr_cuda *cu = g->cu;
	const struct mr__cg_layer_off *o = &g->lo[l];
	struct mr__cg_layer_acts *a = &g->la[l];
	int N = g->B * g->T, C = g->tbl.cfg.d_model, rc;
	size_t nc = (size_t)N * C;
	struct mr_cuda_attn at = attn_desc(g, a->qkv);

	CK(mr_cuda_layernorm_fwd(cu, a->ln1, a->ln1_mean, a->ln1_rstd, res, W(o->ln1w),
				 W(o->ln1b), N, C));
	CK(mr_cuda_matmul_fwd(cu, a->qkv, a->ln1, W(o->qkvw), W(o->qkvb), N, C, 3 * C));
	CK(mr_cuda_attn_fwd(cu, &at, a->atty, (size_t)C, (size_t)g->T * C, a->att_lse));
	CK(mr_cuda_matmul_fwd(cu, a->res2, a->atty, W(o->attprojw), W(o->attprojb), N, C, C));
	CK(mr_cuda_add_inplace(cu, a->res2, res, nc));
	CK(mr_cuda_layernorm_fwd(cu, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, W(o->ln2w),
				 W(o->ln2b), N, C));
	CK(mr_cuda_matmul_fwd(cu, a->fch, a->ln2, W(o->fcw), W(o->fcb), N, C, 4 * C));
	CK(mr_cuda_gelu_fwd(cu, a->fch_gelu, a->fch, 4 * nc));
	CK(mr_cuda_matmul_fwd(cu, a->res3, a->fch_gelu, W(o->fcprojw), W(o->fcprojb), N, 4 * C,
			      C));
	CK(mr_cuda_add_inplace(cu, a->res3, a->res2, nc));
	return 0;
}

static int forward(struct mr_cuda_gpt *g, int has_targets)
{
	struct mr_cuda *cu = g->cu;
	const struct mr_gpt_config *c = &g->tbl.cfg;
	int N = g->B * g->T, C = c->d_model, V = c->vocab, l, rc;
	const mr_bf16 *res;

	CK(mr_cuda_encoder_fwd(cu, g->encoded, g->tok, W(g->wte), W(g->wpe), g->B, g->T, C));
	res = g->encoded;
	for (l = 0; l < c->n_layer; l++) {
		CK(block_fwd(g, l, res));
		res = g->la[l].res3;
	}
	CK(mr_cuda_layernorm_fwd(cu, g->lnf, g->lnf_mean, g->lnf_rstd, res, W(g->lnfw),
				 W(g->lnfb), N, C));
	CK(mr_cuda_matmul_fwd(cu, g->logits, g->lnf, W(g->wte), NULL, N, C, V));
	if (has_targets)
		CK(mr_cuda_crossentropy_fwd(cu, g->losses, g->ce_lse, g->logits, g->tgt, N, V));
	return 0;
}

extern "C" int mr_cuda_gpt_forward(struct mr_cuda_gpt *g, const int *inputs, const int *targets,
				   float *loss, struct mr_errbuf *eb)
{
	int N = g->B * g->T, V = g->tbl.cfg.vocab, i, rc;
	size_t bytes = (size_t)N * sizeof(int);
	double sum = 0.0;

	*loss = 0.0f;
	rc = mr_gpt_check_tokens(inputs, N, V, "input", eb);
	if (rc == 0 && targets)
		rc = mr_gpt_check_tokens(targets, N, V, "target", eb);
	if (rc < 0)
		return rc;
	memcpy(g->tok_host, inputs, bytes);
	g->has_targets = targets != NULL;
	if ((rc = mr_cuda_upload(g->cu, g->tok, inputs, bytes)) < 0 ||
	    (targets && (rc = mr_cuda_upload(g->cu, g->tgt, targets, bytes)) < 0) ||
	    (rc = forward(g, targets != NULL)) < 0)
		return mr__cg_fail(g, rc, "forward pass", eb);
	if (!targets) {
		g->loss = 0.0f;
		return 0;
	}
	if ((rc = mr_cuda_download(g->cu, g->loss_host, g->losses, (size_t)N * sizeof(float))) < 0)
		return mr__cg_fail(g, rc, "forward pass", eb);
	for (i = 0; i < N; i++)
		sum += g->loss_host[i];
	g->loss = (float)(sum / N);
	*loss = g->loss;
	return 0;
}

extern "C" int mr_cuda_gpt_zero_grad(struct mr_cuda_gpt *g, struct mr_errbuf *eb)
{
	int rc = mr_cuda_memset0(g->cu, g->grads, g->n * sizeof(float));

	return rc < 0 ? mr__cg_fail(g, rc, "zero grad", eb) : 0;
}

/* d(res3) in g->dres (N,C) -> d(res of the block) in g->dres. */
static int block_bwd(struct mr_cuda_gpt *g, int l, const mr_bf16 *res)
{
	struct mr_cuda *cu = g->cu;
	const struct mr__cg_layer_off *o = &g->lo[l];
	struct mr__cg_layer_acts *a = &g->la[l];
	int N = g->B * g->T, C = g->tbl.cfg.d_model, NH = g->tbl.cfg.n_head, rc;
	size_t nc = (size_t)N * C;
	struct mr_cuda_attn at = attn_desc(g, a->qkv);

	/* MLP branch */
	CK(mr_cuda_matmul_bwd(cu, g->dfch, G(o->fcprojw), G(o->fcprojb), g->dres, a->fch_gelu,
			      W(o->fcprojw), N, 4 * C, C, 0));
	CK(mr_cuda_gelu_bwd(cu, g->dfch, a->fch, g->dfch, 4 * nc));
	CK(mr_cuda_matmul_bwd(cu, g->dln, G(o->fcw), G(o->fcb), g->dfch, a->ln2, W(o->fcw), N, C,
			      4 * C, 0));
	CK(mr_cuda_layernorm_bwd(cu, g->dres, G(o->ln2w), G(o->ln2b), g->dln, a->res2, W(o->ln2w),
				 a->ln2_mean, a->ln2_rstd, N, C));
	/* attention branch: dres = d(res2) */
	CK(mr_cuda_matmul_bwd(cu, g->datty, G(o->attprojw), G(o->attprojb), g->dres, a->atty,
			      W(o->attprojw), N, C, C, 0));
	CK(mr_cuda_memset0(cu, g->dqkv, 3 * nc * sizeof(mr_bf16)));
	CK(mr_cuda_attn_delta(cu, g->delta, g->datty, a->atty, g->B, NH, g->T, C / NH, (size_t)C,
			      (size_t)g->T * C));
	CK(mr_cuda_attn_bwd(cu, &at, g->datty, (size_t)C, (size_t)g->T * C, a->att_lse, g->delta,
			    g->dqkv, 3 * (size_t)C, (size_t)g->T * 3 * C, g->dqkv + C,
			    g->dqkv + 2 * C, 3 * (size_t)C, (size_t)g->T * 3 * C));
	CK(mr_cuda_matmul_bwd(cu, g->dln, G(o->qkvw), G(o->qkvb), g->dqkv, a->ln1, W(o->qkvw), N,
			      C, 3 * C, 0));
	CK(mr_cuda_layernorm_bwd(cu, g->dres, G(o->ln1w), G(o->ln1b), g->dln, res, W(o->ln1w),
				 a->ln1_mean, a->ln1_rstd, N, C));
	return 0;
}

static int backward(struct mr_cuda_gpt *g, float dscale)
{
	struct mr_cuda *cu = g->cu;
	const struct mr_gpt_config *c = &g->tbl.cfg;
	int N = g->B * g->T, C = c->d_model, V = c->vocab, L = c->n_layer, l, rc;

	CK(mr_cuda_crossentropy_bwd_inplace(cu, g->logits, g->ce_lse, g->tgt, N, V,
					    dscale / (float)N));
	CK(mr_cuda_matmul_bwd(cu, g->dln, G(g->wte), NULL, g->logits, g->lnf, W(g->wte), N, C, V,
			      0));
	CK(mr_cuda_memset0(cu, g->dres, (size_t)N * C * sizeof(mr_bf16)));
	CK(mr_cuda_layernorm_bwd(cu, g->dres, G(g->lnfw), G(g->lnfb), g->dln, g->la[L - 1].res3,
				 W(g->lnfw), g->lnf_mean, g->lnf_rstd, N, C));
	for (l = L - 1; l >= 0; l--)
		CK(block_bwd(g, l, l == 0 ? g->encoded : g->la[l - 1].res3));
	/* the bucketing reads the host copy of the tokens */
	CK(mr_cuda_encoder_bwd(cu, G(g->wte), G(g->wpe), g->dres, g->tok_host, g->B, g->T, C, V));
	return 0;
}

extern "C" int mr_cuda_gpt_backward(struct mr_cuda_gpt *g, float dscale, struct mr_errbuf *eb)
{
	int rc;

	if (!g->has_targets)
		return mr_errf(eb, MR_EINVAL, "backward needs a forward pass with targets");
	if ((rc = backward(g, dscale)) < 0)
		return mr__cg_fail(g, rc, "backward pass", eb);
	return 0;
}

/* ---- the optimizer step ------------------------------------------------------- */

/* Name of the first tensor of a device fp32 buffer (table layout) holding a
 * NaN or Inf; "?" when the download fails. */
static const char *first_nonfinite(struct mr_cuda_gpt *g, const float *dev)
{
	float *host = (float *)malloc(g->n * sizeof(float));
	const char *name = "?";

	if (host && mr_cuda_download(g->cu, host, dev, g->n * sizeof(float)) == 0)
		name = mr_gpt_first_nonfinite(&g->tbl, host);
	free(host);
	return name;
}

static int logits_nonfinite(struct mr_cuda_gpt *g)
{
	size_t i, n = (size_t)g->B * g->T * g->tbl.cfg.vocab;
	mr_bf16 *host = (mr_bf16 *)malloc(n * sizeof(mr_bf16));
	int bad = -1;

	if (host && mr_cuda_download(g->cu, host, g->logits, n * sizeof(mr_bf16)) == 0)
		for (bad = 0, i = 0; i < n && !bad; i++)
			bad = !isfinite(mr_bf16_to_f32(host[i]));
	free(host);
	return bad;
}

/* step.c's nonfinite_loss on device buffers. */
static int nonfinite_loss(struct mr_cuda_gpt *g, long step, float loss, struct mr_errbuf *eb)
{
	const char *p = first_nonfinite(g, g->p32);
	int bad;

	if (p)
		return mr_errf(eb, MR_ENONFINITE,
			       "loss is %g at step %ld: first non-finite tensor 'params.%s'",
			       (double)loss, step, p);
	bad = logits_nonfinite(g);
	if (bad)
		return mr_errf(eb, MR_ENONFINITE, "loss is %g at step %ld: %s", (double)loss, step,
			       bad > 0 ? "first non-finite tensor 'logits'"
				       : "logits could not be read back");
	return mr_errf(eb, MR_ENONFINITE,
		       "loss is %g at step %ld: no non-finite parameter or logit", (double)loss,
		       step);
}

/* AdamW over every tensor: one launch per run of consecutive tensors that
 * share the decay flag. */
static int adamw_all(struct mr_cuda_gpt *g, float lr, float grad_scale)
{
	const struct mr_adamw_config *c = &g->ocfg;
	const struct mr_gpt_tensor *t = g->tbl.tensors;
	struct mr_cuda_adamw o;
	int i = 0, j, rc;

	o.lr = lr;
	o.beta1 = c->beta1;
	o.beta2 = c->beta2;
	o.eps = c->eps;
	o.t = g->t;
	o.grad_scale = grad_scale;
	while (i < g->tbl.ntensors) {
		size_t off = t[i].off, n = t[i].n;
		for (j = i + 1; j < g->tbl.ntensors && t[j].decay == t[i].decay &&
				t[j].off == off + n; j++)
			n += t[j].n;
		o.weight_decay = t[i].decay ? c->weight_decay : 0.0f;
		CK(mr_cuda_adamw_step(g->cu, g->p32 + off, g->p16 + off, g->grads + off, g->m + off,
				      g->v + off, n, &o));
		i = j;
	}
	return 0;
}

extern "C" int mr_cuda_gpt_step(struct mr_cuda_gpt *g, const int *inputs, const int *targets,
				int accum, struct mr_step_result *r, struct mr_errbuf *eb)
{
	size_t N = (size_t)g->B * g->T;
	double loss = 0.0, sumsq, norm, coef;
	long step = g->t;
	float l, scale = 1.0f, clip = g->ocfg.grad_clip;
	int i, rc;

	if (accum < 1)
		return mr_errf_field(eb, MR_EINVAL, "grad_accum",
				     "'grad_accum' must be >= 1, got %d", accum);
	if ((rc = mr_cuda_gpt_zero_grad(g, eb)) < 0)
		return rc;
	for (i = 0; i < accum; i++) {
		if ((rc = mr_cuda_gpt_forward(g, inputs + i * N, targets + i * N, &l, eb)) < 0)
			return rc;
		if (!isfinite(l))
			return nonfinite_loss(g, step, l, eb);
		loss += l;
		if ((rc = backward(g, 1.0f / (float)accum)) < 0)
			return mr_errf(eb, rc, "backward pass failed at step %ld: %s", step,
				       mr_cuda_errmsg(g->cu));
	}
	if ((rc = mr_cuda_grad_sumsq(g->cu, g->grads, g->n, &sumsq)) < 0)
		return mr_errf(eb, rc, "gradient norm failed at step %ld: %s", step,
			       mr_cuda_errmsg(g->cu));
	norm = sqrt(sumsq);
	if (!isfinite(norm)) {
		const char *name = first_nonfinite(g, g->grads);
		return mr_errf(eb, MR_ENONFINITE,
			       "gradient norm is %g at step %ld: first non-finite tensor "
			       "'grads.%s'", norm, step, name ? name : "?");
	}
	/* mr_grad_clip's factor, applied to g inside the update */
	if (clip > 0.0f) {
		coef = (double)clip / (norm + 1e-6);
		if (coef < 1.0)
			scale = (float)coef;
	}
	r->loss = (float)(loss / accum);
	r->aux_loss = 0.0f;
	r->grad_norm = (float)norm;
	r->lr = mr_lr_at(&g->ocfg, step);
	g->t++;
	if ((rc = adamw_all(g, r->lr, scale)) < 0) {
		g->t--;
		return mr_errf(eb, rc, "optimizer update failed at step %ld: %s", step,
			       mr_cuda_errmsg(g->cu));
	}
	return 0;
}
