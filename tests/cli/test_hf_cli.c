/*
 * test_hf_cli.c - `meshrun ckpt export --hf` and `meshrun ckpt import --hf`:
 * a llama model as a Hugging Face Llama directory and back, on a real
 * `meshrun local` job's checkpoint and on directories made by hand.
 *
 * What each test proves:
 *  - export_check_roundtrip_resume: a tp 2 llama job's checkpoint exports
 *    to config.json + model.safetensors + generation_config.json; an
 *    independent reader (tests/reference/hf_llama_check.py: the format
 *    parsed by hand, llama_model.py's forward) computes the logits
 *    meshrun's own forward computes from the checkpoint (1e-4), and
 *    fails when q/k rows get the Meta -> HF rotary permutation; import ->
 *    sharded export (--max-shard-bytes) -> import -> export gives the
 *    first file's bytes again, every shard's tensor the same bytes; an
 *    existing output is kept unless --force; --safetensors refuses a
 *    llama model pointing at --hf; a job at tp 2 resumes from
 *    the import with the first loss of a one-rank job resuming from the
 *    original step.
 *  - import_dtypes_tied_scaled_sharded: a hand-made directory (BF16, F16
 *    and F32 tensors, two shards and an index, a tied head, Llama 3.1
 *    rope_scaling, LlamaConfig defaults for absent keys, an old rotary
 *    buffer) imports with every value exact and the config mapped;
 *    exporting it back writes the tie and the scaling.
 *  - malformed_refused: a missing config key, another model_type, an
 *    unsupported rope_scaling, a missing, misshapen, integer or
 *    unexpected tensor, a weight_map naming a missing shard, a tied head
 *    that differs, no weights: exit 1 naming the file, the key or tensor
 *    and the reason; a gpt2 model is refused naming "arch"; usage errors
 *    exit 2.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/mr_ckpt.h"
#include "ckpt/mr_hf_llama.h"
#include "ckpt/mr_safetensors.h"
#include "model/mr_gpt.h"
#include "mr_gpt_worker.h"
#include "proc.h"

#define CHECKER "tests/reference/hf_llama_check.py"
#define PYTHON "/usr/bin/python3"

/* a tiny llama job: seconds on 2 cores */
#define MODEL "\"arch\": \"llama\", \"n_layer\": 2, \"d_model\": 64, \"n_head\": 4, "     \
	      "\"n_kv_head\": 2, \"ffn_hidden\": 96, \"vocab_size\": 96, \"seq_len\": 16, " \
	      "\"batch_size\": 2, \"threads\": 1, \"seed\": 11, \"lr\": 0.003, "          \
	      "\"warmup_steps\": 2, \"comm_timeout_ms\": 30000"

static const int tokens[] = { 3, 17, 42, 5, 88, 0, 63, 21, 9, 77, 50, 11 };
#define NTOK ((int)(sizeof(tokens) / sizeof(tokens[0])))

static char tmp[64];

static void scratch(void)
{
	const char *d = mr_test_scratch("mr-hf-cli");

	cr_assert_not_null(d);
	snprintf(tmp, sizeof(tmp), "%s", d);
}

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
	return mr_test_slurp(path, len);
}

static void spit(const char *path, const void *buf, size_t n)
{
	FILE *f = fopen(path, "wb");

	cr_assert_not_null(f, "unable to write %s", path);
	cr_assert_eq(fwrite(buf, 1, n, f), n);
	fclose(f);
}

/* A shell command in tmp; stdout + stderr into *out (malloc'd; NULL:
 * dropped); the exit code. */
static int sh(char **out, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = mr_test_vsh(tmp, out, fmt, ap);
	va_end(ap);
	return rc;
}

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

/* A `meshrun local` llama job in tmp; its log in tmp/<tag>.out. */
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

/* The one-rank model of a step directory, every parameter read back. */
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

/* meshrun's logits for tokens[] from step directory dir into tmp/name,
 * (T, V) float32. */
static void write_logits(const char *dir, const char *name)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt m;
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
	spit(in_tmp(name), h, n * sizeof(float));
	free(h);
	mr_gpt_release(&m);
}

