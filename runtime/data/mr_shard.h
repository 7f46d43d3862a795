/*
 * mr_shard.h - llm.c token shards: reading, validation, deterministic
 * shuffled batches, and writing.
 *
 * Format (llm.c / nanoGPT data prep): a header of 256 little-endian int32
 * ([0] magic 20240520, [1] version, [2] token count, rest 0), then `count`
 * tokens: version 1 (llm.c's) uint16 tokens, version 2 (meshrun's, for
 * vocabularies past 65,536 such as Llama 3's 128,256) uint32 tokens, both
 * little-endian. The writer picks version 1 when every token fits in 16
 * bits, else 2. Opening checks the magic, the version (any other is
 * refused naming the file and the version), that the file size is exactly
 * 1024 + (2 or 4)*count bytes, and that every token is below the model's
 * vocabulary; every message names the file.
 *
 * In memory the tokens are uint32 whatever the version, so a v1 file and
 * a v2 file with the same tokens give the same batches.
 *
 * Batches: the shard is cut into windows of T+1 tokens at stride T (inputs
 * are the first T, targets the last T). Epoch e visits every window once in
 * an order shuffled by (seed, e) (Fisher-Yates over mr_rng), so the batch
 * sequence is a pure function of (file, seed, T) - resumable and identical
 * on every rank. A data-parallel rank takes rows [rank*B, (rank+1)*B) of a
 * global batch (first_row argument).
 *
 * Ownership: struct mr_shard owns the token array and the permutation;
 * mr_shard_close releases them. Non-goals: streaming shards larger than
 * memory, multi-shard datasets (a list of struct mr_shard), tokenizers
 * (data/mr_tokenizer.h, used by `meshrun data prepare --tokenizer`).
 */
#ifndef MR_SHARD_H
#define MR_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "mr_err.h"

#define MR_SHARD_MAGIC 20240520
#define MR_SHARD_VERSION 1     /* uint16 tokens (llm.c) */
#define MR_SHARD_VERSION_32 2  /* uint32 tokens */

struct mr_shard {
	char path[256];
	int version;       /* of the file: MR_SHARD_VERSION or MR_SHARD_VERSION_32 */
	uint32_t *tok;     /* (count) whatever the file's version */
	size_t count;      /* tokens */
	int T;             /* window length - 1 */
	size_t nwin;       /* windows per epoch */
	uint64_t seed;
	long epoch;        /* epoch the permutation belongs to, -1 none */
	size_t *perm;      /* (nwin) window order of that epoch */
};

/* Opens and validates path for sequence length T and vocabulary vocab.
 * MR_ENOTFOUND when the file does not exist, MR_ECORRUPT / MR_ERANGE when
 * it is not a valid shard for them, MR_EIO for other read errors. */
int mr_shard_open(struct mr_shard *s, const char *path, int vocab, int T, uint64_t seed,
		  struct mr_errbuf *eb);
void mr_shard_close(struct mr_shard *s);
/* Rows first_row .. first_row+B-1 of the global row sequence (row r is
 * window perm_e[r % nwin] of epoch e = r / nwin) into inputs/targets (B,T). */
int mr_shard_batch(struct mr_shard *s, uint64_t first_row, int B, int *inputs, int *targets,
		   struct mr_errbuf *eb);
/* Writes n tokens (each < 65536) as a version 1 shard. */
int mr_shard_write(const char *path, const uint16_t *tok, size_t n, struct mr_errbuf *eb);
/* Writes n tokens as a shard of version (MR_SHARD_VERSION: each must be
 * < 65536, else MR_ERANGE; MR_SHARD_VERSION_32; 0: version 1 when every
 * token fits in 16 bits, else 2). Tokens above INT32_MAX are refused. */
int mr_shard_write32(const char *path, const uint32_t *tok, size_t n, int version,
		     struct mr_errbuf *eb);

#endif
