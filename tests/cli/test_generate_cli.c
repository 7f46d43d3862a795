/*
 * test_generate_cli.c - `meshrun generate` as a user runs it, on
 * checkpoints written in-process (mr_ckpt_write_params) and by real
 * `meshrun local` jobs (tp 2 x pp 2; MoE over ep 2 with ZeRO-1), and on
 * input made to be wrong.
 *
 * What each test proves:
 *  - same_as_library: for a byte-level gpt2 and a llama with grouped-query
 *    attention and an untied head, the CLI's greedy text is the bytes
 *    mr_gen_run produces on the same weights (test_generate checks those
 *    against the full forward), and so is its sampled text; stdout is only the new text and a
 *    newline, stderr one summary line with tokens and tokens/s.
 *  - seeds: the same seed prints the same text, top-k 1 prints the greedy
 *    text; on a freshly initialised model (logits within ~0.1 of each
 *    other: nearly uniform over 256 bytes at temperature 1) two seeds
 *    print different 16-byte texts.
 *  - max_seq: more new tokens than the window holds stops at max_seq
 *    with a note, exit 0.
 *  - multi_rank_*: a checkpoint written by a tp 2 x pp 2 job, and one by
 *    a MoE job with experts over ep 2 and ZeRO-1, generates the ids the
 *    run's own gathered weights (save_weights) generate in-process, and
 *    the same ids, greedy and sampled, as the checkpoint re-read as one
 *    rank (ckpt export --safetensors, then import).
 *  - cuda_emulated: the emulated-cuda build of meshrun (build/emul)
 *    prints with --device cuda --precision fp32 what the cpu prints; a
 *    llama MoE checkpoint is refused there (exit 2, naming moe_every).
 *  - bad_input: a missing directory, a directory without checkpoints, a
 *    corrupt manifest, a flipped byte in a shard, bad option values, an id outside the vocabulary,
 *    text for a non-byte vocabulary, an empty or too long prompt, a
 *    missing step: exit 2, a message naming the thing, no crash.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/mr_ckpt.h"
#include "core/mr_rng.h"
#include "data/mr_tokenizer.h"
#include "infer/mr_generate.h"
#include "model/mr_gpt.h"
#include "model/mr_weights.h"
#include "proc.h"

static char tmp[256];

static void scratch(void)
{
	const char *d = mr_test_scratch("mr-gen-cli");

	cr_assert_not_null(d);
	snprintf(tmp, sizeof(tmp), "%s", d);
}

/* A whole file ("" when it cannot be read), malloc'd. */
static char *slurp(const char *path)
{
	char *s = mr_test_slurp(path, NULL);

	return s ? s : calloc(1, 1);
}

struct res {
	int rc;
	char *out, *err;
};

static void res_free(struct res *r)
{
	free(r->out);
	free(r->err);
}

/* A shell command in tmp (printf-style), stdout and stderr apart. */
static struct res sh(const char *fmt, ...)
{
	char cmd[8192], body[7000], o[300], e[300];
	struct res r;
	va_list ap;
	int st;

	va_start(ap, fmt);
	vsnprintf(body, sizeof(body), fmt, ap);
	va_end(ap);
	snprintf(o, sizeof(o), "%s/sh.out", tmp);
	snprintf(e, sizeof(e), "%s/sh.err", tmp);
	snprintf(cmd, sizeof(cmd), "cd '%s' && { %s ; } >'%s' 2>'%s'", tmp, body, o, e);
	st = system(cmd);
	r.out = slurp(o);
	r.err = slurp(e);
	r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	cr_assert(!strstr(r.err, "Sanitizer") && !strstr(r.err, "runtime error:"), "%s: %s",
		  body, r.err);
	return r;
}

/* `meshrun generate ARGS` (bin: "meshrun" or "emul/meshrun"). */
static struct res gen(const char *bin, const char *args)
{
	char *b = realpath(mr_proc_build_dir(), NULL);
	struct res r = sh("timeout 300 '%s/%s' generate %s", b ? b : "build", bin, args);

	free(b);
	return r;
}

static struct mr_gpt_config gpt2(void)
{
	struct mr_gpt_config c;

