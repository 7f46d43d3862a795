/*
 * generate.c - `meshrun generate`: text (or token ids) sampled from a
 * checkpoint (runtime/infer/mr_generate.h, docs/CHECKPOINTS.md,
 * "Generating text").
 *
 *   meshrun generate CKPT_DIR --prompt TEXT | --prompt-ids 1,2,3
 *                    [--max-new-tokens N] [--temperature X] [--top-k K]
 *                    [--top-p P] [--seed S] [--device cpu|cuda]
 *                    [--precision fp32|bf16] [--step N] [--threads N]
 *
 * CKPT_DIR is a checkpoint directory (its newest step, or --step N) or
 * one step's directory, written by any mesh. A byte-level model (vocab
 * 256, `meshrun data prepare`'s tokens) takes --prompt's bytes as its
 * tokens and prints the new bytes as text; any model takes --prompt-ids
 * and prints ids (space separated). The new tokens go to stdout (then a
 * newline), one summary line to stderr: tokens, seconds, tokens/s, and a
 * note when the sequence reached max_seq before --max-new-tokens.
 *
 * Exit status: 0 done, 1 decoding failed (a device error), 2 a usage
 * error: a bad flag or value, a missing, corrupt or unreadable
 * checkpoint, a prompt that does not fit the model.
 * Non-goals: tokenizers (none is wired yet), batches of prompts.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/mr_ckpt.h"
#include "cpu/mr_pool.h"
#include "data/mr_tokenizer.h"
#include "infer/mr_generate.h"
#include "mr_cli.h"
#include "mr_config.h"

enum { GEN_EXIT_OK = 0, GEN_EXIT_FAIL = 1, GEN_EXIT_USAGE = 2 };

#define GEN_MAX_PROMPT 65536

struct gen_opts {
	char prompt[GEN_MAX_PROMPT], prompt_ids[GEN_MAX_PROMPT];
	char tokenizer[4096];
	char precision[16];
	int device; /* index in devices */
	int64_t max_new_tokens, top_k, seed, step, threads;
	double temperature, top_p;
};

static const char *const devices[] = { "cpu", "cuda", NULL };

/* No MESHRUN_* variables (main below): a stray MESHRUN_STEP must not
 * pick a step. */
static const struct mr_config_opt gen_table[] = {
	MR_CONFIG_STRING("prompt", struct gen_opts, prompt, "",
			 "The prompt as text: encoded with --tokenizer, else its bytes are the "
			 "tokens (a byte-level model, vocab_size 256)."),
	MR_CONFIG_STRING("tokenizer", struct gen_opts, tokenizer, "",
			 "A Hugging Face tokenizer.json (the one `meshrun data prepare "
			 "--tokenizer` used): encodes --prompt and decodes the new tokens."),
	MR_CONFIG_STRING("prompt_ids", struct gen_opts, prompt_ids, "",
			 "The prompt as token ids, comma separated (any model); the new tokens "
			 "are printed as ids."),
	MR_CONFIG_INT("max_new_tokens", struct gen_opts, max_new_tokens, "64", 1, 1 << 20,
		      "Tokens to generate at most; generation stops earlier when the sequence "
		      "(prompt + new tokens) reaches the model's max_seq, with a note on stderr."),
	MR_CONFIG_DOUBLE("temperature", struct gen_opts, temperature, "1.0", 0.0, 100.0,
			 "Softmax temperature; 0 is greedy (the most likely token each time)."),
	MR_CONFIG_INT("top_k", struct gen_opts, top_k, "0", 0, 1 << 30,
		      "Sample among the K most likely tokens only (0: all; 1: greedy)."),
	MR_CONFIG_DOUBLE("top_p", struct gen_opts, top_p, "1.0", 0.0, 1.0,
			 "Nucleus sampling: among the most likely tokens whose probability "
			 "reaches P, in (0, 1] (1: all)."),
	MR_CONFIG_INT("seed", struct gen_opts, seed, "0", 0, INT64_MAX,
		      "The sampling seed: the same seed gives the same text."),
	MR_CONFIG_ENUM("device", struct gen_opts, device, "cpu", devices,
		       "Where to decode: cpu, or cuda (the first GPU)."),
	MR_CONFIG_STRING("precision", struct gen_opts, precision, "",
			 "fp32 or bf16 (default: the device's; cpu is fp32 only, cuda bf16)."),
	MR_CONFIG_INT("step", struct gen_opts, step, "0", 0, INT64_MAX,
		      "The step to load from a checkpoint directory (default its newest)."),
	MR_CONFIG_INT("threads", struct gen_opts, threads, "0", 0, 1024,
		      "cpu: threads (0: the machine's CPUs)."),
};
#define NOPTS (sizeof(gen_table) / sizeof(gen_table[0]))

