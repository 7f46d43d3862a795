/*
 * gpt_int.h - internals of the model shared by gpt_params.c and
 * gpt_table.c.
 */
#ifndef MR_GPT_INT_H
#define MR_GPT_INT_H

#include "mr_gpt.h"

/* Builds m's parameter table for m->cfg and m->tp.size: tensors,
 * unit_first, ntensors, nunits, nparams (gpt_table.c). MR_ENOMEM. */
int mr__gpt_table_create(struct mr_gpt *m);
/* Points m->wc's views into m->params_c (table order). */
void mr__gpt_bind_compute(struct mr_gpt *m);

#endif
