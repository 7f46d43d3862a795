/*
 * mr_pp_slots.h - a pipeline stage's micro-batch slots: one micro-batch's
 * state (model/mr_gpt.h's struct mr_gpt_slot: its activations, batch,
 * loss and split-backward stash) per micro-batch the stage keeps in
 * flight, and which one the model's passes use. The runner (pp.c) decides
 * how many and which micro-batch goes where; the model only carves one
 * state (mr_gpt_slot_alloc) and swaps it in (mr_gpt_slot_swap).
 *
 * Slot 0 is the state the model was created with; growing carves the
 * others. The slot in use lives in the model's fields, where the passes
 * find it; its entry in `parked` is empty meanwhile.
 *
 * Ownership: the caller owns struct mr_pp_slots (mr_pp_slots_init /
 * mr_pp_slots_release) and borrows the model, which must outlive it.
 * Released, the slots free every state but the one in use, which the
 * model keeps as its own: one state again, as after create. The model's
 * recompute mode and split backward are set before growing
 * (mr_gpt_set_recompute, mr_gpt_split_bwd). Non-goals: assigning
 * micro-batches to slots (pp.c's plan).
 */
#ifndef MR_PP_SLOTS_H
#define MR_PP_SLOTS_H

#include "model/mr_gpt.h"
#include "parallel/mr_pp_sched.h"

struct mr_pp_slots {
	struct mr_gpt *m;
	struct mr_gpt_slot *parked; /* (n) each slot's state, empty for the one in use */
	int n;                      /* slots: 1 after init */
	int cur;                    /* the slot in use, in the model's fields */
};

/* One slot: the model's own state, in use; 0 or MR_ENOMEM (eb says). */
int mr_pp_slots_init(struct mr_pp_slots *ps, struct mr_gpt *m, struct mr_errbuf *eb);
/* Grows to n slots, each new one carved by the model (accounted in its
 * m->mem); never shrinks. The slot in use stays in use. */
int mr_pp_slots_grow(struct mr_pp_slots *ps, int n, struct mr_errbuf *eb);
/* Makes slot k the one the model's passes read and write; MR_EINVAL
 * (nothing changed) unless 0 <= k < n. */
int mr_pp_slots_use(struct mr_pp_slots *ps, int k);
/* Slot k's buffer for the (Nl,C) rows its chunk c receives, whether in
 * use or not: its input (MR_PP_ACT) or its output's gradient (MR_PP_GRAD). */
mr_act *mr_pp_slots_recv_buf(const struct mr_pp_slots *ps, int k, enum mr_pp_msg what, int c);
/* Frees every slot's state but the one in use (the model keeps it). */
void mr_pp_slots_release(struct mr_pp_slots *ps);

#endif