static int usage_error(const char *fmt, const char *a, const char *b)
{
	fputs("meshrun generate: ", stderr);
	fprintf(stderr, fmt, a, b);
	fputc('\n', stderr);
	return GEN_EXIT_USAGE;
}

/* The step directory DIR stands for (itself, its newest step, or step)
 * into out; an exit code, the message printed. */
static int resolve(const char *dir, int has_step, long step, char *out, size_t cap)
{
	struct mr_errbuf eb = { "", "" };
	struct stat st;
	char path[4200];
	char **dirs = NULL;
	int n = 0;

	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return usage_error("'%s' is not a directory%s", dir,
				   errno == ENOENT ? " (no such file)" : "");
	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	if (access(path, F_OK) == 0) {
		if (has_step)
			return usage_error("--step: '%s' is already one step's directory%s", dir,
					   "");
		snprintf(out, cap, "%s", dir);
		return GEN_EXIT_OK;
	}
	if (mr_ckpt_list(dir, &dirs, &n, &eb) < 0)
		return usage_error("%s%s", eb.msg, "");
	if (n == 0)
		return usage_error("'%s' holds no checkpoint (neither a manifest.json nor step-N "
				   "directories)%s", dir, "");
	if (has_step) {
		snprintf(out, cap, "%s/step-%08ld", dir, step);
		if (access(out, F_OK) != 0) {
			fprintf(stderr, "meshrun generate: --step: '%s' has no step %ld (its newest "
					"is '%s')\n", dir, step, dirs[0]);
			mr_ckpt_list_free(dirs, n);
			return GEN_EXIT_USAGE;
		}
	} else {
		snprintf(out, cap, "%s", dirs[0]);
	}
	mr_ckpt_list_free(dirs, n);
	return GEN_EXIT_OK;
}

/* "1,2,3" into ids (at most cap); the count, or -1 with the message
 * printed. */
static int parse_ids(const char *text, int *ids, int cap, int V)
{
	const char *p = text;
	int n = 0;

	while (*p) {
		char *end;
		long v;
		errno = 0;
		v = strtol(p, &end, 10);
		if (end == p || errno || (*end && *end != ',')) {
			fprintf(stderr, "meshrun generate: --prompt-ids: '%s' is not a comma "
					"separated list of token ids\n", text);
			return -1;
		}
		if (v < 0 || v >= V) {
			fprintf(stderr, "meshrun generate: --prompt-ids: token %ld at position %d "
					"is outside the model's vocabulary [0, %d)\n", v, n, V);
			return -1;
		}
		if (n == cap) {
			fprintf(stderr, "meshrun generate: --prompt-ids: more than %d tokens\n",
				cap);
			return -1;
		}
		ids[n++] = (int)v;
		p = *end ? end + 1 : end;
	}
	return n;
}

struct emit_ctx {
	int bytes; /* print bytes (else ids) */
	int count;
	const struct mr_tokenizer *tok; /* decode through it (else bytes or ids) */
};

