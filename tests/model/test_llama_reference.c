/*
 * test_llama_reference.c - the single-rank llama model (runtime/model/
 * llama.c) against PyTorch: tests/reference/llama_model.py, written from
 * the published Llama semantics, gets this model's initial weights and
 * batches and computes the same step.
 *
 * Tolerances as test_reference.c (BRIEF §6): loss rel <= 1e-5, logits abs
 * <= 1e-4, every gradient tensor max|a-b|/max|b| <= 1e-4, each of 10 AdamW
 * steps' loss rel <= 1e-4. Cases: grouped-query attention (n_kv_head 2 of
 * 4) with an untied head and an explicit ffn_hidden; plain multi-head with
 * the head tied and Llama's default hidden size.
 *
 * Needs /usr/bin/python3 with torch (Debian's python3-torch, installed by
 * scripts/deps.sh): skipped without it.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/mr_pool.h"
#include "model/mr_gpt.h"
#include "mr_step.h"
#include "proc.h"

#define B 4
#define T 16
#define NBATCH 4
#define ACCUM 2
#define STEPS 10

static const struct mr_adamw_config OPT = { .lr = 3e-3f, .min_lr_frac = 0.1f, .warmup_steps = 2,
					    .total_steps = STEPS, .beta1 = 0.9f, .beta2 = 0.95f,
					    .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f };

static double rel(double a, double b)
{
	return fabs(a - b) / fmax(fabs(b), 1e-30);
}

static void write_case(const char *dir, const struct mr_gpt *m, const float *params,
		       const int *tok)
{
	const struct mr_gpt_config *c = &m->cfg;
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/case.json", dir);
	cr_assert_not_null(f = fopen(path, "w"));
	fprintf(f, "{\"vocab\": %d, \"d_model\": %d, \"n_layer\": %d, \"n_head\": %d, "
		   "\"n_kv_head\": %d, \"norm_eps\": %.9g, \"rope_theta\": %.9g, \"tie\": %s, "
		   "\"moe_every\": %d, \"n_experts\": %d, \"top_k\": %d, "
		   "\"capacity_factor\": %.9g, \"aux_coef\": %.9g, \"dropless\": %s, "
		   "\"norm_topk\": %s, "
		   "\"B\": %d, \"T\": %d, \"steps\": %d, \"accum\": %d, \"nbatch\": %d, "
		   "\"lr\": %.9g, \"min_lr_frac\": %.9g, \"warmup\": %d, \"total\": %d, "
		   "\"beta1\": %.9g, \"beta2\": %.9g, \"eps\": %.9g, \"weight_decay\": %.9g, "
		   "\"grad_clip\": %.9g, \"tensors\": [",
		c->vocab, c->d_model, c->n_layer, c->n_head, mr_gpt_kv_heads(c),
		(double)mr_gpt_norm_eps(c), (double)mr_gpt_rope_theta(c),
		mr_gpt_tied(c) ? "true" : "false", c->moe_every, c->n_experts, c->top_k,
		(double)c->capacity_factor, (double)c->aux_coef, c->moe_dropless ? "true" : "false",
		mr_gpt_moe_norm_topk(c) ? "true" : "false",
		B, T, STEPS, ACCUM, NBATCH, (double)OPT.lr,
		(double)OPT.min_lr_frac, OPT.warmup_steps, OPT.total_steps, (double)OPT.beta1,
		(double)OPT.beta2, (double)OPT.eps, (double)OPT.weight_decay,
		(double)OPT.grad_clip);
	for (int i = 0; i < m->ntensors; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i];
		fprintf(f, "%s[\"%s\", [", i ? ", " : "", t->name);
		for (int k = 0; k < t->ndim; k++)
			fprintf(f, "%s%d", k ? ", " : "", t->full[k]);
		fprintf(f, "]]");
	}
	fprintf(f, "]}\n");
	fclose(f);
	snprintf(path, sizeof(path), "%s/params.bin", dir);
	cr_assert_not_null(f = fopen(path, "wb"));
	cr_assert_eq(fwrite(params, sizeof(float), m->nparams, f), m->nparams);
	fclose(f);
	snprintf(path, sizeof(path), "%s/batches.bin", dir);
	cr_assert_not_null(f = fopen(path, "wb"));
	cr_assert_eq(fwrite(tok, sizeof(int), 2 * NBATCH * B * T, f), 2 * NBATCH * B * T);
	fclose(f);
}

static void check_case(const struct mr_gpt_config *cfg, int threads)
{
	char dir[] = "/tmp/mr-llama-ref-XXXXXX", cmd[700], path[600];
	struct mr_errbuf eb = { "", "" };
	struct mr_pool *pool = NULL;
	struct mr_adamw_config oc;
	struct mr_step st;
	struct mr_gpt m;
	size_t N = (size_t)B * T, nlog, i;
	float *ref, *logits, *grads, *losses;
	int tok[2 * NBATCH * B * T], s;
	unsigned seed = 7;
	long nref;
	FILE *f;

	if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
		cr_skip_test("/usr/bin/python3 has no torch");
	cr_assert_not_null(mkdtemp(dir));
	cr_assert_eq(mr_pool_create(&pool, threads), 0);
	cr_assert_eq(mr_gpt_create(&m, cfg, B, T, pool, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_init_params(&m, 1337), 0);
	for (i = 0; i < 2 * NBATCH * N; i++)
		tok[i] = (int)(rand_r(&seed) % (unsigned)cfg->vocab);
	write_case(dir, &m, m.params, tok);
	snprintf(cmd, sizeof(cmd), "/usr/bin/python3 tests/reference/llama_model.py %s", dir);
	cr_assert_eq(system(cmd), 0, "%s failed", cmd);

	nlog = N * (size_t)cfg->vocab;
	nref = (long)(1 + nlog + m.nparams + STEPS);
	ref = malloc((size_t)nref * sizeof(float));
	snprintf(path, sizeof(path), "%s/out.bin", dir);
	cr_assert_not_null(f = fopen(path, "rb"));
	cr_assert_eq(fread(ref, sizeof(float), (size_t)nref, f), (size_t)nref);
	fclose(f);
	logits = ref + 1;
	grads = logits + nlog;
	losses = grads + m.nparams;

	cr_assert_eq(mr_gpt_forward(&m, tok, tok + NBATCH * N, &eb), 0, "%s", eb.msg);
	cr_expect(rel(m.loss, ref[0]) <= 1e-5, "loss %.8f vs torch %.8f", (double)m.loss,
		  (double)ref[0]);
	for (i = 0; i < nlog; i++) {
		float a = ((const float *)(const void *)m.logits)[i]; /* cpu: fp32 */
		cr_expect(fabsf(a - logits[i]) <= 1e-4f, "logit %zu: %.7f vs torch %.7f", i,
			  (double)a, (double)logits[i]);
	}
	mr_gpt_zero_grad(&m);
	cr_assert_eq(mr_gpt_backward(&m, 1.0f), 0);
	for (int ti = 0; ti < m.ntensors; ti++) {
		const struct mr_gpt_tensor *t = &m.tensors[ti];
		double md = 0.0, mb = 0.0, e;
		for (i = 0; i < t->n; i++) {
			md = fmax(md, fabs((double)m.grads[t->off + i] - grads[t->off + i]));
			mb = fmax(mb, fabs((double)grads[t->off + i]));
		}
		e = mb > 0.0 ? md / mb : md;
		cr_expect(mb > 0.0, "grad '%s' is zero in torch", t->name);
		cr_expect(e <= 1e-4, "grad '%s' rel error %.3g (max|torch| %.3g)", t->name, e, mb);
	}

	/* 10 AdamW steps from the same weights (the step driver sets them
	 * from the seed again) */
	oc = OPT;
	cr_assert_eq(mr_step_init(&st, &m, &oc, NULL, NULL, 1337, &eb), 0, "%s", eb.msg);
	for (s = 0; s < STEPS; s++) {
		int in[ACCUM * B * T], tg[ACCUM * B * T];
		struct mr_step_result res;
		for (int a = 0; a < ACCUM; a++) {
			size_t b = (size_t)((s * ACCUM + a) % NBATCH);
			memcpy(in + a * N, tok + b * N, N * sizeof(int));
			memcpy(tg + a * N, tok + NBATCH * N + b * N, N * sizeof(int));
		}
		cr_assert_eq(mr_step_run(&st, in, tg, ACCUM, &res, &eb), 0, "%s", eb.msg);
		cr_expect(rel(res.loss, losses[s]) <= 1e-4, "step %d loss %.7f vs torch %.7f", s,
			  (double)res.loss, (double)losses[s]);
	}
	cr_expect(losses[STEPS - 1] < losses[0] - 0.1f, "the loss must fall");
	mr_step_release(&st);
	mr_gpt_release(&m);
	mr_pool_free(pool);
	free(ref);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	cr_expect_eq(system(cmd), 0);
}

