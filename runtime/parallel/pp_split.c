/*
 * pp_split.c - the pipeline's layer split: the cost model, the balanced
 * cut, explicit splits (see mr_pp_split.h).
 */
#include <math.h>
#include <stdlib.h>

#include "model/mr_gpt.h"
#include "parallel/mr_pp_sched.h"
#include "parallel/mr_pp_split.h"

int mr_pp_split_costs(const struct mr_gpt_config *mc, int T, double *block, double *embed,
		      double *head, struct mr_errbuf *eb)
{
	double C = mc->d_model, t = T > 0 ? T : mc->max_seq;

	if (mc->n_layer < 1)
		return mr_errf_field(eb, MR_EINVAL, "n_layer", "'n_layer' must be >= 1, got %d",
				     mc->n_layer);
	if (mc->d_model < 1)
		return mr_errf_field(eb, MR_EINVAL, "d_model", "'d_model' must be >= 1, got %d",
				     mc->d_model);
	if (mc->vocab < 1)
		return mr_errf_field(eb, MR_EINVAL, "vocab_size",
				     "'vocab_size' must be >= 1, got %d", mc->vocab);
	if (t < 1)
		return mr_errf_field(eb, MR_EINVAL, "seq_len", "'seq_len' must be >= 1, got %g", t);
	if (mc->moe_every > 0 && (mc->n_experts < 1 || mc->top_k < 1))
		return mr_errf_field(eb, MR_EINVAL, mc->n_experts < 1 ? "n_experts" : "top_k",
				     "a MoE model needs n_experts >= 1 and top_k >= 1, got %d and %d",
				     mc->n_experts, mc->top_k);
	for (int l = 0; l < mc->n_layer; l++) {
		double attn = 8 * C * C + 4 * C * t;

		block[l] = mr_gpt_layer_is_moe(mc, l)
				   ? attn + 2 * C * mc->n_experts + mc->top_k * 16 * C * C
				   : attn + 16 * C * C;
	}
	*embed = 2 * C;
	*head = 2 * C * mc->vocab;
	return 0;
}

/* Two sums of squares this close are a tie: rounding, not a better cut. */
#define TIE_REL 1e-12

struct cut {
	const double *pre; /* (L+1) prefix sums of the block costs */
	int L;
	double embed, head;
};

/* Cost of the virtual stage holding blocks [i, j). */
static double cost(const struct cut *c, int i, int j)
{
	return c->pre[j] - c->pre[i] + (i == 0 ? c->embed : 0.0) + (j == c->L ? c->head : 0.0);
}

/* The smallest possible cost of the most expensive of q virtual stages. */
static double bottleneck(const struct cut *c, int q, double *row, double *next)
{
	int L = c->L;

	for (int j = 1; j <= L; j++)
		row[j] = cost(c, 0, j);
	for (int k = 2; k <= q; k++) {
		for (int j = k; j <= L - (q - k); j++) {
			double best = INFINITY;

			for (int i = k - 1; i < j; i++) {
				double x = cost(c, i, j);

				if (row[i] > x)
					x = row[i];
				if (x < best)
					best = x;
			}
			next[j] = best;
		}
		for (int j = k; j <= L - (q - k); j++)
			row[j] = next[j];
	}
	return row[L];
}