static int emit(void *ctx, int tok)
{
	struct emit_ctx *e = ctx;

	if (e->tok && tok >= mr_tokenizer_vocab_size(e->tok)) {
		printf("[%d]", tok); /* a padding id past the tokenizer's vocabulary */
	} else if (e->tok) {
		/* a token's bytes may end inside a UTF-8 character: printed as
		 * they are, the terminal joins them */
		struct mr_errbuf eb = { "", "" };
		uint32_t id = (uint32_t)tok;
		char *text = NULL;
		size_t len = 0;

		if (mr_tokenizer_decode(e->tok, &id, 1, &text, &len, &eb) < 0) {
			fprintf(stderr, "\nmeshrun generate: --tokenizer: %s\n", eb.msg);
			return MR_EINVAL;
		}
		fwrite(text, 1, len, stdout);
		free(text);
	} else if (e->bytes) {
		putchar(tok);
	} else {
		printf(e->count ? " %d" : "%d", tok);
	}
	e->count++;
	fflush(stdout);
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Everything after the options: load, check the prompt, decode. */
static int generate(const struct gen_opts *o, const struct mr_config *cfg)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_ckpt_manifest mf;
	struct mr_pool *pool = NULL;
	struct mr_dev dev;
	struct mr_gen g;
	struct mr_gen_opts go;
	struct emit_ctx ec = { 0, 0, NULL };
	struct mr_tokenizer *tok = NULL;
	char dir[4200];
	int *ids = NULL, np = 0, nout = 0, rc, V, dev_open = 0, gen_open = 0;
	double t0;
	const char *prec = o->precision[0] ? o->precision : NULL;
	const char *device = devices[o->device];

	if (cfg->nargs != 1)
		return usage_error("give one checkpoint or step directory (usage: meshrun "
				   "generate CKPT_DIR --prompt TEXT)%s%s", "", "");
	if (!o->prompt[0] == !o->prompt_ids[0])
		return usage_error(o->prompt[0] ? "--prompt and --prompt-ids: give one%s%s"
						: "--prompt or --prompt-ids: the prompt is missing "
						  "(an empty prompt has nothing to continue)%s%s",
				   "", "");
	if (mr_config_is_set(cfg, "top_p") && o->top_p <= 0.0)
		return usage_error("--top-p: '0' is outside (0, 1]%s%s", "", "");
	if ((rc = mr_dev_check_precision(device, prec, &eb)) < 0)
		return usage_error("--%s: %s", eb.field[0] ? eb.field : "precision", eb.msg);
	if ((rc = resolve(cfg->args[0], mr_config_is_set(cfg, "step"), (long)o->step, dir,
			  sizeof(dir))))
		return rc;
	if (mr_ckpt_manifest_read(&mf, dir, &eb) < 0) {
		fprintf(stderr, "meshrun generate: %s\n", eb.msg);
		return GEN_EXIT_USAGE;
	}
	V = mf.model.vocab;
	rc = GEN_EXIT_USAGE;
	if (!(ids = malloc(GEN_MAX_PROMPT * sizeof(int)))) {
		fprintf(stderr, "meshrun generate: out of memory\n");
		goto out;
	}
	if (o->tokenizer[0]) {
		uint32_t *enc = NULL;
		size_t n = 0;

		if (mr_tokenizer_load(&tok, o->tokenizer, &eb) < 0) {
			fprintf(stderr, "meshrun generate: --tokenizer: %s\n", eb.msg);
			goto out;
		}
		if (mr_tokenizer_vocab_size(tok) > V) {
			fprintf(stderr, "meshrun generate: --tokenizer: '%s' has %d tokens, the "
					"model's vocabulary %d: not the tokenizer it was trained "
					"with\n",
				o->tokenizer, mr_tokenizer_vocab_size(tok), V);
			goto out;
		}
		ec.tok = tok;
		if (o->prompt[0]) {
			if (mr_tokenizer_encode(tok, o->prompt, strlen(o->prompt), &enc, &n, &eb) <
			    0) {
				fprintf(stderr, "meshrun generate: --prompt: %s\n", eb.msg);
				goto out;
			}
			for (size_t i = 0; i < n && i < GEN_MAX_PROMPT; i++)
				ids[i] = (int)enc[i];
			np = n < GEN_MAX_PROMPT ? (int)n : GEN_MAX_PROMPT;
			free(enc);
			if (np == 0) {
				fprintf(stderr, "meshrun generate: --prompt: encodes to no token\n");
				goto out;
			}
		}
	} else if (o->prompt[0] && V != 256) {
		fprintf(stderr, "meshrun generate: --prompt: the model's vocabulary (%d tokens) is "
				"not byte-level: give --tokenizer FILE (the tokenizer.json the data "
				"was prepared with) or --prompt-ids\n",
			V);
		goto out;
	}
	if (tok && o->prompt[0]) {
		/* encoded above */
	} else if (o->prompt[0]) {
		np = (int)strlen(o->prompt);
		for (int i = 0; i < np; i++)
			ids[i] = (unsigned char)o->prompt[i];
		ec.bytes = 1;
	} else if ((np = parse_ids(o->prompt_ids, ids, GEN_MAX_PROMPT, V)) < 0) {
		goto out;
	}
	if (np >= mf.model.max_seq) {
		fprintf(stderr, "meshrun generate: %s: the prompt's %d tokens leave no room for a "
				"new one: the model's max_seq is %d\n",
			o->prompt[0] ? "--prompt" : "--prompt-ids", np, mf.model.max_seq);
		goto out;
	}
	if (!strcmp(device, "cpu") &&
	    mr_pool_create(&pool, o->threads > 0 ? (int)o->threads
						 : (int)sysconf(_SC_NPROCESSORS_ONLN)) < 0) {
		fprintf(stderr, "meshrun generate: unable to start the cpu threads\n");
		rc = GEN_EXIT_FAIL;
		goto out;
	}
	if (mr_dev_open(&dev, device, 0, prec, pool, &eb) < 0) {
		fprintf(stderr, "meshrun generate: --device %s: %s\n", device, eb.msg);
		goto out;
	}
	dev_open = 1;
	if (mr_gen_init(&g, &mf, &dev, np, &eb) < 0) {
		fprintf(stderr, "meshrun generate: %s\n", eb.msg);
		goto out;
	}
	gen_open = 1;
	go.max_new = (int)o->max_new_tokens;
	go.temperature = (float)o->temperature;
	go.top_k = (int)o->top_k;
	go.top_p = (float)o->top_p;
	go.seed = (uint64_t)o->seed;
	t0 = now_s();
	if (mr_gen_run(&g, ids, np, &go, NULL, &nout, emit, &ec, &eb) < 0) {
		fprintf(stderr, "\nmeshrun generate: %s\n", eb.msg);
		rc = GEN_EXIT_FAIL;
		goto out;
	}
	putchar('\n');
	fflush(stdout);
	{
		double s = now_s() - t0;
		fprintf(stderr, "generated %d tokens in %.3f s (%.1f tokens/s) from '%s' on %s%s\n",
			nout, s, s > 0 ? nout / s : 0.0, dir, dev.model,
			nout < go.max_new ? ", stopped at the model's max_seq" : "");
	}
	rc = GEN_EXIT_OK;
out:
	if (gen_open)
		mr_gen_release(&g);
	if (dev_open)
		mr_dev_close(&dev);
	mr_pool_free(pool);
	mr_tokenizer_free(tok);
	free(ids);
	mr_ckpt_manifest_release(&mf);
	return rc;
}

