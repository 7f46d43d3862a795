/*
 * test_generate.c - decoding with a key/value cache (infer/mr_generate.h)
 * against the training model's full forward, and the sampler.
 *
 * What each test proves:
 *  - kv_cache_*: for gpt2, llama (grouped-query attention, an untied
 *    head, Llama 3.1 rope scaling) and MoE layers of both families, the
 *    logits decoding produces at every generated position (the prompt fed
 *    once, then one token a feed) equal the full forward's row of that
 *    position over the whole sequence (mr_gpt_forward, all positions
 *    recomputed) within 1e-4 of the row's largest, and every greedy token
 *    is that row's argmax - a cache at the wrong position, a missing
 *    rotary offset or a causal mask off by one moves these by O(1). The
 *    sequence runs to max_seq, so generation stops there.
 *  - feed_in_pieces: the prompt fed whole or a token at a time caches the
 *    same keys and values (same logits after it).
 *  - seeds: the same seed gives the same tokens, top-k 1 and a tiny top-p
 *    give the greedy ones, top-k 3 draws only among the 3 most likely;
 *    on flat logits (256 equally likely ids) two seeds differ in 32 draws
 *    (chance of equal: 256^-32).
 *  - bad_input: an id outside the vocabulary, an empty prompt, a prompt
 *    of max_seq tokens are refused naming them.
 *
 * Weights: the model's init, then every parameter redrawn from
 * normal(0, 0.3), so logits spread by several units and argmax is never
 * a near tie (the init's 0.02 makes logits almost flat).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mr_rng.h"
#include "infer/mr_generate.h"
#include "model/mr_gpt.h"

#define MAXSEQ 24
#define NP 5

static const int prompt[NP] = { 3, 200, 17, 42, 99 };

static struct mr_gpt_config base(void)
{
	struct mr_gpt_config c;

	memset(&c, 0, sizeof(c));
	c.vocab = 256;
	c.max_seq = MAXSEQ;
	c.n_layer = 2;
	c.d_model = 32;
	c.n_head = 4;
	c.capacity_factor = 1.0f;
	return c;
}

static struct mr_gpt_config llama(void)
{
	struct mr_gpt_config c = base();

	c.arch = MR_ARCH_LLAMA;
	c.n_kv_head = 2;
	c.ffn_hidden = 48;
	c.rope_theta = 10000.0f;
	c.rope_scaling.factor = 8.0f;
	c.rope_scaling.low_freq_factor = 1.0f;
	c.rope_scaling.high_freq_factor = 4.0f;
	c.rope_scaling.original_max_pos = 8;
	c.tie_embeddings = 0;
	return c;
}

static struct mr_gpt_config moe(struct mr_gpt_config c)
{
	c.moe_every = 1;
	c.n_experts = 4;
	c.top_k = 2;
	return c;
}

/* A model's whole parameters (malloc'd): init, then redrawn wide. */
static float *weights(const struct mr_gpt_config *c, size_t *n)
{
	struct mr_gpt m;
	struct mr_rng r;
	float *p;

	cr_assert_eq(mr_gpt_create(&m, c, 1, 1, NULL, NULL), 0);
	*n = m.nparams;
	p = malloc(m.nparams * sizeof(float));
	cr_assert_not_null(p);
	mr_rng_seed(&r, 5, 1);
	for (size_t i = 0; i < m.nparams; i++)
		p[i] = (float)(0.3 * mr_rng_normal(&r));
	mr_gpt_release(&m);
	return p;
}

struct trace {
	struct mr_gen *g;
	float *logits; /* (steps, V) the logits each token was drawn from */
	int n;
};

static int keep(void *ctx, int tok)
{
	struct trace *t = ctx;

	(void)tok;
	memcpy(t->logits + (size_t)t->n * (size_t)t->g->V, t->g->host_logits,
	       (size_t)t->g->V * sizeof(float));
	t->n++;
	return 0;
}

static struct mr_pool *pool;
static struct mr_dev dev;

static void open_cpu(void)
{
	cr_assert_eq(mr_pool_create(&pool, 2), 0);
	cr_assert_eq(mr_dev_open(&dev, "cpu", 0, NULL, pool, NULL), 0);
}

static void close_cpu(void)
{
	mr_dev_close(&dev);
	mr_pool_free(pool);
}

