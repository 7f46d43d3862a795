/*
 * layers.c - attaching the parallel layers of a model's blocks (see
 * mr_layers.h): tp, cp and ep from the rank's place, and the MoE
 * exchange wired to them.
 */
#include "mr_layers.h"

#include <string.h>

#include "mr_err.h"

int mr_layers_attach(struct mr_layers *L, const struct mr_place *p, struct mr_dev *dev,
		     struct mr_mem *mem, const struct mr_layers_shape *s, struct mr_errbuf *eb)
{
	int tp = mr_place_size(p, MR_AXIS_TP), cp = mr_place_size(p, MR_AXIS_CP);
	int ep = mr_place_size(p, MR_AXIS_EP);
	int kv_local = tp > s->n_kv_head ? 1 : s->n_kv_head / tp;
	int rc;

	memset(L, 0, sizeof(*L));
	if (tp > 1 && !p->comm[MR_AXIS_TP])
		return mr_errf_field(eb, MR_EINVAL, "tp", "tp %d without a tp communicator", tp);
	if (tp > s->n_kv_head && !p->kv)
		return mr_errf_field(eb, MR_EINVAL, "n_kv_head",
				     "'n_kv_head' (%d) below tp (%d) replicates key/value heads, "
				     "which needs the key/value group (mr_groups_kv)",
				     s->n_kv_head, tp);
	if (ep > 1 && !p->comm[MR_AXIS_EP])
		return mr_errf_field(eb, MR_EINVAL, "ep", "ep %d without an ep communicator", ep);
	if (cp > 1 && !p->comm[MR_AXIS_CP])
		return mr_errf_field(eb, MR_EINVAL, "cp", "cp %d without a cp communicator", cp);

	/* tp works on this rank's rows of every sequence: T / cp */
	mr_tp_init(&L->tp, dev, tp, mr_place_index(p, MR_AXIS_TP), p->sp, p->comm[MR_AXIS_TP],
		   s->B, s->T / cp, s->C, s->V);
	L->tp.cp = cp;
	L->tp.cp_rank = mr_place_index(p, MR_AXIS_CP);
	if (tp > s->n_kv_head) {
		L->tp.kv = p->kv;
		L->tp.kv_n = 2 * (size_t)s->C * (size_t)(s->C / s->n_head);
	}
	if (tp > 1) {
		L->xchg.reduce = mr_tp_moe_reduce;
		L->xchg.reduce_ctx = &L->tp;
		L->xchg.router_dx_off = L->tp.rank != 0;
	}
	if (cp > 1) {
		rc = mr_cp_create(&L->cp, p->comm[MR_AXIS_CP], dev, mem, p->cp_algo, s->B, s->T,
				  s->C / tp, s->n_head / tp, kv_local, eb);
		if (rc < 0) {
			mr_layers_release(L);
			return rc;
		}
		L->xchg.count_reduce = mr_cp_sum_routed;
		L->xchg.count_ctx = &L->cp;
		L->xchg.count_ranks = cp;
	}
	if (ep > 1) {
		rc = mr_ep_create(&L->ep, p->comm[MR_AXIS_EP], dev, mem, s->n_experts, eb);
		if (rc < 0) {
			mr_layers_release(L);
			return rc;
		}
		mr_ep_bind(&L->ep, &L->xchg);
	}
	return 0;
}

void mr_layers_release(struct mr_layers *L)
{
	mr_ep_release(&L->ep);
	mr_cp_release(&L->cp);
	memset(L, 0, sizeof(*L));
}
