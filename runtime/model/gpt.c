/*
 * gpt.c - GPT forward and backward passes over the buffers of struct
 * mr_gpt (see mr_gpt.h). Each step is one kernel from kernels/ or one
 * OpenBLAS GEMM over all B*T rows at once.
 *
 * Non-goals: allocation and init (gpt_params.c), the optimizer (optim/).
 */
#include <string.h>

#include "kernels/mr_attention.h"
#include "kernels/mr_kernels.h"
#include "mr_gpt.h"

static struct mr_moe_shape shape_of(const struct mr_gpt *m)
{
	struct mr_moe_shape s;

	s.N = m->B * m->T;
	s.C = m->cfg.d_model;
	s.E = m->cfg.n_experts;
	s.k = m->cfg.top_k;
	s.cap = mr_moe_capacity(s.N, s.E, s.k, m->cfg.capacity_factor);
	return s;
}

static int check_tokens(const int *tok, int n, int V, const char *what, struct mr_errbuf *eb)
{
	int i;

	for (i = 0; i < n; i++)
		if (tok[i] < 0 || tok[i] >= V)
			return mr_errf_field(eb, MR_ERANGE, what,
					     "%s token %d at position %d is outside [0, %d)", what,
					     tok[i], i, V);
	return 0;
}

int mr_gpt_forward(struct mr_gpt *m, const int *inputs, const int *targets,
		   struct mr_errbuf *eb)
{
	const struct mr_gpt_config *c = &m->cfg;
	struct mr_pool *p = m->pool;
	int B = m->B, T = m->T, C = c->d_model, V = c->vocab, NH = c->n_head;
	int N = B * T, l, i, rc;
	const float *res;
	double sum = 0.0;

	rc = check_tokens(inputs, N, V, "input", eb);
	if (rc == 0 && targets)
		rc = check_tokens(targets, N, V, "target", eb);
	if (rc < 0)
		return rc;
	memcpy(m->inputs, inputs, sizeof(int) * (size_t)N);
	if (targets)
		memcpy(m->targets, targets, sizeof(int) * (size_t)N);
	mr_encoder_fwd(p, m->encoded, inputs, m->w.wte, m->w.wpe, B, T, C);
	res = m->encoded;
	m->aux_loss = 0.0f;
	for (l = 0; l < c->n_layer; l++) {
		const struct mr_gpt_layer_w *w = &m->w.layer[l];
		struct mr_gpt_layer_acts *a = &m->la[l];

		mr_layernorm_fwd(p, a->ln1, a->ln1_mean, a->ln1_rstd, res, w->ln1w, w->ln1b, N, C);
		mr_matmul_fwd(p, a->qkv, a->ln1, w->qkvw, w->qkvb, N, C, 3 * C);
		mr_attn_layer_fwd(p, a->atty, a->att_lse, a->qkv, B, T, C, NH, m->k_ws);
		mr_matmul_fwd(p, a->res2, a->atty, w->attprojw, w->attprojb, N, C, C);
		mr_add_inplace(p, a->res2, res, (size_t)N * C);
		mr_layernorm_fwd(p, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2w, w->ln2b,
				 N, C);
		if (mr_gpt_layer_is_moe(c, l)) {
			struct mr_moe_shape s = shape_of(m);
			rc = mr_moe_fwd(p, &s, &a->moe, &m->xchg, a->res3, a->ln2, w->routerw,
					w->fcw, w->fcb, w->fcprojw, w->fcprojb);
			if (rc < 0)
				return mr_errf(eb, rc, "moe dispatch of layer %d failed", l);
			m->aux_loss += a->moe.aux;
		} else {
			mr_matmul_fwd(p, a->fch, a->ln2, w->fcw, w->fcb, N, C, 4 * C);
			mr_gelu_fwd(p, a->fch_gelu, a->fch, (size_t)N * 4 * C);
			mr_matmul_fwd(p, a->res3, a->fch_gelu, w->fcprojw, w->fcprojb, N, 4 * C, C);
		}
		mr_add_inplace(p, a->res3, a->res2, (size_t)N * C);
		res = a->res3;
	}
	mr_layernorm_fwd(p, m->lnf, m->lnf_mean, m->lnf_rstd, res, m->w.lnfw, m->w.lnfb, N, C);
	mr_matmul_fwd(p, m->logits, m->lnf, m->w.wte, NULL, N, C, V);
	if (!targets) {
		m->loss = 0.0f;
		return 0;
	}
	mr_crossentropy_fwd(p, m->losses, m->ce_lse, m->logits, m->targets, N, V);
	for (i = 0; i < N; i++)
		sum += m->losses[i];
	m->loss = (float)(sum / N);
	return 0;
}

