/*
 * pp_slots.c - a pipeline stage's micro-batch slots (see mr_pp_slots.h):
 * the states the model carves, kept in order, swapped in and out of the
 * model's fields as the runner moves from one micro-batch to the next.
 */
#include <stdlib.h>
#include <string.h>

#include "mr_pp_slots.h"

int mr_pp_slots_init(struct mr_pp_slots *ps, struct mr_gpt *m, struct mr_errbuf *eb)
{
	ps->m = m;
	ps->n = 1;
	ps->cur = 0;
	/* slot 0's entry is empty: its state, the model's own, is in use */
	if (!(ps->parked = calloc(1, sizeof(*ps->parked))))
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the micro-batch slots");
	return 0;
}

int mr_pp_slots_grow(struct mr_pp_slots *ps, int n, struct mr_errbuf *eb)
{
	struct mr_gpt_slot *grown;
	int rc;

	if (n <= ps->n)
		return 0;
	if (!(grown = realloc(ps->parked, (size_t)n * sizeof(*grown))))
		return mr_errf(eb, MR_ENOMEM, "unable to allocate %d micro-batch slots", n);
	ps->parked = grown;
	for (; ps->n < n; ps->n++)
		if ((rc = mr_gpt_slot_alloc(ps->m, &ps->parked[ps->n])) < 0)
			return mr_errf(eb, rc, "unable to allocate micro-batch slot %d of %d (%zu "
					       "bytes of activations each)",
				       ps->n + 1, n, ps->m->nacts);
	return 0;
}

int mr_pp_slots_use(struct mr_pp_slots *ps, int k)
{
	if (k < 0 || k >= ps->n)
		return MR_EINVAL;
	if (k != ps->cur) {
		/* the state in use back to its empty entry, then slot k's out
		 * of its own, which is left empty */
		mr_gpt_slot_swap(ps->m, &ps->parked[ps->cur]);
		mr_gpt_slot_swap(ps->m, &ps->parked[k]);
		ps->cur = k;
	}
	return 0;
}

mr_act *mr_pp_slots_recv_buf(const struct mr_pp_slots *ps, int k, enum mr_pp_msg what, int c)
{
	const struct mr_gpt *m = ps->m;
	const struct mr_gpt_slot *s = &ps->parked[k];

	if (k == ps->cur) /* its state is in the model's fields */
		return what == MR_PP_ACT ? m->xin[c] : m->xgrad[c];
	return what == MR_PP_ACT ? s->xin[c] : s->xgrad[c];
}

void mr_pp_slots_release(struct mr_pp_slots *ps)
{
	int k;

	for (k = 0; ps->parked && k < ps->n; k++)
		mr_gpt_slot_free(ps->m, &ps->parked[k]); /* the one in use: empty, kept */
	free(ps->parked);
	memset(ps, 0, sizeof(*ps));
}