/* The independent reader on tmp/dir against tmp/logits; its exit code. */
static int checker(const char *dir, const char *logits, const char *extra, char **out)
{
	char *src = realpath(CHECKER, NULL), list[256];
	int at = 0, rc;

	cr_assert_not_null(src, "%s not found: run the tests from the repository root", CHECKER);
	for (int i = 0; i < NTOK; i++)
		at += snprintf(list + at, sizeof(list) - (size_t)at, "%s%d", i ? "," : "", tokens[i]);
	rc = sh(out, PYTHON " '%s' '%s' --tokens %s --logits '%s' %s", src, dir, list, logits,
		extra);
	cr_log_info("%s", *out);
	free(src);
	return rc;
}

static int have_torch(void)
{
	return system(PYTHON " -c 'import torch, numpy' >/dev/null 2>&1") == 0;
}

/* Every tensor of file a (a safetensors file) is, byte for byte, the
 * tensor of the same name in one of the files bs[0..nb). */
static void same_tensors(const char *a, const char *const *bs, int nb)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_st_file fa, fb;
	int found = 0;

	cr_assert_eq(mr_st_open(&fa, a, &eb), 0, "%s", eb.msg);
	for (int k = 0; k < nb; k++) {
		cr_assert_eq(mr_st_open(&fb, bs[k], &eb), 0, "%s", eb.msg);
		for (int i = 0; i < fb.ntensors; i++) {
			int j = mr_st_find(&fa, fb.t[i].name);
			size_t n = fb.t[i].end - fb.t[i].begin;
			char *x = malloc(n + 1), *y = malloc(n + 1);
			cr_assert_geq(j, 0, "%s: %s is not in %s", bs[k], fb.t[i].name, a);
			cr_assert_eq(fa.t[j].end - fa.t[j].begin, n);
			cr_assert_eq(mr_st_read_raw(&fa, j, x, &eb), 0, "%s", eb.msg);
			cr_assert_eq(mr_st_read_raw(&fb, i, y, &eb), 0, "%s", eb.msg);
			cr_expect_eq(memcmp(x, y, n), 0, "%s differs", fb.t[i].name);
			free(x);
			free(y);
			found++;
		}
		mr_st_close(&fb);
	}
	cr_expect_eq(found, fa.ntensors, "the shards hold %d tensors, the file %d", found,
		     fa.ntensors);
	mr_st_close(&fa);
}

/* The first step's line of loss log tmp/file ("step loss aux gnorm lr
 * val_loss", after the header line MR_LOSS_LOG_HEADER). */
static char *first_line(const char *file)
{
	char *s = slurp(in_tmp(file), NULL), *row;

	cr_assert_not_null(s, "no %s", file);
	cr_assert(!strncmp(s, MR_LOSS_LOG_HEADER "\n", strlen(MR_LOSS_LOG_HEADER) + 1),
		  "%s does not start with the header: %s", file, s);
	row = strdup(s + strlen(MR_LOSS_LOG_HEADER) + 1);
	free(s);
	cr_assert_not_null(row);
	if (strchr(row, '\n'))
		*strchr(row, '\n') = 0;
	return row;
}

