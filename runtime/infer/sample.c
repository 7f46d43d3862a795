/*
 * sample.c - one token from a row of logits (see mr_generate.h):
 * greedy, temperature, top-k, top-p (nucleus), drawn with mr_rng.h.
 *
 * Order: candidates sorted by logit, highest first (ties: the lower id
 * first), so the draw is a function of the logits and the RNG's state
 * alone - the same seed gives the same tokens on every machine whose
 * logits agree.
 *
 * Non-goals: repetition penalties, min-p, typical sampling.
 */
#include <math.h>
#include <stdlib.h>

#include "infer/mr_generate.h"

/* qsort's comparator has no context: the row being sorted. */
static _Thread_local const float *sort_row;

static int by_logit(const void *pa, const void *pb)
{
	int a = *(const int *)pa, b = *(const int *)pb;

	if (sort_row[a] != sort_row[b])
		return sort_row[a] > sort_row[b] ? -1 : 1;
	return a < b ? -1 : a > b;
}

static int argmax(const float *logits, int V)
{
	int i, best = 0;

	for (i = 1; i < V; i++)
		if (logits[i] > logits[best])
			best = i;
	return best;
}

int mr_gen_sample(const float *logits, int V, const struct mr_gen_opts *o, struct mr_rng *r,
		  float *prob, int *idx)
{
	int i, n = V;
	double sum = 0.0, cut, u;
	float mx;

	if (o->temperature <= 0.0f || o->top_k == 1)
		return argmax(logits, V);
	for (i = 0; i < V; i++)
		idx[i] = i;
	sort_row = logits;
	qsort(idx, (size_t)V, sizeof(int), by_logit);
	if (o->top_k > 0 && o->top_k < n)
		n = o->top_k;
	/* softmax of logits / temperature over the candidates */
	mx = logits[idx[0]];
	for (i = 0; i < n; i++) {
		prob[i] = expf((logits[idx[i]] - mx) / o->temperature);
		sum += prob[i];
	}
	/* nucleus: the most likely until their mass reaches top_p */
	if (o->top_p > 0.0f && o->top_p < 1.0f) {
		double acc = 0.0;
		cut = o->top_p * sum;
		for (i = 0; i < n; i++) {
			acc += prob[i];
			if (acc >= cut)
				break;
		}
		n = i < n ? i + 1 : n;
		sum = acc < sum ? acc : sum;
	}
	u = mr_rng_uniform(r) * sum;
	for (i = 0; i < n - 1; i++) {
		u -= prob[i];
		if (u < 0.0)
			break;
	}
	return idx[i];
}
