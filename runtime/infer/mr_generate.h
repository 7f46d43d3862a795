/*
 * mr_generate.h - text generation from a checkpoint: a single-rank model
 * loaded from any mesh's checkpoint, decoded with a key/value cache on
 * the model's device, and sampled on the host (what `meshrun generate`
 * runs; docs/CHECKPOINTS.md, "Generating text").
 *
 * Decoding: mr_gen_feed runs n new tokens at the next n positions
 * through every block - the prompt once (n rows), then one row per new
 * token - each block appending its keys and values (after rotary
 * positions for llama) to the layer's cache, (max_seq, NKV*hs) rows in
 * the activation type, and attending with the device's attn_part_fwd:
 * n queries at positions pos.. against the pos+n cached keys, causal.
 * Every step is one operation of the device table (device/mr_device.h),
 * so the same code runs on cpu and cuda. Only the last row goes through
 * the final norm and the LM head; its logits are read back to the host.
 *
 * MoE layers run dropless (every expert can take all n rows): at
 * inference nothing is dropped, whatever capacity_factor the model was
 * trained with.
 *
 * Sampling (mr_gen_sample): temperature 0 is greedy (argmax, the lowest
 * id on ties); else logits / temperature, the top_k largest kept (0: all),
 * then the smallest set of the most likely whose probability reaches
 * top_p (1: all), one draw from the project's RNG (mr_rng.h): the same
 * seed gives the same tokens.
 *
 * Ownership: the caller owns struct mr_gen (mr_gen_init / mr_gen_release)
 * and the device it passes (borrowed until release).
 *
 * Non-goals: batches of prompts, beam search, tokenizers (ids in, ids
 * out), tensor/pipeline parallel decoding, a paged cache.
 */
#ifndef MR_GENERATE_H
#define MR_GENERATE_H

#include <stdint.h>

#include "ckpt/mr_ckpt.h"
#include "core/mr_rng.h"
#include "device/mr_device.h"
#include "model/mr_gpt.h"
#include "mr_err.h"

struct mr_gen_opts {
	int max_new;        /* tokens to generate at most (>= 1) */
	float temperature;  /* 0: greedy */
	int top_k;          /* keep the k most likely (0: off) */
	float top_p;        /* nucleus mass in (0, 1] (1: off) */
	uint64_t seed;      /* the sampling stream's seed */
};

struct mr_gen {
	struct mr_gpt m;    /* the weights (a one-rank model, B 1, T 1, no
			     * gradients) */
	struct mr_dev *dev; /* borrowed */
	int maxn;           /* rows one mr_gen_feed takes at most */
	int pos;            /* positions cached (tokens fed so far) */
	int V, C, NH, NKV, hs, qkv, fc, ffn;
	size_t kv;          /* NKV * hs: a cache row */
	/* device: the caches (L of (max_seq, kv) keys then values) and one
	 * feed's rows (maxn each) */
	mr_act *cache;
	size_t cache_bytes, buf_bytes;
	void *buf;
	int *tok, *posv;
	mr_act *x, *h, *qkvr, *att, *y, *fch, *fcg, *logits;
	float *attf, *mean, *rstd, *lse, *logf;
	float *moe_f;
	int *moe_i;
	/* host: the last logits (V), and sampling scratch (V each) */
	float *host_logits, *prob;
	int *idx;
};

/*
 * Loads the step directory mf describes (whatever mesh wrote it: every
 * tensor reassembled whole, each record verified) into a one-rank model
 * on dev, with room for feeds of up to maxn rows (the prompt's length)
 * and a cache of max_seq positions. Errors name the checkpoint and the
 * tensor, or the device (a head size its attention cannot take).
 */
int mr_gen_init(struct mr_gen *g, const struct mr_ckpt_manifest *mf, struct mr_dev *dev,
		int maxn, struct mr_errbuf *eb);
/* The same from a whole model's parameters on the host (params: the
 * one-rank table's order, as mr_ckpt_write_params takes them). */
int mr_gen_init_params(struct mr_gen *g, const struct mr_gpt_config *cfg, const float *params,
		       struct mr_dev *dev, int maxn, struct mr_errbuf *eb);
/* Frees everything g holds; a zeroed or released g is a no-op. */
void mr_gen_release(struct mr_gen *g);
/* Forgets the cached positions (a new sequence). */
void mr_gen_reset(struct mr_gen *g);

/*
 * Runs tokens tok[0..n) at positions pos .. pos+n-1 (1 <= n <= maxn,
 * pos + n <= max_seq; ids in [0, V)), caching their keys and values;
 * g->host_logits (V) then holds the logits after the last of them.
 * MR_ERANGE names a bad id or a sequence past max_seq.
 */
int mr_gen_feed(struct mr_gen *g, const int *tok, int n, struct mr_errbuf *eb);

/* One token from logits (V) by o (see the header); prob and idx are V
 * floats and ints of scratch. */
int mr_gen_sample(const float *logits, int V, const struct mr_gen_opts *o, struct mr_rng *r,
		  float *prob, int *idx);

/* Called with each new token; a non-zero return stops generation. */
typedef int (*mr_gen_emit_fn)(void *ctx, int tok);

/*
 * From a fresh cache: feeds the prompt (np ids, 1 <= np < max_seq, np <=
 * maxn), then samples and feeds up to o->max_new tokens, stopping early
 * when the sequence reaches max_seq (prompt + new tokens <= max_seq).
 * out (o->max_new ints, may be NULL) and emit (may be NULL) get each new
 * token; *nout the count. 0 or the first error.
 */
int mr_gen_run(struct mr_gen *g, const int *prompt, int np, const struct mr_gen_opts *o,
	       int *out, int *nout, mr_gen_emit_fn emit, void *ctx, struct mr_errbuf *eb);

#endif
