/*
 * place.c - the small accessors of struct mr_place (see mr_place.h).
 */
#include <string.h>

#include "core/mr_place.h"

void mr_place_one(struct mr_place *p)
{
	memset(p, 0, sizeof(*p));
}

void mr_place_tp(struct mr_place *p, int tp, int index, struct mr_comm *comm, int sp)
{
	mr_place_one(p);
	p->size[MR_AXIS_TP] = tp;
	p->index[MR_AXIS_TP] = index;
	p->comm[MR_AXIS_TP] = tp > 1 ? comm : NULL;
	p->sp = sp;
}

int mr_place_size(const struct mr_place *p, enum mr_axis a)
{
	return p && p->size[a] > 1 ? p->size[a] : 1;
}

int mr_place_index(const struct mr_place *p, enum mr_axis a)
{
	return p && p->size[a] > 1 ? p->index[a] : 0;
}

int mr_place_chunks(const struct mr_place *p)
{
	return p && p->chunks > 0 ? p->chunks : 1;
}

void mr_place_chunk(const struct mr_place *p, int n_layer, int c, int *lo, int *hi)
{
	if (!p || p->chunks <= 0) {
		*lo = 0;
		*hi = n_layer;
		return;
	}
	*lo = p->layer_lo[c];
	*hi = p->layer_hi[c];
}

const char *mr_axis_name(enum mr_axis a)
{
	static const char *const names[MR_AXIS__COUNT] = { "tp", "cp", "dp", "pp", "ep" };

	return a >= 0 && a < MR_AXIS__COUNT ? names[a] : "?";
}
