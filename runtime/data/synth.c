/*
 * synth.c - the synthetic copy task (see mr_synth.h).
 */
#include <stddef.h>

#include "core/mr_rng.h"
#include "data/mr_synth.h"

#define MOTIF_MAX 16

struct motif {
	int tok[MOTIF_MAX];
	int p, phase;
};

/* A fixed pseudo-random successor of token t: (a*t + c) mod vocab with a
 * odd-ish multiplier derived from the seed (need not be a permutation). */
static int successor(uint64_t seed, int t, int vocab)
{
	uint64_t st = seed ^ 0x9e37u, a = mr_splitmix64(&st), c = mr_splitmix64(&st);

	return (int)(((a | 1) * (uint64_t)t + c) % (uint64_t)vocab);
}

static void motif_of(uint64_t seed, uint64_t stream, uint64_t row, int vocab, struct motif *m)
{
	struct mr_rng r;
	int i;

	mr_rng_seed(&r, seed ^ 0x5354u, stream * 0x100000001b3ULL + row);
	m->p = 4 + (int)mr_rng_below(&r, MOTIF_MAX - 4 + 1);
	m->tok[0] = (int)mr_rng_below(&r, (uint64_t)vocab);
	for (i = 1; i < m->p; i++) {
		/* 3 in 4: the seed's fixed successor (learnable as a bigram) */
		if (mr_rng_below(&r, 4) != 0)
			m->tok[i] = successor(seed, m->tok[i - 1], vocab);
		else
			m->tok[i] = (int)mr_rng_below(&r, (uint64_t)vocab);
	}
	m->phase = (int)mr_rng_below(&r, (uint64_t)m->p);
}

void mr_synth_row(uint64_t seed, uint64_t stream, uint64_t row, int vocab, int len, int *out)
{
	struct motif m;
	int i;

	motif_of(seed, stream, row, vocab, &m);
	for (i = 0; i < len; i++)
		out[i] = m.tok[(i + m.phase) % m.p];
}

void mr_synth_batch(uint64_t seed, uint64_t stream, uint64_t first_row, int vocab, int B,
		    int T, int *inputs, int *targets)
{
	int b, t;

	for (b = 0; b < B; b++) {
		struct motif m;
		motif_of(seed, stream, first_row + (uint64_t)b, vocab, &m);
		for (t = 0; t < T; t++) {
			inputs[(size_t)b * T + t] = m.tok[(t + m.phase) % m.p];
			targets[(size_t)b * T + t] = m.tok[(t + 1 + m.phase) % m.p];
		}
	}
}
