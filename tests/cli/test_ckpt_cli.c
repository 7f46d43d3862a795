/*
 * test_ckpt_cli.c - `meshrun ckpt inspect|export|import` as a user runs
 * them, on checkpoints real `meshrun local` jobs wrote (tp 2, pp 2, and
 * MoE with experts over ep 2) and on files made to be wrong.
 *
 * What each test proves:
 *  - tp2: inspect lists the steps newest first, names the mesh and
 *    verifies every record (text and --json); export's values are
 *    bit-identical to the weights file the same run gathered
 *    (save_weights), each Conv1D matrix the transpose of ours; an
 *    independent reader (tests/ckpt/check_safetensors.py: json + struct +
 *    numpy, torch where present) computes the same logits from the file
 *    as meshrun's own forward on the checkpoint, and tells a file with one
 *    square matrix left untransposed apart; export -> import -> export is
 *    byte-identical; an existing output is kept unless --force; a job
 *    resuming from the import starts at its step with the first loss of a
 *    job resuming from the exported step itself.
 *  - pp2 and MoE/ep2: the same export checks for a pipeline's and an
 *    expert-parallel run's checkpoint (MoE names per expert).
 *  - corruption: a flipped byte, a truncated shard and a broken manifest
 *    make inspect exit 1 naming the file and the reason.
 *  - bad safetensors: every malformed file (truncated, garbage, bad
 *    header length, overlapping, gapped, past the end, unknown dtype,
 *    wrong shape, bad metadata, extra or missing tensors, an untied head)
 *    is refused with exit 1 and a message naming what is wrong; a
 *    byte-mutating fuzz loop never crashes the reader.
 *  - a plain Hugging Face GPT-2 file (no metadata, no "transformer."
 *    prefix, mask buffers, a tied lm_head) imports with --n-head, and
 *    without it exits 2 asking for it; a job loads the import at step 0
 *    (fine-tuning) and its first loss is that of the same weights.
 *  - usage errors exit 2.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/mr_ckpt.h"
#include "ckpt/mr_safetensors.h"
#include "ckpt/mr_st_gpt.h"
#include "model/mr_gpt.h"
#include "model/mr_weights.h"
#include "mr_gpt_worker.h"
#include "proc.h"

#define CHECKER "tests/ckpt/check_safetensors.py"
#define PYTHON "/usr/bin/python3"

/* the model every job trains: small enough for seconds on 2 cores */
#define MODEL "\"n_layer\": 2, \"d_model\": 64, \"n_head\": 4, \"vocab_size\": 96, " \
	      "\"seq_len\": 16, \"batch_size\": 2, \"threads\": 1, \"seed\": 11, "      \
	      "\"lr\": 0.003, \"warmup_steps\": 2, \"comm_timeout_ms\": 30000"
#define MOE ", \"moe_every\": 2, \"n_experts\": 4, \"top_k\": 2, \"capacity_factor\": 1.25"

static const int tokens[] = { 3, 17, 42, 5, 88, 0, 63, 21, 9, 77, 50, 11 };
#define NTOK ((int)(sizeof(tokens) / sizeof(tokens[0])))

static char tmp[64];

static void scratch(void)
{
	const char *d = mr_test_scratch("mr-ckpt-cli");

	cr_assert_not_null(d);
	snprintf(tmp, sizeof(tmp), "%s", d);
}

/* tmp/name (one of 4 rotating buffers). */
static const char *in_tmp(const char *name)
{
	static char buf[4][256];
	static int k;

	k = (k + 1) % 4;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", tmp, name);
	return buf[k];
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	buf = calloc(1, (size_t)n + 1);
	cr_assert_not_null(buf);
	cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	if (len)
		*len = (size_t)n;
	return buf;
}

static void spit(const char *path, const void *buf, size_t n)
{
	FILE *f = fopen(path, "wb");

	cr_assert_not_null(f, "unable to write %s", path);
	cr_assert_eq(fwrite(buf, 1, n, f), n);
	fclose(f);
}

/* A shell command in tmp (printf-style); stdout + stderr into *out
 * (malloc'd; NULL: dropped); the exit code. */
