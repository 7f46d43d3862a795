/*
 * data.c - `meshrun data`: make llm.c token shards.
 *
 *   meshrun data prepare [--out-dir DIR] [--val-fraction F]
 *                        [--tokenizer tokenizer.json] FILE...
 *       without --tokenizer: byte-level (token = byte, vocab 256), the
 *       files concatenated. With it: a Hugging Face byte-level BPE
 *       (GPT-2, Llama 3; runtime/data/mr_tokenizer.h) encodes each file (a
 *       document, UTF-8); when the tokenizer has <|endoftext|> (GPT-2) or
 *       <|begin_of_text|> (Llama 3), that token goes before every document,
 *       as llm.c's data prep does; the vocabulary size the workload needs
 *       is printed. Either way the last F of the tokens become DIR/val.bin,
 *       the rest DIR/train.bin: version 1 shards (uint16) when every id
 *       fits in 16 bits, else version 2 (uint32)
 *   meshrun data synth [--out-dir DIR] [--tokens N] [--vocab V] [--seed S]
 *       the runtime's deterministic synthetic task written as shards
 *   meshrun data inspect FILE
 *       validates a shard (magic, version, size) and prints its version,
 *       token count and largest id
 *
 * The shards (llm.c format, runtime/data/mr_shard.h) feed the runtime with
 * --workload-config '{"train_data": "DIR/train.bin", "val_data": ...,
 * "vocab_size": V}'. Non-goals: tokenizers other than byte-level BPE,
 * multi-shard datasets, streaming inputs larger than memory.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/mr_shard.h"
#include "data/mr_synth.h"
#include "data/mr_tokenizer.h"
#include "mr_cli.h"
#include "mr_config.h"

#define DATA_MAX_TOKENS ((size_t)1 << 30) /* one shard's int32 count, with room */
#define SYNTH_ROW 257                     /* tokens per synthetic row */

struct data_opts {
	char out_dir[1024];
	char tokenizer[1024];
	double val_fraction;
	int64_t tokens;
	int vocab;
	int64_t seed;
};

static const struct mr_config_opt data_table[] = {
	MR_CONFIG_STRING("out_dir", struct data_opts, out_dir, "data",
			 "Directory for train.bin and val.bin (created if missing)."),
	MR_CONFIG_STRING("tokenizer", struct data_opts, tokenizer, "",
			 "prepare: a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3) "
			 "instead of bytes (token = byte). Each FILE is a UTF-8 document with the "
			 "tokenizer's <|endoftext|> (or <|begin_of_text|>) before it; the vocab_size "
			 "the workload needs is printed; ids past 65,535 make v2 (uint32) shards."),
	MR_CONFIG_DOUBLE("val_fraction", struct data_opts, val_fraction, "0.1", 0.0, 0.5,
			 "prepare: fraction of the tokens held out for val.bin."),
	MR_CONFIG_INT("tokens", struct data_opts, tokens, "1048576", 1024, 1 << 30,
		      "synth: tokens in train.bin (val.bin gets a tenth)."),
	MR_CONFIG_INT("vocab", struct data_opts, vocab, "256", 2, 1 << 20,
		      "synth: vocabulary size (past 65,536: version 2 shards)."),
	MR_CONFIG_INT("seed", struct data_opts, seed, "1337", 0, INT64_MAX,
		      "synth: seed of the task (same seed, same files)."),
};

static int parse(struct data_opts *o, struct mr_config *cfg, int argc, char **argv,
		 const char *usage)
{
	struct mr_errbuf eb = {0};
	int rc;

	rc = mr_config_init(cfg, data_table, sizeof(data_table) / sizeof(data_table[0]), o, &eb);
	cfg->prog = "meshrun data";
	cfg->usage = usage;
	cfg->summary = "Make llm.c token shards (256 x int32 header; uint16 tokens, or uint32 "
		       "past 65,535).";
	cfg->config_file = 0;
	cfg->allow_positional = 1;
	if (rc == 0)
		rc = mr_config_parse(cfg, argc, argv, &eb);
	if (rc < 0)
		fprintf(stderr, "meshrun data: %s\n", eb.msg);
	return rc;
}

/* Both shards of one version: 1 when every id fits in 16 bits, else 2. */
static int write_pair(const char *dir, const uint32_t *tok, size_t ntrain, size_t nval)
{
	char path[1100];
	struct mr_errbuf eb = {0};
	int version = MR_SHARD_VERSION;

	for (size_t i = 0; i < ntrain + nval; i++)
		if (tok[i] > UINT16_MAX)
			version = MR_SHARD_VERSION_32;
	if (mkdir(dir, 0755) && errno != EEXIST) {
		fprintf(stderr, "meshrun data: unable to create '%s': %s\n", dir, strerror(errno));
		return 1;
	}
	snprintf(path, sizeof(path), "%s/train.bin", dir);
	if (mr_shard_write32(path, tok, ntrain, version, &eb) < 0) {
		fprintf(stderr, "meshrun data: %s\n", eb.msg);
		return 1;
	}
	printf("%s: %zu tokens (shard v%d)\n", path, ntrain, version);
	snprintf(path, sizeof(path), "%s/val.bin", dir);
	if (mr_shard_write32(path, tok + ntrain, nval, version, &eb) < 0) {
		fprintf(stderr, "meshrun data: %s\n", eb.msg);
		return 1;
	}
	printf("%s: %zu tokens (shard v%d)\n", path, nval, version);
	return 0;
}