Test(hf_cli, export_check_roundtrip_resume, .timeout = 900)
{
	char *out, *x, *y, *a, *b;
	const char *shards[8];
	char names[8][160];
	size_t nx, ny;
	int n;

	scratch();
	cr_assert_eq(job("tp2", "--nproc-per-node 2 --tp 2",
			 ", \"steps\": 2, \"ckpt_dir\": \"tp2.ckpt\", \"ckpt_every\": 2"),
		     0, "%s", job_log("tp2"));

	/* the export: the three files transformers loads */
	cr_assert_eq(MESHRUN(&out, "ckpt export tp2.ckpt --hf hf1"), 0, "%s", out);
	cr_expect(strstr(out, "exported step 2") && strstr(out, "1 safetensors file"), "%s", out);
	free(out);
	cr_assert_eq(access(in_tmp("hf1/config.json"), F_OK), 0);
	cr_assert_eq(access(in_tmp("hf1/generation_config.json"), F_OK), 0);
	cr_assert_eq(access(in_tmp("hf1/model.safetensors"), F_OK), 0);
	x = slurp(in_tmp("hf1/config.json"), NULL);
	cr_expect(strstr(x, "\"LlamaForCausalLM\"") && strstr(x, "\"num_key_value_heads\": 2") &&
		  strstr(x, "\"intermediate_size\": 96") && strstr(x, "\"torch_dtype\": \"float32\"") &&
		  strstr(x, "\"tie_word_embeddings\": false"), "%s", x);
	free(x);

	/* the independent reader: meshrun's logits from the file */
	if (have_torch()) {
		write_logits(in_tmp("tp2.ckpt/step-00000002"), "tp2.logits");
		cr_assert_eq(checker("hf1", "tp2.logits", "", &out), 0, "%s", out);
		cr_expect(strstr(out, "hf_llama_check: ok"), "%s", out);
		free(out);
		cr_assert_eq(checker("hf1", "tp2.logits", "--permute-qk", &out), 1,
			     "q/k rows permuted must change the logits: %s", out);
		cr_expect(strstr(out, "logits differ"), "%s", out);
		free(out);
	} else {
		cr_log_warn("/usr/bin/python3 has no torch: the independent reader is skipped");
	}

	/* import -> sharded export -> import -> export: the same bytes */
	cr_assert_eq(MESHRUN(&out, "ckpt import --hf hf1 imp --step 2"), 0, "%s", out);
	cr_expect(strstr(out, "imp/step-00000002") && strstr(out, "n_kv_head 2"), "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt export imp --hf hf2 --max-shard-bytes 60000"), 0, "%s",
		     out);
	cr_expect(strstr(out, "and an index"), "%s", out);
	free(out);
	cr_assert_eq(access(in_tmp("hf2/model.safetensors"), F_OK), -1, "sharded: no single file");
	for (n = 0; n < 8; n++) {
		snprintf(names[n], sizeof(names[n]), "%s/hf2/model-%05d-of-", tmp, n + 1);
		if (sh(NULL, "ls hf2/model-%05d-of-*.safetensors", n + 1) != 0)
			break;
	}
	cr_assert(n > 1 && n < 8, "%d shards", n);
	for (int k = 0; k < n; k++) {
		char tail[40];
		snprintf(tail, sizeof(tail), "%05d.safetensors", n);
		strncat(names[k], tail, sizeof(names[k]) - strlen(names[k]) - 1);
		shards[k] = names[k];
	}
	same_tensors(in_tmp("hf1/model.safetensors"), shards, n);
	if (have_torch()) {
		cr_assert_eq(checker("hf2", "tp2.logits", "", &out), 0, "sharded: %s", out);
		free(out);
	}
	cr_assert_eq(MESHRUN(&out, "ckpt import --hf hf2 imp2"), 0, "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt export imp2 --hf hf3"), 0, "%s", out);
	free(out);
	x = slurp(in_tmp("hf1/model.safetensors"), &nx);
	y = slurp(in_tmp("hf3/model.safetensors"), &ny);
	cr_assert(x && y);
	cr_expect(nx == ny && memcmp(x, y, nx) == 0, "export -> import -> export changed the file");
	free(x);
	free(y);
	x = slurp(in_tmp("hf1/config.json"), NULL);
	y = slurp(in_tmp("hf3/config.json"), NULL);
	cr_expect_str_eq(x, y, "config.json changed");
	free(x);
	free(y);

	/* --safetensors is GPT-2's layout: it points a llama model at --hf */
	cr_assert_eq(MESHRUN(&out, "ckpt export tp2.ckpt --safetensors x.safetensors"), 1, "%s",
		     out);
	cr_expect(strstr(out, "--hf"), "%s", out);
	free(out);

	/* an existing output is kept unless --force */
	cr_assert_eq(MESHRUN(&out, "ckpt export imp --hf hf1"), 1, "%s", out);
	cr_expect(strstr(out, "exists") && strstr(out, "--force"), "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt export imp --hf hf2 --force"), 0, "%s", out);
	free(out);
	cr_expect_eq(access(in_tmp("hf2/model.safetensors.index.json"), F_OK), -1,
		     "a stale index goes when one file replaces the shards");

	/* resume on another mesh: tp 2 from the import, one rank from the
	 * original step; both start at step 3 with the same loss */
	cr_assert_eq(sh(&out, "mkdir src && cp -r tp2.ckpt/step-00000002 src/"), 0, "%s", out);
	free(out);
	cr_assert_eq(job("from_src", "--nproc-per-node 1",
			 ", \"steps\": 3, \"ckpt_dir\": \"src\", \"loss_log\": \"src.loss\""),
		     0, "%s", job_log("from_src"));
	cr_assert_eq(job("from_imp", "--nproc-per-node 2 --tp 2",
			 ", \"steps\": 3, \"ckpt_dir\": \"imp\", \"loss_log\": \"imp.loss\""),
		     0, "%s", job_log("from_imp"));
	cr_expect(strstr(job_log("from_imp"), "checkpoint_resumed"), "%s", job_log("from_imp"));
	a = first_line("src.loss");
	b = first_line("imp.loss");
	cr_expect(!strncmp(a, "3 ", 2) && !strncmp(b, "3 ", 2), "both start at step 3: %s | %s", a,
		  b);
	cr_expect(fabs(strtod(a + 2, NULL) - strtod(b + 2, NULL)) < 1e-4,
		  "first loss: from the checkpoint %s, from the import at tp 2 %s", a, b);
	free(a);
	free(b);
}