static int sh(char **out, const char *fmt, ...)
{
	char cmd[8192], body[7600], log[128], *text;
	va_list ap;
	int st;

	va_start(ap, fmt);
	vsnprintf(body, sizeof(body), fmt, ap);
	va_end(ap);
	snprintf(log, sizeof(log), "%s/sh.log", tmp);
	snprintf(cmd, sizeof(cmd), "cd '%s' && { %s ; } >'%s' 2>&1", tmp, body, log);
	st = system(cmd);
	text = slurp(log, NULL);
	cr_assert_not_null(text);
	/* under the sanitizer build a report exits 1 too: never an expected 1 */
	cr_assert(!strstr(text, "Sanitizer") && !strstr(text, "runtime error:"), "%s: %s", body,
		  text);
	if (out)
		*out = text;
	else
		free(text);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* `meshrun ARGS` in tmp; its output in *out. */
#define MESHRUN(out, ...) meshrun_(out, __VA_ARGS__)
static int meshrun_(char **out, const char *fmt, ...)
{
	char *bin = realpath(mr_proc_build_dir(), NULL), args[6000];
	va_list ap;
	int rc;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	rc = sh(out, "'%s/meshrun' %s", bin ? bin : "build", args);
	free(bin);
	return rc;
}

/* A `meshrun local` job in tmp: mesh flags, then the workload keys after
 * MODEL; the exit code (its log in tmp/<tag>.out). */
static int job(const char *tag, const char *mesh, const char *keys)
{
	char *bin = realpath(mr_proc_build_dir(), NULL);
	int rc = sh(NULL,
		    "timeout 300 '%s/meshrun' local --nodes 1 %s --workload-config '{" MODEL
		    "%s}' >'%s.out' 2>&1", bin ? bin : "build", mesh, keys, tag);

	free(bin);
	return rc;
}

static const char *job_log(const char *tag)
{
	static char *last;
	char path[160];
	size_t n;

	free(last);
	snprintf(path, sizeof(path), "%s/%s.out", tmp, tag);
	last = slurp(path, &n);
	if (last && n > 3000)
		memmove(last, last + n - 3000, 3001);
	return last ? last : "(no log)";
}

/* Runs the job of tag with a checkpoint every 3 of 6 steps, the weights
 * gathered at the end (tag.bin) and its loss log (tag.loss). */
static void train(const char *tag, const char *mesh, const char *extra)
{
	char keys[512];

	snprintf(keys, sizeof(keys),
		 ", \"steps\": 6, \"ckpt_dir\": \"%s.ckpt\", \"ckpt_every\": 3, "
		 "\"save_weights\": \"%s.bin\", \"loss_log\": \"%s.loss\"%s",
		 tag, tag, tag, extra ? extra : "");
	cr_assert_eq(job(tag, mesh, keys), 0, "job %s failed: %s", tag, job_log(tag));
}

/* ---- the model of a checkpoint, its logits ---- */

/* The one-rank model of a step directory, every parameter read back
 * (reassembled from its mesh), with activations for (1, T). */
static void load_step(const char *dir, struct mr_gpt *m, int T)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_ckpt_manifest mf;

	cr_assert_eq(mr_ckpt_manifest_read(&mf, dir, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_create(m, &mf.model, 1, T, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mf.ntensors, m->ntensors);
	for (int i = 0; i < m->ntensors; i++) {
		int mi = mr_ckpt_manifest_find(&mf, m->tensors[i].name);
		cr_assert_geq(mi, 0, "no %s", m->tensors[i].name);
		cr_assert_eq(mr_ckpt_read_full(&mf, mi, MR_CKPT_PARAM, m->params + m->tensors[i].off,
					       &eb), 0, "%s", eb.msg);
	}
	mr_ckpt_manifest_release(&mf);
}

/* meshrun's logits for tokens[] from the checkpoint in dir, written to
 * tmp/name as (T, V) float32 for the checker. */
static void write_logits(const char *dir, const char *name)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt m;
	char path[160];
	size_t n;
	float *h;

	load_step(dir, &m, NTOK);
	cr_assert_eq(mr_gpt_forward(&m, tokens, NULL, &eb), 0, "%s", eb.msg);
	n = (size_t)NTOK * (size_t)m.cfg.vocab;
	h = malloc(n * sizeof(float));
	cr_assert_not_null(h);
	cr_assert_eq(m.dev->ops->download(m.dev, h, m.logits, n * sizeof(float)), 0);
	for (size_t i = 0; i < n; i++)
		cr_assert(isfinite(h[i]));
	snprintf(path, sizeof(path), "%s/%s", tmp, name);
	spit(path, h, n * sizeof(float));
	free(h);
	mr_gpt_release(&m);
}

/* The independent checker on tmp/file against tmp/logits; its exit code. */
static int checker(const char *file, const char *logits, char **out)
{
	char *src = realpath(CHECKER, NULL), list[256];
	int at = 0, rc;

	cr_assert_not_null(src, "%s not found: run the tests from the repository root", CHECKER);
	for (int i = 0; i < NTOK; i++)
		at += snprintf(list + at, sizeof(list) - (size_t)at, "%s%d", i ? "," : "", tokens[i]);
	rc = sh(out, PYTHON " '%s' '%s' --tokens %s --logits '%s'", src, file, list, logits);
	cr_log_info("%s", *out);
	free(src);
	return rc;
}

/* ---- comparing an export with the run's own weights file ---- */

/* The safetensors file tmp/st, imported in-process, holds exactly the
 * values of the weights file tmp/wfile (same run, same step); and layer
 * 0's c_attn.weight is qkv.w transposed. */
static void export_equals_weights(const char *st, const char *wfile)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt_config wc;
	struct mr_gpt imp, w;
	struct mr_st_file f;
	const struct mr_gpt_tensor *qkv;
	char sp[160], wp[160];
	long step = -1;
	int meta = 0, i, C;
	float *ca;

	snprintf(sp, sizeof(sp), "%s/%s", tmp, st);
	snprintf(wp, sizeof(wp), "%s/%s", tmp, wfile);
	cr_assert_eq(mr_st_gpt_import(&imp, sp, 0, &step, &meta, &eb), 0, "%s", eb.msg);
	cr_expect_eq(meta, 1);
	cr_expect_eq(step, 6);
	cr_assert_eq(mr_weights_read_config(wp, &wc, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_create(&w, &wc, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_weights_load(&w, wp, &eb), 0, "%s", eb.msg);
	cr_assert_eq(imp.nparams, w.nparams);
	cr_expect(imp.cfg.n_layer == wc.n_layer && imp.cfg.d_model == wc.d_model &&
		  imp.cfg.vocab == wc.vocab && imp.cfg.n_head == wc.n_head &&
		  imp.cfg.moe_every == wc.moe_every && imp.cfg.n_experts == wc.n_experts &&
		  imp.cfg.top_k == wc.top_k && imp.cfg.capacity_factor == wc.capacity_factor);
	for (i = 0; i < w.ntensors; i++) {
		const struct mr_gpt_tensor *t = &w.tensors[i];
		cr_expect_eq(memcmp(imp.params + t->off, w.params + t->off, t->n * sizeof(float)), 0,
			     "'%s' differs from the run's weights file", t->name);
	}
	/* the file itself: Conv1D (in, out) = our (out, in) transposed */
	cr_assert_eq(mr_st_open(&f, sp, &eb), 0, "%s", eb.msg);
	i = mr_st_find(&f, "transformer.h.0.attn.c_attn.weight");
	qkv = mr_gpt_find(&w, "h.0.attn.qkv.w");
	C = w.cfg.d_model;
	cr_assert(i >= 0 && qkv);
	cr_assert(f.t[i].ndim == 2 && f.t[i].shape[0] == C && f.t[i].shape[1] == 3 * C);
	ca = malloc(f.t[i].count * sizeof(float));
	cr_assert_eq(mr_st_read_f32(&f, i, ca, &eb), 0, "%s", eb.msg);
	for (int r = 0; r < 3 * C; r++)
		for (int c = 0; c < C; c++)
			cr_assert_eq(ca[c * 3 * C + r], w.params[qkv->off + (size_t)r * C + c],
				     "c_attn.weight[%d][%d] is not qkv.w[%d][%d]", c, r, r, c);
	cr_expect_eq(mr_st_find(&f, "lm_head.weight"), -1, "the head is tied: not exported");
	free(ca);
	mr_st_close(&f);
	mr_gpt_release(&w);
	mr_gpt_release(&imp);
}

/* tmp/src rewritten as tmp/dst with tensor `name` (square) transposed in
 * place: the file a missing transpose would make. */
static void untranspose(const char *src, const char *dst, const char *name)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_st_file f;
	struct mr_st_writer w;
	struct mr_st_spec *sp;
	const char **meta;
	char p[160], q[160];
	int i;

	snprintf(p, sizeof(p), "%s/%s", tmp, src);
	snprintf(q, sizeof(q), "%s/%s", tmp, dst);
	cr_assert_eq(mr_st_open(&f, p, &eb), 0, "%s", eb.msg);
	sp = calloc((size_t)f.ntensors, sizeof(*sp));
	meta = calloc((size_t)(2 * f.nmeta + 1), sizeof(char *));
	for (i = 0; i < 2 * f.nmeta; i++)
		meta[i] = f.meta[i];
	for (i = 0; i < f.ntensors; i++) {
		sp[i].name = f.t[i].name;
		sp[i].ndim = f.t[i].ndim;
		memcpy(sp[i].shape, f.t[i].shape, sizeof(sp[i].shape));
	}
	cr_assert_eq(mr_st_writer_open(&w, q, sp, f.ntensors, meta, 0, &eb), 0, "%s", eb.msg);
	for (i = 0; i < f.ntensors; i++) {
		float *v = malloc(f.t[i].count * sizeof(float) + 1), *t;
		cr_assert_eq(mr_st_read_f32(&f, i, v, &eb), 0, "%s", eb.msg);
		if (!strcmp(f.t[i].name, name)) {
			int64_t n = f.t[i].shape[0];
			cr_assert_eq(f.t[i].shape[1], n);
			t = malloc(f.t[i].count * sizeof(float));
			for (int64_t r = 0; r < n; r++)
				for (int64_t c = 0; c < n; c++)
					t[c * n + r] = v[r * n + c];
			free(v);
			v = t;
		}
		cr_assert_eq(mr_st_writer_put(&w, v, f.t[i].count, &eb), 0, "%s", eb.msg);
		free(v);
	}
	cr_assert_eq(mr_st_writer_commit(&w, &eb), 0, "%s", eb.msg);
	free(sp);
	free(meta);
	mr_st_close(&f);
}

/* The first line of tmp/file ("step loss ..."), NUL-terminated. */
/* The first step's line of a loss log (after its header). */
static char *first_line(const char *file)
{
	char path[160], *s, *line;
	size_t n = strlen(MR_LOSS_LOG_HEADER "\n");

	snprintf(path, sizeof(path), "%s/%s", tmp, file);
	s = slurp(path, NULL);
	cr_assert_not_null(s, "no %s", path);
	cr_assert(!strncmp(s, MR_LOSS_LOG_HEADER "\n", n), "%s: no header line", path);
	line = strdup(s + n);
	free(s);
	if (strchr(line, '\n'))
		*strchr(line, '\n') = 0;
	return line;
}

/* ---- jobs ---- */

Test(ckpt_cli, tp2_inspect_export_import_and_resume, .timeout = 900)
{
	char *out, *a, *b, *x, *y;
	const char *s6, *s3;
	json_t *doc, *steps;
	size_t nx, ny;

	scratch();
	train("tp2", "--nproc-per-node 2 --tp 2", NULL);

	/* inspect: both steps, newest first, the mesh, everything verified */
	cr_assert_eq(MESHRUN(&out, "ckpt inspect tp2.ckpt"), 0, "%s", out);
	s6 = strstr(out, "step-00000006");
	s3 = strstr(out, "step-00000003");
	cr_expect(s6 && s3 && s6 < s3, "steps newest first: %s", out);
	cr_expect(strstr(out, "world 2: tp 2") && strstr(out, "parameters, AdamW m and v"), "%s",
		  out);
	cr_expect(strstr(out, "tp dim 0 (q|k|v), 2 slices") && strstr(out, "rank-00001.bin"), "%s",
		  out);
	cr_expect(strstr(out, "verified ") && !strstr(out, "CORRUPT"), "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt inspect --json tp2.ckpt/step-00000006 2>/dev/null"), 0,
		     "%s", out);
	doc = json_loads(out, 0, NULL);
	cr_assert_not_null(doc, "not JSON: %s", out);
	steps = json_object_get(doc, "steps");
	cr_assert_eq(json_array_size(steps), 1);
	cr_expect_eq(json_integer_value(json_object_get(json_array_get(steps, 0), "step")), 6);
	cr_expect_eq(json_integer_value(json_object_get(
			     json_object_get(json_array_get(steps, 0), "mesh"), "tp")), 2);
	cr_expect(json_is_true(json_object_get(json_array_get(steps, 0), "verified")));
	cr_expect(json_integer_value(json_object_get(json_array_get(steps, 0), "verified_bytes")) >
		  0);
	cr_expect(json_is_true(json_object_get(doc, "ok")));
	json_decref(doc);
	free(out);

	/* export of the newest step = the run's own gathered weights */
	cr_assert_eq(MESHRUN(&out, "ckpt export tp2.ckpt --safetensors x6.safetensors"), 0, "%s",
		     out);
	cr_expect(strstr(out, "exported step 6"), "%s", out);
	free(out);
	export_equals_weights("x6.safetensors", "tp2.bin");

	/* the independent reader computes meshrun's logits from the file */
	write_logits(in_tmp("tp2.ckpt/step-00000006"), "x6.logits");
	cr_assert_eq(checker("x6.safetensors", "x6.logits", &out), 0, "%s", out);
	cr_expect(strstr(out, "numpy:") && strstr(out, "check_safetensors: ok"), "%s", out);
	cr_expect(strstr(out, "torch"), "torch (python3-torch, scripts/deps.sh) checks too: %s", out);
	free(out);
	untranspose("x6.safetensors", "bad.safetensors", "transformer.h.1.attn.c_proj.weight");
	cr_assert_eq(checker("bad.safetensors", "x6.logits", &out), 1,
		     "a square matrix left untransposed must be caught: %s", out);
	cr_expect(strstr(out, "logits differ"), "%s", out);
	free(out);

	/* an existing output is kept, --force replaces it */
	cr_assert_eq(MESHRUN(&out, "ckpt export tp2.ckpt --step 3 --safetensors x6.safetensors"), 1,
		     "%s", out);
	cr_expect(strstr(out, "exists") && strstr(out, "--force"), "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt export tp2.ckpt --safetensors x6.safetensors --force"), 0,
		     "%s", out);
	free(out);

	/* export -> import -> export: the same bytes */
	cr_assert_eq(MESHRUN(&out, "ckpt import --safetensors x6.safetensors imp6"), 0, "%s", out);
	cr_expect(strstr(out, "step-00000006"), "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt export imp6 --safetensors y6.safetensors"), 0, "%s", out);
	free(out);
	x = slurp(in_tmp("x6.safetensors"), &nx);
	y = slurp(in_tmp("y6.safetensors"), &ny);
	cr_assert(x && y);
	cr_expect(nx == ny && memcmp(x, y, nx) == 0, "export -> import -> export changed the file");
	free(x);
	free(y);
	cr_assert_eq(MESHRUN(&out, "ckpt inspect imp6"), 0, "%s", out);
	cr_expect(strstr(out, "parameters only") && strstr(out, "world 1"), "%s", out);
	free(out);

	/* resume: a job from the imported step 3 and a job from the exported
	 * step itself start at step 4 with the same loss and gradient norm */
	cr_assert_eq(MESHRUN(&out, "ckpt export tp2.ckpt --step 3 --safetensors x3.safetensors"), 0,
		     "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt import --safetensors x3.safetensors imp3"), 0, "%s", out);
	free(out);
	cr_assert_eq(sh(&out, "mkdir src3 && cp -r tp2.ckpt/step-00000003 src3/"), 0, "%s", out);
	free(out);
	cr_assert_eq(job("from_src", "--nproc-per-node 1",
			 ", \"steps\": 4, \"ckpt_dir\": \"src3\", \"loss_log\": \"src.loss\""),
		     0, "%s", job_log("from_src"));
	cr_assert_eq(job("from_imp", "--nproc-per-node 1",
			 ", \"steps\": 4, \"ckpt_dir\": \"imp3\", \"loss_log\": \"imp.loss\""),
		     0, "%s", job_log("from_imp"));
	cr_expect(strstr(job_log("from_imp"), "checkpoint_resumed"), "%s", job_log("from_imp"));
	a = first_line("src.loss");
	b = first_line("imp.loss");
	cr_expect(!strncmp(a, "4 ", 2), "the job from the source starts at step 4: %s", a);
	cr_expect(!strncmp(b, "4 ", 2), "the job from the import starts at step 4: %s", b);
	cr_expect(strtod(a + 2, NULL) > 0.0);
	/* step, loss, aux loss, gradient norm; the lr differs: an imported
	 * checkpoint has no optimizer state, AdamW (and its warmup) starts anew
	 * (val_loss is nan: no validation) */
	for (int k = 0; k < 2; k++) {
		*strrchr(a, ' ') = 0;
		*strrchr(b, ' ') = 0;
	}
	cr_expect_str_eq(a, b, "first loss: from the checkpoint %s, from the import %s", a, b);
	free(a);
	free(b);
}

