/*
 * gpt.c - GPT forward and backward passes over the buffers of struct
 * mr_gpt (see mr_gpt.h), in pieces (embedding, a range of blocks, head +
 * loss). Every step is one operation of the model's device
 * (device/mr_device.h) over all B*T rows at once, so the same code runs
 * on every device.
 *
 * Tensor and sequence parallelism are layers from layers/mr_tp.h that
 * the passes call unconditionally (each the single-rank operation with one
 * tp rank): a column-parallel GEMM reads the full input rows (gathered
 * from the sequence shards with sp) and writes this rank's slice of
 * outputs; a row-parallel GEMM's partial (N,C) sum is reduced before its
 * replicated bias and the residual add; the embedding and the loss are
 * vocab-parallel. Backward runs the conjugates: the activation gradient
 * entering a column-parallel GEMM's backward is a partial sum and is
 * reduced the same way; LayerNorm gradients under sp are summed over tp
 * at the end of their unit.
 *
 * Weights: the kernels read the compute copy of each weight, in the
 * device's activation type (WV and CW below): on an fp32 device that is
 * the master itself, elsewhere the model's params_c (see mr_gpt.h).
 *
 * Non-goals: allocation and init (gpt_params.c), the optimizer (optim/).
 */
#include <string.h>

#include "gpt_family.h"
#include "layers/mr_tp.h"

/* The LM head's weight: the untied head, else the token embedding. */
static inline const float *head_w(const struct mr_gpt_weights *w)
{
	return w->head ? w->head : w->wte;
}

int mr_gpt_check_tokens(const int *tok, int n, int V, const char *what, struct mr_errbuf *eb)
{
	int i;

	for (i = 0; i < n; i++)
		if (tok[i] < 0 || tok[i] >= V)
			return mr_errf_field(eb, MR_ERANGE, what,
					     "%s token %d at position %d is outside [0, %d)", what,
					     tok[i], i, V);
	return 0;
}

int mr__gpt_moe_fwd(struct mr_gpt *m, int l, mr_act *out)
{
	const struct mr_gpt_layer_w *w = &WV(m)->layer[l];
	struct mr_gpt_layer_acts *a = &m->la[l];
	struct mr_moe_shape s = mr_gpt_moe_shape(m);
	mr_act *y = mr_tp_if_split(&m->par.tp, out, m->dln);
	int rc;

	a->moe.stat = m->moe_stat ? m->moe_stat + 2 * l : NULL;
	/* row-parallel experts: the bias once, on tp rank 0, before the sum */
	rc = OP(m, moe_fwd, &s, &a->moe, &m->par.xchg, y, a->ln2, CW(w->routerw), CW(w->fcw),
		CW(w->fcb), CW(w->fcprojw), m->par.tp.rank == 0 ? CW(w->fcprojb) : NULL);
	if (rc == 0)
		rc = mr_tp_reduce_rows(&m->par.tp, out, y);
	/* counted once, by the forward; when the device kept it, at the
	 * chunk's end (read_moe_stat) */
	if (!m->recomputing && !a->moe.stat_on_dev)
		m->aux_loss += a->moe.aux;
	return rc;
}

/*
 * The per-micro-batch scalars the device kept for blocks [lo, hi) (the
 * sync-free MoE: each layer's aux loss and dropped count), read in one
 * download and added to aux_loss; nothing when no forward left any
 * unread. A pipeline chunk's forward reads its blocks' at its end; the
 * whole model's forward leaves them to mr_gpt_read_results, after the
 * passes, so the passes read nothing on the host (a device graph).
 */
static int read_moe_stat(struct mr_gpt *m, int lo, int hi)
{
	int l, rc;

	if (!m->moe_stat_unread)
		return 0;
	m->moe_stat_unread = 0;
	CK(OP(m, download, m->moe_stat_host + 2 * lo, m->moe_stat + 2 * lo,
	      2 * (size_t)(hi - lo) * sizeof(int)));
	for (l = lo; l < hi; l++) {
		struct mr_moe_acts *a = &m->la[l].moe;
		if (!mr_gpt_layer_is_moe(&m->cfg, l) || !a->stat_on_dev)
			continue;
		memcpy(&a->aux, &m->moe_stat_host[2 * l], sizeof(float));
		a->dropped = m->moe_stat_host[2 * l + 1];
		m->aux_loss += a->aux;
	}
	return 0;
}

