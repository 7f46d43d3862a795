/*
 * test_cli.c - the `meshrun` subcommands that need no controller: `mesh`
 * (the table comes from mr_mesh, so check it against the pure function;
 * each pipeline stage's layers against the runtime's split, and a bad
 * split refused naming the field) and `data` (shards written by the CLI
 * read back through the runtime's own shard reader; bad files rejected
 * naming the file; `prepare --tokenizer` writes the ids the tokenizer
 * module gives, in v2 shards when they pass 65,535, and inspect says so).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/mr_shard.h"
#include "data/mr_synth.h"
#include "data/mr_tokenizer.h"
#include "model/mr_gpt.h"
#include "mr_mesh.h"
#include "parallel/mr_pp_split.h"

static char tmp[64];

static void mktmp(void)
{
	snprintf(tmp, sizeof(tmp), "/tmp/mr-cli-test-XXXXXX");
	cr_assert_not_null(mkdtemp(tmp));
}

static void rmtmp(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	(void)!system(cmd);
}

/* Each test runs in a fresh scratch directory, removed at exit. */
static void scratch(void)
{
	mktmp();
	atexit(rmtmp); /* Criterion runs each test in its own process */
}

/* Runs `meshrun ARGS` (a shell fragment) in tmp; returns the exit code and
 * the combined output in *out (malloc'd). */