/* g on the cpu device with the wide weights of c; maxn rows a feed. */
static void open_gen(struct mr_gen *g, const struct mr_gpt_config *c, int maxn, float **pw)
{
	struct mr_errbuf eb = { "", "" };
	size_t n;
	float *p = weights(c, &n);

	cr_assert_eq(mr_gen_init_params(g, c, p, &dev, maxn, &eb), 0, "%s", eb.msg);
	if (pw)
		*pw = p;
	else
		free(p);
}

static int argmax(const float *row, int V)
{
	int best = 0;

	for (int v = 1; v < V; v++)
		if (row[v] > row[best])
			best = v;
	return best;
}

static void check_kv_cache(struct mr_gpt_config c)
{
	struct mr_gen_opts o = { MAXSEQ, 0.0f, 0, 1.0f, 1 };
	struct mr_errbuf eb = { "", "" };
	struct mr_gen g;
	struct mr_gpt ref;
	struct trace tr;
	struct mr_gpt_config rc = c;
	int out[MAXSEQ], seq[MAXSEQ], nout = 0, len, V = c.vocab, i;
	float *p, *full;

	open_cpu();
	open_gen(&g, &c, NP, &p);
	tr.g = &g;
	tr.n = 0;
	tr.logits = malloc((size_t)MAXSEQ * (size_t)V * sizeof(float));
	cr_assert_not_null(tr.logits);
	cr_assert_eq(mr_gen_run(&g, prompt, NP, &o, out, &nout, keep, &tr, &eb), 0, "%s", eb.msg);
	/* stops at max_seq: prompt + new tokens fill the window */
	cr_assert_eq(nout, MAXSEQ - NP, "%d new tokens, max_seq %d, prompt %d", nout, MAXSEQ, NP);
	cr_assert_eq(tr.n, nout);
	len = NP + nout;
	memcpy(seq, prompt, sizeof(prompt));
	memcpy(seq + NP, out, (size_t)nout * sizeof(int));

	/* the training model's forward over the whole sequence; MoE dropless
	 * as decoding runs it */
	rc.moe_dropless = c.moe_every > 0;
	cr_assert_eq(mr_gpt_create(&ref, &rc, 1, len, pool, &eb), 0, "%s", eb.msg);
	memcpy(ref.params, p, ref.nparams * sizeof(float));
	cr_assert_eq(mr_gpt_refresh_compute(&ref), 0);
	cr_assert_eq(mr_gpt_forward(&ref, seq, NULL, &eb), 0, "%s", eb.msg);
	full = (float *)(void *)ref.logits;
	for (i = 0; i < nout; i++) {
		const float *want = full + (size_t)(NP - 1 + i) * (size_t)V;
		const float *got = tr.logits + (size_t)i * (size_t)V;
		float mx = 0.0f, worst = 0.0f;
		for (int v = 0; v < V; v++) {
			mx = fmaxf(mx, fabsf(want[v]));
			worst = fmaxf(worst, fabsf(got[v] - want[v]));
		}
		cr_assert(worst <= 1e-4f * mx, "position %d: logits differ by %g (largest %g)",
			  NP - 1 + i, worst, mx);
		cr_assert_eq(out[i], argmax(want, V),
			     "position %d: greedy token %d, the full forward's argmax %d", NP + i,
			     out[i], argmax(want, V));
	}
	/* and the logits are not flat: greedy is not a tie-break */
	cr_assert_gt(fabsf(tr.logits[out[0]] - tr.logits[(out[0] + 1) % V]), 1e-3f);
	mr_gpt_release(&ref);
	mr_gen_release(&g);
	free(tr.logits);
	free(p);
	close_cpu();
}

Test(generate, kv_cache_gpt2)
{
	check_kv_cache(base());
}

Test(generate, kv_cache_llama_gqa_untied)
{
	check_kv_cache(llama());
}

Test(generate, kv_cache_gpt2_moe)
{
	check_kv_cache(moe(base()));
}

Test(generate, kv_cache_llama_moe)
{
	check_kv_cache(moe(llama()));
}

Test(generate, feed_in_pieces)
{
	struct mr_gpt_config c = llama();
	struct mr_errbuf eb = { "", "" };
	struct mr_gen g;
	float *whole = malloc(256 * sizeof(float));
	int i;

	cr_assert_not_null(whole);
	open_cpu();
	open_gen(&g, &c, NP, NULL);
	cr_assert_eq(mr_gen_feed(&g, prompt, NP, &eb), 0, "%s", eb.msg);
	memcpy(whole, g.host_logits, 256 * sizeof(float));
	mr_gen_reset(&g);
	for (i = 0; i < NP; i++)
		cr_assert_eq(mr_gen_feed(&g, prompt + i, 1, &eb), 0, "%s", eb.msg);
	for (i = 0; i < 256; i++)
		cr_assert_float_eq(g.host_logits[i], whole[i], 1e-4f * (1.0f + fabsf(whole[i])),
				   "id %d: %g fed in pieces, %g whole", i, g.host_logits[i],
				   whole[i]);
	cr_assert_eq(g.pos, NP);
	mr_gen_release(&g);
	free(whole);
	close_cpu();
}