/* The norm (LayerNorm; RMSNorm for llama) of the local rows into full
 * (N,C) rows for a column-parallel GEMM (sp: gathered; else written in
 * place). */
int mr__gpt_norm_fwd(struct mr_gpt *m, mr_act *full, float *mean, float *rstd,
		     const mr_act *res, const float *w, const float *b)
{
	mr_act *local = mr_tp_if_sp(&m->par.tp, full, m->dtmp);
	int Nl = mr_tp_local_rows(&m->par.tp), C = m->cfg.d_model;
	int rc = m->family->rms_norm
			 ? OP(m, rmsnorm_fwd, local, rstd, res, CW(w), Nl, C,
			      mr_gpt_norm_eps(&m->cfg))
			 : OP(m, layernorm_fwd, local, mean, rstd, res, CW(w), CW(b), Nl, C);

	return rc < 0 ? rc : mr_tp_gather_rows(&m->par.tp, full, local);
}

int mr__gpt_add_norm_fwd(struct mr_gpt *m, mr_act *full, float *mean, float *rstd, mr_act *res,
			 const mr_act *x, const float *w, const float *b)
{
	mr_act *local = mr_tp_if_sp(&m->par.tp, full, m->dtmp);
	int Nl = mr_tp_local_rows(&m->par.tp), C = m->cfg.d_model, rc;

	if (m->family->rms_norm || !m->dev->ops->add_layernorm_fwd) {
		CK(OP(m, add, res, x, (size_t)Nl * C));
		return mr__gpt_norm_fwd(m, full, mean, rstd, res, w, b);
	}
	CK(OP(m, add_layernorm_fwd, res, local, mean, rstd, x, CW(w), CW(b), Nl, C));
	return mr_tp_gather_rows(&m->par.tp, full, local);
}

/*
 * Brings back what block l's backward reads and the block did not keep
 * (mr_gpt.h's enum mr_gpt_recompute), from its input res: under full its
 * forward again into the scratch - its collectives, and MoE routing
 * over the same input, which picks and drops the same tokens - without
 * the forward's hooks and without counting the aux loss again; under
 * selective its two norms and the MLP's activation function. First the
 * block's two units are asked for (pre_recompute: ZeRO-3 gathers their
 * parameters again). A split backward's weight phase recomputes again:
 * other blocks used the scratch in between.
 */
static int recompute(struct mr_gpt *m, int l, const mr_act *res)
{
	const struct mr_gpt_layer_w *w;
	struct mr_gpt_layer_acts *a = &m->la[l];
	int mode = mr_gpt_layer_recompute(m, l), u = m->layer_unit[l], rc;

	if (mode == MR_GPT_RC_NONE)
		return 0;
	CK(HOOK(m, pre_recompute, u));
	CK(HOOK(m, pre_recompute, u + 1));
	w = &WV(m)->layer[l];
	m->recomputing = 1;
	if (mode == MR_GPT_RC_FULL) {
		rc = m->family->block_fwd(m, l, res);
	} else if ((rc = mr__gpt_norm_fwd(m, a->ln1, a->ln1_mean, a->ln1_rstd, res, w->ln1w,
					  w->ln1b)) == 0 &&
		   (rc = mr__gpt_norm_fwd(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2w,
					  w->ln2b)) == 0 &&
		   !mr_gpt_layer_is_moe(&m->cfg, l)) {
		rc = m->family->mlp_act(m, l);
	}
	m->recomputing = 0;
	return rc;
}

int mr_gpt_set_batch(struct mr_gpt *m, const int *inputs, const int *targets,
		     struct mr_errbuf *eb)
{
	struct mr_dev *d = m->dev;
	int N = m->B * m->T, V = m->cfg.vocab, rc = 0;
	size_t bytes = sizeof(int) * (size_t)N;