Test(ckpt_cli, pp2_export_equals_the_runs_weights, .timeout = 600)
{
	char *out, dir[128];

	scratch();
	train("pp2", "--nproc-per-node 2 --pp 2", ", \"lr_schedule\": \"wsd\", \"decay_frac\": 0.5");
	cr_assert_eq(MESHRUN(&out, "ckpt inspect pp2.ckpt/step-00000006"), 0, "%s", out);
	cr_expect(strstr(out, "pp 2") && strstr(out, "verified "), "%s", out);
	cr_expect(strstr(out, "lr_schedule wsd  decay_frac 0.5 "), "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt export pp2.ckpt/step-00000006 --safetensors p.safetensors"),
		     0, "%s", out);
	free(out);
	export_equals_weights("p.safetensors", "pp2.bin");
	snprintf(dir, sizeof(dir), "%s/pp2.ckpt/step-00000006", tmp);
	write_logits(dir, "p.logits");
	cr_assert_eq(checker("p.safetensors", "p.logits", &out), 0, "%s", out);
	free(out);
}

Test(ckpt_cli, moe_ep2_export_equals_the_runs_weights, .timeout = 600)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_st_file f;
	char *out, dir[128], path[160];

	scratch();
	train("moe", "--nproc-per-node 2 --ep 2", MOE);
	cr_assert_eq(MESHRUN(&out, "ckpt inspect moe.ckpt"), 0, "%s", out);
	cr_expect(strstr(out, "ep 2") && strstr(out, "experts, ep 2") &&
			  strstr(out, "MoE every 2 layers: 4 experts, top_k 2"),
		  "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt export moe.ckpt --safetensors m.safetensors"), 0, "%s",
		     out);
	free(out);
	export_equals_weights("m.safetensors", "moe.bin");
	snprintf(path, sizeof(path), "%s/m.safetensors", tmp);
	cr_assert_eq(mr_st_open(&f, path, &eb), 0, "%s", eb.msg);
	cr_expect_geq(mr_st_find(&f, "transformer.h.1.moe.router.weight"), 0);
	cr_expect_geq(mr_st_find(&f, "transformer.h.1.moe.experts.3.c_proj.weight"), 0);
	cr_expect_eq(mr_st_find(&f, "transformer.h.1.mlp.c_fc.weight"), -1);
	cr_expect_str_eq(mr_st_meta(&f, "moe_every"), "2");
	mr_st_close(&f);
	snprintf(dir, sizeof(dir), "%s/moe.ckpt/step-00000006", tmp);
	write_logits(dir, "m.logits");
	cr_assert_eq(checker("m.safetensors", "m.logits", &out), 0, "%s", out);
	free(out);
}