void mr_gpt_zero_grad(struct mr_gpt *m)
{
	memset(m->grads, 0, sizeof(float) * m->nparams);
}

void mr_gpt_backward(struct mr_gpt *m, float dscale)
{
	const struct mr_gpt_config *c = &m->cfg;
	struct mr_pool *p = m->pool;
	int B = m->B, T = m->T, C = c->d_model, V = c->vocab, NH = c->n_head;
	int N = B * T, l;
	const float *res_last = m->la[c->n_layer - 1].res3;

	mr_crossentropy_bwd_inplace(p, m->logits, m->ce_lse, m->targets, N, V,
				    dscale / (float)N);
	mr_matmul_bwd(p, m->dln, m->g.wte, NULL, m->logits, m->lnf, m->w.wte, N, C, V, 0, m->ones);
	memset(m->dres, 0, sizeof(float) * (size_t)N * C);
	mr_layernorm_bwd(p, m->dres, m->g.lnfw, m->g.lnfb, m->dln, res_last, m->w.lnfw,
			 m->lnf_mean, m->lnf_rstd, N, C, m->k_ws);
	for (l = c->n_layer - 1; l >= 0; l--) {
		const struct mr_gpt_layer_w *w = &m->w.layer[l];
		const struct mr_gpt_layer_w *g = &m->g.layer[l];
		struct mr_gpt_layer_acts *a = &m->la[l];
		const float *res = l == 0 ? m->encoded : m->la[l - 1].res3;

		/* dres = d(res3): the MLP branch */
		if (mr_gpt_layer_is_moe(c, l)) {
			struct mr_moe_shape s = shape_of(m);
			/* the identity exchange cannot fail */
			(void)mr_moe_bwd(p, &s, &a->moe, &m->xchg, m->dln, m->dres, a->ln2,
					 w->routerw, w->fcw, w->fcprojw, g->routerw, g->fcw,
					 g->fcb, g->fcprojw, g->fcprojb, c->aux_coef * dscale,
					 m->k_ws, m->ones);
		} else {
			mr_matmul_bwd(p, m->dfch, g->fcprojw, g->fcprojb, m->dres, a->fch_gelu,
				      w->fcprojw, N, 4 * C, C, 0, m->ones);
			mr_gelu_bwd(p, m->dfch, a->fch, m->dfch, (size_t)N * 4 * C);
			mr_matmul_bwd(p, m->dln, g->fcw, g->fcb, m->dfch, a->ln2, w->fcw, N, C, 4 * C,
				      0, m->ones);
		}
		mr_layernorm_bwd(p, m->dres, g->ln2w, g->ln2b, m->dln, a->res2, w->ln2w,
				 a->ln2_mean, a->ln2_rstd, N, C, m->k_ws);
		/* dres = d(res2): the attention branch */
		mr_matmul_bwd(p, m->datty, g->attprojw, g->attprojb, m->dres, a->atty, w->attprojw,
			      N, C, C, 0, m->ones);
		mr_attn_layer_bwd(p, m->dqkv, m->datty, a->qkv, a->atty, a->att_lse, B, T, C, NH,
				  m->k_ws);
		mr_matmul_bwd(p, m->dln, g->qkvw, g->qkvb, m->dqkv, a->ln1, w->qkvw, N, C, 3 * C, 0,
			      m->ones);
		mr_layernorm_bwd(p, m->dres, g->ln1w, g->ln1b, m->dln, res, w->ln1w, a->ln1_mean,
				 a->ln1_rstd, N, C, m->k_ws);
	}
	mr_encoder_bwd(p, m->g.wte, m->g.wpe, m->dres, m->inputs, B, T, C);
}