/* Mixtral: a llama MoE job with experts in every layer exports as
 * MixtralForCausalLM (one tensor per expert and projection), reads back
 * in the independent reader with meshrun's logits, and imports and
 * exports again to the same bytes; a model with experts every 2nd layer
 * has no Mixtral form and is refused naming moe_every. */
Test(hf_cli, mixtral_export_check_roundtrip, .timeout = 900, MR_NOT_UNDER_SAN)
{
	char *out, *x, *y;
	size_t nx, ny;

	scratch();
	cr_assert_eq(job("mx", "--nproc-per-node 2 --ep 2",
			 ", \"moe_every\": 1, \"n_experts\": 4, \"top_k\": 2, "
			 "\"moe_policy\": \"dropless\", \"aux_coef\": 0.02, \"steps\": 2, "
			 "\"ckpt_dir\": \"mx.ckpt\", \"ckpt_every\": 2"),
		     0, "%s", job_log("mx"));
	cr_assert_eq(MESHRUN(&out, "ckpt export mx.ckpt --hf hf1"), 0, "%s", out);
	free(out);
	x = slurp(in_tmp("hf1/config.json"), NULL);
	cr_assert_not_null(x);
	cr_expect(strstr(x, "\"MixtralForCausalLM\"") && strstr(x, "\"model_type\": \"mixtral\"") &&
		  strstr(x, "\"num_local_experts\": 4") &&
		  strstr(x, "\"num_experts_per_tok\": 2") &&
		  strstr(x, "\"router_aux_loss_coef\": 0.02") &&
		  strstr(x, "\"intermediate_size\": 96"), "%s", x);
	free(x);
	x = slurp(in_tmp("hf1/model.safetensors"), &nx);
	cr_assert_not_null(x);
	cr_expect(memmem(x, nx, "model.layers.1.block_sparse_moe.experts.3.w2.weight", 51) &&
		  memmem(x, nx, "model.layers.0.block_sparse_moe.gate.weight", 43) &&
		  !memmem(x, nx, "mlp.gate_proj", 13), "tensor names");
	free(x);
	if (have_torch()) {
		write_logits(in_tmp("mx.ckpt/step-00000002"), "mx.logits");
		cr_assert_eq(checker("hf1", "mx.logits", "", &out), 0, "%s", out);
		cr_expect(strstr(out, "hf_llama_check: ok"), "%s", out);
		free(out);
	} else {
		cr_log_warn("/usr/bin/python3 has no torch: the independent reader is skipped");
	}
	cr_assert_eq(MESHRUN(&out, "ckpt import --hf hf1 imp"), 0, "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt export imp --hf hf2"), 0, "%s", out);
	free(out);
	x = slurp(in_tmp("hf1/model.safetensors"), &nx);
	y = slurp(in_tmp("hf2/model.safetensors"), &ny);
	cr_assert(x && y);
	cr_expect(nx == ny && memcmp(x, y, nx) == 0, "export -> import -> export changed the file");
	free(x);
	free(y);
	x = slurp(in_tmp("hf1/config.json"), NULL);
	y = slurp(in_tmp("hf2/config.json"), NULL);
	cr_expect_str_eq(x, y, "config.json changed");
	free(x);
	free(y);

	cr_assert_eq(job("mx2", "--nproc-per-node 1",
			 ", \"moe_every\": 2, \"n_experts\": 4, \"top_k\": 2, \"steps\": 1, "
			 "\"ckpt_dir\": \"mx2.ckpt\", \"ckpt_every\": 1"),
		     0, "%s", job_log("mx2"));
	cr_assert_eq(MESHRUN(&out, "ckpt export mx2.ckpt --hf hf3"), 1, "%s", out);
	cr_expect(strstr(out, "moe_every"), "%s", out);
	free(out);
}

/* ---- hand-made directories ---- */

enum { D_F32, D_F16, D_BF16, D_I32 };

