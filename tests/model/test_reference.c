/*
 * test_reference.c - the single-rank GPT runtime against PyTorch.
 *
 * tests/reference/{dense,moe1,moe2}.bin hold what PyTorch computed for the
 * same weights (regenerated here from the seed; the file's parameter sum
 * of squares proves they are the same) - see gen_reference.py for the
 * format. Tolerances (BRIEF §6, issue 4):
 *   loss (and MoE aux loss): relative error <= 1e-5
 *   logits: absolute error <= 1e-4
 *   every gradient tensor: rel = max|a - b| / max|b| over the tensor <= 1e-4
 *   10 AdamW steps (2 micro-batches each): each loss relative error <= 1e-4
 * PyTorch is not needed to run this test.
 *
 * Built a second time against the CUDA emulation (-DREF_CUDA_EMUL: the
 * Makefile's gpu-emul/test_reference): the same checks with the model on
 * the device layer's cuda backend in fp32, for the configurations whose
 * head size the device's attention takes (32 to 128). Every buffer the
 * checks read comes back through the device's download.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/mr_pool.h"
#include "device/dev_int.h"
#include "model/mr_gpt.h"
#include "model/mr_weights.h"
#include "mr_step.h"

struct ref {
	int32_t hdr[256];
	struct mr_gpt_config cfg;
	int B, T, steps, nlog, nbatch, accum;
	uint64_t seed;
	size_t nparams;
	double sumsq;
	int *inputs, *targets;
	float *logits, loss, aux, *grads, *losses;
};

static float hf(const struct ref *r, int i)
{
	float f;

	memcpy(&f, &r->hdr[i], sizeof(f));
	return f;
}

static void read_ref(struct ref *r, const char *name)
{
	char path[256];
	FILE *f;
	size_t nt;

	snprintf(path, sizeof(path), "tests/reference/%s.bin", name);
	f = fopen(path, "rb");
	cr_assert_not_null(f, "cannot open %s (run from the repository root)", path);
	cr_assert_eq(fread(r->hdr, 4, 256, f), 256);
	cr_assert_eq(r->hdr[0], 20261122);
	cr_assert_eq(r->hdr[1], 1);
	mr_weights_unpack_config(r->hdr, &r->cfg);
	r->B = r->hdr[12];
	r->T = r->hdr[13];
	r->steps = r->hdr[14];
	r->seed = (uint64_t)r->hdr[15];
	r->nlog = r->hdr[16];
	r->nbatch = r->hdr[17];
	r->accum = r->hdr[18];
	r->nparams = (size_t)r->hdr[19];
	memcpy(&r->sumsq, &r->hdr[30], sizeof(double));
	nt = (size_t)r->nbatch * r->B * r->T;
	r->inputs = malloc(nt * sizeof(int));
	r->targets = malloc(nt * sizeof(int));
	r->logits = malloc((size_t)r->nlog * sizeof(float));
	r->grads = malloc(r->nparams * sizeof(float));
	r->losses = malloc((size_t)r->steps * sizeof(float));
	cr_assert(r->inputs && r->targets && r->logits && r->grads && r->losses);
	cr_assert_eq(fread(r->inputs, sizeof(int), nt, f), nt);
	cr_assert_eq(fread(r->targets, sizeof(int), nt, f), nt);
	cr_assert_eq(fread(r->logits, sizeof(float), (size_t)r->nlog, f), (size_t)r->nlog);
	cr_assert_eq(fread(&r->loss, sizeof(float), 1, f), 1);
	cr_assert_eq(fread(&r->aux, sizeof(float), 1, f), 1);
	cr_assert_eq(fread(r->grads, sizeof(float), r->nparams, f), r->nparams);
	cr_assert_eq(fread(r->losses, sizeof(float), (size_t)r->steps, f), (size_t)r->steps);
	fclose(f);
}

static void free_ref(struct ref *r)
{
	free(r->inputs);
	free(r->targets);
	free(r->logits);
	free(r->grads);
	free(r->losses);
}

static double rel(double a, double b)
{
	return fabs(a - b) / fmax(fabs(b), 1e-30);
}

/* n floats of device memory, downloaded (caller frees). */
static float *host_copy(struct mr_dev *d, const void *p, size_t n)
{
	float *h = malloc(n * sizeof(float));

	cr_assert_not_null(h);
	cr_assert_eq(d->ops->download(d, h, p, n * sizeof(float)), 0);
	return h;
}

/* The device the checks run on: cpu, or the emulated cuda device (fp32). */
static void open_device(struct mr_dev *d, struct mr_pool *pool)
{
	struct mr_errbuf eb = { "", "" };

#ifdef REF_CUDA_EMUL
	(void)pool;
	cr_assert_eq(mr__dev_cuda_open(d, 0, MR_DT_F32, &eb), 0, "%s", eb.msg);
#else
	cr_assert_eq(mr_dev_open(d, "cpu", 0, NULL, pool, &eb), 0, "%s", eb.msg);
#endif
}

