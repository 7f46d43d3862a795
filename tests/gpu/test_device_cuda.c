/*
 * test_device_cuda.c - every operation of the device table
 * (device/mr_device.h) on the `cuda` device against the `cpu` device:
 * the same inputs on both, in both precisions of the cuda device (fp32
 * and bf16), with the edge cases the model and the tp layers use (tokens
 * and targets < 0, wpe NULL, accumulate 0/1, NULL outputs, odd sizes,
 * dropped MoE assignments), plus opening and its errors; in the
 * emulation also the stream-ordered waits of collectives (a wait past its
 * deadline or whose communicator failed fails the host's wait instead of
 * hanging).
 *
 * Built twice (Makefile): against tests/gpu/cuda_emul.c (-DMR_CUDA_EMUL;
 * part of make test on every machine, sanitizer build included), where
 * each cuda kernel is its CPU twin with the device's bf16 rounding points,
 * and against the real kernels (make test-gpu; skips without a device).
 *
 * Inputs are random values rounded to bf16, so both devices start from
 * exactly the same numbers in either precision. Tolerances (|cuda - cpu|
 * <= rtol*|cpu| + atol*max|cpu|):
 *   emulated, fp32 throughout    1e-6, 1e-6: the same CPU twins on the
 *                                same values (in practice bit-identical);
 *   emulated, fp32 outputs of a  1e-6, 1e-6: they come from identical
 *   bf16 device                  inputs through fp32 arithmetic;
 *   bf16 activation outputs      8e-3, 1e-3: one rounding to nearest even
 *                                (<= 2^-9 = 1.95e-3 relative), 4x margin;
 *   bf16 results through several 1e-2, 4e-3: up to ~4 roundings in a row
 *   rounded intermediates        (MoE experts, accumulated dinp);
 *   real GPU, fp32 outputs       1e-4, 1e-5: other summation orders
 *                                (cuBLAS tiles, block reductions, expf).
 * The elementwise attention cases are the block-wise kernels' (the cuDNN
 * path turned off, MESHRUN_CUDNN=0); the bf16 layer through cuDNN is
 * bounded by relative L2 error instead (||cuda - cpu|| / ||cpu||: out and
 * dqkv 1e-2, lse 1e-3; test_cuda_attention.c says why) and must not be
 * counted as a fallback.
 * A wrong operation (an offset off by one, a missing scale, = instead of
 * +=) moves whole values and fails by orders of magnitude.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mr_comm.h"
#include "device/dev_int.h"
#include "device/mr_dev_comm.h"
#include "device/mr_peak.h"
#include "gpu_harness.h"
#include "kernels/mr_moe.h"
#ifdef MR_CUDA_EMUL
#include <time.h>

#include "cuda_emul.h"
#endif

#define MAXBUF 256

enum tol { T_ACT, T_GRAD, T_F32 };

/* The two devices and every buffer a test allocates (freed at teardown). */
static struct {
	struct mr_dev cpu, gpu;
	struct mr_mem mem;
	int bf16;
	int n;
	struct {
		struct mr_dev *d;
		void *p;
		size_t bytes;
	} b[MAXBUF];
} F;

/* A pair of buffers with the same contents: c on cpu, g on cuda. */
struct pr {
	void *c, *g;
	size_t n;
	int act; /* activation type (else fp32 or int) */
};

static int open_cuda(struct mr_dev *d, int bf16, struct mr_errbuf *eb)
{
#ifdef MR_CUDA_EMUL
	return mr__dev_cuda_open(d, 0, bf16 ? MR_DT_BF16 : MR_DT_F32, eb);
#else
	return mr_dev_open(d, "cuda", 0, bf16 ? "bf16" : "fp32", NULL, eb);
#endif
}

static void setup(int bf16)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };

	need_gpu(); /* skips without a device (never in the emulation) */
	memset(&F, 0, sizeof(F));
	F.bf16 = bf16;
	cr_assert_eq(mr_dev_open(&F.cpu, "cpu", 0, NULL, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(open_cuda(&F.gpu, bf16, &eb), 0, "%s", eb.msg);
	cr_assert_eq(F.gpu.act, bf16 ? MR_DT_BF16 : MR_DT_F32);
	cr_assert_eq(F.gpu.act_bytes, bf16 ? 2u : 4u);
}

static void teardown(void)
{
	int i;

	for (i = F.n - 1; i >= 0; i--)
		mr_dev_free(F.b[i].d, &F.mem, MR_MEM_ACTS, F.b[i].p, F.b[i].bytes);
	cr_assert_eq(F.mem.bytes[MR_MEM_ACTS], 0, "ledger not back to 0 after the frees");
	mr_dev_close(&F.gpu);
	mr_dev_close(&F.cpu);
	gpu_teardown();
}

static void *dalloc(struct mr_dev *d, size_t bytes)
{
	void *p = mr_dev_alloc(d, &F.mem, MR_MEM_ACTS, bytes ? bytes : 1);

	cr_assert_not_null(p);
	cr_assert_lt(F.n, MAXBUF);
	F.b[F.n].d = d;
	F.b[F.n].p = p;
	F.b[F.n].bytes = bytes ? bytes : 1;
	F.n++;
	return p;
}

#define OK(call) cr_assert_eq((call), 0, "%s failed", #call)
/* The same operation on both devices: OP(name, args...) with the pair
 * members named by the caller as C(x) / G(x). */
#define BOTH(name, ...)                                                         \
	do {                                                                    \
		struct mr_dev *d_ = &F.cpu;                                     \
		int g_ = 0;                                                     \
		OK(d_->ops->name(d_, __VA_ARGS__));                             \
		d_ = &F.gpu;                                                    \
		g_ = 1;                                                         \
		OK(d_->ops->name(d_, __VA_ARGS__));                             \
		OK(d_->ops->sync(d_));                                          \
		(void)g_;                                                       \
	} while (0)
/* inside BOTH: the member of a pair for the device being called */
#define P(x) (g_ ? (x).g : (x).c)

/* fp32 buffer on d holding h (n). */
static float *up32(struct mr_dev *d, const float *h, size_t n)
{
	float *p = dalloc(d, n * sizeof(float));

	if (h)
		OK(d->ops->upload(d, p, h, n * sizeof(float)));
	return p;
}

static struct pr act_in(const float *h, size_t n)
{
	struct pr r = { NULL, NULL, n, 1 };
	float *t = up32(&F.gpu, h, n);

	r.c = up32(&F.cpu, h, n);
	r.g = dalloc(&F.gpu, mr_dev_act_bytes(&F.gpu, n));
	OK(F.gpu.ops->to_act(&F.gpu, r.g, t, n));
	return r;
}

static struct pr act_zero(size_t n)
{
	struct pr r = { NULL, NULL, n, 1 };

	r.c = dalloc(&F.cpu, n * sizeof(float));
	r.g = dalloc(&F.gpu, mr_dev_act_bytes(&F.gpu, n));
	return r;
}

static struct pr f32_in(const float *h, size_t n)
{
	struct pr r = { NULL, NULL, n, 0 };

	r.c = up32(&F.cpu, h, n);
	r.g = up32(&F.gpu, h, n);
	return r;
}

static struct pr int_in(const int *h, size_t n)
{
	struct pr r = { NULL, NULL, n, 0 };

	r.c = dalloc(&F.cpu, n * sizeof(int));
	r.g = dalloc(&F.gpu, n * sizeof(int));
	OK(F.cpu.ops->upload(&F.cpu, r.c, h, n * sizeof(int)));
	OK(F.gpu.ops->upload(&F.gpu, r.g, h, n * sizeof(int)));
	return r;
}

/* The contents of one side as fp32 on the host (caller frees). */
static float *get(struct mr_dev *d, const void *p, size_t n, int act)
{
	float *h = xmalloc(n * sizeof(float)), *t = act ? up32(d, NULL, n) : (float *)p;

	if (act)
		OK(d->ops->to_f32(d, t, p, n));
	OK(d->ops->download(d, h, t, n * sizeof(float)));
	return h;
}

static void tol_of(enum tol t, double *rt, double *at)
{
	if (!F.bf16 || t == T_F32) {
#ifdef MR_CUDA_EMUL
		*rt = 1e-6;
		*at = 1e-6;
#else
		*rt = 1e-4;
		*at = 1e-5;
#endif
		return;
	}
	*rt = t == T_ACT ? BF_RTOL : 1e-2;
	*at = t == T_ACT ? BF_ATOL : 4e-3;
}

/* The cuda side of p equals the cpu side within tolerance class t. */
static void same(const char *what, struct pr p, enum tol t)
{
	float *c = get(&F.cpu, p.c, p.n, p.act), *g = get(&F.gpu, p.g, p.n, p.act);
	double rt, at;

	tol_of(t, &rt, &at);
	check_close(what, g, c, p.n, rt, at);
	free(c);
	free(g);
}

static float *rnd(size_t n, float scale)
{
	return rand_bf(n, scale);
}

/* Runs a body for fp32 and for bf16. */
#define BOTH_PRECISIONS(fn)          \
	do {                         \
		setup(0);            \
		fn();                \
		teardown();          \
		setup(1);            \
		fn();                \
		teardown();          \
	} while (0)

/* ---- opening ---------------------------------------------------------------- */

Test(device_cuda, open_names_the_field_it_refuses)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_dev d;

	cr_assert_eq(mr_dev_open(&d, "cuda", 0, "fp16", NULL, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "precision");
	cr_assert(strstr(eb.msg, "fp16") != NULL, "%s", eb.msg);
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_dev_open(&d, "tpu", 0, NULL, NULL, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "device");
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_dev_open(&d, "cpu", 0, "bf16", NULL, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "precision");
	mr_errbuf_clear(&eb);
	/* a GPU index past the last one */
	cr_assert_lt(mr_dev_open(&d, "cuda", 64, NULL, NULL, &eb), 0);
	cr_assert_str_eq(eb.field, "device");
#ifdef MR_CUDA_EMUL
	/* no device at all: named, not fatal (a build without the CUDA side:
	 * tests/plugin/test_cuda_load.c) */
	setenv("MR_CUDA_EMUL_NODEV", "1", 1);
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_dev_open(&d, "cuda", 0, NULL, NULL, &eb), MR_ENOTSUP);
	cr_assert_str_eq(eb.field, "device");
	cr_assert(strstr(eb.msg, "no cuda device") != NULL, "%s", eb.msg);
	unsetenv("MR_CUDA_EMUL_NODEV");
#endif
}