/* ---- offline: a checkpoint written by mr_ckpt_write_params ---- */

static void small_config(struct mr_gpt_config *c)
{
	memset(c, 0, sizeof(*c));
	c->vocab = 40;
	c->max_seq = 8;
	c->n_layer = 2;
	c->d_model = 16;
	c->n_head = 2;
}

/* A one-rank checkpoint of a freshly initialised model in tmp/dir. */
static void offline_ckpt(const char *dir, long step)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt_config c;
	struct mr_gpt m;
	char path[160];

	small_config(&c);
	cr_assert_eq(mr_gpt_create(&m, &c, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_init_params(&m, 5), 0);
	snprintf(path, sizeof(path), "%s/%s", tmp, dir);
	cr_assert_eq(mr_ckpt_write_params(path, &c, step, m.params, &eb), 0, "%s", eb.msg);
	mr_gpt_release(&m);
}

Test(ckpt_cli, inspect_names_the_corrupt_file_and_exits_1)
{
	char *out, path[160], *orig;
	size_t n;
	json_t *doc;

	scratch();
	offline_ckpt("ck", 5);
	cr_assert_eq(MESHRUN(&out, "ckpt inspect ck"), 0, "%s", out);
	cr_expect(strstr(out, "step-00000005") && strstr(out, "verified ") &&
			  strstr(out, "parameters only"),
		  "%s", out);
	free(out);
	snprintf(path, sizeof(path), "%s/ck/step-00000005/rank-00000.bin", tmp);
	orig = slurp(path, &n);
	cr_assert(orig && n > 200);

	orig[150] ^= 0x40; /* a flipped bit in a record */
	spit(path, orig, n);
	cr_assert_eq(MESHRUN(&out, "ckpt inspect ck"), 1, "%s", out);
	cr_expect(strstr(out, "CORRUPT") && strstr(out, "rank-00000.bin") &&
			  strstr(out, "checksum mismatch"),
		  "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt inspect --json ck 2>/dev/null"), 1, "%s", out);
	doc = json_loads(out, 0, NULL);
	cr_assert_not_null(doc, "%s", out);
	cr_expect(json_is_false(json_object_get(doc, "ok")));
	cr_expect(strstr(json_string_value(json_object_get(
				 json_array_get(json_object_get(doc, "steps"), 0), "error")),
			 "checksum"));
	json_decref(doc);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt export ck --safetensors z.safetensors"), 1, "%s", out);
	cr_expect(strstr(out, "checksum mismatch"), "export reads verified records: %s", out);
	cr_expect(access(in_tmp("z.safetensors"), F_OK) != 0,
		  "nothing written");
	free(out);

	orig[150] ^= 0x40;
	spit(path, orig, n - 4); /* truncated */
	cr_assert_eq(MESHRUN(&out, "ckpt inspect ck/step-00000005"), 1, "%s", out);
	cr_expect(strstr(out, "rank-00000.bin") && strstr(out, "truncated"), "%s", out);
	free(out);
	spit(path, orig, n); /* whole again */
	cr_assert_eq(MESHRUN(&out, "ckpt inspect ck"), 0, "%s", out);
	free(out);

	snprintf(path, sizeof(path), "%s/ck/step-00000005/manifest.json", tmp);
	spit(path, "{\"format\": \"meshrun-checkpoint\", \"version\": 1", 44);
	cr_assert_eq(MESHRUN(&out, "ckpt inspect ck"), 1, "%s", out);
	cr_expect(strstr(out, "manifest.json"), "%s", out);
	free(out);
	free(orig);

	/* a directory without checkpoints */
	cr_assert_eq(sh(NULL, "mkdir empty"), 0);
	cr_assert_eq(MESHRUN(&out, "ckpt inspect empty"), 1, "%s", out);
	cr_expect(strstr(out, "holds no checkpoint"), "%s", out);
	free(out);
}

