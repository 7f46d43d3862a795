/*
 * ep.c - expert parallelism's token exchange (see mr_ep.h).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/mr_dev_comm.h"
#include "mr_ep.h"

int mr_ep_create(struct mr_ep *ep, struct mr_comm *comm, struct mr_dev *dev, struct mr_mem *mem,
		 int E, struct mr_errbuf *eb)
{
	int n = comm ? mr_comm_size(comm) : 1;

	memset(ep, 0, sizeof(*ep));
	if (E < 1)
		return mr_errf_field(eb, MR_EINVAL, "n_experts",
				     "expert parallelism needs a MoE model ('n_experts' %d)", E);
	if (E % n != 0)
		return mr_errf_field(eb, MR_EINVAL, "ep",
				     "ep (%d) does not divide 'n_experts' (%d)", n, E);
	ep->comm = comm;
	ep->dev = dev;
	ep->mem = mem;
	ep->size = n;
	ep->rank = comm ? mr_comm_rank(comm) : 0;
	ep->E = E;
	ep->El = E / n;
	ep->cnt = calloc((size_t)E, sizeof(int));
	ep->view = calloc((size_t)ep->El, sizeof(int));
	ep->sc = calloc((size_t)n * 4, sizeof(size_t));
	if (!ep->cnt || !ep->view || !ep->sc) {
		mr_ep_release(ep);
		return mr_errf(eb, MR_ENOMEM, "out of memory for the expert-parallel exchange");
	}
	ep->sd = ep->sc + n;
	ep->rc = ep->sd + n;
	ep->rd = ep->rc + n;
	return 0;
}

static void free_scratch(struct mr_ep *ep)
{
	if (ep->send)
		ep->dev->ops->free(ep->dev, ep->mem, MR_MEM_WORKSPACE, ep->send, ep->bytes);
	if (ep->recv)
		ep->dev->ops->free(ep->dev, ep->mem, MR_MEM_WORKSPACE, ep->recv, ep->bytes);
	ep->send = ep->recv = NULL;
	ep->bytes = 0;
}

void mr_ep_release(struct mr_ep *ep)
{
	if (ep->dev)
		free_scratch(ep);
	free(ep->cnt);
	free(ep->view);
	free(ep->sc);
	memset(ep, 0, sizeof(*ep));
}

/* Scratch for a source buffer of `bytes`, kept across calls. */
static int scratch(struct mr_ep *ep, size_t bytes)
{
	if (bytes <= ep->bytes)
		return 0;
	free_scratch(ep);
	ep->send = ep->dev->ops->alloc(ep->dev, ep->mem, MR_MEM_WORKSPACE, bytes);
	ep->recv = ep->dev->ops->alloc(ep->dev, ep->mem, MR_MEM_WORKSPACE, bytes);
	if (!ep->send || !ep->recv) {
		free_scratch(ep);
		return MR_ENOMEM;
	}
	ep->bytes = bytes;
	return 0;
}

static int copy_rows(struct mr_ep *ep, char *dst, const char *src, size_t rows, size_t rb)
{
	return rows ? ep->dev->ops->copy(ep->dev, dst, src, rows * rb) : 0;
}

/* Sends the packed rows (sc, sd set by the packing) and receives rrows[r]
 * rows from each rank r, packed in rank order. */
static int exchange(struct mr_ep *ep, const size_t *rrows, size_t row, int dtype)
{
	size_t off = 0;
	int r, rc;

	for (r = 0; r < ep->size; r++) {
		ep->rd[r] = off;
		ep->rc[r] = rrows[r] * row;
		off += ep->rc[r];
	}
	if ((rc = mr_dev_comm_sync(ep->dev, ep->comm)) < 0)
		return rc;
	return mr_comm_alltoallv(ep->comm, ep->send, ep->sc, ep->sd, ep->recv, ep->rc, ep->rd,
				 dtype);
}

/* Source layout -> packed by destination rank (experts in order) ->
 * exchange -> packed by source rank -> view. */
static int to_view(struct mr_ep *ep, char *buf, const int *counts, int cap, size_t rb,
		   size_t row, int dtype)
{
	int r, l, e, n = ep->size, El = ep->El, rc;
	size_t off = 0, pos[1024], rrows[1024];

	for (r = 0; r < n; r++) {
		ep->sd[r] = off / rb * row;
		for (e = r * El; e < (r + 1) * El; e++) {
			if ((rc = copy_rows(ep, (char *)ep->send + off, buf + (size_t)e * cap * rb,
					    (size_t)counts[e], rb)) < 0)
				return rc;
			off += (size_t)counts[e] * rb;
		}
		ep->sc[r] = off / rb * row - ep->sd[r];
		for (rrows[r] = 0, l = 0; l < El; l++)
			rrows[r] += (size_t)ep->cnt[r * El + l];
	}
	if ((rc = exchange(ep, rrows, row, dtype)) < 0)
		return rc;
	for (l = 0; l < El; l++)
		pos[l] = (size_t)l * (size_t)n * (size_t)cap;
	off = 0;
	for (r = 0; r < n; r++)
		for (l = 0; l < El; l++) {
			size_t m = (size_t)ep->cnt[r * El + l];
			if ((rc = copy_rows(ep, buf + pos[l] * rb, (char *)ep->recv + off, m, rb)) < 0)
				return rc;
			pos[l] += m;
			off += m * rb;
		}
	return 0;
}