/* MFU's denominator: the datasheet's dense peak by the driver's name */
Test(device_cuda, peak_flops_by_gpu_name_and_precision)
{
	static const struct {
		const char *model;
		enum mr_dtype act;
		double tflops;
	} want[] = {
		{ "NVIDIA H100 80GB HBM3", MR_DT_BF16, 989.4 }, /* SXM */
		{ "NVIDIA H100 80GB HBM3", MR_DT_F32, 66.9 },
		{ "NVIDIA H100 PCIe", MR_DT_BF16, 756.5 },
		{ "NVIDIA H200", MR_DT_BF16, 989.4 },
		{ "NVIDIA GH200 480GB", MR_DT_BF16, 989.4 },
		{ "NVIDIA A100-SXM4-80GB", MR_DT_BF16, 312.0 },
		{ "NVIDIA A100 80GB PCIe", MR_DT_F32, 19.5 },
		{ "NVIDIA L40S", MR_DT_BF16, 362.05 },
		{ "NVIDIA GeForce GTX 1080", MR_DT_BF16, 0.0 },
		{ "cpu", MR_DT_F32, 0.0 },
	};
	size_t i;

	for (i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		cr_expect_float_eq(mr_dev_peak_flops(want[i].model, want[i].act),
				   want[i].tflops * 1e12, 1.0, "%s", want[i].model);
	cr_expect_eq(mr_dev_peak_flops(NULL, MR_DT_BF16), 0.0);
}

#ifdef MR_CUDA_EMUL
Test(device_cuda, emulated_open_gives_the_precision_asked)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_dev d;

	cr_assert_eq(mr__dev_cuda_open(&d, 0, MR_DT_BF16, &eb), 0, "%s", eb.msg);
	cr_assert_str_eq(d.ops->name, "cuda");
	cr_assert_eq(d.act, MR_DT_BF16);
	/* the driver's name, and no datasheet peak for it */
	cr_assert(strstr(d.model, "emulated GPU 0") != NULL, "%s", d.model);
	cr_assert_eq(d.peak_flops, 0.0);
	cr_assert_not_null(d.ops->moe_fwd);
	mr_dev_close(&d);
	/* and through the name, as a worker opens it */
	cr_assert_eq(mr_dev_open(&d, "cuda", 0, NULL, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(d.act, MR_DT_BF16, "bf16 is the default precision on cuda");
	mr_dev_close(&d);
	cr_assert_eq(mr_dev_open(&d, "cuda", 0, "fp32", NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(d.act, MR_DT_F32);
	mr_dev_close(&d);
}
#endif

/* ---- memory ------------------------------------------------------------------- */

static void memory_case(void)
{
	size_t n = 1000, i;
	float *h = rnd(n, 1.0f), *z, *g, *r;
	struct pr a = act_in(h, n), b = act_zero(n), f = f32_in(h, n);
	size_t before = F.mem.bytes[MR_MEM_ACTS];
	void *p = mr_dev_alloc(&F.gpu, &F.mem, MR_MEM_PARAMS, 4096);

	/* zeroed, accounted under its kind */
	cr_assert_not_null(p);
	cr_assert_eq(F.mem.bytes[MR_MEM_PARAMS], 4096u);
	cr_assert_eq(F.mem.bytes[MR_MEM_ACTS], before);
	z = get(&F.gpu, p, 1024, 0);
	for (i = 0; i < 1024; i++)
		cr_assert_eq(z[i], 0.0f, "alloc not zeroed at %zu", i);
	free(z);
	mr_dev_free(&F.gpu, &F.mem, MR_MEM_PARAMS, p, 4096);
	cr_assert_eq(F.mem.bytes[MR_MEM_PARAMS], 0u);
	cr_assert_eq(F.mem.peak[MR_MEM_PARAMS], 4096u);
	/* to_act then to_f32: the values (bf16-representable) come back */
	g = get(&F.gpu, a.g, n, 1);
	for (i = 0; i < n; i++)
		cr_assert_eq(g[i], h[i], "to_act/to_f32 [%zu]: %g != %g", i, g[i], h[i]);
	free(g);
	/* copy, zero, copy2d (odd widths and pitches) */
	BOTH(copy, P(b), P(a), mr_dev_act_bytes(d_, n));
	same("copy", b, T_F32);
	BOTH(zero, P(b), mr_dev_act_bytes(d_, 10));
	BOTH(copy2d, P(b), mr_dev_act_bytes(d_, 37), P(a), mr_dev_act_bytes(d_, 29),
	     mr_dev_act_bytes(d_, 23), 21);
	same("copy2d", b, T_F32);
	g = get(&F.gpu, b.g, n, 1);
	cr_assert_eq(g[37], h[29], "copy2d row 1");
	cr_assert_eq(g[30], h[30], "copy2d wrote into the gap between rows");
	cr_assert_eq(g[23], h[23], "copy2d wrote past its width");
	free(g);
	/* fp32 round trip, and to_act rounding a value that is not bf16 */
	r = get(&F.gpu, f.g, n, 0);
	cr_assert(memcmp(r, h, n * sizeof(float)) == 0, "upload/download differ");
	free(r);
	{
		float x[2] = { 1.0f + 0x1p-8f + 0x1p-20f, -3.0f }, *y;
		struct pr q = act_in(x, 2);
		y = get(&F.gpu, q.g, 2, 1);
		cr_assert_eq(y[0], F.bf16 ? 1.0f + 0x1p-7f : x[0], "to_act rounding: %.9g", y[0]);
		cr_assert_eq(y[1], -3.0f);
		free(y);
	}
	free(h);
}

Test(device_cuda, memory_copies_and_conversions)
{
	BOTH_PRECISIONS(memory_case);
}

/* ---- GEMM ------------------------------------------------------------------------ */

static void matmul_case(void)
{
	int N = 19, IC = 24, OC = 13;
	float *hi = rnd((size_t)N * IC, 1.0f), *hw = rnd((size_t)OC * IC, 0.3f);
	float *hb = rnd(OC, 0.5f), *hd = rnd((size_t)N * OC, 1.0f);
	float *hdi = rnd((size_t)N * IC, 1.0f), *hdw = rnd((size_t)OC * IC, 1.0f);
	struct pr inp = act_in(hi, (size_t)N * IC), w = act_in(hw, (size_t)OC * IC);
	struct pr b = act_in(hb, OC), dout = act_in(hd, (size_t)N * OC);
	struct pr out = act_zero((size_t)N * OC), dinp = act_in(hdi, (size_t)N * IC);
	struct pr dw = f32_in(hdw, (size_t)OC * IC), db = f32_in(hb, OC);

	BOTH(matmul_fwd, P(out), P(inp), P(w), P(b), N, IC, OC);
	same("matmul out", out, T_ACT);
	BOTH(matmul_fwd, P(out), P(inp), P(w), NULL, N, IC, OC);
	same("matmul out, no bias", out, T_ACT);
	/* acc = 1 onto a non-zero dinp; dw and dbias += */
	BOTH(matmul_bwd, P(dinp), P(dw), P(db), P(dout), P(inp), P(w), N, IC, OC, 1);
	same("matmul dinp +=", dinp, T_GRAD);
	same("matmul dw", dw, T_F32);
	same("matmul dbias", db, T_F32);
	/* acc = 0 overwrites; NULL outputs are skipped */
	BOTH(matmul_bwd, P(dinp), NULL, NULL, P(dout), P(inp), P(w), N, IC, OC, 0);
	same("matmul dinp =", dinp, T_ACT);
	BOTH(matmul_bwd, NULL, P(dw), NULL, P(dout), P(inp), P(w), N, IC, OC, 0);
	same("matmul dw, no dinp", dw, T_F32);
	BOTH(matmul_bwd, NULL, NULL, P(db), P(dout), P(inp), P(w), N, IC, OC, 0);
	same("matmul dbias alone", db, T_F32);
	free(hi);
	free(hw);
	free(hb);
	free(hd);
	free(hdi);
	free(hdw);
}

Test(device_cuda, matmul_forward_and_backward)
{
	BOTH_PRECISIONS(matmul_case);
}

/* The GEMM after a GELU with the GELU's backward fused (cuda) against the
 * two apart (the cpu device has no fusion); dinp is written, not added. */
static void dgelu_case(void)
{
	int N = 37, IC = 48, OC = 40;
	size_t ni = (size_t)N * IC;
	float *hx = rnd(ni, 1.0f), *hw = rnd((size_t)OC * IC, 0.5f), *hp = rnd(ni, 2.0f);
	float *hd = rnd((size_t)N * OC, 1.0f), *hj = rnd(ni, 1.0f);
	struct pr x = act_in(hx, ni), w = act_in(hw, (size_t)OC * IC), pre = act_in(hp, ni);
	struct pr dout = act_in(hd, (size_t)N * OC), dinp = act_in(hj, ni);
	struct pr dw = f32_in(hw, (size_t)OC * IC), db = f32_in(hd, OC);

	cr_assert_null(F.cpu.ops->matmul_dgelu_bwd);
	OK(F.cpu.ops->matmul_bwd(&F.cpu, dinp.c, dw.c, db.c, dout.c, x.c, w.c, N, IC, OC, 0));
	OK(F.cpu.ops->gelu_bwd(&F.cpu, dinp.c, pre.c, dinp.c, ni));
	OK(F.gpu.ops->matmul_dgelu_bwd(&F.gpu, dinp.g, dw.g, db.g, dout.g, x.g, w.g, pre.g, N, IC,
				       OC));
	OK(F.gpu.ops->sync(&F.gpu));
	same("dgelu dinp", dinp, T_GRAD);
	same("dgelu dw +=", dw, T_F32);
	same("dgelu db +=", db, T_F32);
	free(hx);
	free(hw);
	free(hp);
	free(hd);
	free(hj);
}

Test(device_cuda, matmul_with_the_gelu_backward_fused)
{
	BOTH_PRECISIONS(dgelu_case);
}

/* The GEMM before a GELU with the GELU fused (cuda) against the two apart
 * (the cpu device has no fusion): the GELU's input and its output, both
 * written over poison, with and without a bias. */
static void gelu_fwd_case(void)
{
	int N = 37, IC = 48, OC = 40;
	size_t no = (size_t)N * OC;
	float *hx = rnd((size_t)N * IC, 1.0f), *hw = rnd((size_t)OC * IC, 0.5f);
	float *hb = rnd(OC, 1.0f), *hp = xmalloc(no * sizeof(float));
	struct pr x = act_in(hx, (size_t)N * IC), w = act_in(hw, (size_t)OC * IC);
	struct pr b = act_in(hb, OC), pre, out;

	for (size_t i = 0; i < no; i++)
		hp[i] = NAN;
	pre = act_in(hp, no);
	out = act_in(hp, no);
	cr_assert_null(F.cpu.ops->matmul_gelu_fwd);
	for (int bias = 1; bias >= 0; bias--) {
		OK(F.cpu.ops->matmul_fwd(&F.cpu, pre.c, x.c, w.c, bias ? b.c : NULL, N, IC, OC));
		OK(F.cpu.ops->gelu_fwd(&F.cpu, out.c, pre.c, no));
		OK(F.gpu.ops->matmul_gelu_fwd(&F.gpu, out.g, pre.g, x.g, w.g, bias ? b.g : NULL, N,
					      IC, OC));
		OK(F.gpu.ops->sync(&F.gpu));
		same(bias ? "fused gelu pre" : "fused gelu pre, no bias", pre, T_ACT);
		same(bias ? "fused gelu out" : "fused gelu out, no bias", out, T_ACT);
	}
	free(hx);
	free(hw);
	free(hb);
	free(hp);
}

Test(device_cuda, matmul_with_the_gelu_forward_fused)
{
	BOTH_PRECISIONS(gelu_fwd_case);
}

/* ---- layernorm, elementwise -------------------------------------------------------- */

static void layernorm_case(void)
{
	int N = 21, C = 40;
	size_t n = (size_t)N * C, wsb = F.cpu.ops->ws_bytes(&F.cpu, 1, C, 1);
	float *hx = rnd(n, 2.0f), *hw = rnd(C, 1.0f), *hb = rnd(C, 1.0f), *hd = rnd(n, 1.0f);
	float *hdi = rnd(n, 1.0f);
	struct pr x = act_in(hx, n), w = act_in(hw, C), b = act_in(hb, C), dout = act_in(hd, n);
	struct pr out = act_zero(n), mean = f32_in(NULL, N), rstd = f32_in(NULL, N);
	struct pr dinp = act_in(hdi, n), dw = f32_in(hw, C), db = f32_in(hb, C);
	struct pr ws = { dalloc(&F.cpu, wsb), dalloc(&F.gpu, 1), 0, 0 };

	BOTH(layernorm_fwd, P(out), P(mean), P(rstd), P(x), P(w), P(b), N, C);
	same("layernorm out", out, T_ACT);
	same("layernorm mean", mean, T_F32);
	same("layernorm rstd", rstd, T_F32);
	BOTH(layernorm_bwd, P(dinp), P(dw), P(db), P(dout), P(x), P(w), P(mean), P(rstd), N, C,
	     P(ws));
	same("layernorm dinp +=", dinp, T_GRAD);
	same("layernorm dw +=", dw, T_F32);
	same("layernorm db +=", db, T_F32);
	free(hx);
	free(hw);
	free(hb);
	free(hd);
	free(hdi);
}

/* The residual add fused into the LayerNorm (cuda) against the two apart
 * (the cpu device has no fusion). */
static void add_layernorm_case(void)
{
	int N = 21, C = 40;
	size_t n = (size_t)N * C;
	float *hy = rnd(n, 2.0f), *hx = rnd(n, 2.0f), *hw = rnd(C, 1.0f), *hb = rnd(C, 1.0f);
	struct pr y = act_in(hy, n), x = act_in(hx, n), w = act_in(hw, C), b = act_in(hb, C);
	struct pr out = act_zero(n), mean = f32_in(NULL, N), rstd = f32_in(NULL, N);

	cr_assert_null(F.cpu.ops->add_layernorm_fwd);
	OK(F.cpu.ops->add(&F.cpu, y.c, x.c, n));
	OK(F.cpu.ops->layernorm_fwd(&F.cpu, out.c, mean.c, rstd.c, y.c, w.c, b.c, N, C));
	OK(F.gpu.ops->add_layernorm_fwd(&F.gpu, y.g, out.g, mean.g, rstd.g, x.g, w.g, b.g, N, C));
	OK(F.gpu.ops->sync(&F.gpu));
	same("add_layernorm sum", y, T_ACT);
	same("add_layernorm out", out, T_GRAD);
	same("add_layernorm mean", mean, T_GRAD); /* of the rounded sum */
	same("add_layernorm rstd", rstd, T_GRAD);
	free(hy);
	free(hx);
	free(hw);
	free(hb);
}

Test(device_cuda, residual_add_fused_into_the_layernorm)
{
	BOTH_PRECISIONS(add_layernorm_case);
}

Test(device_cuda, layernorm_forward_and_backward)
{
	BOTH_PRECISIONS(layernorm_case);
}

static void elementwise_case(void)
{
	int n = 7, C = 33;
	size_t m = (size_t)n * C;
	float *hx = rnd(m, 2.0f), *hy = rnd(m, 1.0f), *hb = rnd(C, 1.0f);
	struct pr x = act_in(hx, m), y = act_in(hy, m), b = act_in(hb, C), o = act_zero(m);
	struct pr d = act_in(hy, m), f = f32_in(hx, m), f2 = f32_in(hy, m);

	BOTH(gelu_fwd, P(o), P(x), m);
	same("gelu out", o, T_ACT);
	BOTH(gelu_bwd, P(d), P(x), P(d), m); /* in place, as the model does */
	same("gelu dinp (aliasing dout)", d, T_ACT);
	BOTH(add, P(y), P(x), m);
	same("add", y, T_ACT);
	BOTH(add_bias, P(y), P(b), n, C);
	same("add_bias", y, T_GRAD);
	BOTH(add_f32, P(f), P(f2), m);
	same("add_f32", f, T_F32);
	BOTH(scale, P(f), m, -0.375f);
	same("scale", f, T_F32);
	{
		/* three ranges, one of them empty */
		size_t off[3] = { 0, 100, 100 }, len[3] = { 100, 0, m - 100 };
		double sc[3], sg[3] = { -1.0, -1.0, -1.0 };
		int r;
		OK(F.cpu.ops->sumsq(&F.cpu, f.c, off, len, 3, sc));
		OK(F.gpu.ops->sumsq(&F.gpu, f.g, off, len, 3, sg));
		for (r = 0; r < 3; r++)
			cr_assert(fabs(sg[r] - sc[r]) <= 1e-6 * sc[r], "sumsq %d: cuda %.10g cpu %.10g",
				  r, sg[r], sc[r]);
		cr_assert_eq(sg[1], 0.0);
		cr_assert_gt(sg[0], 0.0);
	}
	free(hx);
	free(hy);
	free(hb);
}

Test(device_cuda, elementwise_bias_and_gradient_helpers)
{
	BOTH_PRECISIONS(elementwise_case);
}

/* ---- embedding ------------------------------------------------------------------------ */

static void embedding_case(void)
{
	int B = 2, T = 9, C = 24, V = 11, N = B * T, i;
	float *hte = rnd((size_t)V * C, 1.0f), *hpe = rnd((size_t)T * C, 1.0f);
	float *hd = rnd((size_t)N * C, 1.0f), *hg = rnd((size_t)V * C, 1.0f);
	int *tok = xmalloc(sizeof(int) * N);
	struct pr wte, wpe, dout, out, dwte, dwpe, dt;

	for (i = 0; i < N; i++) /* repeats, and rows of another rank's slice */
		tok[i] = i % 5 == 3 ? -1 : (int)mr_rng_below(&rng, 6);
	wte = act_in(hte, (size_t)V * C);
	wpe = act_in(hpe, (size_t)T * C);
	dout = act_in(hd, (size_t)N * C);
	out = act_zero((size_t)N * C);
	dwte = f32_in(hg, (size_t)V * C);
	dwpe = f32_in(hpe, (size_t)T * C);
	dt = int_in(tok, N);

	BOTH(embed_fwd, P(out), P(dt), P(wte), P(wpe), B, T, C);
	same("embed out", out, T_ACT);
	BOTH(embed_fwd, P(out), P(dt), P(wte), NULL, B, T, C);
	same("embed out, no positions, tok < 0", out, T_ACT);
	BOTH(embed_bwd, P(dwte), P(dwpe), P(dout), P(dt), tok, B, T, C);
	same("embed dwte +=", dwte, T_F32);
	same("embed dwpe +=", dwpe, T_F32);
	BOTH(embed_bwd, P(dwte), NULL, P(dout), P(dt), tok, B, T, C);
	same("embed dwte, no dwpe", dwte, T_F32);
	/* an sp shard: 6 rows of period 3 from position 3 (rank 1 of 3) */
	BOTH(add_pos, P(out), P(wpe), 6, C, 3, 3);
	same("add_pos", out, T_GRAD);
	free(hte);
	free(hpe);
	free(hd);
	free(hg);
	free(tok);
}

Test(device_cuda, embedding_with_foreign_tokens_and_positions)
{
	BOTH_PRECISIONS(embedding_case);
}

/* ---- cross-entropy ------------------------------------------------------------------- */

static void crossentropy_case(void)
{
	int N = 13, V = 37, i;
	size_t nv = (size_t)N * V;
	float *hl = rnd(nv, 3.0f);
	int *tgt = xmalloc(sizeof(int) * N), *tgt_tp = xmalloc(sizeof(int) * N);
	struct pr lg, lg2, t, t2, loss = f32_in(NULL, N), lse = f32_in(NULL, N);
	struct pr mx = f32_in(NULL, N), sum = f32_in(NULL, N), tl = f32_in(NULL, N);

	for (i = 0; i < N; i++) {
		tgt[i] = (int)mr_rng_below(&rng, (uint64_t)V);
		tgt_tp[i] = i % 3 == 1 ? -1 : tgt[i];
	}
	lg = act_in(hl, nv);
	lg2 = act_in(hl, nv);
	t = int_in(tgt, N);
	t2 = int_in(tgt_tp, N);

	BOTH(ce_fwd, P(loss), P(lse), P(lg), P(t), N, V);
	same("ce losses", loss, T_F32);
	same("ce lse", lse, T_F32);
	BOTH(ce_bwd, P(lg), P(lse), P(t), N, V, 0.25f);
	same("ce dlogits * dscale", lg, T_ACT);
	/* the vocab-parallel pieces, targets < 0 on another rank */
	BOTH(ce_rowmax, P(mx), P(lg2), N, V);
	same("ce rowmax", mx, T_F32);
	BOTH(ce_sumexp, P(sum), P(tl), P(lg2), P(mx), P(t2), N, V);
	same("ce sumexp", sum, T_F32);
	same("ce target logit (0 for tgt < 0)", tl, T_F32);
	BOTH(ce_finish, P(loss), P(lse), P(mx), P(sum), P(tl), N);
	same("ce finish losses", loss, T_F32);
	same("ce finish lse", lse, T_F32);
	BOTH(ce_bwd, P(lg2), P(lse), P(t2), N, V, 1.0f / N);
	same("ce dlogits, tgt < 0 rows", lg2, T_ACT);
	/* padded vocabulary columns */
	BOTH(fill_cols, P(lg2), N, V, V - 4, -1e30f);
	same("fill_cols -1e30", lg2, T_ACT);
	BOTH(fill_cols, P(lg2), N, V, 5, 0.0f);
	same("fill_cols 0", lg2, T_ACT);
	free(hl);
	free(tgt);
	free(tgt_tp);
}

Test(device_cuda, crossentropy_and_its_vocab_parallel_pieces)
{
	BOTH_PRECISIONS(crossentropy_case);
}

/* ---- attention ------------------------------------------------------------------------ */

/* The cuda side of p within relative L2 error tol of the cpu side (the
 * layer attention through cuDNN: bf16 noise of random sign, not
 * elementwise-tight; see test_cuda_attention.c). */
static void near_l2(const char *what, struct pr p, double tol)
{
	float *c = get(&F.cpu, p.c, p.n, p.act), *g = get(&F.gpu, p.g, p.n, p.act);
	double e = rel_l2(g, c, p.n);

	cr_expect(e <= tol, "%s: rel L2 %g > %g", what, e, tol);
	free(c);
	free(g);
}

/* A whole causal layer of NH query heads and NKV key/value heads (qkv
 * rows of C + 2*NKV*hs) on both devices, forward and backward; l2: the
 * cuDNN path's bounds (relative L2) instead of elementwise ones. */
static void attention_layer_tol(int B, int T, int C, int NH, int NKV, int l2)
{
	size_t nq = (size_t)B * T * (C + 2 * (size_t)NKV * (C / NH)), n = (size_t)B * T * C;
	size_t wsb = F.cpu.ops->ws_bytes(&F.cpu, T, C, NH);
	float *hq = rnd(nq, 1.0f), *hd = rnd(n, 1.0f), *hg = rnd(nq, 1.0f);
	struct pr qkv = act_in(hq, nq), dout = act_in(hd, n), out = act_zero(n);
	struct pr lse = f32_in(NULL, (size_t)B * NH * T), dqkv = act_in(hg, nq);
	struct pr ws = { dalloc(&F.cpu, wsb), dalloc(&F.gpu, 1), 0, 0 };

	cr_log_info("attention layer B %d T %d C %d NH %d NKV %d (%s)", B, T, C, NH, NKV,
		    F.bf16 ? "bf16" : "fp32");
	BOTH(attn_fwd, P(out), P(lse), P(qkv), B, T, C, NH, NKV, P(ws));
	if (l2) {
		near_l2("attn out", out, 1e-2);
		near_l2("attn lse", lse, 1e-3);
	} else {
		same("attn out", out, T_ACT);
		same("attn lse", lse, T_F32);
	}
	/* dqkv is written (=): its old contents must not leak in */
	BOTH(attn_bwd, P(dqkv), P(dout), P(qkv), P(out), P(lse), B, T, C, NH, NKV, P(ws));
	if (l2)
		near_l2("attn dqkv", dqkv, 1e-2);
	else
		same("attn dqkv", dqkv, T_GRAD);
	free(hq);
	free(hd);
	free(hg);
}

static void attention_layer(int B, int T, int C, int NH, int NKV)
{
	attention_layer_tol(B, T, C, NH, NKV, 0);
}

/* The elementwise cases above are the block-wise kernels' (on a GPU with
 * cuDNN the bf16 layer would run through it, within other bounds): the
 * cuDNN path is turned off for them, and checked on its own below. */
static void own_kernels(void)
{
	setenv("MESHRUN_CUDNN", "0", 1); /* read when the device opens */
}

static void attention_case(void)
{
	int B = 2, T = 19, C = 64, NH = 2; /* head size 32: the device kernels' minimum */
	struct pr out = act_zero((size_t)B * T * C), lse = f32_in(NULL, (size_t)B * 4 * T);
	struct pr qkv = act_zero((size_t)B * T * 3 * C);

	attention_layer(B, T, C, NH, NH);
	/* a head size the device kernels do not support is refused */
	cr_assert_eq(F.gpu.ops->attn_fwd(&F.gpu, out.g, lse.g, qkv.g, B, T, C, 4, 4, NULL),
		     MR_EINVAL);
	/* and so is a key/value head count that does not divide NH */
	cr_assert_eq(F.gpu.ops->attn_fwd(&F.gpu, out.g, lse.g, qkv.g, B, T, C, NH, 3, NULL),
		     MR_EINVAL);
}

Test(device_cuda, attention_forward_and_backward)
{
	own_kernels();
	BOTH_PRECISIONS(attention_case);
}

/* Grouped-query attention: 4 query heads of size 32 on 2 key/value heads
 * and on 1 (multi-query), T past one tile of the kernels. */
static void gqa_case(void)
{
	cr_assert(F.gpu.attn_gqa, "the cuda device takes n_kv_head < n_head");
	attention_layer(2, 37, 128, 4, 2);
	attention_layer(1, 37, 128, 4, 1);
}

Test(device_cuda, grouped_query_attention_forward_and_backward)
{
	own_kernels();
	BOTH_PRECISIONS(gqa_case);
}

/* The layer attention of the bf16 cuda device through cuDNN (a real GPU;
 * the emulation has no cuDNN): within bf16 noise of the cpu device, and
 * not counted as a fallback. 4 query heads of 64 on 2 key/value heads. */
Test(device_cuda, attention_through_cudnn_bf16)
{
#ifdef MR_CUDA_EMUL
	cr_skip_test("the emulation has no cuDNN");
#else
	setup(1);
	attention_layer_tol(2, 128, 256, 4, 2, 1);
	attention_layer_tol(1, 256, 256, 4, 4, 1);
	OK(F.gpu.ops->sync(&F.gpu));
	cr_expect_eq(F.gpu.fallbacks, 0, "the device took %ld slow paths (the log names why)",
		     F.gpu.fallbacks);
	teardown();
#endif
}

/* The context-parallel pieces on a grouped-query layout: B 2, T 40, 4
 * query heads of 32 on 2 key/value heads, qkv rows of W = C + 2*NKV*hs.
 * Queries [T/2, T) against key blocks [0, T/2) and [T/2, T), each a fp32
 * partial (the first written, the second merged into it), delta from the
 * merged output, then the backward per key block into fp32 gradients
 * (dk, dv rows of NKV heads). */
enum { S_B = 2, S_T = 40, S_NH = 4, S_NKV = 2, S_HS = 32, S_C = S_NH * S_HS,
       S_W = S_C + 2 * S_NKV * S_HS, S_HALF = S_T / 2 };

/* Query rows [T/2, T) against key block blk of qkv on the device g
 * (BOTH's g_), in *a. */
static const struct mr_dev_attn *gqa_slice(int g, struct pr qkv, int blk, struct mr_dev_attn *a)
{
	struct mr_dev *d = g ? &F.gpu : &F.cpu;
	const mr_act *q = g ? qkv.g : qkv.c;
	size_t k0 = (size_t)blk * S_HALF * S_W;

	memset(a, 0, sizeof(*a));
	a->q = mr_dev_at(d, q, (size_t)S_HALF * S_W);
	a->k = mr_dev_at(d, q, k0 + S_C);
	a->v = mr_dev_at(d, q, k0 + S_C + S_NKV * S_HS);
	a->q_row = a->kv_row = S_W;
	a->q_batch = a->kv_batch = (size_t)S_T * S_W;
	a->B = S_B;
	a->NH = S_NH;
	a->NKV = S_NKV;
	a->hs = S_HS;
	a->tq = a->tk = S_HALF;
	a->q_pos0 = S_HALF;
	a->k_pos0 = blk * S_HALF;
	a->causal = 1;
	a->scale = 1.0f / sqrtf((float)S_HS);
	return a;
}

static void gqa_slices_case(void)
{
	size_t no = (size_t)S_B * S_HALF * S_C, nl = (size_t)S_B * S_NH * S_HALF;
	size_t nqkv = (size_t)S_B * S_T * S_W, kvw = (size_t)S_NKV * S_HS;
	size_t nkv = (size_t)S_B * S_T * kvw, ob = (size_t)S_HALF * S_C;
	float *hq = rnd(nqkv, 1.0f), *hd = rnd(no, 1.0f);
	struct pr qkv = act_in(hq, nqkv), dout = act_in(hd, no), outa;
	struct pr o32 = f32_in(NULL, no), p32 = f32_in(NULL, no);
	struct pr lse = f32_in(NULL, nl), plse = f32_in(NULL, nl), delta = f32_in(NULL, nl);
	struct pr dq = f32_in(NULL, no), dk = f32_in(NULL, nkv), dv = f32_in(NULL, nkv);
	struct mr_dev_attn a;
	float *ho;
	size_t i;
	int blk;

	BOTH(attn_part_fwd, gqa_slice(g_, qkv, 0, &a), P(o32), (size_t)S_C, ob, P(lse));
	BOTH(attn_part_fwd, gqa_slice(g_, qkv, 1, &a), P(p32), (size_t)S_C, ob, P(plse));
	BOTH(attn_merge, P(o32), P(lse), P(p32), P(plse), S_B, S_NH, S_HALF, S_HS, (size_t)S_C,
	     ob);
	same("slice out", o32, T_F32);
	same("slice lse", lse, T_F32);
	/* the output in the activation type, the same values on both sides */
	ho = get(&F.gpu, o32.g, no, 0);
	for (i = 0; i < no && F.bf16; i++)
		ho[i] = mr_bf16_to_f32(mr_bf16_from_f32(ho[i]));
	outa = act_in(ho, no);
	BOTH(attn_delta, P(delta), P(dout), P(outa), S_B, S_NH, S_HALF, S_HS, (size_t)S_C, ob);
	same("slice delta", delta, T_F32);
	BOTH(zero, P(dq), no * sizeof(float));
	BOTH(zero, P(dk), nkv * sizeof(float));
	BOTH(zero, P(dv), nkv * sizeof(float));
	for (blk = 0; blk < 2; blk++) {
		size_t g0 = (size_t)blk * S_HALF * kvw;

		BOTH(attn_part_bwd, gqa_slice(g_, qkv, blk, &a), P(dout), (size_t)S_C, ob, P(lse),
		     P(delta), P(dq), (size_t)S_C, ob, (float *)P(dk) + g0, (float *)P(dv) + g0,
		     kvw, (size_t)S_T * kvw);
	}
	same("slice dq", dq, T_F32);
	same("slice dk", dk, T_F32);
	same("slice dv", dv, T_F32);
	free(ho);
	free(hq);
	free(hd);
}

Test(device_cuda, grouped_query_context_parallel_slices)
{
	BOTH_PRECISIONS(gqa_slices_case);
}

/* ---- optimizer ------------------------------------------------------------------------- */

/* One AdamW range, decayed, as a one-element array (a compound literal). */
#define ONE_RANGE(p, pc, g, m, v, n)                                                    \
	(&(struct mr_dev_adamw_range){ (float *)(p), (mr_act *)(pc), (const float *)(g), \
				       (float *)(m), (float *)(v), (n), 1 })

static void adamw_case(void)
{
	size_t n = 301;
	float *hp = rnd(n, 1.0f), *hg = rnd(n, 0.1f);
	struct pr p = f32_in(hp, n), g = f32_in(hg, n), m = f32_in(NULL, n), v = f32_in(NULL, n);
	struct pr pc = act_zero(n);
	struct mr_dev_adamw o = { 3e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0, 1.0f };
	float *got;
	size_t i;

	BOTH(zero, P(m), n * sizeof(float));
	BOTH(zero, P(v), n * sizeof(float));
	for (o.t = 1; o.t <= 3; o.t++) {
		o.weight_decay = o.t == 2 ? 0.0f : 0.1f;
		BOTH(adamw_args, &o);
		BOTH(adamw, ONE_RANGE(P(p), P(pc), P(g), P(m), P(v), n), 1);
	}
	same("adamw p", p, T_F32);
	same("adamw m", m, T_F32);
	same("adamw v", v, T_F32);
	/* the compute copy is the new master in the activation type */
	got = get(&F.gpu, pc.g, n, 1);
	{
		float *mp = get(&F.gpu, p.g, n, 0);
		for (i = 0; i < n; i++)
			cr_assert_eq(got[i], F.bf16 ? mr_bf16_to_f32(mr_bf16_from_f32(mp[i])) : mp[i],
				     "compute copy [%zu]", i);
		free(mp);
	}
	free(got);
	/* pc NULL and pc == p (an fp32 device's copy is the master) */
	o.t = 4;
	BOTH(adamw_args, &o);
	BOTH(adamw, ONE_RANGE(P(p), NULL, P(g), P(m), P(v), n), 1);
	if (!F.bf16) {
		o.t = 5;
		BOTH(adamw_args, &o);
		BOTH(adamw, ONE_RANGE(P(p), (mr_act *)P(p), P(g), P(m), P(v), n), 1);
	}
	same("adamw p after pc NULL / aliased", p, T_F32);
	free(hp);
	free(hg);
}

Test(device_cuda, adamw_writes_master_state_and_compute_copy)
{
	BOTH_PRECISIONS(adamw_case);
}

/* Many ranges in one call (one launch on cuda): tensors of a chunk and
 * more (past the kernel's 65,536-element chunks), tiny ones and an empty
 * one, with and without decay and compute copy, in the order a step
 * passes them - the same as the cpu device's; then the same table again
 * (no new upload) and a changed one (one range fewer). */
static void adamw_ranges_case(void)
{
	static const size_t len[] = { 70001, 3, 0, 65536, 1, 2048 };
	enum { K = sizeof(len) / sizeof(len[0]) };
	size_t n = 0, off[K], i;
	struct mr_dev_adamw_range rc[K], rg[K];
	struct mr_dev_adamw o = { 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0, 1.0f };
	float *hp, *hg;
	struct pr p, g, m, v, pc;
	int k;

	for (k = 0; k < K; k++) {
		off[k] = n;
		n += len[k];
	}
	hp = rnd(n, 1.0f);
	hg = rnd(n, 0.1f);
	p = f32_in(hp, n), g = f32_in(hg, n), m = f32_in(NULL, n), v = f32_in(NULL, n);
	pc = act_zero(n);
	BOTH(zero, P(m), n * sizeof(float));
	BOTH(zero, P(v), n * sizeof(float));
	for (k = 0; k < K; k++) {
		int pcs = k % 3 != 1; /* some without a compute copy */
		rc[k] = (struct mr_dev_adamw_range){ (float *)p.c + off[k],
						     pcs ? (mr_act *)((float *)pc.c + off[k]) : NULL,
						     (float *)g.c + off[k], (float *)m.c + off[k],
						     (float *)v.c + off[k], len[k], k % 2 == 0 };
		rg[k] = rc[k];
		rg[k].p = (float *)p.g + off[k];
		rg[k].pc = pcs ? mr_dev_at(&F.gpu, pc.g, off[k]) : NULL;
		rg[k].g = (float *)g.g + off[k];
		rg[k].m = (float *)m.g + off[k];
		rg[k].v = (float *)v.g + off[k];
	}
	for (o.t = 1; o.t <= 3; o.t++) {
		int nr = o.t == 3 ? K - 1 : K;
		OK(F.cpu.ops->adamw_args(&F.cpu, &o));
		OK(F.cpu.ops->adamw(&F.cpu, rc, nr));
		OK(F.gpu.ops->adamw_args(&F.gpu, &o));
		OK(F.gpu.ops->adamw(&F.gpu, rg, nr));
		OK(F.gpu.ops->sync(&F.gpu));
	}
	same("adamw ranges p", p, T_F32);
	same("adamw ranges m", m, T_F32);
	same("adamw ranges v", v, T_F32);
	{
		float *got = get(&F.gpu, pc.g, n, 1), *mp = get(&F.gpu, p.g, n, 0);
		for (k = 0; k < K; k++)
			for (i = off[k]; i < off[k] + len[k]; i++)
				cr_assert_eq(got[i],
					     k % 3 == 1 ? 0.0f
					     : F.bf16   ? mr_bf16_to_f32(mr_bf16_from_f32(mp[i]))
							: mp[i],
					     "compute copy of range %d [%zu]", k, i - off[k]);
		free(got);
		free(mp);
	}
	free(hp);
	free(hg);
}

Test(device_cuda, adamw_of_many_ranges_in_one_call)
{
	BOTH_PRECISIONS(adamw_ranges_case);
}

/* ---- mixture of experts ------------------------------------------------------------------ */

/* An exchange that moves nothing and records the counts it was given
 * (cap for each expert and a whole-block call counted when it got none:
 * the sync-free path's whole cap blocks). */
struct xrec {
	int calls[4], whole[4];
	int counts[4][8];
};

static int record_xchg(void *ctx, enum mr_moe_phase phase, float *buf, const int *counts, int E,
		       int cap, size_t row)
{
	struct xrec *x = ctx;
	int e;

	(void)buf;
	(void)row;
	x->calls[phase]++;
	x->whole[phase] += counts == NULL;
	for (e = 0; e < E && e < 8; e++)
		x->counts[phase][e] = counts ? counts[e] : cap;
	return 0;
}

/* How the cuda side runs the layer: the host path for want of a stat
 * array, sync-free (capacity routing, stat on the device; also with a
 * context-parallel count_reduce), or dropless (stat given; the host path
 * by policy). */
enum moe_mode { MOE_NO_STAT, MOE_SYNC_FREE, MOE_CP, MOE_DROPLESS };

/* A context-parallel count_reduce of 2 ranks whose other rank routed
 * nothing (the sum is routed itself): counts its calls, touches nothing,
 * so the aux loss is formed from sums over 2 ranks on both devices. */
static int count_calls(void *ctx, int *routed, int E)
{
	(void)routed;
	(void)E;
	++*(int *)ctx;
	return 0;
}

/* One MoE layer's acts and workspace on d, the expert rows and the
 * workspace poisoned (all-ones bytes: NaN in either type), so a padded
 * row the device forgets to zero reaches the gradients as NaN. */
static void moe_bind(struct mr_dev *d, const struct mr_moe_shape *s, struct mr_moe_acts *a,
		     void **ws)
{
	size_t fb = mr_moe_act_floats(s) * sizeof(float), wb = mr_moe_ws_floats(s) * sizeof(float);
	float *f = dalloc(d, fb);
	int *iv = dalloc(d, mr_moe_act_ints(s) * sizeof(int));
	unsigned char *nan = xmalloc(fb > wb ? fb : wb);

	memset(nan, 0xff, fb > wb ? fb : wb);
	mr_moe_acts_bind(a, s, f, iv);
	*ws = dalloc(d, wb);
	OK(d->ops->upload(d, f, nan, fb));
	OK(d->ops->upload(d, *ws, nan, wb));
	free(nan);
}

/* Host reads of the cuda side so far: the emulation counts them; -1 on a
 * real GPU (not checked there). */
static long host_reads(void)
{
#ifdef MR_CUDA_EMUL
	return mr_cuda_emul_host_reads(0);
#else
	return -1;
#endif
}

/* Rows [count[e], cap) of each expert's block of rows (E,cap,C) of the
 * cuda side are exactly zero; count is the device's. */
static void padded_rows_zero(const char *what, const struct mr_moe_shape *s,
			     const struct mr_moe_acts *a, const void *rows, int width)
{
	size_t n = (size_t)s->E * s->cap * width, i;
	float *h = get(&F.gpu, rows, n, 1);
	int count[8], e;

	OK(F.gpu.ops->download(&F.gpu, count, a->count, sizeof(int) * (size_t)s->E));
	for (e = 0; e < s->E; e++)
		for (i = (size_t)count[e] * width; i < (size_t)s->cap * width; i++)
			cr_assert(h[(size_t)e * s->cap * width + i] == 0.0f,
				  "%s: expert %d padded element %zu is %g, not 0", what, e, i,
				  h[(size_t)e * s->cap * width + i]);
	free(h);
}

/* The cuda side's aux loss and dropped count after a forward: on the
 * host, or read from its stat on the device. */
static void moe_stat_of(const struct mr_moe_acts *a, float *aux, int *dropped)
{
	int st[2];

	*aux = a->aux;
	*dropped = a->dropped;
	if (!a->stat_on_dev)
		return;
	OK(F.gpu.ops->download(&F.gpu, st, a->stat, sizeof(st)));
	memcpy(aux, &st[0], sizeof(float));
	*dropped = st[1];
}

static void moe_layer(int k, float cf, enum moe_mode mode)
{
	int B = 2, T = 10, C = 32, E = 4, H = 4 * C, N = B * T, dropless = mode == MOE_DROPLESS, i;
	struct mr_moe_shape s = { N, C, H, E, k, dropless ? N : mr_moe_capacity(N, E, k, cf),
				  0, 0, dropless };
	float *hx = rnd((size_t)N * C, 1.0f), *hr = rnd((size_t)E * C, 0.5f);
	float *hfw = rnd((size_t)E * H * C, 0.1f), *hfb = rnd((size_t)E * H, 0.1f);
	float *hpw = rnd((size_t)E * C * H, 0.1f), *hpb = rnd((size_t)E * C, 0.1f);
	float *hdy = rnd((size_t)N * C, 1.0f), *one = xmalloc(sizeof(float) * N), aux;
	struct pr x, rw, fw, fb, pw, pb, y, dy, dx, drw, dfw, dfb, dpw, dpb, ones, ws;
	struct mr_moe_acts ac, ag;
	struct mr_moe_ws wg;
	struct xrec rc_, rg_;
	int sync_free = mode == MOE_SYNC_FREE || mode == MOE_CP, dropped, cc = 0, cg = 0;
	int cp = mode == MOE_CP ? 2 : 0;
	struct mr_moe_xchg xc = { .fn = record_xchg, .ctx = &rc_, .count_ctx = &cc,
				  .count_ranks = cp, .count_reduce = cp ? count_calls : NULL };
	struct mr_moe_xchg xg = { .fn = record_xchg, .ctx = &rg_, .count_ctx = &cg,
				  .count_ranks = cp, .count_reduce = cp ? count_calls : NULL };
	long reads, host_fwds = F.gpu.moe_host_counts;

	for (i = 0; i < N; i++)
		one[i] = 1.0f;
	memset(&rc_, 0, sizeof(rc_));
	memset(&rg_, 0, sizeof(rg_));
	x = act_in(hx, (size_t)N * C);
	rw = act_in(hr, (size_t)E * C);
	fw = act_in(hfw, (size_t)E * H * C);
	fb = act_in(hfb, (size_t)E * H);
	pw = act_in(hpw, (size_t)E * C * H);
	pb = act_in(hpb, (size_t)E * C);
	dy = act_in(hdy, (size_t)N * C);
	y = act_zero((size_t)N * C);
	dx = act_zero((size_t)N * C);
	ones = act_in(one, N);
	drw = f32_in(hr, (size_t)E * C);
	dfw = f32_in(hfw, (size_t)E * H * C);
	dfb = f32_in(hfb, (size_t)E * H);
	dpw = f32_in(hpw, (size_t)E * C * H);
	dpb = f32_in(hpb, (size_t)E * C);
	moe_bind(&F.cpu, &s, &ac, &ws.c);
	moe_bind(&F.gpu, &s, &ag, &ws.g);
	if (mode != MOE_NO_STAT)
		ag.stat = dalloc(&F.gpu, 2 * sizeof(int));

	reads = host_reads();
	OK(F.cpu.ops->moe_fwd(&F.cpu, &s, &ac, &xc, y.c, x.c, rw.c, fw.c, fb.c, pw.c, pb.c));
	OK(F.gpu.ops->moe_fwd(&F.gpu, &s, &ag, &xg, y.g, x.g, rw.g, fw.g, fb.g, pw.g, pb.g));
	OK(F.gpu.ops->sync(&F.gpu));
	if (reads >= 0)
		cr_assert(sync_free ? host_reads() == reads : host_reads() > reads,
			  "mode %d: the forward read the host %ld times", mode,
			  host_reads() - reads);
	cr_assert_eq(ag.stat_on_dev, sync_free);
	cr_assert_eq(F.gpu.moe_host_counts, host_fwds + !sync_free);
	same("moe y", y, T_GRAD);
	moe_stat_of(&ag, &aux, &dropped);
	cr_assert(fabsf(aux - ac.aux) <= 1e-5f * fabsf(ac.aux), "aux cuda %g cpu %g", aux, ac.aux);
	cr_assert_eq(dropped, ac.dropped, "dropped cuda %d cpu %d", dropped, ac.dropped);
	cr_assert(cg == !!cp && cc == !!cp, "count_reduce calls: cuda %d cpu %d", cg, cc);
	cr_assert_eq(rg_.calls[MR_MOE_DISPATCH], 1);
	cr_assert_eq(rg_.calls[MR_MOE_COMBINE], 1);
	cr_assert_eq(rg_.whole[MR_MOE_DISPATCH], sync_free, "whole cap blocks exchanged");
	for (i = 0; i < E && !sync_free; i++)
		cr_assert_eq(rg_.counts[MR_MOE_DISPATCH][i], rc_.counts[MR_MOE_DISPATCH][i],
			     "expert %d: counts given to the exchange differ", i);
	if (sync_free)
		padded_rows_zero("xin after the dispatch", &s, &ag, ag.xin, C);

	reads = host_reads();
	OK(F.cpu.ops->moe_bwd(&F.cpu, &s, &ac, &xc, dx.c, dy.c, x.c, rw.c, fw.c, pw.c, drw.c,
			      dfw.c, dfb.c, dpw.c, dpb.c, 0.3f, ws.c, ones.c));
	OK(F.gpu.ops->moe_bwd(&F.gpu, &s, &ag, &xg, dx.g, dy.g, x.g, rw.g, fw.g, pw.g, drw.g,
			      dfw.g, dfb.g, dpw.g, dpb.g, 0.3f, ws.g, ones.g));
	OK(F.gpu.ops->sync(&F.gpu));
	if (reads >= 0)
		cr_assert(sync_free ? host_reads() == reads : host_reads() > reads,
			  "mode %d: the backward read the host %ld times", mode,
			  host_reads() - reads);
	same("moe dx", dx, T_GRAD);
	same("moe drouterw +=", drw, T_GRAD);
	same("moe dfcw +=", dfw, T_GRAD);
	same("moe dfcb +=", dfb, T_GRAD);
	same("moe dfcprojw +=", dpw, T_GRAD);
	same("moe dfcprojb +=", dpb, T_GRAD);
	cr_assert_eq(rg_.calls[MR_MOE_DISPATCH_GRAD], 1);
	cr_assert_eq(rg_.calls[MR_MOE_COMBINE_GRAD], 1);
	cr_assert_eq(rg_.whole[MR_MOE_COMBINE_GRAD], sync_free, "whole cap blocks exchanged");
	for (i = 0; i < E && !sync_free; i++)
		cr_assert_eq(rg_.counts[MR_MOE_COMBINE_GRAD][i], rc_.counts[MR_MOE_COMBINE_GRAD][i]);
	if (sync_free) {
		mr_moe_ws_bind(&wg, &s, ws.g);
		padded_rows_zero("dyo after the combine's backward", &s, &ag, wg.dyo, C);
		padded_rows_zero("dh after the experts' backward", &s, &ag, wg.dh, H);
	}
	free(hx);
	free(hr);
	free(hfw);
	free(hfb);
	free(hpw);
	free(hpb);
	free(hdy);
	free(one);
}

static void moe_case(void)
{
	moe_layer(1, 1.25f, MOE_NO_STAT);
	moe_layer(2, 0.5f, MOE_NO_STAT); /* capacity 5 of 40 assignments per 4 experts: drops */
}

Test(device_cuda, moe_forward_and_backward_top1_top2_with_drops)
{
	BOTH_PRECISIONS(moe_case);
}

/* Capacity routing runs sync-free: no host read in the forward or the
 * backward, whole cap blocks to the exchange, padded rows exactly zero
 * (poisoned first), results as the cpu's; dropless reads the host. */
static void moe_sync_free_case(void)
{
	moe_layer(1, 1.25f, MOE_SYNC_FREE);
	moe_layer(2, 0.5f, MOE_SYNC_FREE);
	moe_layer(2, 0.5f, MOE_CP);
	moe_layer(2, 0.5f, MOE_DROPLESS);
}

Test(device_cuda, moe_capacity_runs_sync_free_and_dropless_reads_counts)
{
	BOTH_PRECISIONS(moe_sync_free_case);
}

/* ---- timing by kind ------------------------------------------------------------------- */

/* time_ops/time_take: each operation counts under its kind, one past the
 * room is counted untimed, sync is not an operation, and nothing is
 * timed once stopped. The cpu device has no timing. */
static void timing_case(void)
{
	struct mr_dev *d = &F.gpu;
	struct mr_dev_times t;
	int N = 256, C = 256, k;
	float *hx = rnd((size_t)N * C, 1.0f), *hw = rnd((size_t)C * C, 1.0f);
	struct pr x = act_in(hx, (size_t)N * C), w = act_in(hw, (size_t)C * C);
	struct pr y = act_zero((size_t)N * C), g = f32_in(hw, (size_t)C * C);
	double busy = 0.0;

	cr_assert_null(F.cpu.ops->time_ops);
	cr_assert_not_null(d->ops->time_ops);
	OK(d->ops->sync(d));
	OK(d->ops->time_ops(d, 3));
	OK(d->ops->matmul_fwd(d, y.g, x.g, w.g, NULL, N, C, C));
	OK(d->ops->gelu_fwd(d, y.g, y.g, (size_t)N * C));
	OK(d->ops->sync(d));
	OK(d->ops->zero(d, x.g, mr_dev_act_bytes(d, (size_t)N * C)));
	OK(d->ops->scale(d, g.g, (size_t)C * C, 0.5f)); /* past the room */
	OK(d->ops->time_take(d, &t));
	cr_assert_eq(t.ops, 3);
	cr_assert_eq(t.untimed, 1);
	cr_assert_gt(t.ms[MR_DEV_GEMM], 0.0);
	cr_assert_eq(t.ms[MR_DEV_ATTENTION], 0.0);
	cr_assert_eq(t.ms[MR_DEV_OPTIMIZER], 0.0, "the untimed scale counted");
	for (k = 0; k < MR_DEV_KINDS; k++) {
		cr_assert_geq(t.ms[k], 0.0);
		busy += t.ms[k];
	}
	cr_assert_leq(busy, t.span_ms + 1e-6, "operations %.6f ms in a span of %.6f", busy,
		      t.span_ms);
	/* taken: the next take starts afresh; then stopped: nothing timed */
	OK(d->ops->scale(d, g.g, (size_t)C * C, 0.5f));
	OK(d->ops->time_take(d, &t));
	cr_assert_eq(t.ops, 1);
	cr_assert_eq(t.untimed, 0);
	cr_assert_gt(t.ms[MR_DEV_OPTIMIZER], 0.0);
	cr_assert_eq(t.ms[MR_DEV_GEMM], 0.0);
	OK(d->ops->time_ops(d, 0));
	OK(d->ops->matmul_fwd(d, y.g, x.g, w.g, NULL, N, C, C));
	OK(d->ops->time_take(d, &t));
	cr_assert_eq(t.ops, 0);
	cr_assert_eq(t.span_ms, 0.0);
	cr_assert_str_eq(mr_dev_kind_name(MR_DEV_GEMM), "gemm");
	cr_assert_str_eq(mr_dev_kind_name(MR_DEV_KINDS), "idle");
	free(hx);
	free(hw);
}

Test(device_cuda, timing_counts_each_operation_under_its_kind)
{
	BOTH_PRECISIONS(timing_case);
}

#ifdef MR_CUDA_EMUL
/* ---- stream-ordered waits (emulation only: its "busy" knob) ----------------
 * A wait the stream has not passed is the device's to watch: a host wait
 * for the stream polls it and fails once its deadline passes or its owner
 * fails, aborting the owner once (the knob keeps the stream "busy" until
 * then, as a GPU's stream waits on a collective that never ends). */

static int fence_aborts;

static int owner_sound(void *owner)
{
	(void)owner;
	return 0;
}

static int owner_lost(void *owner)
{
	(void)owner;
	return MR_EPEER;
}

/* NCCL's kernels return after ncclCommAbort: the stream drains. */
static void owner_abort(void *owner, int rc)
{
	(void)owner;
	(void)rc;
	fence_aborts++;
	mr_cuda_emul_set_busy(0, 0);
}

static long long mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A fence on d with the stream kept busy; returns what `host_wait` gives. */
static int wait_behind_busy_stream(struct mr_dev *d, struct mr_comm_fence *f,
				   int (*host_wait)(struct mr_dev *d))
{
	long waits = mr_cuda_emul_stream_waits(0);

	fence_aborts = 0;
	mr_cuda_emul_set_busy(0, 1);
	OK(d->ops->stream_wait(d, NULL, f));
	cr_assert_eq(mr_cuda_emul_stream_waits(0), waits + 1, "the stream's wait was not queued");
	return host_wait(d);
}

static int sync_of(struct mr_dev *d)
{
	return d->ops->sync(d);
}

static int download_of(struct mr_dev *d)
{
	float h = 0.0f, *g = dalloc(d, sizeof(float));

	return d->ops->download(d, &h, g, sizeof(float));
}

Test(device_cuda, a_stream_wait_past_its_deadline_fails_the_host_wait, .timeout = 60)
{
	struct mr_comm_fence f = { &fence_aborts, "tp", 0, owner_sound, owner_abort };
	struct mr_dev *d;

	setup(0);
	d = &F.gpu;
	f.deadline_ms = mono_ms() + 100;
	cr_expect_eq(wait_behind_busy_stream(d, &f, sync_of), MR_ETIMEDOUT);
	cr_expect_eq(fence_aborts, 1, "the owner was aborted %d times", fence_aborts);
	/* dropped once failed: the next sync neither fails nor aborts again */
	cr_expect_eq(d->ops->sync(d), 0);
	cr_expect_eq(fence_aborts, 1);
	/* a download waits for the stream too */
	f.deadline_ms = mono_ms() + 100;
	cr_expect_eq(wait_behind_busy_stream(d, &f, download_of), MR_ETIMEDOUT);
	cr_expect_eq(fence_aborts, 1);
	mr_cuda_emul_set_busy(0, 0);
	teardown();
}

Test(device_cuda, a_stream_wait_whose_owner_failed_fails_the_host_wait, .timeout = 60)
{
	struct mr_comm_fence f = { &fence_aborts, "dp", 0, owner_lost, owner_abort };

	setup(0);
	f.deadline_ms = mono_ms() + 3600 * 1000; /* far away: the owner's failure decides */
	cr_expect_eq(wait_behind_busy_stream(&F.gpu, &f, sync_of), MR_EPEER);
	cr_expect_eq(fence_aborts, 1);
	mr_cuda_emul_set_busy(0, 0);
	teardown();
}

Test(device_cuda, a_stream_wait_the_stream_passed_is_dropped_quietly)
{
	struct mr_comm_fence f = { &fence_aborts, "tp", 0, owner_lost, owner_abort };

	setup(0);
	fence_aborts = 0;
	f.deadline_ms = mono_ms() - 1; /* would fail if it were still pending */
	OK(F.gpu.ops->stream_wait(&F.gpu, NULL, &f));
	OK(F.gpu.ops->sync(&F.gpu));
	cr_expect_eq(fence_aborts, 0);
	teardown();
}

/* The communicator's side: a host communicator claiming stream order on
 * the emulated device leaves its waits with the device (the host does not
 * sync), a barrier's excepted; one that times out there aborts the
 * communicator, whose next operation fails; an abort from another thread
 * fails the host wait. */
static int comm_on_device(struct mr_comm **c, struct mr_dev_comm *dc, long timeout_ms)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_comm_config cfg = { .id = "sw", .rank = 0, .world_size = 1,
				      .timeout_ms = timeout_ms };
	int rc = mr_comm_init(c, &cfg, &eb);

	cr_assert_eq(rc, 0, "%s", eb.msg);
	mr_dev_comm_init(dc, &F.gpu);
	dc->cd.claim_stream_order = 1;
	mr_comm_set_device(*c, &dc->cd);
	return rc;
}

Test(device_cuda, a_claimed_stream_order_leaves_waits_with_the_device, .timeout = 60)
{
	struct mr_dev_comm dc;
	struct mr_comm *c;
	float one = 1.0f, back = 0.0f, *g;
	long syncs, waits;

	setup(0);
	g = dalloc(&F.gpu, sizeof(float));
	OK(F.gpu.ops->upload(&F.gpu, g, &one, sizeof(float)));
	comm_on_device(&c, &dc, 200);
	cr_assert(mr_comm_stream_ordered(c));
	syncs = mr_cuda_emul_syncs(0);
	waits = mr_cuda_emul_stream_waits(0);
	OK(mr_dev_comm_sync(&F.gpu, c));
	OK(mr_comm_allreduce(c, g, g, 1, MR_COMM_F32, MR_COMM_SUM));
	cr_expect_eq(mr_cuda_emul_syncs(0), syncs, "the host synced before or after");
	cr_expect_eq(mr_cuda_emul_stream_waits(0), waits + 1);
	OK(F.gpu.ops->download(&F.gpu, &back, g, sizeof(float)));
	cr_expect_eq(back, 1.0f);
	/* a barrier synchronizes hosts: never the stream's */
	OK(mr_comm_barrier(c));
	cr_expect_eq(mr_cuda_emul_stream_waits(0), waits + 1, "the barrier went to the stream");
	/* the stream never passes it: the deadline aborts the communicator */
	mr_cuda_emul_set_busy(0, 1);
	OK(mr_comm_allreduce(c, g, g, 1, MR_COMM_F32, MR_COMM_SUM));
	cr_expect_eq(F.gpu.ops->sync(&F.gpu), MR_ETIMEDOUT);
	cr_expect_eq(mr_comm_allreduce(c, g, g, 1, MR_COMM_F32, MR_COMM_SUM), MR_EABORTED);
	mr_cuda_emul_set_busy(0, 0);
	mr_comm_free(c);
	/* aborted by another thread while the stream waits */
	comm_on_device(&c, &dc, 3600 * 1000);
	mr_cuda_emul_set_busy(0, 1);
	OK(mr_comm_allreduce(c, g, g, 1, MR_COMM_F32, MR_COMM_SUM));
	mr_comm_abort(c);
	cr_expect_eq(F.gpu.ops->sync(&F.gpu), MR_EABORTED);
	mr_cuda_emul_set_busy(0, 0);
	mr_comm_free(c);
	teardown();
}
#endif