int mr_pp_split_balance(const double *block, int n_layer, double embed, double head, int p,
			int v, int *layers, struct mr_errbuf *eb)
{
	int q = p * v, L = n_layer, rc = 0;
	double *pre = NULL, *row = NULL, *next = NULL, *ss = NULL, bmax;
	struct cut c;

	if (p < 1 || p > MR_PP_MAX_STAGES || v < 1 || v > MR_PP_MAX_VIRTUAL)
		return mr_errf_field(eb, MR_EINVAL, v > 1 ? "pp_virtual" : "pp",
				     "pipeline split needs pp in 1..%d and pp_virtual in 1..%d, "
				     "got %d and %d",
				     MR_PP_MAX_STAGES, MR_PP_MAX_VIRTUAL, p, v);
	if (L < q)
		return v > 1 ? mr_errf_field(eb, MR_EINVAL, "pp_virtual",
					     "'pp_virtual' %d: pp %d x pp_virtual %d = %d virtual "
					     "stages need a block each, the model has n_layer %d",
					     v, p, v, q, L)
			     : mr_errf_field(eb, MR_EINVAL, "pp",
					     "'pp' %d: every stage needs a block, the model has "
					     "n_layer %d",
					     p, L);
	if (!(isfinite(embed) && embed >= 0 && isfinite(head) && head >= 0))
		return mr_errf(eb, MR_EINVAL, "pipeline split: embedding cost %g and head cost %g "
			       "must be finite and >= 0", embed, head);
	for (int l = 0; l < L; l++)
		if (!(isfinite(block[l]) && block[l] >= 0))
			return mr_errf(eb, MR_EINVAL,
				       "pipeline split: block %d's cost %g must be finite and >= 0",
				       l, block[l]);
	pre = malloc((size_t)(L + 1) * sizeof(*pre));
	row = malloc((size_t)(L + 1) * sizeof(*row));
	next = malloc((size_t)(L + 1) * sizeof(*next));
	ss = malloc((size_t)(q + 1) * (L + 1) * sizeof(*ss));
	if (!pre || !row || !next || !ss) {
		rc = mr_errf(eb, MR_ENOMEM, "pipeline split: out of memory");
		goto out;
	}
	pre[0] = 0.0;
	for (int l = 0; l < L; l++)
		pre[l + 1] = pre[l] + block[l];
	c = (struct cut){ .pre = pre, .L = L, .embed = embed, .head = head };
	bmax = bottleneck(&c, q, row, next);

	/* ss[k*(L+1) + j]: least sum of squares of k stages over blocks [0, j),
	 * none above bmax (INFINITY: impossible). */
	for (size_t i = 0; i < (size_t)(q + 1) * (L + 1); i++)
		ss[i] = INFINITY;
	for (int j = 1; j <= L; j++) {
		double x = cost(&c, 0, j);

		if (x <= bmax)
			ss[(L + 1) + j] = x * x;
	}
	for (int k = 2; k <= q; k++) {
		for (int j = k; j <= L - (q - k); j++) {
			double best = INFINITY;

			for (int i = k - 1; i < j; i++) {
				double x = cost(&c, i, j), y = ss[(size_t)(k - 1) * (L + 1) + i];

				if (x <= bmax && y + x * x < best)
					best = y + x * x;
			}
			ss[(size_t)k * (L + 1) + j] = best;
		}
	}
	/* Back from the last stage: the smallest i (the most blocks on the later
	 * stage) that is as good as the best. */
	for (int k = q, j = L; k >= 1; k--) {
		int i = k - 1;

		if (k > 1) {
			double goal = ss[(size_t)k * (L + 1) + j];

			for (; i < j; i++) {
				double x = cost(&c, i, j), y = ss[(size_t)(k - 1) * (L + 1) + i];

				if (x <= bmax && y + x * x <= goal + goal * TIE_REL)
					break;
			}
		}
		layers[k - 1] = j - i;
		j = i;
	}
out:
	free(pre);
	free(row);
	free(next);
	free(ss);
	return rc;
}

int mr_pp_split_check(const int *layers, int n, int p, int v, int n_layer,
		      struct mr_errbuf *eb)
{
	long sum = 0;

	if (n != p * v)
		return v > 1 ? mr_errf_field(eb, MR_EINVAL, "pp_layers",
					     "'pp_layers' has %d entries, pp %d x pp_virtual %d "
					     "needs %d (one per virtual stage, chunk-major)",
					     n, p, v, p * v)
			     : mr_errf_field(eb, MR_EINVAL, "pp_layers",
					     "'pp_layers' has %d entries, pp %d needs %d", n, p, p);
	for (int k = 0; k < n; k++) {
		if (layers[k] < 1)
			return mr_errf_field(eb, MR_EINVAL, "pp_layers",
					     "'pp_layers'[%d] is %d: every stage needs at least one "
					     "block",
					     k, layers[k]);
		sum += layers[k];
	}
	if (sum != n_layer)
		return mr_errf_field(eb, MR_EINVAL, "pp_layers",
				     "'pp_layers' adds up to %ld blocks, the model has n_layer %d",
				     sum, n_layer);
	return 0;
}

int mr_pp_split_model(const struct mr_gpt_config *mc, int T, int p, int v,
		      const int *explicit_layers, int n_explicit, int *layers,
		      struct mr_errbuf *eb)
{
	double embed, head, *block;
	int rc;

	if (explicit_layers) {
		if ((rc = mr_pp_split_check(explicit_layers, n_explicit, p, v, mc->n_layer, eb)) < 0)
			return rc;
		for (int k = 0; k < n_explicit; k++)
			layers[k] = explicit_layers[k];
		return 0;
	}
	if (mc->n_layer < 1)
		return mr_errf_field(eb, MR_EINVAL, "n_layer", "'n_layer' must be >= 1, got %d",
				     mc->n_layer);
	block = malloc((size_t)mc->n_layer * sizeof(*block));
	if (!block)
		return mr_errf(eb, MR_ENOMEM, "pipeline split: out of memory");
	rc = mr_pp_split_costs(mc, T, block, &embed, &head, eb);
	if (rc == 0)
		rc = mr_pp_split_balance(block, mc->n_layer, embed, head, p, v, layers, eb);
	free(block);
	return rc;
}

void mr_pp_split_range(const int *layers, int p, int stage, int chunk, int *lo, int *hi)
{
	int k = chunk * p + stage;

	*lo = 0;
	for (int i = 0; i < k; i++)
		*lo += layers[i];
	*hi = *lo + layers[k];
}