/* One tensor of a hand-made file: shape (r, c) (c 0: 1-D), its dtype. */
struct ht {
	char name[96];
	int r, c, dtype;
};

/* The test's value of element j of tensor i: a multiple of 1/8 in
 * [-1, 1], exact in F16 and BF16. */
static float val(int i, int j)
{
	return (float)((i * 7 + j * 3) % 17 - 8) / 8.0f;
}

static uint16_t to_f16(float f) /* exact for val()'s values */
{
	uint32_t s = f < 0 ? 0x8000u : 0, m;
	int e;

	f = fabsf(f);
	if (f == 0)
		return (uint16_t)s;
	m = (uint32_t)ldexpf(frexpf(f, &e), 11); /* 1024..2047 */
	return (uint16_t)(s | (uint32_t)(e - 1 + 15) << 10 | (m & 0x3ffu));
}

static uint16_t to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return (uint16_t)(u >> 16);
}

/* Writes a safetensors file of tensors ts[0..n) with val() values (the
 * i of val is the tensor's index in `all`, by name). */
static void write_st(const char *path, const struct ht *ts, int n, const struct ht *all, int nall)
{
	char head[16384];
	size_t at, off = 0, hl;
	FILE *f;

	at = (size_t)snprintf(head, sizeof(head), "{\"__metadata__\":{\"format\":\"pt\"}");
	for (int i = 0; i < n; i++) {
		size_t cnt = (size_t)ts[i].r * (size_t)(ts[i].c ? ts[i].c : 1);
		size_t sz = ts[i].dtype == D_F16 || ts[i].dtype == D_BF16 ? 2 : 4;
		static const char *const dn[] = { "F32", "F16", "BF16", "I32" };
		char shape[40];
		if (ts[i].c)
			snprintf(shape, sizeof(shape), "[%d,%d]", ts[i].r, ts[i].c);
		else
			snprintf(shape, sizeof(shape), "[%d]", ts[i].r);
		at += (size_t)snprintf(head + at, sizeof(head) - at,
				       ",\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
				       ts[i].name, dn[ts[i].dtype], shape, off, off + cnt * sz);
		off += cnt * sz;
	}
	at += (size_t)snprintf(head + at, sizeof(head) - at, "}");
	while (at % 8)
		head[at++] = ' ';
	cr_assert_lt(at, sizeof(head));
	f = fopen(path, "wb");
	cr_assert_not_null(f, "%s", path);
	hl = at;
	for (int k = 0; k < 8; k++)
		fputc((int)((uint64_t)hl >> (8 * k) & 0xff), f);
	fwrite(head, 1, at, f);
	for (int i = 0; i < n; i++) {
		size_t cnt = (size_t)ts[i].r * (size_t)(ts[i].c ? ts[i].c : 1);
		int gi = 0;
		for (int k = 0; k < nall; k++)
			if (!strcmp(all[k].name, ts[i].name))
				gi = k;
		for (size_t j = 0; j < cnt; j++) {
			float v = val(gi, (int)j);
			if (ts[i].dtype == D_F16) {
				uint16_t h = to_f16(v);
				fwrite(&h, 2, 1, f);
			} else if (ts[i].dtype == D_BF16) {
				uint16_t h = to_bf16(v);
				fwrite(&h, 2, 1, f);
			} else if (ts[i].dtype == D_I32) {
				int32_t q = (int32_t)(v * 8);
				fwrite(&q, 4, 1, f);
			} else {
				fwrite(&v, 4, 1, f);
			}
		}
	}
	fclose(f);
}

/* What to make wrong in a hand-made directory (zero: a good one). */
struct knobs {
	const char *model_type;  /* NULL: "llama" */
	const char *drop_key;    /* a config key left out */
	const char *scaling;     /* rope_scaling's JSON; NULL: Llama 3.1's */
	const char *drop;        /* a tensor left out */
	const char *odd;         /* a tensor one row too many */
	const char *i32;         /* a tensor stored as I32 */
	const char *extra;       /* an extra tensor */
	const char *ghost;       /* a shard the weight_map names that is missing */
	int single;              /* model.safetensors instead of two shards */
	int head_differs;        /* a tied head that is not the embedding */
};