static struct mr_gpt_config llama(int n_kv_head, int ffn_hidden, int tie)
{
	struct mr_gpt_config c;

	memset(&c, 0, sizeof(c));
	c.arch = MR_ARCH_LLAMA;
	c.vocab = 64;
	c.max_seq = T;
	c.n_layer = 2;
	c.d_model = 64;
	c.n_head = 4;
	c.n_kv_head = n_kv_head;
	c.ffn_hidden = ffn_hidden;
	c.rope_theta = 10000.0f; /* angles that turn within T positions */
	c.tie_embeddings = tie;
	return c;
}

Test(llama_reference, gqa_untied_head, .timeout = 300)
{
	struct mr_gpt_config c = llama(2, 96, 0);

	check_case(&c, 2);
}

Test(llama_reference, mha_tied_head_default_ffn, .timeout = 300, MR_NOT_UNDER_SAN)
{
	struct mr_gpt_config c = llama(0, 0, 1);

	check_case(&c, 1);
}

/* SwiGLU experts every 2nd layer, 4 experts: top-2 with a capacity that
 * drops tokens, and top-1 dropless */
Test(llama_reference, moe_top2_dropping, .timeout = 300)
{
	struct mr_gpt_config c = llama(2, 48, 0);
	struct mr_errbuf eb = { "", "" };

	c.moe_every = 2;
	c.n_experts = 4;
	c.top_k = 2;
	c.capacity_factor = 0.75f;
	c.aux_coef = 0.01f;
	cr_assert_eq(mr_gpt_config_check(&c, &eb), 0, "%s", eb.msg);
	check_case(&c, 2);
}

