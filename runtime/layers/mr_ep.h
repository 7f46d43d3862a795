/*
 * mr_ep.h - expert parallelism: the experts of every MoE layer sharded
 * over the ep group (ep ranks, E / ep experts each), tokens moved to the
 * rank of their experts and back by all-to-all (struct mr_moe_xchg).
 *
 * Every rank routes its own micro-batch exactly as one rank would - the
 * capacity per expert, the drops by token position, the aux loss are the
 * source micro-batch's (kernels/mr_moe.h) - so an ep job computes what one
 * rank computes on the same micro-batches. Where the counts are on the
 * host (the cpu device; dropless routing on cuda) each exchange sends the
 * row counts first (E / ep ints to every rank), then the rows themselves
 * with mr_comm_alltoallv: only kept rows travel, never the capacity's
 * padding, which is what makes the dropless policy cheap to send. Where
 * the device kept them (the exchange gets counts NULL: sync-free capacity
 * MoE on cuda) no counts travel: every expert's whole cap block does, its
 * padded rows zero - a fixed-size all-to-all.
 *
 * Layouts (row = C elements of the device's activation type):
 *   source  (E, cap, row): expert e's kept rows at e * cap (the dispatch
 *           buffer, as one rank has it);
 *   view    (E/ep, ep * cap, row): local expert l's rows from rank 0,
 *           then rank 1, ... packed from l * ep * cap; view_counts[l].
 * DISPATCH(_GRAD) turns source into view in place, COMBINE(_GRAD) view
 * into source; both through two scratch buffers of the source's size on
 * the device, and the device's copies (any device).
 *
 * Not here: where expert weights live and which group reduces their
 * gradients (the model's table and the data-parallel layer).
 */
#ifndef MR_EP_H
#define MR_EP_H

#include "comm/mr_comm.h"
#include "core/mr_mem.h"
#include "device/mr_device.h"
#include "kernels/mr_moe.h"

struct mr_ep {
	struct mr_comm *comm;   /* the ep group */
	struct mr_dev *dev;
	struct mr_mem *mem;     /* ledger of the scratch (workspace) */
	int size, rank;
	int E, El;              /* experts, local experts (E / size) */
	int *cnt;               /* (size * El) rows of local expert l from/to rank r at [r*El+l]
				 * (all cap for whole blocks) */
	int *view;              /* (El) rows per local expert in the view */
	size_t *sc, *sd, *rc, *rd; /* (size each) alltoallv counts and displacements */
	void *send, *recv;      /* device scratch, bytes each */
	size_t bytes;
	double xchg_s;          /* seconds in exchanges so far (bench/cp_ep's share) */
	long xchgs;             /* exchanges so far */
};

/* E experts over comm (its size must divide E); the message names
 * "ep" or "n_experts". */
int mr_ep_create(struct mr_ep *ep, struct mr_comm *comm, struct mr_dev *dev, struct mr_mem *mem,
		 int E, struct mr_errbuf *eb);
void mr_ep_release(struct mr_ep *ep);
/* Points xg's fn, ctx, local_experts and view_counts at ep (reduce and
 * router_dx_off are left as they are). */
void mr_ep_bind(struct mr_ep *ep, struct mr_moe_xchg *xg);
/* The first expert rank r holds. */
static inline int mr_ep_first_expert(const struct mr_ep *ep, int r)
{
	return r * ep->El;
}

#endif