/* Model: L 1, C 8, NH 2, NKV 1 (hs 4), F 16, V 10, tied head. */
#define HC 8
#define HF_ 16
#define HV 10
static int hf_tensors(struct ht *t, const struct knobs *k)
{
	static const struct {
		const char *name;
		int r, c, dtype;
	} base[] = {
		{ "model.embed_tokens.weight", HV, HC, D_BF16 },
		{ "model.layers.0.input_layernorm.weight", HC, 0, D_F16 },
		{ "model.layers.0.self_attn.q_proj.weight", HC, HC, D_F32 },
		{ "model.layers.0.self_attn.k_proj.weight", 4, HC, D_BF16 },
		{ "model.layers.0.self_attn.v_proj.weight", 4, HC, D_F16 },
		{ "model.layers.0.self_attn.o_proj.weight", HC, HC, D_F32 },
		{ "model.layers.0.self_attn.rotary_emb.inv_freq", 2, 0, D_F32 },
		{ "model.layers.0.post_attention_layernorm.weight", HC, 0, D_F16 },
		{ "model.layers.0.mlp.gate_proj.weight", HF_, HC, D_BF16 },
		{ "model.layers.0.mlp.up_proj.weight", HF_, HC, D_F32 },
		{ "model.layers.0.mlp.down_proj.weight", HC, HF_, D_F16 },
		{ "model.norm.weight", HC, 0, D_F32 },
	};
	int n = 0;

	for (size_t i = 0; i < sizeof(base) / sizeof(base[0]); i++) {
		if (k->drop && !strcmp(k->drop, base[i].name))
			continue;
		snprintf(t[n].name, sizeof(t[n].name), "%s", base[i].name);
		t[n].r = base[i].r + (k->odd && !strcmp(k->odd, base[i].name));
		t[n].c = base[i].c;
		t[n].dtype = k->i32 && !strcmp(k->i32, base[i].name) ? D_I32 : base[i].dtype;
		n++;
	}
	if (k->extra) {
		snprintf(t[n].name, sizeof(t[n].name), "%s", k->extra);
		t[n].r = 3, t[n].c = 0, t[n].dtype = D_F32;
		n++;
	}
	if (k->head_differs) { /* a tied head: val() of another index differs */
		snprintf(t[n].name, sizeof(t[n].name), "lm_head.weight");
		t[n].r = HV, t[n].c = HC, t[n].dtype = D_F32;
		n++;
	}
	return n;
}

static void make_hf(const char *dir, const struct knobs *k)
{
	static const char *const keys[][2] = {
		{ "architectures", "[\"LlamaForCausalLM\"]" },
		{ "hidden_size", "8" },
		{ "intermediate_size", "16" },
		{ "num_hidden_layers", "1" },
		{ "num_attention_heads", "2" },
		{ "num_key_value_heads", "1" },
		{ "vocab_size", "10" },
		{ "max_position_embeddings", "32" },
		{ "tie_word_embeddings", "true" },
		{ "hidden_act", "\"silu\"" },
		{ "bos_token_id", "1" },
	};
	char text[4096], path[300], mt[64];
	struct ht t[20];
	size_t at;
	int n;

	snprintf(path, sizeof(path), "%s/%s", tmp, dir);
	cr_assert_eq(mkdir(path, 0755), 0, "%s", path);
	snprintf(mt, sizeof(mt), "\"%s\"", k->model_type ? k->model_type : "llama");
	at = (size_t)snprintf(text, sizeof(text), "{\"model_type\": %s", mt);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!k->drop_key || strcmp(k->drop_key, keys[i][0]))
			at += (size_t)snprintf(text + at, sizeof(text) - at, ", \"%s\": %s",
					       keys[i][0], keys[i][1]);
	snprintf(text + at, sizeof(text) - at, ", \"rope_scaling\": %s}",
		 k->scaling ? k->scaling
			    : "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": "
			      "1.0, \"high_freq_factor\": 4.0, "
			      "\"original_max_position_embeddings\": 8192}");
	snprintf(path, sizeof(path), "%s/%s/config.json", tmp, dir);
	spit(path, text, strlen(text));
	n = hf_tensors(t, k);
	if (k->single) {
		snprintf(path, sizeof(path), "%s/%s/model.safetensors", tmp, dir);
		write_st(path, t, n, t, n);
		return;
	}
	/* two shards: the first 5 tensors, then the rest */
	snprintf(path, sizeof(path), "%s/%s/model-00001-of-00002.safetensors", tmp, dir);
	write_st(path, t, 5, t, n);
	snprintf(path, sizeof(path), "%s/%s/model-00002-of-00002.safetensors", tmp, dir);
	write_st(path, t + 5, n - 5, t, n);
	at = (size_t)snprintf(text, sizeof(text), "{\"metadata\": {\"total_size\": 0}, "
						  "\"weight_map\": {");
	for (int i = 0; i < n; i++)
		at += (size_t)snprintf(text + at, sizeof(text) - at, "%s\"%s\": \"%s\"",
				       i ? ", " : "", t[i].name,
				       k->ghost && i == n - 1 ? k->ghost
				       : i < 5		      ? "model-00001-of-00002.safetensors"
							      : "model-00002-of-00002.safetensors");
	snprintf(text + at, sizeof(text) - at, "}}");
	snprintf(path, sizeof(path), "%s/%s/model.safetensors.index.json", tmp, dir);
	spit(path, text, strlen(text));
}

