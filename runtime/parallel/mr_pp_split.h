/*
 * mr_pp_split.h - which transformer blocks each pipeline stage holds:
 * the model's L blocks cut into p*v contiguous ranges, one per virtual
 * stage (v chunks per stage for interleaved, else v = 1), in virtual-stage
 * order: virtual stage k = c*p + s (chunk c of stage s, mr_pp_sched.h)
 * holds the k-th range. Virtual stage 0 also runs the embedding, the last
 * one the final LayerNorm, the LM head and the loss.
 *
 * Cost model (forward FLOPs per token; backward is about twice that for
 * every piece, so it changes no ratio), C = d_model, T = sequence length,
 * V = vocabulary, E = experts:
 *   dense block   24*C^2 + 4*C*T   (QKV 6C^2, attention projection 2C^2,
 *                                   MLP 16C^2; scores and values 4CT)
 *   MoE block      8*C^2 + 4*C*T + 2*C*E + top_k*16*C^2
 *                                  (attention as above, the router, the
 *                                   MLPs of the top_k experts a token visits)
 *   embedding      2*C             (two rows gathered and added: small but
 *                                   not zero, so it breaks ties)
 *   head           2*C*V           (the LM head GEMM; LayerNorm and loss
 *                                   are O(C + V), left out)
 * Tensor and sequence parallelism divide every term alike, so the split
 * does not depend on them. The costs are whole numbers well below 2^53,
 * so every sum is exact and every rank computes the same split.
 *
 * Balanced split: the cut that minimises the cost of the most expensive
 * virtual stage (the pipeline runs at the pace of its slowest stage);
 * among those, the one with the smallest sum of squared stage costs (the
 * others as even as they can be); among those, the one whose later
 * stages hold more layers (under 1F1B stage s keeps p-s micro-batches'
 * activations, so the early stages are the memory-hungry ones). Every
 * virtual stage gets at least one block. Exact dynamic programming,
 * O(p*v*L^2) for L blocks.
 *
 * Explicit split ("pp_layers": [3,3,2,2]): p*v block counts in
 * virtual-stage order, each >= 1, adding up to n_layer.
 *
 * Ownership: every array is the caller's. Non-goals: cutting the
 * parameter table (the model does, from a stage's range), memory-aware
 * splits.
 */
#ifndef MR_PP_SPLIT_H
#define MR_PP_SPLIT_H

#include "mr_err.h"

struct mr_gpt_config;

/* The cost model above for mc at sequence length T (<= 0: mc->max_seq):
 * block[l] for l in 0..n_layer-1, *embed, *head. MR_EINVAL naming the
 * field when a size it uses is not positive. */
int mr_pp_split_costs(const struct mr_gpt_config *mc, int T, double *block, double *embed,
		      double *head, struct mr_errbuf *eb);

/*
 * The balanced split of n_layer blocks costing block[] (embed on virtual
 * stage 0, head on the last) over p*v virtual stages: writes p*v counts
 * to layers. MR_EINVAL naming "pp" (v = 1) or "pp_virtual" when there are
 * fewer blocks than virtual stages, or for a negative or non-finite cost;
 * MR_ENOMEM.
 */
int mr_pp_split_balance(const double *block, int n_layer, double embed, double head, int p,
			int v, int *layers, struct mr_errbuf *eb);

/* Checks an explicit split of n entries for p stages of v chunks and a
 * model of n_layer blocks; MR_EINVAL naming "pp_layers" for a wrong
 * length, an entry below 1, or a sum other than n_layer. */
int mr_pp_split_check(const int *layers, int n, int p, int v, int n_layer,
		      struct mr_errbuf *eb);

/*
 * The split a job runs: the explicit one (explicit_layers, n_explicit
 * entries, checked by mr_pp_split_check) or, with explicit_layers NULL,
 * the balanced one for model mc at sequence length T. Writes p*v counts
 * to layers.
 */
int mr_pp_split_model(const struct mr_gpt_config *mc, int T, int p, int v,
		      const int *explicit_layers, int n_explicit, int *layers,
		      struct mr_errbuf *eb);

/* Blocks [*lo, *hi) of chunk of stage under the split layers (p*v counts). */
void mr_pp_split_range(const int *layers, int p, int stage, int chunk, int *lo, int *hi);

#endif