Test(ckpt_cli, usage_errors_exit_2)
{
	static const struct {
		const char *args, *says;
	} bad[] = {
		{ "ckpt", "usage" },
		{ "ckpt verify x", "unknown command 'verify'" },
		{ "ckpt inspect", "give one" },
		{ "ckpt inspect nowhere", "'nowhere' is not a directory" },
		{ "ckpt inspect ck --force", "--force: not an option of 'inspect'" },
		{ "ckpt inspect ck --bogus", "--bogus" },
		{ "ckpt export ck", "--safetensors" },
		{ "ckpt export ck --safetensors o --step 9", "no step 9" },
		{ "ckpt export ck/step-00000002 --safetensors o --step 2", "already one step" },
		{ "ckpt export ck --safetensors o --json", "--json: not an option" },
		{ "ckpt import out", "--safetensors" },
		{ "ckpt import --safetensors missing.safetensors out", "unable to open" },
		{ "ckpt import --safetensors x.safetensors", "give the checkpoint directory" },
		{ "ckpt import --safetensors x.safetensors out --n-head -1", "--n-head" },
	};
	char *out;

	scratch();
	offline_ckpt("ck", 2);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_expect_eq(MESHRUN(&out, "%s", bad[i].args), 2, "'%s' must exit 2: %s", bad[i].args,
			     out);
		cr_expect(strstr(out, bad[i].says), "'%s' must say '%s': %s", bad[i].args,
			  bad[i].says, out);
		free(out);
	}
	cr_assert_eq(MESHRUN(&out, "ckpt --help"), 0, "%s", out);
	cr_expect(strstr(out, "meshrun ckpt export DIR --safetensors OUT"), "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt export --help"), 0, "%s", out);
	cr_expect(strstr(out, "--n-head") && strstr(out, "--force"), "%s", out);
	free(out);
}

/* ---- malformed safetensors ---- */

/* The valid export of a small model (tmp/good.safetensors). */
static void good_file(void)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt_config c;
	struct mr_gpt m;
	char path[160];

	small_config(&c);
	cr_assert_eq(mr_gpt_create(&m, &c, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_init_params(&m, 9), 0);
	snprintf(path, sizeof(path), "%s/good.safetensors", tmp);
	cr_assert_eq(mr_st_gpt_export(&m, 42, path, 0, &eb), 0, "%s", eb.msg);
	mr_gpt_release(&m);
}