Test(hf_cli, import_dtypes_tied_scaled_sharded, .timeout = 120)
{
	struct knobs k = { 0 };
	struct mr_errbuf eb = { "", "" };
	struct mr_ckpt_manifest mf;
	struct ht t[20];
	struct mr_gpt m;
	char *out, *cfg;
	int n;

	scratch();
	make_hf("good", &k);
	cr_assert_eq(MESHRUN(&out, "ckpt import --hf good imp"), 0, "%s", out);
	cr_expect(strstr(out, "tied head") && strstr(out, "llama3 rope scaling") &&
		  strstr(out, "imp/step-00000000"), "%s", out);
	free(out);
	cr_assert_eq(mr_ckpt_manifest_read(&mf, in_tmp("imp/step-00000000"), &eb), 0, "%s",
		     eb.msg);
	cr_expect_eq(mf.model.arch, MR_ARCH_LLAMA);
	cr_expect(mf.model.d_model == HC && mf.model.n_layer == 1 && mf.model.n_head == 2 &&
		  mr_gpt_kv_heads(&mf.model) == 1 && mr_gpt_ffn(&mf.model) == HF_ &&
		  mf.model.vocab == HV && mf.model.max_seq == 32 && mf.model.tie_embeddings);
	/* absent keys: LlamaConfig's defaults, not meshrun's */
	cr_expect_eq(mr_gpt_norm_eps(&mf.model), 1e-6f);
	cr_expect_eq(mr_gpt_rope_theta(&mf.model), 10000.0f);
	cr_expect(mf.model.rope_scaling.factor == 8.0f &&
		  mf.model.rope_scaling.low_freq_factor == 1.0f &&
		  mf.model.rope_scaling.high_freq_factor == 4.0f &&
		  mf.model.rope_scaling.original_max_pos == 8192);
	mr_ckpt_manifest_release(&mf);
	/* every value exact, whatever its dtype */
	load_step(in_tmp("imp/step-00000000"), &m, 1);
	n = hf_tensors(t, &k);
	for (int i = 0; i < m.ntensors; i++) {
		char hf[128];
		int gi = -1;
		cr_assert_eq(mr_hf_llama_name(m.tensors[i].name, hf, sizeof(hf)), 0);
		for (int j = 0; j < n; j++)
			if (!strcmp(t[j].name, hf))
				gi = j;
		cr_assert_geq(gi, 0, "%s", hf);
		for (size_t j = 0; j < m.tensors[i].n; j++)
			cr_assert_eq(m.params[m.tensors[i].off + j], val(gi, (int)j),
				     "%s[%zu] (%s)", hf, j, t[gi].dtype == D_BF16 ? "BF16"
							    : t[gi].dtype == D_F16 ? "F16" : "F32");
	}
	mr_gpt_release(&m);
	/* and back out: the tie and the scaling in config.json, no head */
	cr_assert_eq(MESHRUN(&out, "ckpt export imp --hf back"), 0, "%s", out);
	free(out);
	cfg = slurp(in_tmp("back/config.json"), NULL);
	cr_expect(strstr(cfg, "\"tie_word_embeddings\": true") &&
		  strstr(cfg, "\"rope_type\": \"llama3\"") && strstr(cfg, "\"factor\": 8.0") &&
		  strstr(cfg, "\"original_max_position_embeddings\": 8192") &&
		  strstr(cfg, "\"rms_norm_eps\": 1e-6") && strstr(cfg, "\"rope_theta\": 10000.0"),
		  "%s", cfg);
	free(cfg);
	cr_assert_eq(sh(&out, "grep -c lm_head back/model.safetensors"), 1, "tied: no lm_head %s",
		     out);
	free(out);
	/* a single-file directory too; --max-seq in place of
	 * max_position_embeddings */
	k.single = 1;
	make_hf("one", &k);
	cr_assert_eq(MESHRUN(&out, "ckpt import --hf one imp1 --max-seq 24"), 0, "%s", out);
	cr_expect(strstr(out, "max_seq 24"), "%s", out);
	free(out);
}