	if (inputs && (rc = mr_gpt_check_tokens(inputs, N, V, "input", eb)) < 0)
		return rc;
	if (targets && (rc = mr_gpt_check_tokens(targets, N, V, "target", eb)) < 0)
		return rc;
	/* ids relative to this rank's vocabulary slice, on the host and the device */
	if (inputs) {
		memcpy(m->inputs, inputs, bytes);
		m->tok_local = mr_tp_vocab_ids(&m->par.tp, m->tok_tp, m->inputs, N);
		rc = d->ops->upload(d, m->tok_dev, m->tok_local, bytes);
	}
	m->has_targets = targets != NULL;
	if (rc == 0 && targets) {
		memcpy(m->targets, targets, bytes);
		rc = d->ops->upload(d, m->tgt_dev,
				    mr_tp_vocab_ids(&m->par.tp, m->tgt_tp, m->targets, N), bytes);
	}
	return rc < 0 ? mr_errf(eb, rc, "unable to copy the batch to the device") : 0;
}

int mr_gpt_embed_fwd(struct mr_gpt *m)
{
	int rc = HOOK(m, pre_fwd, 0);

	m->aux_loss = 0.0f;
	if (rc < 0)
		return rc;
	return mr_tp_embedding_fwd(&m->par.tp, m->encoded, m->tok_dev, CW(WV(m)->wte),
				   CW(WV(m)->wpe), m->dln);
}

/* Blocks [lo, hi) forward, their MoE scalars left on the device. */
static int blocks_passes(struct mr_gpt *m, int lo, int hi, const mr_act *in)
{
	const mr_act *res = in;
	int l, rc;

	for (l = lo; l < hi; l++) {
		CK(HOOK(m, pre_fwd, m->layer_unit[l]));
		CK(m->family->block_fwd(m, l, res));
		if (mr_gpt_layer_is_moe(&m->cfg, l) && m->la[l].moe.stat_on_dev)
			m->moe_stat_unread = 1;
		res = m->la[l].res3;
	}
	return 0;
}

int mr_gpt_blocks_fwd(struct mr_gpt *m, int lo, int hi, const mr_act *in)
{
	int rc = blocks_passes(m, lo, hi, in);

	return rc < 0 ? rc : read_moe_stat(m, lo, hi);
}

/* The head's device work: logits and, with targets, the per-token
 * losses (m->losses; mr_gpt_read_results brings them to the host). */
static int head_passes(struct mr_gpt *m, const mr_act *in)
{
	const struct mr_gpt_config *c = &m->cfg;
	int N = m->B * m->T, Vl = mr_tp_vocab_rows(&m->par.tp), rc;

	CK(HOOK(m, pre_fwd, m->nunits - 1));
	CK(mr__gpt_norm_fwd(m, m->lnf, m->lnf_mean, m->lnf_rstd, in, WV(m)->lnfw, WV(m)->lnfb));
	/* the LM head: column-parallel over the vocabulary */
	CK(OP(m, matmul_fwd, m->logits, m->lnf, CW(head_w(WV(m))), NULL, N, c->d_model, Vl));
	CK(mr_tp_mask_vocab_pad(&m->par.tp, m->logits, -1e30f));
	if (!m->has_targets)
		return 0;
	return mr_tp_cross_entropy_fwd(&m->par.tp, m->losses, m->ce_lse, m->logits, m->tgt_dev);
}

int mr_gpt_read_results(struct mr_gpt *m)
{
	int N = m->B * m->T, i, rc;
	double sum = 0.0;

	CK(read_moe_stat(m, 0, m->cfg.n_layer));
	m->loss = 0.0f;
	if (!m->has_targets)
		return 0;
	CK(OP(m, download, m->losses_host, m->losses, sizeof(float) * (size_t)N));
	for (i = 0; i < N; i++)
		sum += m->losses_host[i];
	m->loss = (float)(sum / N);
	return 0;
}