/* The file tmp/name: an 8-byte length n, header text (as is, unpadded),
 * then data bytes. */
static void write_raw(const char *name, uint64_t n, const char *header, const void *data,
		      size_t dn)
{
	char path[160];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", tmp, name);
	f = fopen(path, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(&n, 8, 1, f), 1);
	fputs(header, f);
	if (dn)
		cr_assert_eq(fwrite(data, 1, dn, f), dn);
	fclose(f);
}

/* tmp/good.safetensors with its header changed by edit (a jansson
 * document) and extra data bytes appended, as tmp/name. */
static void mutate(const char *name, void (*edit)(json_t *), size_t extra)
{
	char path[160], *raw, *text, *pad, *data;
	uint64_t n;
	size_t len, tl, dn;
	json_t *doc;

	snprintf(path, sizeof(path), "%s/good.safetensors", tmp);
	raw = slurp(path, &len);
	cr_assert_not_null(raw);
	memcpy(&n, raw, 8);
	doc = json_loadb(raw + 8, n, 0, NULL);
	cr_assert_not_null(doc);
	edit(doc);
	text = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
	tl = strlen(text);
	pad = calloc(1, tl + 8);
	memcpy(pad, text, tl);
	while (tl % 8)
		pad[tl++] = ' ';
	dn = len - 8 - n;
	data = calloc(1, dn + extra + 1);
	cr_assert_not_null(data);
	memcpy(data, raw + 8 + n, dn);
	write_raw(name, tl, pad, data, dn + extra);
	free(data);
	json_decref(doc);
	free(text);
	free(pad);
	free(raw);
}

static json_t *entry(json_t *d, const char *name)
{
	json_t *e = json_object_get(d, name);

	cr_assert_not_null(e, "no %s in the good file", name);
	return e;
}

#define WTE "transformer.wte.weight"
#define WPE "transformer.wpe.weight"
#define CATTN "transformer.h.0.attn.c_attn.weight"
static void e_overlap(json_t *d)
{
	/* wpe's data starts inside wte's */
	json_t *o = json_object_get(entry(d, WPE), "data_offsets");
	json_int_t b = json_integer_value(json_array_get(o, 0));
	json_array_set_new(o, 0, json_integer(b - 8));
	json_array_set_new(o, 1, json_integer(json_integer_value(json_array_get(o, 1)) - 8));
}
static void e_gap(json_t *d)
{
	json_t *o = json_object_get(entry(d, WTE), "data_offsets");
	json_array_set_new(json_object_get(entry(d, WTE), "shape"), 0, json_integer(39));
	json_array_set_new(o, 1, json_integer(json_integer_value(json_array_get(o, 1)) - 64));
}
static void e_past_end(json_t *d)
{
	json_t *o = json_object_get(entry(d, "transformer.ln_f.bias"), "data_offsets");
	json_array_set_new(o, 1, json_integer(json_integer_value(json_array_get(o, 1)) + 64));
}
static void e_dtype(json_t *d) { json_object_set_new(entry(d, WTE), "dtype", json_string("F12")); }
static void e_int_dtype(json_t *d) { json_object_set_new(entry(d, WTE), "dtype", json_string("I32")); }
static void e_neg_shape(json_t *d)
{
	json_array_set_new(json_object_get(entry(d, WTE), "shape"), 0, json_integer(-40));
}
static void e_size(json_t *d)
{
	json_array_set_new(json_object_get(entry(d, WTE), "shape"), 0, json_integer(41));
}
static void e_offsets(json_t *d)
{
	json_object_set_new(entry(d, WTE), "data_offsets", json_pack("[i]", 0));
}
static void e_meta_type(json_t *d)
{
	json_object_set_new(json_object_get(d, "__metadata__"), "step", json_integer(42));
}
static void e_meta_layers(json_t *d)
{
	json_object_set_new(json_object_get(d, "__metadata__"), "n_layer", json_string("two"));
}
static void e_meta_heads(json_t *d)
{
	json_object_set_new(json_object_get(d, "__metadata__"), "n_head", json_string("3"));
}
static void e_missing(json_t *d)
{
	/* c_attn's bytes handed to an unknown name */
	json_object_set(d, "transformer.h.0.attn.qkv", entry(d, CATTN));
	json_object_del(d, CATTN);
}
static void e_transposed(json_t *d)
{
	/* (3C, C) where the Conv1D layout is (C, 3C): same bytes, wrong shape */
	json_object_set_new(entry(d, CATTN), "shape", json_pack("[i, i]", 48, 16));
}
static void e_not_gpt(json_t *d)
{
	json_object_set(d, "embed.weight", entry(d, WTE));
	json_object_del(d, WTE);
}
static void e_extra(json_t *d)
{
	json_t *o = json_object_get(entry(d, "transformer.ln_f.bias"), "data_offsets");
	json_int_t end = json_integer_value(json_array_get(o, 1));
	json_object_set_new(d, "transformer.h.0.attn.rotary", json_pack("{s:s, s:[i], s:[I, I]}",
		"dtype", "F32", "shape", 4, "data_offsets", end, end + 16));
}
static void e_head(json_t *d)
{
	json_t *o = json_object_get(entry(d, "transformer.ln_f.bias"), "data_offsets");
	json_int_t end = json_integer_value(json_array_get(o, 1));
	json_object_set_new(d, "lm_head.weight", json_pack("{s:s, s:[i, i], s:[I, I]}",
		"dtype", "F32", "shape", 40, 16, "data_offsets", end, end + 40 * 16 * 4));
}