/* make_hf(dir, k), then import: exit 1 and every needle in the message. */
static void refused(const char *dir, const struct knobs *k, const char *n1, const char *n2,
		    const char *n3)
{
	char *out;

	make_hf(dir, k);
	cr_assert_eq(MESHRUN(&out, "ckpt import --hf %s %s.out", dir, dir), 1, "%s: %s", dir, out);
	cr_expect(strstr(out, n1) && strstr(out, n2) && (!n3 || strstr(out, n3)), "%s: %s", dir,
		  out);
	cr_expect_eq(access(in_tmp(dir), F_OK), 0);
	free(out);
}

Test(hf_cli, malformed_refused, .timeout = 120)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt_config gc = { .vocab = 16, .max_seq = 8, .n_layer = 1, .d_model = 8,
				    .n_head = 2 };
	struct mr_gpt g;
	char *out;

	scratch();
	refused("nokey", &(struct knobs){ .drop_key = "hidden_size" }, "nokey/config.json",
		"'hidden_size' is missing", NULL);
	refused("mistral", &(struct knobs){ .model_type = "mistral" }, "config.json",
		"model_type is \"mistral\"", "\"llama\"");
	refused("yarn", &(struct knobs){ .scaling = "{\"rope_type\": \"yarn\", \"factor\": 4}" },
		"config.json", "'yarn' is not supported", NULL);
	refused("notensor", &(struct knobs){ .drop = "model.norm.weight" }, "index.json",
		"no tensor 'model.norm.weight'", NULL);
	refused("notensor1", &(struct knobs){ .drop = "model.norm.weight", .single = 1 },
		"notensor1/model.safetensors", "no tensor 'model.norm.weight'", NULL);
	refused("shape", &(struct knobs){ .odd = "model.layers.0.self_attn.k_proj.weight" },
		"model-00001-of-00002.safetensors", "'model.layers.0.self_attn.k_proj.weight' has "
		"shape [5, 8]", "needs [4, 8]");
	refused("i32", &(struct knobs){ .i32 = "model.layers.0.mlp.up_proj.weight" },
		"model-00002-of-00002.safetensors", "'model.layers.0.mlp.up_proj.weight' is I32",
		"not a float type");
	refused("extra", &(struct knobs){ .extra = "model.layers.0.mlp.bias" },
		"extra/model-00002", "unexpected tensor 'model.layers.0.mlp.bias'", NULL);
	refused("ghost", &(struct knobs){ .ghost = "model-00003-of-00002.safetensors" },
		"ghost/model.safetensors.index.json",
		"names shard 'model-00003-of-00002.safetensors', which is missing", NULL);
	refused("head", &(struct knobs){ .head_differs = 1 }, "'lm_head.weight' differs",
		"tie_word_embeddings", NULL);
	cr_assert_eq(sh(&out, "mkdir empty && cp head/config.json empty/"), 0, "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt import --hf empty e.out"), 1, "%s", out);
	cr_expect(strstr(out, "'empty' has neither 'model.safetensors' nor "
			      "'model.safetensors.index.json'"), "%s", out);
	free(out);

	/* a gpt2 model has no Llama layout */
	cr_assert_eq(mr_gpt_create(&g, &gc, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	cr_expect_eq(mr_hf_llama_export(&g, in_tmp("gpt2hf"), 0, 0, NULL, &eb), MR_ENOTSUP);
	cr_expect_str_eq(eb.field, "arch");
	mr_gpt_release(&g);

	/* usage */
	cr_assert_eq(MESHRUN(&out, "ckpt import --hf nodir x"), 2, "%s", out);
	cr_expect(strstr(out, "'nodir' is not a directory"), "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt import --hf head --safetensors a.st x"), 2, "%s", out);
	cr_expect(strstr(out, "give one input"), "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt import --hf head --n-head 4 x"), 2, "%s", out);
	cr_expect(strstr(out, "--n-head"), "%s", out);
	free(out);
	cr_assert_eq(MESHRUN(&out, "ckpt export head --safetensors a.st --max-shard-bytes 9"), 2,
		     "%s", out);
	cr_expect(strstr(out, "only with --hf"), "%s", out);
	free(out);
}