int mr_gpt_head_fwd(struct mr_gpt *m, const mr_act *in)
{
	int rc = head_passes(m, in);

	return rc < 0 ? rc : mr_gpt_read_results(m);
}

/* Chunk c's forward (mr_gpt_chunk_fwd) without reading the loss back. */
static int chunk_passes(struct mr_gpt *m, int c, const mr_act *in)
{
	int lo, hi, rc;

	mr_place_chunk(&m->place, m->cfg.n_layer, c, &lo, &hi);
	if (c == 0 && m->first_stage) {
		CK(mr_gpt_embed_fwd(m));
		in = m->encoded;
	} else if (c == 0) {
		m->aux_loss = 0.0f;
		if (m->tied_replica)
			CK(HOOK(m, pre_fwd, 0)); /* the LM head's embeddings */
	}
	CK(blocks_passes(m, lo, hi, in));
	if (c == mr_place_chunks(&m->place) - 1 && m->last_stage)
		return head_passes(m, m->la[hi - 1].res3);
	return 0;
}

int mr_gpt_chunk_fwd(struct mr_gpt *m, int c, const mr_act *in)
{
	int lo, hi, rc = chunk_passes(m, c, in);

	mr_place_chunk(&m->place, m->cfg.n_layer, c, &lo, &hi);
	if (rc == 0)
		rc = read_moe_stat(m, lo, hi);
	if (rc < 0 || c != mr_place_chunks(&m->place) - 1 || !m->last_stage)
		return rc;
	return mr_gpt_read_results(m);
}

mr_act *mr_gpt_chunk_out(const struct mr_gpt *m, int c)
{
	int lo, hi;

	mr_place_chunk(&m->place, m->cfg.n_layer, c, &lo, &hi);
	return m->la[hi - 1].res3;
}

int mr_gpt_forward(struct mr_gpt *m, const int *inputs, const int *targets,
		   struct mr_errbuf *eb)
{
	int rc;

	if (!m->first_stage || !m->last_stage)
		return mr_errf(eb, MR_ESTATE, "a pipeline stage's passes run in the step driver");
	if ((rc = mr_gpt_set_batch(m, inputs, targets, eb)) < 0)
		return rc;
	if ((rc = mr_gpt_forward_passes(m)) == 0)
		rc = mr_gpt_read_results(m);
	return rc < 0 ? mr_errf(eb, rc, "forward pass failed: %s", mr_strerror(rc)) : 0;
}

int mr_gpt_forward_passes(struct mr_gpt *m)
{
	int c, rc = 0;

	if (!m->first_stage || !m->last_stage)
		return MR_ESTATE; /* a pipeline stage: the step driver */
	for (c = 0; c < mr_place_chunks(&m->place) && rc == 0; c++)
		rc = chunk_passes(m, c, c ? mr_gpt_chunk_out(m, c - 1) : NULL);
	return rc;
}

void mr_gpt_zero_grad(struct mr_gpt *m)
{
	if (m->grads)
		m->dev->ops->zero(m->dev, m->grads, sizeof(float) * m->nparams);
}

/*
 * Backward of a column-parallel GEMM's input: m->dln holds this rank's
 * partial (N,C) gradient of the norm's output; summed over tp into the
 * local rows and through the norm into m->dres (added).
 */
int mr__gpt_norm_bwd(struct mr_gpt *m, float *gw, float *gb, const mr_act *res, const float *w,
		     const float *mean, const float *rstd)
{
	mr_act *dlocal = mr_tp_if_sp(&m->par.tp, m->dln, m->dtmp);
	int Nl = mr_tp_local_rows(&m->par.tp), C = m->cfg.d_model;
	float *pw, *pb;
	int rc;

	CK(mr_tp_reduce_rows(&m->par.tp, dlocal, m->dln));
	CK(mr_tp_norm_grads(&m->par.tp, gw, gb, &pw, &pb));
	if (m->family->rms_norm)
		CK(OP(m, rmsnorm_bwd, m->dres, pw, dlocal, res, CW(w), rstd, Nl, C, m->k_ws));
	else
		CK(OP(m, layernorm_bwd, m->dres, pw, pb, dlocal, res, CW(w), mean, rstd, Nl, C,
		      m->k_ws));
	return mr_tp_sp_norm_grads(&m->par.tp, gw, gb);
}