Test(ckpt_cli, bad_safetensors_are_refused_naming_the_problem)
{
	static const struct {
		void (*edit)(json_t *);
		size_t extra;
		const char *says;
	} cases[] = {
		{ e_overlap, 0, "overlap" },
		{ e_gap, 0, "a gap of 64 bytes" },
		{ e_past_end, 0, "past the data" },
		{ e_dtype, 0, "unknown dtype 'F12'" },
		{ e_int_dtype, 0, "is I32, not a float type" },
		{ e_neg_shape, 0, "'shape'[0] is not a non-negative integer" },
		{ e_size, 0, "its F32 shape needs" },
		{ e_offsets, 0, "'data_offsets' is not a pair" },
		{ e_meta_type, 0, "metadata 'step' is not a string" },
		{ e_meta_layers, 0, "metadata 'n_layer' is 'two'" },
		{ e_meta_heads, 0, "n_head" },
		{ e_missing, 0, "no tensor 'transformer.h.0.attn.c_attn.weight'" },
		{ e_transposed, 0, "has shape [48, 16], the model" },
		{ e_not_gpt, 0, "not a GPT-2 model" },
		{ e_extra, 16, "unexpected tensor 'transformer.h.0.attn.rotary'" },
		{ e_head, 40 * 16 * 4, "'lm_head.weight' differs from the token embedding" },
	};
	static const char *const raw_cases[][2] = {
		{ "", "shorter than the 8-byte" },
		{ "{\"a\"", "header length of 4" },
		{ "{\"a\": {}}    ", "tensor 'a': 'dtype' is missing" },
		{ "[1, 2, 3, 4, 5, 6, 7]   ", "does not start with '{'" },
		{ "{\"a\": 1, \"a\": 2}      ", "not valid JSON" },
		{ "{garbage garbage}       ", "not valid JSON" },
		{ "{\"__metadata__\": 7}     ", "'__metadata__' is not an object" },
	};
	char *out, name[32];

	scratch();
	good_file();
	cr_assert_eq(MESHRUN(&out, "ckpt import --safetensors good.safetensors ok"), 0, "%s", out);
	cr_expect(strstr(out, "step-00000042"), "the metadata's step: %s", out);
	free(out);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(name, sizeof(name), "bad%zu.safetensors", i);
		mutate(name, cases[i].edit, cases[i].extra);
		cr_expect_eq(MESHRUN(&out, "ckpt import --safetensors %s out%zu", name, i), 1,
			     "case %zu: %s", i, out);
		cr_expect(strstr(out, cases[i].says), "case %zu must say '%s': %s", i, cases[i].says,
			  out);
		cr_expect(strstr(out, name), "case %zu names the file: %s", i, out);
		free(out);
		cr_expect_neq(sh(NULL, "test -e out%zu/step-00000042", i), 0, "nothing imported");
	}
	for (size_t i = 0; i < sizeof(raw_cases) / sizeof(raw_cases[0]); i++) {
		snprintf(name, sizeof(name), "raw%zu.safetensors", i);
		write_raw(name, strlen(raw_cases[i][0]), raw_cases[i][0], NULL, 0);
		if (i == 0) /* 4 bytes only */
			spit(in_tmp(name), "abcd", 4);
		if (i == 1) /* a length past the end */
			write_raw(name, 4000, raw_cases[i][0], NULL, 0);
		cr_expect_eq(MESHRUN(&out, "ckpt import --safetensors %s o", name), 1, "raw %zu: %s",
			     i, out);
		cr_expect(strstr(out, raw_cases[i][1]), "raw %zu must say '%s': %s", i,
			  raw_cases[i][1], out);
		free(out);
	}
	/* a header length past the bound is refused before anything is read */
	write_raw("huge.safetensors", (uint64_t)1 << 40, "{}", NULL, 0);
	cr_expect_eq(MESHRUN(&out, "ckpt import --safetensors huge.safetensors o"), 1, "%s", out);
	cr_expect(strstr(out, "at most 100000000"), "%s", out);
	free(out);
	/* a truncated good file */
	cr_assert_eq(sh(NULL, "head -c 1000 good.safetensors > cut.safetensors"), 0);
	cr_expect_eq(MESHRUN(&out, "ckpt import --safetensors cut.safetensors o"), 1, "%s", out);
	cr_expect(strstr(out, "truncated"), "%s", out);
	free(out);
}

/* A tiny deterministic generator for the fuzz loop. */
static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

Test(ckpt_cli, fuzzed_files_never_crash_the_reader, .timeout = 600)
{
	struct mr_errbuf eb;
	char good[160], path[160], *raw, *buf;
	size_t len;
	uint64_t seed = 0x9e3779b97f4a7c15ull, n;
	int opened = 0, imported = 0;

	scratch();
	good_file();
	snprintf(good, sizeof(good), "%s/good.safetensors", tmp);
	snprintf(path, sizeof(path), "%s/fuzz.safetensors", tmp);
	raw = slurp(good, &len);
	cr_assert_not_null(raw);
	memcpy(&n, raw, 8);
	buf = malloc(len);
	for (int it = 0; it < 3000; it++) {
		struct mr_st_file f;
		size_t cut = len;
		int flips = 1 + (int)(rnd(&seed) % 6);
		memcpy(buf, raw, len);
		for (int k = 0; k < flips; k++) {
			/* mostly the header (and its length), sometimes anywhere */
			size_t at = rnd(&seed) % 4 ? rnd(&seed) % (8 + n) : rnd(&seed) % len;
			buf[at] = rnd(&seed) % 3 ? (char)rnd(&seed) : "{}[]\",:0 9-"[rnd(&seed) % 11];
		}
		if (rnd(&seed) % 8 == 0)
			cut = rnd(&seed) % len;
		spit(path, buf, cut);
		memset(&eb, 0, sizeof(eb));
		if (mr_st_open(&f, path, &eb) == 0) {
			opened++;
			for (int i = 0; i < f.ntensors; i++) {
				cr_assert_leq(f.t[i].end, f.size - f.data_at);
				cr_assert_eq(f.t[i].end - f.t[i].begin,
					     f.t[i].count * mr_st_dtype_size(f.t[i].dtype));
			}
			mr_st_close(&f);
			if (it % 4 == 0) {
				struct mr_gpt m;
				long step;
				if (mr_st_gpt_import(&m, path, 0, &step, NULL, &eb) == 0) {
					imported++;
					mr_gpt_release(&m);
				}
			}
		} else {
			cr_assert(eb.msg[0], "a failure says why");
		}
	}
	cr_log_info("fuzz: 3000 files, %d opened, %d imported", opened, imported);
	cr_expect_gt(opened, 0, "some mutations keep the file valid (data bytes)");
	free(buf);
	free(raw);
}