/* The reverse: view -> packed by destination (the rows' source rank) ->
 * exchange -> packed by the rank of their experts -> source layout. */
static int from_view(struct mr_ep *ep, char *buf, const int *counts, int cap, size_t rb,
		     size_t row, int dtype)
{
	int r, l, e, n = ep->size, El = ep->El, rc;
	size_t off = 0, pos[1024], rrows[1024];

	for (l = 0; l < El; l++)
		pos[l] = (size_t)l * (size_t)n * (size_t)cap;
	for (r = 0; r < n; r++) {
		ep->sd[r] = off / rb * row;
		for (l = 0; l < El; l++) {
			size_t m = (size_t)ep->cnt[r * El + l];
			if ((rc = copy_rows(ep, (char *)ep->send + off, buf + pos[l] * rb, m, rb)) < 0)
				return rc;
			pos[l] += m;
			off += m * rb;
		}
		ep->sc[r] = off / rb * row - ep->sd[r];
		for (rrows[r] = 0, e = r * El; e < (r + 1) * El; e++)
			rrows[r] += (size_t)counts[e];
	}
	if ((rc = exchange(ep, rrows, row, dtype)) < 0)
		return rc;
	off = 0;
	for (e = 0; e < ep->E; e++) {
		if ((rc = copy_rows(ep, buf + (size_t)e * cap * rb, (char *)ep->recv + off,
				    (size_t)counts[e], rb)) < 0)
			return rc;
		off += (size_t)counts[e] * rb;
	}
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The rows each rank sends each of this rank's experts into ep->cnt:
 * with host counts, an all-to-all of them (counts of expert e go to the
 * rank holding e, El of them to each); without (counts NULL: the device
 * kept them), whole cap blocks, from every rank - and ep->cnt, all cap,
 * then stands for the source's counts too. */
static int rows_from_ranks(struct mr_ep *ep, const int **counts, int cap)
{
	int e;

	if (*counts)
		return mr_comm_alltoall(ep->comm, *counts, ep->cnt, (size_t)ep->El, MR_COMM_I32);
	for (e = 0; e < ep->E; e++)
		ep->cnt[e] = cap;
	*counts = ep->cnt;
	return 0;
}

static int exchange_phase(struct mr_ep *ep, enum mr_moe_phase phase, float *buf,
			  const int *counts, int E, int cap, size_t row)
{
	size_t rb = mr_dev_act_bytes(ep->dev, row);
	int dtype = ep->dev->act_bytes == 2 ? MR_COMM_BF16 : MR_COMM_F32, l, r, rc;

	if (E != ep->E || ep->El > 1024)
		return MR_EINVAL;
	if ((rc = scratch(ep, (size_t)E * (size_t)cap * rb)) < 0)
		return rc;
	if ((rc = rows_from_ranks(ep, &counts, cap)) < 0)
		return rc;
	for (l = 0; l < ep->El; l++)
		for (ep->view[l] = 0, r = 0; r < ep->size; r++)
			ep->view[l] += ep->cnt[r * ep->El + l];
	if (phase == MR_MOE_DISPATCH || phase == MR_MOE_DISPATCH_GRAD)
		return to_view(ep, (char *)buf, counts, cap, rb, row, dtype);
	return from_view(ep, (char *)buf, counts, cap, rb, row, dtype);
}

/* One exchange, timed (counts, rows and the device copies around them). */
static int ep_fn(void *ctx, enum mr_moe_phase phase, float *buf, const int *counts, int E,
		 int cap, size_t row)
{
	struct mr_ep *ep = ctx;
	double t0 = now_s();
	int rc = exchange_phase(ep, phase, buf, counts, E, cap, row);

	ep->xchg_s += now_s() - t0;
	ep->xchgs++;
	return rc;
}

void mr_ep_bind(struct mr_ep *ep, struct mr_moe_xchg *xg)
{
	xg->fn = ep->size > 1 ? ep_fn : NULL;
	xg->ctx = ep;
	xg->local_experts = ep->size > 1 ? ep->El : 0;
	xg->view_counts = ep->view;
}
