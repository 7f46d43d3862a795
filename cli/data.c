/*
 * data.c - `meshrun data`: make llm.c token shards.
 *
 *   meshrun data prepare [--out-dir DIR] [--val-fraction F] FILE...
 *       byte-level tokenizer (token = byte, vocab 256): the files are
 *       concatenated; the last F of the tokens become DIR/val.bin, the rest
 *       DIR/train.bin
 *   meshrun data synth [--out-dir DIR] [--tokens N] [--vocab V] [--seed S]
 *       the runtime's deterministic synthetic task written as shards
 *   meshrun data inspect FILE
 *       validates a shard (magic, version, size) and prints its token count
 *
 * The shards (llm.c format, runtime/data/mr_shard.h) feed the runtime with
 * --workload-config '{"train_data": "DIR/train.bin", "val_data": ...}'.
 * Non-goals: BPE tokenizers (nanoGPT/llm.c data prep already writes this
 * format), multi-shard datasets.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/mr_shard.h"
#include "data/mr_synth.h"
#include "mr_cli.h"
#include "mr_config.h"

#define DATA_MAX_TOKENS ((size_t)1 << 30) /* one shard's int32 count, with room */
#define SYNTH_ROW 257                     /* tokens per synthetic row */

struct data_opts {
	char out_dir[1024];
	double val_fraction;
	int64_t tokens;
	int vocab;
	int64_t seed;
};

static const struct mr_config_opt data_table[] = {
	MR_CONFIG_STRING("out_dir", struct data_opts, out_dir, "data",
			 "Directory for train.bin and val.bin (created if missing)."),
	MR_CONFIG_DOUBLE("val_fraction", struct data_opts, val_fraction, "0.1", 0.0, 0.5,
			 "prepare: fraction of the tokens held out for val.bin."),
	MR_CONFIG_INT("tokens", struct data_opts, tokens, "1048576", 1024, 1 << 30,
		      "synth: tokens in train.bin (val.bin gets a tenth)."),
	MR_CONFIG_INT("vocab", struct data_opts, vocab, "256", 2, 65536,
		      "synth: vocabulary size."),
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
	cfg->summary = "Make llm.c token shards (256 x int32 header, uint16 tokens).";
	cfg->config_file = 0;
	cfg->allow_positional = 1;
	if (rc == 0)
		rc = mr_config_parse(cfg, argc, argv, &eb);
	if (rc < 0)
		fprintf(stderr, "meshrun data: %s\n", eb.msg);
	return rc;
}

static int write_pair(const char *dir, const uint16_t *tok, size_t ntrain, size_t nval)
{
	char path[1100];
	struct mr_errbuf eb = {0};

	if (mkdir(dir, 0755) && errno != EEXIST) {
		fprintf(stderr, "meshrun data: unable to create '%s': %s\n", dir, strerror(errno));
		return 1;
	}
	snprintf(path, sizeof(path), "%s/train.bin", dir);
	if (mr_shard_write(path, tok, ntrain, &eb) < 0) {
		fprintf(stderr, "meshrun data: %s\n", eb.msg);
		return 1;
	}
	printf("%s: %zu tokens\n", path, ntrain);
	snprintf(path, sizeof(path), "%s/val.bin", dir);
	if (mr_shard_write(path, tok + ntrain, nval, &eb) < 0) {
		fprintf(stderr, "meshrun data: %s\n", eb.msg);
		return 1;
	}
	printf("%s: %zu tokens\n", path, nval);
	return 0;
}

/* Appends the bytes of path to *tok (grown as needed, bounded). */
static int read_bytes(const char *path, uint16_t **tok, size_t *n, size_t *cap)
{
	FILE *f = fopen(path, "rb");
	unsigned char buf[65536];
	size_t r;

	if (!f) {
		fprintf(stderr, "meshrun data: unable to open '%s': %s\n", path, strerror(errno));
		return 1;
	}
	while ((r = fread(buf, 1, sizeof(buf), f)) > 0) {
		if (*n + r > DATA_MAX_TOKENS) {
			fprintf(stderr, "meshrun data: '%s': more than %zu tokens in all; split the "
					"input\n", path, DATA_MAX_TOKENS);
			fclose(f);
			return 1;
		}
		if (*n + r > *cap) {
			size_t nc = *cap ? *cap * 2 : 1 << 20;
			uint16_t *t;

			while (nc < *n + r)
				nc *= 2;
			t = realloc(*tok, nc * sizeof(**tok));
			if (!t) {
				fclose(f);
				fprintf(stderr, "meshrun data: out of memory\n");
				return 1;
			}
			*tok = t;
			*cap = nc;
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

static int cmd_prepare(struct data_opts *o, struct mr_config *cfg)
{
	uint16_t *tok = NULL;
	size_t n = 0, cap = 0, nval;
	int rc = 1;

	if (cfg->nargs < 1) {
		fprintf(stderr, "meshrun data prepare: no input file (usage: meshrun data prepare "
				"[--out-dir DIR] FILE...)\n");
		return MR_CONFIG_EXIT_USAGE;
	}
	for (int i = 0; i < cfg->nargs; i++)
		if (read_bytes(cfg->args[i], &tok, &n, &cap))
			goto out;
	nval = (size_t)((double)n * o->val_fraction);
	if (n < 2 || (o->val_fraction > 0 && nval < 2)) {
		fprintf(stderr, "meshrun data prepare: only %zu tokens in the input; too few to "
				"split\n", n);
		goto out;
	}
	rc = write_pair(o->out_dir, tok, n - nval, nval);
out:
	free(tok);
	return rc;
}

/* n tokens of synthetic stream `stream`, row after row. */
static void synth_fill(const struct data_opts *o, uint64_t stream, uint16_t *tok, size_t n)
{
	int row[SYNTH_ROW];

	for (size_t at = 0, r = 0; at < n; at += SYNTH_ROW, r++) {
		int len = n - at < SYNTH_ROW ? (int)(n - at) : SYNTH_ROW;

		mr_synth_row((uint64_t)o->seed, stream, r, o->vocab, len, row);
		for (int k = 0; k < len; k++)
			tok[at + (size_t)k] = (uint16_t)row[k];
	}
}

static int cmd_synth(struct data_opts *o)
{
	size_t ntrain = (size_t)o->tokens, nval = ntrain / 10;
	uint16_t *tok = malloc((ntrain + nval) * sizeof(*tok));
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
		uint16_t max = 0;

		mr_errbuf_clear(&eb);
		if (mr_shard_open(&s, cfg->args[i], 65536, 1, 0, &eb) < 0) {
			fprintf(stderr, "meshrun data: %s\n", eb.msg);
			rc = 1;
			continue;
		}
		for (size_t k = 0; k < s.count; k++)
			max = s.tok[k] > max ? s.tok[k] : max;
		printf("%s: llm.c shard v%d, %zu tokens, largest token id %u\n", cfg->args[i],
		       MR_SHARD_VERSION, s.count, max);
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