	memset(&c, 0, sizeof(c));
	c.vocab = 256;
	c.max_seq = 24;
	c.n_layer = 2;
	c.d_model = 64;
	c.n_head = 2;
	return c;
}

static struct mr_gpt_config llama(void)
{
	struct mr_gpt_config c = gpt2();

	c.arch = MR_ARCH_LLAMA;
	c.d_model = 128;
	c.n_head = 4;
	c.n_kv_head = 2;
	c.ffn_hidden = 96;
	c.rope_theta = 10000.0f;
	return c;
}

/* Writes tmp/dir, a one-rank checkpoint of c: wide weights (normal 0.3,
 * no near ties) or the model's own init. *params (may be NULL) gets them. */
static void write_ckpt(const char *dir, const struct mr_gpt_config *c, int wide, float **params)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt m;
	struct mr_rng r;
	char path[512];
	float *p;

	cr_assert_eq(mr_gpt_create(&m, c, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_init_params(&m, 3), 0);
	p = malloc(m.nparams * sizeof(float));
	cr_assert_not_null(p);
	memcpy(p, m.params, m.nparams * sizeof(float));
	mr_rng_seed(&r, 5, 1);
	for (size_t i = 0; wide && i < m.nparams; i++)
		p[i] = (float)(0.3 * mr_rng_normal(&r));
	snprintf(path, sizeof(path), "%s/%s", tmp, dir);
	cr_assert_eq(mr_ckpt_write_params(path, c, 10, p, &eb), 0, "%s", eb.msg);
	mr_gpt_release(&m);
	if (params)
		*params = p;
	else
		free(p);
}