/* Room for k more tokens in *tok (grown by doubling, bounded). */
static int reserve(const char *path, uint32_t **tok, size_t n, size_t *cap, size_t k)
{
	size_t nc = *cap ? *cap : 1 << 20;
	uint32_t *t;

	if (n + k > DATA_MAX_TOKENS) {
		fprintf(stderr, "meshrun data: '%s': more than %zu tokens in all; split the input\n",
			path, DATA_MAX_TOKENS);
		return 1;
	}
	if (n + k <= *cap)
		return 0;
	while (nc < n + k)
		nc *= 2;
	if (!(t = realloc(*tok, nc * sizeof(*t)))) {
		fprintf(stderr, "meshrun data: out of memory\n");
		return 1;
	}
	*tok = t;
	*cap = nc;
	return 0;
}

/* Appends the bytes of path to *tok (grown as needed, bounded). */
static int read_bytes(const char *path, uint32_t **tok, size_t *n, size_t *cap)
{
	FILE *f = fopen(path, "rb");
	unsigned char buf[65536];
	size_t r;

	if (!f) {
		fprintf(stderr, "meshrun data: unable to open '%s': %s\n", path, strerror(errno));
		return 1;
	}
	while ((r = fread(buf, 1, sizeof(buf), f)) > 0) {
		if (reserve(path, tok, *n, cap, r)) {
			fclose(f);
			return 1;
		}
		for (size_t i = 0; i < r; i++)
			(*tok)[(*n)++] = buf[i];
	}
	if (ferror(f)) {
		fprintf(stderr, "meshrun data: unable to read '%s'\n", path);
		fclose(f);
		return 1;
	}
	fclose(f);
	return 0;
}

/* The whole of path (a document) into *buf (malloc'd, bounded). */
static int read_text(const char *path, char **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	size_t cap = 1 << 16, r;
	char *b = NULL, *nb;

	*len = 0;
	if (!f) {
		fprintf(stderr, "meshrun data: unable to open '%s': %s\n", path, strerror(errno));
		return 1;
	}
	for (;;) {
		if (!(nb = realloc(b, cap))) {
			fprintf(stderr, "meshrun data: out of memory\n");
			break;
		}
		b = nb;
		r = fread(b + *len, 1, cap - *len, f);
		*len += r;
		if (r == 0 || *len < cap) {
			if (ferror(f)) {
				fprintf(stderr, "meshrun data: unable to read '%s'\n", path);
				break;
			}
			if (feof(f)) {
				fclose(f);
				*buf = b;
				return 0;
			}
			continue;
		}
		if (cap >= DATA_MAX_TOKENS) {
			fprintf(stderr, "meshrun data: '%s': more than %zu bytes; split the input\n",
				path, DATA_MAX_TOKENS);
			break;
		}
		cap *= 2;
	}
	fclose(f);
	free(b);
	return 1;
}

/* Appends sep (when >= 0) and the ids of path's text to *tok. */
static int encode_file(const struct mr_tokenizer *t, int sep, const char *path, uint32_t **tok,
		       size_t *n, size_t *cap)
{
	struct mr_errbuf eb = {0};
	uint32_t *ids = NULL;
	size_t len, k = 0;
	char *text = NULL;
	int rc = 1;

	if (read_text(path, &text, &len))
		return 1;
	if (mr_tokenizer_encode(t, text, len, &ids, &k, &eb) < 0) {
		fprintf(stderr, "meshrun data: '%s': %s\n", path, eb.msg);
		goto out;
	}
	if (reserve(path, tok, *n, cap, k + 1))
		goto out;
	if (sep >= 0)
		(*tok)[(*n)++] = (uint32_t)sep;
	if (k)
		memcpy(*tok + *n, ids, k * sizeof(*ids));
	*n += k;
	rc = 0;
out:
	free(ids);
	free(text);
	return rc;
}

/* The document separator: GPT-2's <|endoftext|>, else Llama 3's
 * <|begin_of_text|>, else none (-1). */
static int doc_separator(const struct mr_tokenizer *t)
{
	int id = mr_tokenizer_added_id(t, "<|endoftext|>");

	return id >= 0 ? id : mr_tokenizer_added_id(t, "<|begin_of_text|>");
}

