/*
 * test_cuda_gpt.c - the device GPT (runtime/cuda/mr_cuda_gpt.h) against
 * the CPU model and step driver (model/mr_gpt.h, mr_step.h): same
 * config, same initial weights, same synthetic batches.
 *
 * Config: L2, d_model 64, 2 heads (head size 32: the device attention
 * needs a multiple of 32), T 32, B 4, vocab 128, 2 micro-batches per step,
 * 10 AdamW steps with warmup, cosine decay, weight decay and clipping.
 *
 * Tolerances and why. Every rounding point of the device (bf16 weights
 * copies, activations, activation gradients) was emulated on the CPU by
 * running this test against a host implementation of mr_cuda.h (each
 * kernel = its CPU twin on bf16-rounded inputs, bf16-rounded outputs); the
 * differences it measured are quoted as "emulated":
 *   init params        exact (the same generator writes fp32 masters)
 *   initial loss       rel 2e-4 (emulated 2.5e-6). At init the logits are
 *                      ~0.1 in size; bf16 perturbs each by ~2^-9 relative,
 *                      which moves a loss of ln(128) = 4.85 by ~1e-5.
 *   loss, every step   rel 5e-3 (emulated <= 6e-5). The loss falls by 6%
 *                      over the 10 steps, so a device that does not learn
 *                      fails by 10x.
 *   grad norm, step 0  rel 1e-2 (emulated 1.6e-4).
 *   final params       ||dev - cpu|| / ||cpu|| <= 2e-2 over the whole table
 *                      (emulated 4.5e-3; a device that never updates: 0.14).
 *   updates            ||(dev - init) - (cpu - init)|| / ||cpu - init||
 *                      <= 0.15 (emulated 0.03; a wrong or missing update
 *                      gives >= 1). AdamW moves an element by ~lr per step
 *                      whatever the size of its gradient, so elements whose
 *                      gradient is within bf16 noise of zero (the key bias,
 *                      whose exact gradient is 0; near-cancelling sums) step
 *                      in a direction set by rounding on each side: this is
 *                      the loosest bound and the first to look at if a real
 *                      device lands slightly outside it.
 * The real kernels sum in other orders than the emulation (cuBLAS tiles,
 * attention blocks, fixed-chunk column sums), which changes fp32 rounding,
 * not the bf16 rounding points that dominate; the margins above allow for
 * it. Not yet run on a GPU (written on a machine without one).
 *
 * Tests that need a device skip without one; the scope checks run
 * everywhere.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/mr_pool.h"
#include "cuda/mr_cuda_gpt.h"
#include "data/mr_synth.h"
#include "gpu_harness.h"
#include "mr_step.h"

#define STEPS 10
#define ACCUM 2
#define SEED 11
#define BATCH 4
#define SEQ 32
/* bytes of one step's token ids (accum micro-batches) */
#define STEP_BYTES (sizeof(int) * ACCUM * BATCH * SEQ)

/* vocab, max_seq, L, C, NH, moe_every, E, top_k, capacity, aux */
static const struct mr_gpt_config dense = { 128, 32, 2, 64, 2, 0, 0, 0, 0.0f, 0.0f };
static const struct mr_gpt_config moe = { 128, 32, 2, 64, 2, 2, 4, 2, 1.0f, 0.01f };
/* lr, min_lr_frac, warmup, total, beta1, beta2, eps, weight_decay, clip */
static const struct mr_adamw_config ocfg = { 3e-3f, 0.1f, 2, STEPS, 0.9f, 0.95f, 1e-8f,
					     0.1f, 1.0f };

/* accum micro-batches of step s */
static void batch(int s, int *in, int *tg)
{
	int i;

	for (i = 0; i < ACCUM; i++)
		mr_synth_batch(SEED, 0, ((uint64_t)s * ACCUM + i) * BATCH, dense.vocab, BATCH, SEQ,
			       in + i * BATCH * SEQ, tg + i * BATCH * SEQ);
}

struct cpu_run {
	struct mr_pool *pool;
	struct mr_gpt m;
	struct mr_step s; /* the CPU step driver, one replica */
};