/* The CLI's text for args against mr_gen_run's bytes with o on g. */
static void same_text(struct mr_gen *g, const struct mr_gen_opts *o, const char *args)
{
	struct mr_errbuf eb = { "", "" };
	const char *text = "hello";
	int ids[5], out[8], n, i;
	char want[16], line[64];
	struct res r;

	for (i = 0; i < 5; i++)
		ids[i] = (unsigned char)text[i];
	cr_assert_eq(mr_gen_run(g, ids, 5, o, out, &n, NULL, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(n, 8);
	for (i = 0; i < 8; i++)
		want[i] = (char)out[i];
	want[8] = '\n';
	r = gen("meshrun", args);
	cr_assert_eq(r.rc, 0, "exit %d: %s", r.rc, r.err);
	cr_assert(memcmp(r.out, want, 9) == 0 && r.out[9] == 0, "'%s': stdout is not the 8 "
		  "bytes mr_gen_run made and a newline: '%s'", args, r.out);
	snprintf(line, sizeof(line), "generated 8 tokens");
	cr_assert(strstr(r.err, line) && strstr(r.err, "tokens/s") &&
		  strstr(r.err, "step-00000010"), "%s", r.err);
	cr_assert(strchr(r.err, '\n') == strrchr(r.err, '\n'), "more than one line on stderr: %s",
		  r.err);
	res_free(&r);
}

static void check_same_as_library(struct mr_gpt_config c)
{
	struct mr_gen_opts greedy = { 8, 0.0f, 0, 1.0f, 0 }, sampled = { 8, 1.0f, 0, 1.0f, 9 };
	struct mr_errbuf eb = { "", "" };
	struct mr_pool *pool;
	struct mr_dev dev;
	struct mr_gen g;
	float *p;

	scratch();
	write_ckpt("ck", &c, 1, &p);
	cr_assert_eq(mr_pool_create(&pool, 1), 0);
	cr_assert_eq(mr_dev_open(&dev, "cpu", 0, NULL, pool, NULL), 0);
	cr_assert_eq(mr_gen_init_params(&g, &c, p, &dev, 5, &eb), 0, "%s", eb.msg);
	same_text(&g, &greedy, "ck --prompt hello --max-new-tokens 8 --temperature 0 --threads 1");
	/* sampled: every step's whole distribution counts, not only its top */
	same_text(&g, &sampled, "ck --prompt hello --max-new-tokens 8 --seed 9 --threads 1");
	mr_gen_release(&g);
	mr_dev_close(&dev);
	mr_pool_free(pool);
	free(p);
}

Test(generate_cli, same_as_library_gpt2, .timeout = 300)
{
	check_same_as_library(gpt2());
}

Test(generate_cli, same_as_library_llama_gqa_untied, .timeout = 300)
{
	check_same_as_library(llama());
}

Test(generate_cli, seeds, .timeout = 300)
{
	struct mr_gpt_config c = gpt2();
	struct res a, b, k1, gr;

	scratch();
	write_ckpt("wide", &c, 1, NULL);
	write_ckpt("init", &c, 0, NULL);
	a = gen("meshrun", "wide --prompt abc --max-new-tokens 16 --seed 7 --top-p 0.9");
	b = gen("meshrun", "wide --prompt abc --max-new-tokens 16 --seed 7 --top-p 0.9");
	cr_assert(a.rc == 0 && b.rc == 0, "%s %s", a.err, b.err);
	cr_assert_str_eq(a.out, b.out, "the same seed printed other text");
	k1 = gen("meshrun", "wide --prompt abc --max-new-tokens 16 --seed 3 --top-k 1");
	gr = gen("meshrun", "wide --prompt abc --max-new-tokens 16 --temperature 0");
	cr_assert(k1.rc == 0 && gr.rc == 0, "%s %s", k1.err, gr.err);
	cr_assert_str_eq(k1.out, gr.out, "top-k 1 is not greedy");
	res_free(&a);
	res_free(&b);
	a = gen("meshrun", "init --prompt abc --max-new-tokens 16 --seed 1 --temperature 1");
	b = gen("meshrun", "init --prompt abc --max-new-tokens 16 --seed 2 --temperature 1");
	cr_assert(a.rc == 0 && b.rc == 0, "%s %s", a.err, b.err);
	cr_assert_eq(strlen(a.out), 17);
	cr_assert(strcmp(a.out, b.out) != 0, "seeds 1 and 2 printed the same text '%s'", a.out);
	res_free(&a);
	res_free(&b);
	res_free(&k1);
	res_free(&gr);
}

Test(generate_cli, max_seq, .timeout = 300)
{
	struct mr_gpt_config c = gpt2();
	struct res r;

	scratch();
	write_ckpt("ck", &c, 1, NULL);
	r = gen("meshrun", "ck --prompt-ids 1,2,3,4 --max-new-tokens 100 --temperature 0");
	cr_assert_eq(r.rc, 0, "%s", r.err);
	cr_assert(strstr(r.err, "generated 20 tokens") && strstr(r.err, "max_seq"), "%s", r.err);
	{
		int n = 0;
		for (char *s = strtok(r.out, " \n"); s; s = strtok(NULL, " \n"))
			n++;
		cr_assert_eq(n, 20, "%d ids printed for a window of 24 after 4", n);
	}
	res_free(&r);
}

/* The ids (o->max_new <= 10) from the weights file a job gathered at its end (another
 * path than the checkpoint's: mr_gpt_gather_full), as the CLI prints. */
static void ids_from_weights(const char *file, const int *prompt, int np,
			     const struct mr_gen_opts *o, char *buf, size_t cap)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt_config wc;
	struct mr_pool *pool;
	struct mr_dev dev;
	struct mr_gpt w;
	struct mr_gen g;
	char path[1024];
	int out[10], n, i;
	size_t k = 0;

	snprintf(path, sizeof(path), "%s/%s", tmp, file);
	cr_assert_eq(mr_weights_read_config(path, &wc, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_create(&w, &wc, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_weights_load(&w, path, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_pool_create(&pool, 1), 0);
	cr_assert_eq(mr_dev_open(&dev, "cpu", 0, NULL, pool, NULL), 0);
	cr_assert_eq(mr_gen_init_params(&g, &wc, w.params, &dev, np, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gen_run(&g, prompt, np, o, out, &n, NULL, NULL, &eb), 0, "%s", eb.msg);
	for (i = 0; i < n; i++)
		k += (size_t)snprintf(buf + k, cap - k, i ? " %d" : "%d", out[i]);
	snprintf(buf + k, cap - k, "\n");
	mr_gen_release(&g);
	mr_dev_close(&dev);
	mr_pool_free(pool);
	mr_gpt_release(&w);
}

/* Trains tag over mesh for 3 steps (a checkpoint at 3, the weights
 * gathered into tag.bin), then checks generate on the checkpoint against
 * the weights file and against the checkpoint re-read as one rank. One
 * thread everywhere, as ids_from_weights: the same arithmetic, bit for
 * bit. */
static void check_mesh(const char *tag, const char *mesh, const char *keys)
{
	static const int prompt[3] = { 5, 17, 3 };
	struct mr_gen_opts greedy = { 10, 0.0f, 0, 1.0f, 0 }, topk = { 10, 1.0f, 20, 1.0f, 4 };
	char *b = realpath(mr_proc_build_dir(), NULL), want[256], args[512];
	struct res r, x, y;

	scratch();
	r = sh("timeout 300 '%s/meshrun' local --nodes 1 %s --workload-config "
	       "'{\"n_layer\": 2, \"d_model\": 64, \"n_head\": 4, \"vocab_size\": 96, "
	       "\"seq_len\": 16, \"batch_size\": 2, \"threads\": 1, \"seed\": 11, "
	       "\"lr\": 0.01, \"steps\": 3, \"ckpt_dir\": \"%s\", \"ckpt_every\": 3, "
	       "\"save_weights\": \"%s.bin\", \"comm_timeout_ms\": 30000%s}'", b, mesh, tag, tag,
	       keys);
	cr_assert_eq(r.rc, 0, "the %s job failed: %s", mesh, r.err);
	res_free(&r);
	r = sh("'%s/meshrun' ckpt export %s --safetensors m.safetensors && '%s/meshrun' ckpt "
	       "import --safetensors m.safetensors one", b, tag, b);
	cr_assert_eq(r.rc, 0, "%s%s", r.out, r.err);
	res_free(&r);
	snprintf(args, sizeof(args), "%s --prompt-ids 5,17,3 --max-new-tokens 10 --temperature 0 --threads 1",
		 tag);
	x = gen("meshrun", args);
	y = gen("meshrun", "one --prompt-ids 5,17,3 --max-new-tokens 10 --temperature 0");
	cr_assert(x.rc == 0 && y.rc == 0, "%s %s", x.err, y.err);
	cr_assert(strstr(y.err, "step-00000003"), "%s", y.err);
	snprintf(args, sizeof(args), "%s.bin", tag);
	ids_from_weights(args, prompt, 3, &greedy, want, sizeof(want));
	cr_assert_str_eq(x.out, want, "%s: the checkpoint generates other ids than the run's "
		     "gathered weights", mesh);
	cr_assert_str_eq(x.out, y.out, "%s and one-rank checkpoints differ (greedy)", mesh);
	res_free(&x);
	res_free(&y);
	snprintf(args, sizeof(args),
		 "%s --prompt-ids 5,17,3 --max-new-tokens 10 --seed 4 --top-k 20 --threads 1", tag);
	x = gen("meshrun", args);
	y = gen("meshrun", "one --prompt-ids 5,17,3 --max-new-tokens 10 --seed 4 --top-k 20");
	cr_assert(x.rc == 0 && y.rc == 0, "%s %s", x.err, y.err);
	cr_assert_str_eq(x.out, y.out, "%s and one-rank checkpoints differ (sampled)", mesh);
	snprintf(args, sizeof(args), "%s.bin", tag);
	ids_from_weights(args, prompt, 3, &topk, want, sizeof(want));
	cr_assert_str_eq(x.out, want, "%s: the checkpoint samples other ids than the run's "
		     "gathered weights", mesh);
	res_free(&x);
	res_free(&y);
	free(b);
}

Test(generate_cli, multi_rank_tp2_pp2, .timeout = 600)
{
	check_mesh("mesh", "--nproc-per-node 4 --tp 2 --pp 2", "");
}

Test(generate_cli, multi_rank_moe_ep2_zero1, .timeout = 600)
{
	check_mesh("moe", "--nproc-per-node 2 --ep 2",
		   ", \"moe_every\": 2, \"n_experts\": 4, \"top_k\": 2, \"capacity_factor\": 1.25, "
		   "\"zero\": 1");
}

Test(generate_cli, cuda_emulated, .timeout = 300)
{
	struct mr_gpt_config c = llama();
	char bin[512];
	struct res x, y;

	snprintf(bin, sizeof(bin), "%s/emul/meshrun", mr_proc_build_dir());
	if (access(bin, X_OK) != 0)
		cr_skip_test("no emulated-cuda meshrun (%s)", bin);
	scratch();
	write_ckpt("ck", &c, 1, NULL);
	x = gen("meshrun", "ck --prompt hello --max-new-tokens 12 --temperature 0");
	y = gen("emul/meshrun", "ck --prompt hello --max-new-tokens 12 --temperature 0 "
				"--device cuda --precision fp32");
	cr_assert(x.rc == 0 && y.rc == 0, "%s %s", x.err, y.err);
	cr_assert(memcmp(x.out, y.out, 13) == 0, "cuda printed other text than cpu");
	cr_assert(strstr(y.err, "generated 12 tokens"), "%s", y.err);
	res_free(&x);
	res_free(&y);
	/* a llama MoE: SwiGLU experts on cuda print what the cpu prints */
	c.moe_every = 1;
	c.n_experts = 4;
	c.top_k = 2;
	c.capacity_factor = 1.0f;
	write_ckpt("lmoe", &c, 1, NULL);
	x = gen("meshrun", "lmoe --prompt hello --max-new-tokens 8 --temperature 0");
	y = gen("emul/meshrun", "lmoe --prompt hello --max-new-tokens 8 --temperature 0 "
				"--device cuda --precision fp32");
	cr_assert(x.rc == 0 && y.rc == 0, "%s %s", x.err, y.err);
	cr_assert(memcmp(x.out, y.out, 9) == 0, "cuda printed other text than cpu (llama MoE)");
	res_free(&x);
	res_free(&y);
}

/* --tokenizer: the prompt is encoded and the new tokens are decoded with
 * a tokenizer.json (the tiny Llama-3-style fixture, its two special
 * tokens renumbered to follow its 353 BPE tokens): the text printed is
 * the decoding of the ids --prompt-ids prints for the encoded prompt; a
 * tokenizer larger than the model's vocabulary is refused. */
Test(generate_cli, tokenizer_encodes_the_prompt_and_decodes_the_text, .timeout = 300)
{
	struct mr_gpt_config c = gpt2();
	struct mr_errbuf eb = { "", "" };
	struct mr_tokenizer *t;
	json_t *doc, *added;
	uint32_t *ids, gotid[64];
	char path[512], list[512], args[1024], *want = NULL, *grown, *p;
	size_t n, wl = 0, at = 0, ng = 0;
	struct res x, y;

	scratch();
	doc = json_load_file("tests/fixtures/tiny-llama3-tokenizer.json", 0, NULL);
	cr_assert_not_null(doc, "run from the repository root");
	added = json_object_get(doc, "added_tokens");
	for (size_t i = 0; i < json_array_size(added); i++)
		json_object_set_new(json_array_get(added, i), "id", json_integer(353 + (int)i));
	snprintf(path, sizeof(path), "%s/tok.json", tmp);
	cr_assert_eq(json_dump_file(doc, path, 0), 0);
	json_decref(doc);
	cr_assert_eq(mr_tokenizer_load(&t, path, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_tokenizer_encode(t, "hello world", 11, &ids, &n, &eb), 0, "%s", eb.msg);
	cr_assert_gt(n, 1);
	for (size_t i = 0; i < n; i++)
		at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%u", i ? "," : "", ids[i]);
	free(ids);
	c.vocab = 384; /* the tokenizer's 355 and padding rows */
	write_ckpt("tk", &c, 1, NULL);
	x = gen("meshrun", "tk --tokenizer tok.json --prompt 'hello world' --temperature 0 "
			   "--max-new-tokens 6");
	snprintf(args, sizeof(args), "tk --prompt-ids %s --temperature 0 --max-new-tokens 6",
		 list);
	y = gen("meshrun", args);
	cr_assert(x.rc == 0 && y.rc == 0, "%s %s", x.err, y.err);
	for (p = y.out; ng < 64 && *p && *p != '\n'; ng++)
		gotid[ng] = (uint32_t)strtoul(p, &p, 10);
	cr_assert_eq(ng, 6, "%s", y.out);
	for (size_t i = 0; i < ng; i++) { /* what the CLI prints for each */
		char *piece = NULL, pad[16];
		size_t pl = 0;

		if ((int)gotid[i] >= mr_tokenizer_vocab_size(t)) {
			pl = (size_t)snprintf(pad, sizeof(pad), "[%u]", gotid[i]);
			piece = strdup(pad);
		} else {
			cr_assert_eq(mr_tokenizer_decode(t, &gotid[i], 1, &piece, &pl, &eb), 0, "%s",
				     eb.msg);
		}
		grown = realloc(want, wl + pl + 2);
		cr_assert_not_null(grown);
		want = grown;
		memcpy(want + wl, piece, pl);
		wl += pl;
		free(piece);
	}
	want[wl++] = '\n';
	want[wl] = '\0';
	cr_expect_str_eq(x.out, want, "the text is not the decoding of the ids");
	free(want);
	res_free(&x);
	res_free(&y);
	mr_tokenizer_free(t);
	c.vocab = 300;
	write_ckpt("small", &c, 1, NULL);
	x = gen("meshrun", "small --tokenizer tok.json --prompt 'hello world'");
	cr_expect_eq(x.rc, 2, "%s", x.err);
	cr_expect(strstr(x.err, "--tokenizer") && strstr(x.err, "355"), "%s", x.err);
	res_free(&x);
}

/* generate ARGS exits 2 with all of the words in its message. */
static void refused(const char *args, const char *w1, const char *w2)
{
	struct res r = gen("meshrun", args);

	cr_assert_eq(r.rc, 2, "'%s': exit %d (want 2): %s", args, r.rc, r.err);
	cr_assert(strstr(r.err, "meshrun generate: "), "'%s': %s", args, r.err);
	cr_assert(strstr(r.err, w1) && (!w2 || strstr(r.err, w2)),
		  "'%s': the message names neither '%s' nor '%s': %s", args, w1, w2 ? w2 : "",
		  r.err);
	cr_assert_str_eq(r.out, "", "'%s' printed on stdout", args);
	res_free(&r);
}

Test(generate_cli, bad_input, .timeout = 300)
{
	struct mr_gpt_config c = gpt2(), v96 = gpt2();
	struct res r;

	scratch();
	v96.vocab = 96;
	write_ckpt("ck", &c, 1, NULL);
	write_ckpt("ids", &v96, 1, NULL);
	r = sh("mkdir empty bad && cp -r ck/step-00000010 bad/ && echo '{\"broken' > "
	       "bad/step-00000010/manifest.json && cp -r ck flip && printf '\\377' | dd "
	       "of=flip/step-00000010/rank-00000.bin bs=1 seek=200000 conv=notrunc");
	cr_assert_eq(r.rc, 0);
	res_free(&r);
	refused("nowhere --prompt hi", "'nowhere'", "no such file");
	refused("empty --prompt hi", "'empty'", "no checkpoint");
	refused("bad --prompt hi", "manifest.json", NULL);
	refused("flip --prompt hi", "rank-00000.bin", "checksum");
	refused("ck --prompt hi --temperature hot", "--temperature", "hot");
	refused("ck --prompt hi --temperature -1", "--temperature", NULL);
	refused("ck --prompt hi --top-k -3", "--top-k", NULL);
	refused("ck --prompt hi --top-p 0", "--top-p", NULL);
	refused("ck --prompt hi --top-p 1.5", "--top-p", NULL);
	refused("ck --prompt hi --max-new-tokens 0", "--max-new-tokens", NULL);
	refused("ck --prompt hi --device tpu", "tpu", NULL);
	refused("ck --prompt hi --precision fp8", "precision", "fp8");
	refused("ck --prompt hi --nope 1", "--nope", NULL);
	refused("ck --prompt hi --step 4", "--step", "no step 4");
	refused("ck --prompt-ids 1,256", "256", "vocabulary");
	refused("ck --prompt-ids 1,,2", "--prompt-ids", "'1,,2'");
	refused("ids --prompt hi", "--prompt-ids", "96");
	refused("ck", "prompt is missing", NULL);
	refused("ck --prompt ''", "prompt is missing", NULL);
	refused("ck --prompt hi --prompt-ids 1", "give one", NULL);
	refused("--prompt hi", "checkpoint", NULL);
	refused("ck --prompt abcdefghijklmnopqrstuvwxyz", "26 tokens", "max_seq is 24");
}