static int cmd_prepare(struct data_opts *o, struct mr_config *cfg)
{
	struct mr_tokenizer *t = NULL;
	struct mr_errbuf eb = {0};
	uint32_t *tok = NULL;
	size_t n = 0, cap = 0, nval;
	int rc = 1, sep = -1;

	if (cfg->nargs < 1) {
		fprintf(stderr, "meshrun data prepare: no input file (usage: meshrun data prepare "
				"[--out-dir DIR] [--tokenizer tokenizer.json] FILE...)\n");
		return MR_CONFIG_EXIT_USAGE;
	}
	if (o->tokenizer[0]) {
		if (mr_tokenizer_load(&t, o->tokenizer, &eb) < 0) {
			fprintf(stderr, "meshrun data prepare: %s\n", eb.msg);
			return 1;
		}
		sep = doc_separator(t);
	}
	for (int i = 0; i < cfg->nargs; i++)
		if (t ? encode_file(t, sep, cfg->args[i], &tok, &n, &cap)
		      : read_bytes(cfg->args[i], &tok, &n, &cap))
			goto out;
	nval = (size_t)((double)n * o->val_fraction);
	if (n < 2 || (o->val_fraction > 0 && nval < 2)) {
		fprintf(stderr, "meshrun data prepare: only %zu tokens in the input; too few to "
				"split\n", n);
		goto out;
	}
	if ((rc = write_pair(o->out_dir, tok, n - nval, nval)) == 0 && t) {
		int v = mr_tokenizer_vocab_size(t);

		if (sep >= 0)
			printf("documents: %d, each after token %d\n", cfg->nargs, sep);
		printf("vocab_size: %d (the workload's \"vocab_size\" must be at least this; "
		       "%d rounds it up to a multiple of 128)\n", v, (v + 127) / 128 * 128);
	}
out:
	mr_tokenizer_free(t);
	free(tok);
	return rc;
}

/* n tokens of synthetic stream `stream`, row after row. */
static void synth_fill(const struct data_opts *o, uint64_t stream, uint32_t *tok, size_t n)
{
	int row[SYNTH_ROW];

	for (size_t at = 0, r = 0; at < n; at += SYNTH_ROW, r++) {
		int len = n - at < SYNTH_ROW ? (int)(n - at) : SYNTH_ROW;

		mr_synth_row((uint64_t)o->seed, stream, r, o->vocab, len, row);
		for (int k = 0; k < len; k++)
			tok[at + (size_t)k] = (uint32_t)row[k];
	}
}

static int cmd_synth(struct data_opts *o)
{
	size_t ntrain = (size_t)o->tokens, nval = ntrain / 10;
	uint32_t *tok = malloc((ntrain + nval) * sizeof(*tok));
	int rc;

	if (!tok) {
		fprintf(stderr, "meshrun data synth: out of memory\n");
		return 1;
	}
	synth_fill(o, 0, tok, ntrain);       /* stream 0: train, as the runtime draws it */
	synth_fill(o, 1, tok + ntrain, nval); /* stream 1: validation */
	rc = write_pair(o->out_dir, tok, ntrain, nval);
	free(tok);
	return rc;
}

static int cmd_inspect(struct mr_config *cfg)
{
	struct mr_shard s;
	struct mr_errbuf eb = {0};
	int rc = 0;

	if (cfg->nargs < 1) {
		fprintf(stderr, "meshrun data inspect: no shard given\n");
		return MR_CONFIG_EXIT_USAGE;
	}
	for (int i = 0; i < cfg->nargs; i++) {
		uint32_t max = 0;

		mr_errbuf_clear(&eb);
		if (mr_shard_open(&s, cfg->args[i], INT32_MAX, 1, 0, &eb) < 0) {
			fprintf(stderr, "meshrun data: %s\n", eb.msg);
			rc = 1;
			continue;
		}
		for (size_t k = 0; k < s.count; k++)
			max = s.tok[k] > max ? s.tok[k] : max;
		printf("%s: llm.c shard v%d (%s tokens), %zu tokens, largest token id %u\n",
		       cfg->args[i], s.version, s.version == MR_SHARD_VERSION ? "uint16" : "uint32",
		       s.count, max);
		mr_shard_close(&s);
	}
	return rc;
}

int mr_cli_data(int argc, char **argv)
{
	struct data_opts o;
	struct mr_config cfg = {0};
	const char *sub = argc > 1 ? argv[1] : "";
	int rc;

	if (strcmp(sub, "prepare") && strcmp(sub, "synth") && strcmp(sub, "inspect")) {
		fprintf(strcmp(sub, "--help") ? stderr : stdout,
			"usage: meshrun data prepare|synth|inspect [options] [FILE...]\n"
			"Run 'meshrun data <command> --help' for the options.\n");
		return strcmp(sub, "--help") ? MR_CONFIG_EXIT_USAGE : 0;
	}
	rc = parse(&o, &cfg, argc - 1, argv + 1, "prepare|synth|inspect [options] [FILE...]");
	if (rc == MR_CONFIG_HELP)
		rc = 0;
	else if (rc < 0)
		rc = MR_CONFIG_EXIT_USAGE;
	else if (!strcmp(sub, "prepare"))
		rc = cmd_prepare(&o, &cfg);
	else if (!strcmp(sub, "synth"))
		rc = cmd_synth(&o);
	else
		rc = cmd_inspect(&cfg);
	mr_config_release(&cfg);
	return rc;
}