static void cpu_open(struct cpu_run *c)
{
	struct mr_errbuf eb = { "", "" };

	cr_assert_eq(mr_pool_create(&c->pool, 1), 0);
	cr_assert_eq(mr_gpt_create(&c->m, &dense, BATCH, SEQ, c->pool, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_step_init(&c->s, &c->m, &ocfg, NULL, NULL, SEED, &eb), 0, "%s", eb.msg);
}

static void cpu_close(struct cpu_run *c)
{
	mr_step_release(&c->s);
	mr_gpt_release(&c->m);
	mr_pool_free(c->pool);
}

/* A device model holding the CPU model's initial weights. */
static struct mr_cuda_gpt *dev_open(const struct mr_gpt *host)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_cuda_gpt *g = NULL;

	cr_assert_eq(mr_cuda_gpt_create(&g, cu, &dense, BATCH, SEQ, &ocfg, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_cuda_gpt_nparams(g), host->nparams);
	cr_assert_eq(mr_cuda_gpt_upload_params(g, host->params, host->nparams, &eb), 0, "%s",
		     eb.msg);
	return g;
}

Test(cuda_gpt, scope_check_names_the_field)
{
	struct mr_gpt_config c = dense;
	struct mr_errbuf eb = { "", "" };

	cr_expect_eq(mr_cuda_gpt_check(&dense, BATCH, SEQ, &eb), 0, "%s", eb.msg);
	cr_expect_eq(mr_cuda_gpt_check(&moe, BATCH, SEQ, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "moe_every", "%s", eb.msg);
	cr_expect(strstr(eb.msg, "moe_every") != NULL, "%s", eb.msg);
	mr_errbuf_clear(&eb);
	c.n_head = 4; /* head size 16 */
	cr_expect_eq(mr_cuda_gpt_check(&c, BATCH, SEQ, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "n_head", "%s", eb.msg);
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_cuda_gpt_check(&dense, BATCH, SEQ + 1, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "seq_len", "%s", eb.msg);
	mr_errbuf_clear(&eb);
	c = dense;
	c.vocab = 1; /* the CPU model's own checks run first */
	cr_expect_eq(mr_cuda_gpt_check(&c, BATCH, SEQ, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "vocab_size", "%s", eb.msg);
}

Test(cuda_gpt, moe_is_rejected)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_cuda_gpt *g = (struct mr_cuda_gpt *)1;

	need_gpu();
	cr_assert_eq(mr_cuda_gpt_create(&g, cu, &moe, BATCH, SEQ, &ocfg, &eb), MR_EINVAL);
	cr_expect_null(g);
	cr_expect_str_eq(eb.field, "moe_every", "%s", eb.msg);
	gpu_teardown();
}

Test(cuda_gpt, init_and_ledger)
{
	struct mr_errbuf eb = { "", "" };
	struct cpu_run c;
	struct mr_cuda_gpt *g = NULL;
	const struct mr_mem *mem;
	float *got;
	size_t n;

	need_gpu();
	cpu_open(&c);
	n = c.m.nparams;
	cr_assert_eq(mr_cuda_gpt_create(&g, cu, &dense, BATCH, SEQ, &ocfg, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_cuda_gpt_init_params(g, SEED, &eb), 0, "%s", eb.msg);
	got = xmalloc(n * sizeof(float));
	cr_assert_eq(mr_cuda_gpt_download_params(g, got, n, &eb), 0, "%s", eb.msg);
	cr_expect(memcmp(got, c.m.params, n * sizeof(float)) == 0,
		  "device init differs from mr_gpt_init_params");
	cr_expect_eq(mr_cuda_gpt_download_params(g, got, n - 1, &eb), MR_EINVAL);
	mem = mr_cuda_gpt_mem(g);
	cr_expect_geq(mem->bytes[MR_MEM_PARAMS], n * (sizeof(float) + sizeof(mr_bf16)));
	cr_expect_eq(mem->bytes[MR_MEM_GRADS], n * sizeof(float));
	cr_expect_eq(mem->bytes[MR_MEM_OPTIM], 2 * n * sizeof(float));
	/* at least the 14 (N,C) bf16 tensors per layer and the logits */
	cr_expect_geq(mem->bytes[MR_MEM_ACTS], (size_t)BATCH * SEQ *
		      (14 * dense.d_model * dense.n_layer + dense.vocab) * sizeof(mr_bf16));
	cr_expect_gt(mem->bytes[MR_MEM_WORKSPACE], 0);
	cr_expect_eq(mr_cuda_gpt_flops_per_token(g), mr_gpt_flops_per_token(&c.m));
	mr_cuda_gpt_free(g);
	free(got);
	cpu_close(&c);
	gpu_teardown();
}

Test(cuda_gpt, initial_loss_matches_cpu)
{
	struct mr_errbuf eb = { "", "" };
	struct cpu_run c;
	struct mr_cuda_gpt *g;
	int *in = xmalloc(STEP_BYTES), *tg = xmalloc(STEP_BYTES);
	float loss;

	need_gpu();
	cpu_open(&c);
	g = dev_open(&c.m);
	batch(0, in, tg);
	cr_assert_eq(mr_gpt_forward(&c.m, in, tg, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_cuda_gpt_forward(g, in, tg, &loss, &eb), 0, "%s", eb.msg);
	cr_expect(fabsf(loss - c.m.loss) <= 2e-4f * c.m.loss, "initial loss: device %.7f cpu %.7f",
		  (double)loss, (double)c.m.loss);
	/* and an independent anchor: near-uniform predictions at init */
	cr_expect(fabsf(c.m.loss - logf((float)dense.vocab)) < 0.1f, "cpu loss %.5f",
		  (double)c.m.loss);
	mr_cuda_gpt_free(g);
	cpu_close(&c);
	free(in);
	free(tg);
	gpu_teardown();
}

Test(cuda_gpt, ten_steps_match_cpu_trainer)
{
	struct mr_errbuf eb = { "", "" };
	struct cpu_run c;
	struct mr_cuda_gpt *g;
	struct mr_step_result rcpu, rg;
	int *in = xmalloc(STEP_BYTES), *tg = xmalloc(STEP_BYTES);
	float first = 0.0f, last = 0.0f, *init, *got;
	size_t n, i;
	int s;

	need_gpu();
	cpu_open(&c);
	n = c.m.nparams;
	init = xmalloc(n * sizeof(float));
	got = xmalloc(n * sizeof(float));
	memcpy(init, c.m.params, n * sizeof(float));
	g = dev_open(&c.m);
	for (s = 0; s < STEPS; s++) {
		batch(s, in, tg);
		cr_assert_eq(mr_step_run(&c.s, in, tg, ACCUM, &rcpu, &eb), 0, "%s", eb.msg);
		cr_assert_eq(mr_cuda_gpt_step(g, in, tg, ACCUM, &rg, &eb), 0, "step %d: %s", s,
			     eb.msg);
		cr_expect(fabsf(rg.loss - rcpu.loss) <= 5e-3f * rcpu.loss,
			  "step %d: loss device %.6f cpu %.6f", s, (double)rg.loss,
			  (double)rcpu.loss);
		cr_expect_eq(rg.lr, rcpu.lr, "step %d: lr %g vs %g", s, (double)rg.lr,
			     (double)rcpu.lr);
		if (s == 0) {
			cr_expect(fabsf(rg.grad_norm - rcpu.grad_norm) <= 1e-2f * rcpu.grad_norm,
				  "grad norm device %.6f cpu %.6f", (double)rg.grad_norm,
				  (double)rcpu.grad_norm);
			first = rg.loss;
		}
		last = rg.loss;
	}
	cr_expect_eq(mr_cuda_gpt_steps(g), STEPS);
	cr_expect(last < first, "the device run must learn: %.5f -> %.5f", (double)first,
		  (double)last);
	cr_assert_eq(mr_cuda_gpt_download_params(g, got, n, &eb), 0, "%s", eb.msg);
	cr_expect_leq(rel_l2(got, c.m.params, n), 2e-2, "final params rel L2 %.4g",
		      rel_l2(got, c.m.params, n));
	for (i = 0; i < n; i++) {
		got[i] -= init[i];
		init[i] = c.m.params[i] - init[i];
	}
	cr_expect_leq(rel_l2(got, init, n), 0.15, "updates rel L2 %.4g", rel_l2(got, init, n));
	mr_cuda_gpt_free(g);
	cpu_close(&c);
	free(init);
	free(got);
	free(in);
	free(tg);
	gpu_teardown();
}

/*
 * The optimizer half of a step in isolation: the CPU's mr_grad_clip +
 * mr_lr_at + mr_adamw_step applied to the device's own (unclipped)
 * gradients must give the device's new fp32 masters up to fp32 rounding
 * (rtol 1e-5, atol 1e-6 of max|p|: the AdamW kernel tolerance of
 * test_cuda_kernels.c; the formula is the same, FMA contraction differs).
 * This sees what the bf16-dominated comparison above cannot: weight decay
 * on the wrong tensors, a missing clip, a wrong schedule or step count.
 */
Test(cuda_gpt, optimizer_matches_cpu_adamw_on_device_grads)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_step_result r;
	struct cpu_run c; /* the shadow: CPU optimizer, device gradients */
	struct mr_cuda_gpt *g;
	int *in = xmalloc(STEP_BYTES), *tg = xmalloc(STEP_BYTES);
	float *got, lr;
	double norm;
	size_t n;
	int s;

	need_gpu();
	cpu_open(&c);
	n = c.m.nparams;
	got = xmalloc(n * sizeof(float));
	g = dev_open(&c.m);
	for (s = 0; s < 4; s++) {
		batch(s, in, tg);
		cr_assert_eq(mr_cuda_gpt_step(g, in, tg, ACCUM, &r, &eb), 0, "%s", eb.msg);
		cr_assert_eq(mr_cuda_gpt_download_grads(g, c.m.grads, n, &eb), 0, "%s", eb.msg);
		norm = sqrt(mr_grad_sumsq(c.m.grads, n));
		cr_expect(fabs(r.grad_norm - norm) <= 1e-5 * norm,
			  "step %d: grad norm %.8g vs %.8g", s, (double)r.grad_norm, norm);
		lr = mr_lr_at(&ocfg, mr_dp_steps(c.s.dp));
		cr_expect_eq(r.lr, lr, "step %d", s);
		cr_assert_eq(mr_dp_update(c.s.dp, norm, lr), 0); /* clip + AdamW, as a step */
		cr_assert_eq(mr_cuda_gpt_download_params(g, got, n, &eb), 0, "%s", eb.msg);
		check_close("params after the update", got, c.m.params, n, 1e-5, 1e-6);
	}
	cr_expect_eq(mr_cuda_gpt_steps(g), mr_dp_steps(c.s.dp));
	mr_cuda_gpt_free(g);
	cpu_close(&c);
	free(got);
	free(in);
	free(tg);
	gpu_teardown();
}

/* Device steps use no float atomics: the same run twice is bit-identical. */
Test(cuda_gpt, steps_are_deterministic)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_step_result r[2];
	struct cpu_run c;
	struct mr_cuda_gpt *g[2];
	int *in = xmalloc(STEP_BYTES), *tg = xmalloc(STEP_BYTES);
	float *p[2];
	size_t n;
	int k, s;

	need_gpu();
	cpu_open(&c);
	n = c.m.nparams;
	for (k = 0; k < 2; k++) {
		g[k] = dev_open(&c.m);
		p[k] = xmalloc(n * sizeof(float));
	}
	for (s = 0; s < 3; s++) {
		batch(s, in, tg);
		for (k = 0; k < 2; k++)
			cr_assert_eq(mr_cuda_gpt_step(g[k], in, tg, ACCUM, &r[k], &eb), 0, "%s",
				     eb.msg);
		cr_expect_eq(r[0].loss, r[1].loss, "step %d", s);
		cr_expect_eq(r[0].grad_norm, r[1].grad_norm, "step %d", s);
	}
	for (k = 0; k < 2; k++)
		cr_assert_eq(mr_cuda_gpt_download_params(g[k], p[k], n, &eb), 0, "%s", eb.msg);
	cr_expect(memcmp(p[0], p[1], n * sizeof(float)) == 0, "two identical runs differ");
	/* and the step changed something */
	cr_expect(memcmp(p[0], c.m.params, n * sizeof(float)) != 0, "params did not move");
	for (k = 0; k < 2; k++) {
		mr_cuda_gpt_free(g[k]);
		free(p[k]);
	}
	cpu_close(&c);
	free(in);
	free(tg);
	gpu_teardown();
}

Test(cuda_gpt, bad_tokens_and_nonfinite_name_the_culprit)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_step_result r;
	struct cpu_run c;
	struct mr_cuda_gpt *g;
	const struct mr_gpt_tensor *t;
	int *in = xmalloc(STEP_BYTES), *tg = xmalloc(STEP_BYTES);
	float loss;

	need_gpu();
	cpu_open(&c);
	g = dev_open(&c.m);
	batch(0, in, tg);
	in[5] = dense.vocab;
	cr_expect_eq(mr_cuda_gpt_forward(g, in, tg, &loss, &eb), MR_ERANGE);
	cr_expect_str_eq(eb.field, "input", "%s", eb.msg);
	batch(0, in, tg);
	/* a NaN weight: the step fails naming the step and the tensor */
	t = mr_gpt_find(&c.m, "h.1.mlp.fc.w");
	cr_assert_not_null(t);
	c.m.params[t->off + 3] = NAN;
	cr_assert_eq(mr_cuda_gpt_upload_params(g, c.m.params, c.m.nparams, &eb), 0, "%s", eb.msg);
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_cuda_gpt_step(g, in, tg, ACCUM, &r, &eb), MR_ENONFINITE);
	cr_expect(strstr(eb.msg, "at step 0") && strstr(eb.msg, "'params.h.1.mlp.fc.w'"), "%s",
		  eb.msg);
	cr_expect_eq(mr_cuda_gpt_steps(g), 0);
	mr_cuda_gpt_free(g);
	cpu_close(&c);
	free(in);
	free(tg);
	gpu_teardown();
}