static void check_config(const char *name, int threads)
{
	struct ref r;
	struct mr_gpt m;
	struct mr_dev dev;
	struct mr_pool *pool = NULL;
	float *h;
	struct mr_errbuf eb = { "", "" };
	struct mr_step st;
	struct mr_adamw_config oc;
	double ss = 0.0, worst = 0.0;
	const char *worst_name = "";
	size_t i, N;
	int s, ti;

	read_ref(&r, name);
	cr_assert_eq(mr_pool_create(&pool, threads), 0);
	open_device(&dev, pool);
	cr_assert_eq(mr_gpt_create_on(&m, &r.cfg, r.B, r.T, &dev, NULL, 0, &eb), 0, "%s", eb.msg);
	cr_assert_eq(m.nparams, r.nparams);
	mr_gpt_init_params(&m, r.seed);
	h = host_copy(&dev, m.params, m.nparams);
	for (i = 0; i < m.nparams; i++)
		ss += (double)h[i] * h[i];
	free(h);
	cr_assert(rel(ss, r.sumsq) < 1e-9,
		  "%s: initial weights differ from the reference (sumsq %.12g vs %.12g); "
		  "run make reference", name, ss, r.sumsq);

	/* forward + backward on batch 0 */
	cr_assert_eq(mr_gpt_forward(&m, r.inputs, r.targets, &eb), 0, "%s", eb.msg);
	cr_expect(rel(m.loss, r.loss) <= 1e-5, "%s: loss %.8f vs torch %.8f", name,
		  (double)m.loss, (double)r.loss);
	if (r.cfg.moe_every > 0) {
		int dropped = 0, l;
		for (l = 0; l < r.cfg.n_layer; l++)
			if (mr_gpt_layer_is_moe(&r.cfg, l))
				dropped += m.la[l].moe.dropped;
		cr_expect_eq(dropped, r.hdr[29], "%s: dropped %d vs torch %d", name, dropped,
			     r.hdr[29]);
		cr_expect(dropped > 0, "%s: the reference must drop tokens", name);
		cr_expect(rel(m.aux_loss, r.aux) <= 1e-5, "%s: aux %.8f vs torch %.8f", name,
			  (double)m.aux_loss, (double)r.aux);
	}
	h = host_copy(&dev, m.logits, (size_t)r.nlog); /* fp32 activations */
	for (i = 0; i < (size_t)r.nlog; i++)
		cr_expect(fabsf(h[i] - r.logits[i]) <= 1e-4f, "%s: logit %zu: %.7f vs torch %.7f",
			  name, i, (double)h[i], (double)r.logits[i]);
	free(h);
	mr_gpt_zero_grad(&m);
	mr_gpt_backward(&m, 1.0f);
	h = host_copy(&dev, m.grads, m.nparams);
	for (ti = 0; ti < m.ntensors; ti++) {
		const struct mr_gpt_tensor *t = &m.tensors[ti];
		double md = 0.0, mb = 0.0, e;
		for (i = 0; i < t->n; i++) {
			double a = h[t->off + i], b = r.grads[t->off + i];
			md = fmax(md, fabs(a - b));
			mb = fmax(mb, fabs(b));
		}
		e = mb > 0.0 ? md / mb : md;
		cr_expect(e <= 1e-4, "%s: grad '%s' rel error %.3g (max|torch| %.3g)", name,
			  t->name, e, mb);
		if (e > worst) {
			worst = e;
			worst_name = t->name;
		}
	}
	free(h);
	cr_log_info("%s: worst gradient rel error %.3g ('%s')", name, worst, worst_name);

	/* 10 AdamW steps from the same initial weights (the step driver
	 * initialises them from the seed) */
	oc.lr = hf(&r, 20);
	oc.min_lr_frac = hf(&r, 21);
	oc.warmup_steps = r.hdr[22];
	oc.total_steps = r.hdr[23];
	oc.beta1 = hf(&r, 24);
	oc.beta2 = hf(&r, 25);
	oc.eps = hf(&r, 26);
	oc.weight_decay = hf(&r, 27);
	oc.grad_clip = hf(&r, 28);
	cr_assert_eq(mr_step_init(&st, &m, &oc, NULL, NULL, r.seed, &eb), 0, "%s", eb.msg);
	N = (size_t)r.B * r.T;
	{
		int *in = malloc(N * r.accum * sizeof(int)), *tg = malloc(N * r.accum * sizeof(int));
		cr_assert(in && tg);
		for (s = 0; s < r.steps; s++) {
			struct mr_step_result res;
			int a;
			for (a = 0; a < r.accum; a++) {
				size_t b = (size_t)((s * r.accum + a) % r.nbatch);
				memcpy(in + a * N, r.inputs + b * N, N * sizeof(int));
				memcpy(tg + a * N, r.targets + b * N, N * sizeof(int));
			}
			cr_assert_eq(mr_step_run(&st, in, tg, r.accum, &res, &eb), 0, "%s", eb.msg);
			cr_expect(rel(res.loss, r.losses[s]) <= 1e-4,
				  "%s: step %d loss %.7f vs torch %.7f", name, s, (double)res.loss,
				  (double)r.losses[s]);
		}
		cr_expect(r.losses[r.steps - 1] < r.losses[0] - 0.1f, "%s: loss must fall", name);
		free(in);
		free(tg);
	}
	mr_step_release(&st);
	mr_gpt_release(&m);
	mr_dev_close(&dev);
	mr_pool_free(pool);
	free_ref(&r);
}

/* head size 16 and 8: the cpu device only */
#ifndef REF_CUDA_EMUL
Test(reference, dense) { check_config("dense", 1); }
Test(reference, dense_threads) { check_config("dense", 2); }
Test(reference, moe_top1_dropping) { check_config("moe1", 2); }
Test(reference, moe_top2_dropping) { check_config("moe2", 1); }
#endif
/* head size 32: both devices */
Test(reference, dense_hs32) { check_config("dense_hs32", 2); }
Test(reference, moe_top2_dropping_hs32) { check_config("moe2_hs32", 1); }