int mr_cli_generate(int argc, char **argv)
{
	struct mr_config_opt rows[NOPTS];
	struct mr_config cfg = { 0 };
	struct mr_errbuf eb = { "", "" };
	struct gen_opts *o = calloc(1, sizeof(*o));
	int rc;

	if (!o) {
		fprintf(stderr, "meshrun generate: out of memory\n");
		return GEN_EXIT_FAIL;
	}
	memcpy(rows, gen_table, sizeof(rows));
	for (size_t i = 0; i < NOPTS; i++)
		rows[i].env = "";
	rc = mr_config_init(&cfg, rows, NOPTS, o, &eb);
	cfg.prog = "meshrun generate";
	cfg.usage = "CKPT_DIR --prompt TEXT | --prompt-ids IDS [options]";
	cfg.summary = "Generate text from a checkpoint written by any mesh: a one-rank model "
		      "decoded with a key/value cache on the cpu or cuda device, greedy or "
		      "sampled (temperature, top-k, top-p, seeded). The new tokens go to stdout, "
		      "a summary line (tokens, seconds, tokens/s) to stderr.";
	cfg.config_file = 0;
	cfg.allow_positional = 1;
	if (rc == 0)
		rc = mr_config_parse(&cfg, argc, argv, &eb);
	if (rc == MR_CONFIG_HELP) {
		rc = GEN_EXIT_OK;
	} else if (rc < 0) {
		fprintf(stderr, "meshrun generate: %s\n", eb.msg);
		rc = GEN_EXIT_USAGE;
	} else {
		rc = generate(o, &cfg);
	}
	mr_config_release(&cfg);
	free(o);
	return rc;
}