static int meshrun(char **out, const char *args)
{
	const char *b = getenv("MESHRUN_BUILD");
	char cmd[2048], log[128];
	FILE *f;
	long n;
	int st;

	snprintf(log, sizeof(log), "%s/out.log", tmp);
	snprintf(cmd, sizeof(cmd), "cd '%s' && '%s/meshrun' %s >'%s' 2>&1", tmp,
		 b && b[0] ? b : "build", args, log);
	st = system(cmd);
	f = fopen(log, "rb");
	cr_assert_not_null(f);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	*out = calloc(1, (size_t)n + 1);
	cr_assert_eq(fread(*out, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(cli, mesh_table_matches_the_mesh_function)
{
	struct mr_mesh m;
	struct mr_mesh_coord c;
	char *out, want[128];

	scratch();

	cr_assert_eq(meshrun(&out, "mesh --tp 2 --pp 2 --dp 2 --ep 2"), 0, "%s", out);
	cr_assert_eq(mr_mesh_init(&m, 0, 2, 2, 1, 2, 2, NULL), 0);
	for (int r = 0; r < m.world; r++) {
		cr_assert_eq(mr_mesh_coord(&m, r, &c), 0);
		/* rank pp dp cp tp ep edp, as the table's first columns */
		snprintf(want, sizeof(want), "%6d %4d %4d %4d %4d %4d %4d |", r, c.pp, c.dp, c.cp,
			 c.tp, c.ep, c.edp);
		cr_expect(strstr(out, want), "row '%s' missing:\n%s", want, out);
	}
	free(out);
	cr_assert_eq(meshrun(&out, "mesh --world 12 --tp 8"), 2);
	cr_expect(strstr(out, "not divisible"), "%s", out);
	free(out);
}

/* The line `meshrun mesh` prints for stage s of the split layers (p stages
 * of v chunks), as far as the block list: "stage 1: layers 2-4, 7 (". */
static void stage_line(char *buf, size_t cap, const int *layers, int p, int v, int s)
{
	int lo, hi, n = 0, len;

	for (int c = 0; c < v; c++) {
		mr_pp_split_range(layers, p, s, c, &lo, &hi);
		n += hi - lo;
	}
	len = snprintf(buf, cap, "stage %d: layer%s ", s, n == 1 ? "" : "s");
	for (int c = 0; c < v; c++) {
		mr_pp_split_range(layers, p, s, c, &lo, &hi);
		len += hi - lo == 1 ? snprintf(buf + len, cap - (size_t)len, "%s%d", c ? ", " : "", lo)
				    : snprintf(buf + len, cap - (size_t)len, "%s%d-%d",
					       c ? ", " : "", lo, hi - 1);
	}
	snprintf(buf + len, cap - (size_t)len, " (%d block%s", n, n == 1 ? "" : "s");
}

/* A MoE model over 3 stages (the head and the MoE blocks weigh, so the
 * balanced split is uneven) and an interleaved one (2 chunks a stage):
 * the lines name the blocks mr_pp_split_model gives for the same model. */
Test(cli, mesh_prints_each_stage_layers_as_the_runtime_splits)
{
	struct mr_gpt_config mc = { .vocab = 512, .max_seq = 16, .n_layer = 6, .d_model = 32,
				    .n_head = 4, .moe_every = 2, .n_experts = 4, .top_k = 2,
				    .capacity_factor = 1.25f, .aux_coef = 0.01f };
	struct mr_errbuf eb = {0};
	int layers[4], uneven = 0;
	char *out, want[128];

	scratch();
	cr_assert_eq(meshrun(&out, "mesh --pp 3 --dp 2 --workload-config '{\"n_layer\": 6, "
				   "\"moe_every\": 2, \"n_experts\": 4, \"top_k\": 2, "
				   "\"d_model\": 32, \"n_head\": 4, \"vocab_size\": 512, "
				   "\"seq_len\": 16}'"),
		     0, "%s", out);
	cr_assert_eq(mr_pp_split_model(&mc, 16, 3, 1, NULL, 0, layers, &eb), 0, "%s", eb.msg);
	cr_expect(strstr(out, "pipeline: 6 layers over 3 stages x 1 chunk, balanced by cost\n"),
		  "%s", out);
	for (int s = 0; s < 3; s++) {
		stage_line(want, sizeof(want), layers, 3, 1, s);
		cr_expect(strstr(out, want), "'%s' missing:\n%s", want, out);
		uneven |= layers[s] != 2;
	}
	cr_expect(uneven, "the costs should make the split uneven: %d %d %d", layers[0],
		  layers[1], layers[2]);
	cr_expect(strstr(out, "+ embedding\n"), "%s", out);
	cr_expect(strstr(out, "+ final LayerNorm, LM head and loss\n"), "%s", out);
	cr_expect(strstr(out, "     0    0    0    0    0    0    0 |"), "the table follows:\n%s",
		  out);
	free(out);

	mc = (struct mr_gpt_config){ .vocab = 64, .max_seq = 16, .n_layer = 8, .d_model = 32,
				     .n_head = 4 };
	cr_assert_eq(meshrun(&out, "mesh --pp 2 --workload-config '{\"n_layer\": 8, "
				   "\"d_model\": 32, \"n_head\": 4, \"vocab_size\": 64, "
				   "\"seq_len\": 16, \"pp_schedule\": \"interleaved\", "
				   "\"grad_accum\": 4}'"),
		     0, "%s", out);
	cr_assert_eq(mr_pp_split_model(&mc, 16, 2, 2, NULL, 0, layers, &eb), 0, "%s", eb.msg);
	for (int s = 0; s < 2; s++) {
		stage_line(want, sizeof(want), layers, 2, 2, s);
		cr_expect(strstr(out, want), "'%s' missing:\n%s", want, out);
	}
	cr_expect(strstr(out, " in 2 chunks)"), "%s", out);
	free(out);
}

/* An explicit split is printed as given; one that does not add up to
 * n_layer, or has an entry per stage too few, is refused with exit 2,
 * naming pp_layers, before the table. Without a workload config the
 * table comes with a hint, not a split. */
Test(cli, mesh_pp_layers_printed_or_refused_naming_the_field)
{
	char *out;

	scratch();
	cr_assert_eq(meshrun(&out, "mesh --pp 2 --tp 2 --workload-config "
				   "'{\"n_layer\": 3, \"pp_layers\": [1, 2]}'"),
		     0, "%s", out);
	cr_expect(strstr(out, "pipeline: 3 layers over 2 stages x 1 chunk, split by pp_layers\n"
			      "stage 0: layer 0 (1 block) + embedding\n"
			      "stage 1: layers 1-2 (2 blocks) + final LayerNorm, LM head and "
			      "loss\n"),
		  "%s", out);
	free(out);

	cr_assert_eq(meshrun(&out, "mesh --pp 2 --workload-config "
				   "'{\"n_layer\": 4, \"pp_layers\": [3, 2]}'"),
		     2, "%s", out);
	cr_expect(strstr(out, "meshrun mesh: workload_config: 'pp_layers' adds up to 5 blocks, "
			      "the model has n_layer 4"),
		  "%s", out);
	cr_expect_null(strstr(out, "rank"), "no table after an error:\n%s", out);
	free(out);

	cr_assert_eq(meshrun(&out, "mesh --pp 2 --workload-config "
				   "'{\"n_layer\": 4, \"pp_layers\": [4]}'"),
		     2, "%s", out);
	cr_expect(strstr(out, "'pp_layers' has 1 entries, pp 2 needs 2"), "%s", out);
	free(out);

	cr_assert_eq(meshrun(&out, "mesh --pp 4 --workload-config '{\"n_layer\": 2}'"), 2, "%s",
		     out);
	cr_expect(strstr(out, "'pp' 4: every stage needs a block, the model has n_layer 2"), "%s",
		  out);
	free(out);

	cr_assert_eq(meshrun(&out, "mesh --pp 2 --workload-config '{\"n_layer\": 4, "
				   "\"n_layers\": 4}'"),
		     2, "%s", out);
	cr_expect(strstr(out, "n_layers"), "an unknown key is named:\n%s", out);
	free(out);

	cr_assert_eq(meshrun(&out, "mesh --pp 2"), 0, "%s", out);
	cr_expect(strstr(out, "pipeline: pass --workload-config"), "%s", out);
	cr_expect_null(strstr(out, "stage 0:"), "%s", out);
	free(out);
}

Test(cli, data_synth_writes_the_runtime_task)
{
	struct mr_shard s;
	struct mr_errbuf eb = {0};
	char *out, path[128];
	int row[257];

	scratch();

	cr_assert_eq(meshrun(&out, "data synth --out-dir d --tokens 5000 --vocab 64 --seed 7"), 0,
		     "%s", out);
	free(out);
	snprintf(path, sizeof(path), "%s/d/train.bin", tmp);
	cr_assert_eq(mr_shard_open(&s, path, 64, 16, 0, &eb), 0, "%s", eb.msg);
	cr_assert_eq(s.count, 5000);
	mr_synth_row(7, 0, 1, 64, 257, row); /* the second row of stream 0 */
	for (int k = 0; k < 257; k++)
		cr_assert_eq((int)s.tok[257 + k], row[k], "token %d", 257 + k);
	mr_shard_close(&s);
	snprintf(path, sizeof(path), "%s/d/val.bin", tmp);
	cr_assert_eq(mr_shard_open(&s, path, 64, 16, 0, &eb), 0, "%s", eb.msg);
	cr_assert_eq(s.count, 500);
	mr_synth_row(7, 1, 0, 64, 257, row);
	cr_assert_eq((int)s.tok[0], row[0]);
	cr_assert_eq((int)s.tok[256], row[256]);
	mr_shard_close(&s);
}

Test(cli, data_prepare_is_byte_level_and_splits)
{
	static const char text[] = "hello meshrun, a byte-level corpus\n";
	struct mr_shard tr, va;
	struct mr_errbuf eb = {0};
	char *out, path[128];
	FILE *f;

	scratch();

	snprintf(path, sizeof(path), "%s/in.txt", tmp);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	for (int i = 0; i < 100; i++)
		fputs(text, f);
	fclose(f);
	cr_assert_eq(meshrun(&out, "data prepare --out-dir p --val-fraction 0.25 in.txt"), 0, "%s",
		     out);
	free(out);
	snprintf(path, sizeof(path), "%s/p/train.bin", tmp);
	cr_assert_eq(mr_shard_open(&tr, path, 256, 8, 0, &eb), 0, "%s", eb.msg);
	snprintf(path, sizeof(path), "%s/p/val.bin", tmp);
	cr_assert_eq(mr_shard_open(&va, path, 256, 8, 0, &eb), 0, "%s", eb.msg);
	cr_assert_eq(tr.count + va.count, 100 * (sizeof(text) - 1));
	cr_assert_eq(va.count, (size_t)(0.25 * (double)(100 * (sizeof(text) - 1))));
	for (size_t i = 0; i < tr.count; i++)
		cr_assert_eq(tr.tok[i], (unsigned char)text[i % (sizeof(text) - 1)]);
	mr_shard_close(&tr);
	mr_shard_close(&va);
}

Test(cli, data_rejects_bad_input_naming_it)
{
	char *out, path[128];
	FILE *f;

	scratch();

	snprintf(path, sizeof(path), "%s/in.txt", tmp);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	for (int i = 0; i < 300; i++)
		fputs("not a shard\n", f);
	fclose(f);
	cr_assert_eq(meshrun(&out, "data inspect in.txt"), 1);
	cr_expect(strstr(out, "shard 'in.txt': bad magic"), "%s", out);
	free(out);
	cr_assert_eq(meshrun(&out, "data prepare --out-dir p missing.txt"), 1);
	cr_expect(strstr(out, "unable to open 'missing.txt'"), "%s", out);
	free(out);
	cr_assert_eq(meshrun(&out, "data synth --tokens 5"), 2);
	cr_expect(strstr(out, "--tokens: '5' is out of range"), "%s", out);
	free(out);
	cr_assert_eq(meshrun(&out, "data prepare"), 2);
	free(out);
}

/* Appends the tokenizer's ids of text to ids[*n..]. */
static void encode_into(const struct mr_tokenizer *t, const char *text, uint32_t *ids, size_t *n)
{
	struct mr_errbuf eb = {0};
	uint32_t *v;
	size_t k;

	cr_assert_eq(mr_tokenizer_encode(t, text, strlen(text), &v, &k, &eb), 0, "%s", eb.msg);
	memcpy(ids + *n, v, k * sizeof(*v));
	*n += k;
	free(v);
}

Test(cli, data_prepare_with_a_tokenizer_then_inspect)
{
	static const char a[] = "The quick brown fox jumps over the lazy dog. Les \xc3\xa9l\xc3\xa8ves "
				"\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 1234567\n\n";
	static const char b[] = "the other thing is the best thing in the world.\n";
	char tk[1024], cwd[512], *out, path[128], args[1400];
	struct mr_tokenizer *t;
	struct mr_shard tr, va;
	struct mr_errbuf eb = {0};
	uint32_t want[512];
	size_t n = 0;
	FILE *f;

	cr_assert_not_null(getcwd(cwd, sizeof(cwd)));
	snprintf(tk, sizeof(tk), "%s/tests/fixtures/tiny-llama3-tokenizer.json", cwd);
	cr_assert_eq(mr_tokenizer_load(&t, tk, &eb), 0, "%s", eb.msg);
	scratch();
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "%s/%c.txt", tmp, "ab"[i]);
		f = fopen(path, "w");
		cr_assert_not_null(f);
		fputs(i ? b : a, f);
		fclose(f);
	}
	snprintf(args, sizeof(args),
		 "data prepare --tokenizer '%s' --out-dir p --val-fraction 0.2 a.txt b.txt", tk);
	cr_assert_eq(meshrun(&out, args), 0, "%s", out);
	cr_expect(strstr(out, "vocab_size: 128002"), "%s", out);
	cr_expect(strstr(out, "p/train.bin: ") && strstr(out, "(shard v2)"), "%s", out);
	cr_expect(strstr(out, "each after token 128000"), "%s", out);
	free(out);
	/* each document after <|begin_of_text|>, as the tokenizer encodes it */
	want[n++] = 128000;
	encode_into(t, a, want, &n);
	want[n++] = 128000;
	encode_into(t, b, want, &n);
	snprintf(path, sizeof(path), "%s/p/train.bin", tmp);
	cr_assert_eq(mr_shard_open(&tr, path, 128002, 4, 0, &eb), 0, "%s", eb.msg);
	snprintf(path, sizeof(path), "%s/p/val.bin", tmp);
	cr_assert_eq(mr_shard_open(&va, path, 128002, 4, 0, &eb), 0, "%s", eb.msg);
	cr_expect_eq(tr.version, 2);
	cr_expect_eq(va.version, 2);
	cr_assert_eq(tr.count + va.count, n);
	cr_expect_eq(va.count, (size_t)(0.2 * (double)n));
	for (size_t i = 0; i < n; i++)
		cr_expect_eq(i < tr.count ? tr.tok[i] : va.tok[i - tr.count], want[i],
			     "token %zu", i);
	mr_shard_close(&tr);
	mr_shard_close(&va);
	/* a model too small for the ids is refused naming the file */
	snprintf(path, sizeof(path), "%s/p/train.bin", tmp);
	cr_expect_eq(mr_shard_open(&tr, path, 1000, 4, 0, &eb), MR_ERANGE);
	cr_expect(strstr(eb.msg, path) && strstr(eb.msg, "token 128000 at index 0"), "%s", eb.msg);
	cr_assert_eq(meshrun(&out, "data inspect p/train.bin"), 0, "%s", out);
	cr_expect(strstr(out, "p/train.bin: llm.c shard v2 (uint32 tokens)"), "%s", out);
	cr_expect(strstr(out, "largest token id 128000"), "%s", out);
	free(out);
	/* a text that is not UTF-8, a tokenizer that is not there */
	snprintf(path, sizeof(path), "%s/bad.txt", tmp);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs("caf\xe9 latin-1\n", f);
	fclose(f);
	snprintf(args, sizeof(args), "data prepare --tokenizer '%s' --out-dir q bad.txt", tk);
	cr_assert_eq(meshrun(&out, args), 1, "%s", out);
	cr_expect(strstr(out, "'bad.txt'") && strstr(out, "not valid UTF-8 at byte 3"), "%s", out);
	free(out);
	cr_assert_eq(meshrun(&out, "data prepare --tokenizer nope.json a.txt"), 1, "%s", out);
	cr_expect(strstr(out, "nope.json"), "%s", out);
	free(out);
	/* the synthetic task past 16 bits is a v2 shard too */
	cr_assert_eq(meshrun(&out, "data synth --vocab 100000 --tokens 2048 --out-dir s"), 0, "%s",
		     out);
	cr_expect(strstr(out, "s/train.bin: 2048 tokens (shard v2)"), "%s", out);
	free(out);
	mr_tokenizer_free(t);
}