static void run(struct mr_gen *g, float temp, int top_k, float top_p, uint64_t seed, int *out)
{
	struct mr_gen_opts o = { 12, temp, top_k, top_p, seed };
	struct mr_errbuf eb = { "", "" };
	int nout;

	cr_assert_eq(mr_gen_run(g, prompt, NP, &o, out, &nout, NULL, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(nout, 12);
}

Test(generate, seeds)
{
	struct mr_gpt_config c = base();
	struct mr_gen g;
	struct mr_rng r1, r2;
	struct mr_gen_opts o = { 1, 1.0f, 0, 1.0f, 0 }, k3 = { 1, 1.0f, 3, 1.0f, 0 };
	int a[12], b[12], greedy[12], same = 0, i;
	float flat[256], prob[256];
	int idx[256];

	open_cpu();
	open_gen(&g, &c, NP, NULL);
	run(&g, 1.0f, 0, 1.0f, 42, a);
	run(&g, 1.0f, 0, 1.0f, 42, b);
	cr_assert_arr_eq(a, b, sizeof(a), "the same seed gave other tokens");
	run(&g, 0.0f, 0, 1.0f, 0, greedy);
	run(&g, 1.0f, 1, 1.0f, 7, a);
	cr_assert_arr_eq(a, greedy, sizeof(a), "top-k 1 is not greedy");
	run(&g, 1.0f, 0, 1e-6f, 7, a);
	cr_assert_arr_eq(a, greedy, sizeof(a), "top-p 1e-6 is not greedy");
	mr_gen_release(&g);
	close_cpu();

	/* flat logits: 32 draws of two seeds differ */
	memset(flat, 0, sizeof(flat));
	mr_rng_seed(&r1, 1, 0);
	mr_rng_seed(&r2, 2, 0);
	for (i = 0; i < 32; i++) {
		int x = mr_gen_sample(flat, 256, &o, &r1, prob, idx);
		int y = mr_gen_sample(flat, 256, &o, &r2, prob, idx);
		cr_assert(x >= 0 && x < 256 && y >= 0 && y < 256);
		same += x == y;
	}
	cr_assert_lt(same, 32, "two seeds drew the same 32 tokens from 256 equally likely");
	/* top-k 3 draws only the 3 most likely (ids 10, 20, 30 here) */
	for (i = 0; i < 256; i++)
		flat[i] = (float)(i % 7) * 0.01f;
	flat[10] = 5.0f;
	flat[20] = 5.1f;
	flat[30] = 4.9f;
	for (i = 0; i < 64; i++) {
		int x = mr_gen_sample(flat, 256, &k3, &r1, prob, idx);
		cr_assert(x == 10 || x == 20 || x == 30, "top-k 3 drew %d", x);
	}
}

Test(generate, bad_input)
{
	struct mr_gpt_config c = base();
	struct mr_gen_opts o = { 4, 0.0f, 0, 1.0f, 0 };
	struct mr_errbuf eb = { "", "" };
	struct mr_gen g;
	int bad[2] = { 1, 256 }, longp[MAXSEQ] = { 0 }, out[4], nout;

	open_cpu();
	open_gen(&g, &c, MAXSEQ, NULL);
	cr_assert_eq(mr_gen_run(&g, bad, 2, &o, out, &nout, NULL, NULL, &eb), MR_ERANGE);
	cr_assert(strstr(eb.msg, "256"), "%s", eb.msg);
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_gen_run(&g, bad, 0, &o, out, &nout, NULL, NULL, &eb), MR_EINVAL);
	cr_assert(strstr(eb.msg, "empty"), "%s", eb.msg);
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_gen_run(&g, longp, MAXSEQ, &o, out, &nout, NULL, NULL, &eb), MR_ERANGE);
	cr_assert(strstr(eb.msg, "max_seq"), "%s", eb.msg);
	mr_gen_release(&g);
	mr_gen_release(&g); /* released twice: a no-op */
	close_cpu();
}