Test(llama_reference, moe_top1_dropless, .timeout = 300, MR_NOT_UNDER_SAN)
{
	struct mr_gpt_config c = llama(4, 48, 1);

	c.moe_every = 1;
	c.n_experts = 4;
	c.top_k = 1;
	c.capacity_factor = 1.0f;
	c.aux_coef = 0.01f;
	c.moe_dropless = 1;
	check_case(&c, 1);
}

/* moe_norm_topk the other way round: top-2 with the router's raw
 * probabilities as gates, top-1 renormalised (a gate of 1) */
Test(llama_reference, moe_norm_topk_either_way, .timeout = 300, MR_NOT_UNDER_SAN)
{
	struct mr_gpt_config c = llama(2, 48, 0);

	c.moe_every = 1;
	c.n_experts = 4;
	c.top_k = 2;
	c.capacity_factor = 1.0f;
	c.aux_coef = 0.01f;
	c.moe_norm_topk = -1;
	check_case(&c, 2);
	c.top_k = 1;
	c.moe_norm_topk = 1;
	check_case(&c, 1);
}

Test(llama_reference, bad_shapes_name_their_keys)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt_config c = llama(3, 96, 0);

	cr_expect_lt(mr_gpt_config_check(&c, &eb), 0);
	cr_expect_str_eq(eb.field, "n_kv_head", "%s", eb.msg);
	eb = (struct mr_errbuf){ "", "" }; /* the first error stays */
	c = llama(2, -1, 0);
	cr_expect_lt(mr_gpt_config_check(&c, &eb), 0);
	cr_expect_str_eq(eb.field, "ffn_hidden", "%s", eb.msg);
	eb = (struct mr_errbuf){ "", "" };
	c = llama(2, 96, 0);
	c.n_head = 8;
	c.d_model = 8 * 3; /* head size 3: rotary positions need it even */
	c.n_kv_head = 2;
	cr_expect_lt(mr_gpt_config_check(&c, &eb), 0);
	cr_expect_str_eq(eb.field, "n_head", "%s", eb.msg);
	eb = (struct mr_errbuf){ "", "" };
	c = llama(2, 96, 0);
	c.moe_every = 1;
	c.n_experts = 2;
	c.top_k = 3;
	cr_expect_lt(mr_gpt_config_check(&c, &eb), 0);
	cr_expect_str_eq(eb.field, "top_k", "%s", eb.msg);
}