/* ---- a plain Hugging Face GPT-2 file ---- */

Test(ckpt_cli, plain_gpt2_file_imports_with_n_head_and_a_job_fine_tunes_it, .timeout = 600)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt_config c;
	struct mr_gpt m, back;
	struct mr_st_writer w;
	struct mr_st_spec sp[64];
	char names[64][96], path[160], *out, *a, *b;
	float *mask, *bufs[64];
	int n = 0, i, T;

	scratch();
	/* the jobs' model (MODEL), initialised as a job with their seed does */
	memset(&c, 0, sizeof(c));
	c.vocab = 96;
	c.max_seq = T = 16;
	c.n_layer = 2;
	c.d_model = 64;
	c.n_head = 4;
	cr_assert_eq(mr_gpt_create(&m, &c, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_init_params(&m, 11), 0);
	mask = calloc((size_t)(T * T), sizeof(float));
	for (i = 0; i < m.ntensors; i++) {
		const struct mr_gpt_tensor *t = &m.tensors[i];
		char full[96];
		int tr;
		cr_assert_eq(mr_st_gpt_name(t, 0, full, sizeof(full), &tr), 0);
		/* GPT2Model's names: no "transformer." */
		snprintf(names[n], sizeof(names[n]), "%s", full + strlen("transformer."));
		sp[n].name = names[n];
		sp[n].ndim = t->ndim;
		bufs[n] = malloc(t->n * sizeof(float));
		if (tr) {
			sp[n].shape[0] = t->full[1];
			sp[n].shape[1] = t->full[0];
			for (int r = 0; r < t->full[0]; r++)
				for (int q = 0; q < t->full[1]; q++)
					bufs[n][q * t->full[0] + r] =
						m.params[t->off + (size_t)r * t->full[1] + q];
		} else {
			for (int k = 0; k < t->ndim; k++)
				sp[n].shape[k] = t->full[k];
			memcpy(bufs[n], m.params + t->off, t->n * sizeof(float));
		}
		n++;
		if (strstr(t->name, "attn.proj.b")) { /* the mask buffer after each block's attn */
			snprintf(names[n], sizeof(names[n]), "h.%c.attn.bias", t->name[2]);
			sp[n] = (struct mr_st_spec){ names[n], 4, { 1, 1, T, T } };
			bufs[n++] = NULL;
		}
	}
	snprintf(names[n], sizeof(names[n]), "lm_head.weight");
	sp[n] = (struct mr_st_spec){ names[n], 2, { c.vocab, c.d_model } };
	bufs[n++] = m.params; /* tied: wte's values */
	snprintf(path, sizeof(path), "%s/gpt2.safetensors", tmp);
	cr_assert_eq(mr_st_writer_open(&w, path, sp, n, NULL, 0, &eb), 0, "%s", eb.msg);
	for (i = 0; i < n; i++) {
		uint64_t cnt = 1;
		for (int k = 0; k < sp[i].ndim; k++)
			cnt *= (uint64_t)sp[i].shape[k];
		cr_assert_eq(mr_st_writer_put(&w, bufs[i] ? bufs[i] : mask, cnt, &eb), 0, "%s",
			     eb.msg);
		if (bufs[i] != m.params)
			free(bufs[i]);
	}
	cr_assert_eq(mr_st_writer_commit(&w, &eb), 0, "%s", eb.msg);
	free(mask);

	cr_assert_eq(MESHRUN(&out, "ckpt import --safetensors gpt2.safetensors hf"), 2, "%s", out);
	cr_expect(strstr(out, "--n-head") && strstr(out, "n_head"), "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt import --safetensors gpt2.safetensors hf --n-head 3"), 2,
		     "%s", out);
	cr_expect(strstr(out, "--n-head 3") && strstr(out, "divide"), "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt import --safetensors gpt2.safetensors hf --n-head 4"), 0,
		     "%s", out);
	cr_expect(strstr(out, "GPT-2 shapes") && strstr(out, "n_layer 2 d_model 64 n_head 4") &&
			  strstr(out, "step-00000000"),
		  "%s", out);
	free(out);
	snprintf(path, sizeof(path), "%s/hf/step-00000000", tmp);
	load_step(path, &back, 1);
	cr_assert_eq(back.nparams, m.nparams);
	cr_expect_eq(memcmp(back.params, m.params, m.nparams * sizeof(float)), 0,
		     "the imported parameters are the model's");
	cr_expect(back.cfg.vocab == c.vocab && back.cfg.max_seq == c.max_seq &&
		  back.cfg.n_layer == c.n_layer && back.cfg.d_model == c.d_model);
	mr_gpt_release(&back);
	/* fine-tuning from it: a job loads step 0 and trains from there - the
	 * values a job with the same seed initialises, so the same first loss */
	cr_assert_eq(job("from_hf", "--nproc-per-node 1",
			 ", \"steps\": 1, \"ckpt_dir\": \"hf\", \"loss_log\": \"hf.loss\""),
		     0, "%s", job_log("from_hf"));
	cr_expect(strstr(job_log("from_hf"), "checkpoint_resumed step=0"), "%s",
		  job_log("from_hf"));
	cr_assert_eq(job("fresh", "--nproc-per-node 1",
			 ", \"steps\": 1, \"loss_log\": \"fresh.loss\""), 0, "%s", job_log("fresh"));
	a = first_line("hf.loss");
	b = first_line("fresh.loss");
	cr_expect(!strncmp(a, "1 ", 2), "%s", a);
	cr_expect_str_eq(a, b, "from the import %s, fresh %s", a, b);
	free(a);
	free(b);
	/* --step and an existing step */
	cr_assert_eq(MESHRUN(&out, "ckpt import --safetensors gpt2.safetensors hf --n-head 4"), 1,
		     "%s", out);
	cr_expect(strstr(out, "exists"), "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt import --safetensors gpt2.safetensors hf --n-head 4 "
				   "--step 7"), 0, "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt inspect hf"), 0, "%s", out);
	cr_expect(strstr(out, "step-00000007 step-00000000"), "%s", out);
	free(out);
	mr_gpt_release(&m);
}
