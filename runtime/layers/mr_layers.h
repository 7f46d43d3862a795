/*
 * mr_layers.h - the parallel layers inside a model's blocks, attached in
 * one call: tensor (+ sequence) parallel (mr_tp.h), context parallel
 * (mr_cp.h), expert parallel (mr_ep.h), and the MoE exchange that ties
 * them to the experts (kernels/mr_moe.h: tp sums the router's input
 * gradient, cp sums the routing counts of the aux loss, ep dispatches
 * and combines over its group).
 *
 * A model family reads them (its blocks call their entry points) and
 * never wires them: mr_layers_attach does, from where the rank sits
 * (core/mr_place.h) and the few shapes the layers need. The degree 1 of
 * an axis is the identity, so the blocks call every layer
 * unconditionally.
 *
 * Ownership: struct mr_layers is the model's; the device, the ledger and
 * the communicators are borrowed. The tp layer's scratch is the model's
 * workspace (the model carves it).
 */
#ifndef MR_LAYERS_H
#define MR_LAYERS_H

#include "core/mr_place.h"
#include "kernels/mr_moe.h"
#include "layers/mr_cp.h"
#include "layers/mr_ep.h"
#include "layers/mr_tp.h"

struct mr_layers {
	struct mr_tp tp;         /* tensor/sequence parallel (size 1: identity) */
	struct mr_cp cp;         /* cp > 1: attention across the sequence split */
	struct mr_ep ep;         /* ep > 1: E / ep experts per MoE layer here */
	struct mr_moe_xchg xchg; /* dispatch/combine exchange (identity; all-to-all
				  * over the ep group under expert parallelism) */
};

/* What the layers need of the model: the micro-batch (B sequences of T
 * positions, the whole sequence: cp splits it), the width, the
 * vocabulary, the query and key/value heads of the whole model and its
 * experts (0: dense). */
struct mr_layers_shape {
	int B, T, C, V;
	int n_head, n_kv_head;
	int n_experts;
};

/* Wires L for a rank at place p; on error (a degree above 1 without its
 * communicator, key/value heads replicated over tp without the key/value
 * group, no memory) L is released and eb names the key. */
int mr_layers_attach(struct mr_layers *L, const struct mr_place *p, struct mr_dev *dev,
		     struct mr_mem *mem, const struct mr_layers_shape *s, struct mr_errbuf *eb);
/* Frees what attach allocated; a zeroed or released L is a no-op. */
void mr_layers_release(struct mr_layers *L);

#endif
