/*
 * mr_synth.h - a deterministic synthetic language task, so the default run
 * needs no download.
 *
 * Each sequence is a "motif" of 4..16 tokens repeated to fill the row,
 * starting at a random phase. Inside a motif, 3 of 4 tokens are a fixed
 * (seed-dependent) successor of the previous one, the rest are random. A
 * model first learns the successor table (bigram: the loss falls within
 * tens of steps), then copying from one period earlier (an induction head:
 * the loss falls further toward the unpredictable first period).
 *
 * Row r of stream s is a pure function of (seed, s, r): any rank can draw
 * any slice of any batch. Non-goals: natural-language statistics.
 */
#ifndef MR_SYNTH_H
#define MR_SYNTH_H

#include <stdint.h>

/* Fills out (len tokens in [0, vocab)) with row `row` of stream `stream`. */
void mr_synth_row(uint64_t seed, uint64_t stream, uint64_t row, int vocab, int len, int *out);
/* inputs/targets (B,T): rows first_row.. of the stream, shifted by one. */
void mr_synth_batch(uint64_t seed, uint64_t stream, uint64_t first_row, int vocab, int B,
		    int T, int *inputs, int *targets);

#endif