int mr_gpt_head_bwd(struct mr_gpt *m, const mr_act *in, float dscale)
{
	int N = m->B * m->T, Nl = mr_tp_local_rows(&m->par.tp), C = m->cfg.d_model;
	int Vl = mr_tp_vocab_rows(&m->par.tp), last = m->nunits - 1, rc;

	CK(HOOK(m, pre_bwd, last));
	CK(OP(m, ce_bwd, m->logits, m->ce_lse, m->tgt_dev, N, Vl, dscale / (float)N));
	CK(mr_tp_mask_vocab_pad(&m->par.tp, m->logits, 0.0f));
	CK(OP(m, matmul_bwd, m->dln, m->g.head ? m->g.head : m->g.wte, NULL, m->logits, m->lnf,
	      CW(head_w(WV(m))), N, C, Vl, 0));
	CK(OP(m, zero, m->dres, mr_dev_act_bytes(m->dev, (size_t)Nl * C)));
	CK(mr__gpt_norm_bwd(m, m->g.lnfw, m->g.lnfb, in, WV(m)->lnfw, m->lnf_mean, m->lnf_rstd));
	return HOOK(m, post_bwd, last);
}

int mr_gpt_blocks_bwd(struct mr_gpt *m, int lo, int hi, const mr_act *in, float dscale,
		      int phase)
{
	int l, rc;

	if (phase != MR_GPT_BWD_ALL && !m->stash)
		return MR_ESTATE; /* mr_gpt_split_bwd first */
	for (l = hi - 1; l >= lo; l--) {
		const mr_act *res = l == lo ? in : m->la[l - 1].res3;
		CK(recompute(m, l, res));
		CK(m->family->block_bwd(m, l, res, dscale, phase));
	}
	return 0;
}

int mr_gpt_embed_bwd(struct mr_gpt *m)
{
	int rc;

	CK(HOOK(m, pre_bwd, 0));
	CK(mr_tp_embedding_bwd(&m->par.tp, m->g.wte, m->g.wpe, m->dres, m->tok_dev, m->tok_local,
			       m->sp_full));
	return HOOK(m, post_bwd, 0);
}

int mr_gpt_chunk_bwd(struct mr_gpt *m, int c, const mr_act *in, float dscale, int phase)
{
	int lo, hi, rc;

	mr_place_chunk(&m->place, m->cfg.n_layer, c, &lo, &hi);
	if (c == 0 && m->first_stage)
		in = m->encoded;
	if (phase == MR_GPT_BWD_WEIGHT)
		return mr_gpt_blocks_bwd(m, lo, hi, in, dscale, phase);
	if (c == mr_place_chunks(&m->place) - 1 && m->last_stage) {
		CK(mr_gpt_head_bwd(m, m->la[hi - 1].res3, dscale));
		/* the replica's embedding gradient (the LM head's) is complete */
		if (m->tied_replica && ((rc = HOOK(m, pre_bwd, 0)) < 0 ||
					(rc = HOOK(m, post_bwd, 0)) < 0))
			return rc;
	}
	CK(mr_gpt_blocks_bwd(m, lo, hi, in, dscale, phase));
	return c == 0 && m->first_stage ? mr_gpt_embed_bwd(m) : 0;
}

int mr_gpt_backward(struct mr_gpt *m, float dscale)
{
	int c, rc;

	if (!m->first_stage || !m->last_stage)
		return MR_ESTATE; /* a pipeline stage: the step driver */
	for (c = mr_place_chunks(&m->place) - 1; c >= 0; c--)
		CK(mr_gpt_chunk_bwd(m, c, c ? mr_gpt_chunk_out(m, c - 1) : NULL, dscale,
				    MR_GPT_BWD_ALL));
	return 0;
}
