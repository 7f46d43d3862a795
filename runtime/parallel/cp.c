/*
 * cp.c - context parallelism's attention across the sequence split (see
 * mr_cp.h).
 */
#include <math.h>
#include <string.h>

#include "mr_cp.h"

enum { ALL, O32, P32, PLSE, DELTA, DALL, DMINE };

int mr_cp_create(struct mr_cp *cp, struct mr_comm *comm, struct mr_dev *dev, struct mr_mem *mem,
		 int B, int T, int C, int NH, struct mr_errbuf *eb)
{
	int n = comm ? mr_comm_size(comm) : 1;
	size_t rows;
	void **p[7];
	int i;

	memset(cp, 0, sizeof(*cp));
	if (T % (2 * n) != 0)
		return mr_errf_field(eb, MR_EINVAL, "seq_len",
				     "'seq_len' (%d) is not divisible by 2 * cp (%d), as context "
				     "parallel's load-balanced chunks need", T, 2 * n);
	if (!dev->ops->attn_part_fwd)
		return mr_errf_field(eb, MR_ENOTSUP, "cp", "device %s has no attention slices",
				     dev->ops->name);
	cp->dev = dev;
	cp->mem = mem;
	cp->comm = comm;
	cp->size = n;
	cp->rank = comm ? mr_comm_rank(comm) : 0;
	cp->B = B;
	cp->T = T;
	cp->Tl = T / n;
	cp->Tc = T / (2 * n);
	cp->C = C;
	cp->NH = NH;
	cp->hs = C / NH;
	rows = (size_t)B * (size_t)cp->Tl;
	cp->bytes[ALL] = mr_dev_act_bytes(dev, (size_t)n * rows * 3 * (size_t)C);
	cp->bytes[O32] = cp->bytes[P32] = rows * (size_t)C * sizeof(float);
	cp->bytes[PLSE] = cp->bytes[DELTA] = rows * (size_t)NH * sizeof(float);
	cp->bytes[DALL] = (size_t)n * rows * 3 * (size_t)C * sizeof(float);
	cp->bytes[DMINE] = rows * 3 * (size_t)C * sizeof(float);
	p[ALL] = (void **)&cp->all;
	p[O32] = (void **)&cp->o32;
	p[P32] = (void **)&cp->p32;
	p[PLSE] = (void **)&cp->plse;
	p[DELTA] = (void **)&cp->delta;
	p[DALL] = (void **)&cp->dall;
	p[DMINE] = (void **)&cp->dmine;
	for (i = 0; i < 7; i++)
		if (!(*p[i] = dev->ops->alloc(dev, mem, MR_MEM_WORKSPACE, cp->bytes[i]))) {
			mr_cp_release(cp);
			return mr_errf(eb, MR_ENOMEM, "unable to allocate context-parallel buffers");
		}
	return 0;
}

void mr_cp_release(struct mr_cp *cp)
{
	void *p[7] = { cp->all, cp->o32, cp->p32, cp->plse, cp->delta, cp->dall, cp->dmine };
	int i;

	for (i = 0; cp->dev && i < 7; i++)
		if (p[i])
			cp->dev->ops->free(cp->dev, cp->mem, MR_MEM_WORKSPACE, p[i], cp->bytes[i]);
	memset(cp, 0, sizeof(*cp));
}

void mr_cp_select(int size, int rank, const int *full, int B, int T, int *local)
{
	int Tc = T / (2 * size), Tl = T / size, b, k;

	for (b = 0; b < B; b++)
		for (k = 0; k < 2; k++)
			memcpy(local + (size_t)b * Tl + (size_t)k * Tc,
			       full + (size_t)b * T + mr_cp_pos0(size, Tc, rank, k),
			       sizeof(int) * (size_t)Tc);
}

/* The attention slice of local query chunk qk against global key chunk g
 * (rows of rank g < cp ? g : 2cp-1-g in the gathered buffer). */
static struct mr_dev_attn slice(const struct mr_cp *cp, const mr_act *qkv, int qk, int g)
{
	struct mr_dev *d = cp->dev;
	size_t C = (size_t)cp->C, row = 3 * C, batch = (size_t)cp->Tl * row;
	int owner = g < cp->size ? g : 2 * cp->size - 1 - g, kk = g >= cp->size;
	const mr_act *kv = mr_dev_at(d, cp->all, (size_t)owner * (size_t)cp->B * batch +
						  (size_t)kk * cp->Tc * row);
	struct mr_dev_attn a;

	memset(&a, 0, sizeof(a));
	a.q = mr_dev_at(d, qkv, (size_t)qk * cp->Tc * row);
	a.k = mr_dev_at(d, kv, C);
	a.v = mr_dev_at(d, kv, 2 * C);
	a.q_row = a.kv_row = row;
	a.q_batch = a.kv_batch = batch;
	a.B = cp->B;
	a.NH = cp->NH;
	a.hs = cp->hs;
	a.tq = a.tk = cp->Tc;
	a.q_pos0 = mr_cp_pos0(cp->size, cp->Tc, cp->rank, qk);
	a.k_pos0 = g * cp->Tc;
	a.causal = 1;
	a.scale = 1.0f / sqrtf((float)cp->hs);
	return a;
}

/* The global chunk index of local chunk qk. */
static int chunk_of(const struct mr_cp *cp, int qk)
{
	return qk ? 2 * cp->size - 1 - cp->rank : cp->rank;
}

/* Every rank's q|k|v rows of this layer into cp->all (the buffer serves
 * one layer at a time: the backward gathers its layer's again). */
static int gather(struct mr_cp *cp, const mr_act *qkv)
{
	struct mr_dev *d = cp->dev;
	size_t n = (size_t)cp->B * cp->Tl * 3 * (size_t)cp->C;
	int rc = d->ops->sync(d);

	return rc < 0 ? rc
		      : mr_comm_allgather(cp->comm, qkv, cp->all, n,
					  d->act_bytes == 2 ? MR_COMM_BF16 : MR_COMM_F32);
}

int mr_cp_attn_fwd(struct mr_cp *cp, mr_act *out, float *lse, const mr_act *qkv)
{
	struct mr_dev *d = cp->dev;
	size_t C = (size_t)cp->C, rows = (size_t)cp->B * cp->Tl;
	size_t o_batch = (size_t)cp->Tl * C, nl = (size_t)cp->B * cp->NH * cp->Tc;
	int qk, g, rc;

	if ((rc = gather(cp, qkv)) < 0)
		return rc;
	for (qk = 0; qk < 2; qk++) {
		float *o = cp->o32 + (size_t)qk * cp->Tc * C, *p = cp->p32 + (size_t)qk * cp->Tc * C;
		float *l = lse + (size_t)qk * nl, *pl = cp->plse + (size_t)qk * nl;
		/* key chunks in position order up to the query's own */
		for (g = 0; g <= chunk_of(cp, qk); g++) {
			struct mr_dev_attn a = slice(cp, qkv, qk, g);
			if (g == 0) {
				if ((rc = d->ops->attn_part_fwd(d, &a, o, C, o_batch, l)) < 0)
					return rc;
				continue;
			}
			if ((rc = d->ops->attn_part_fwd(d, &a, p, C, o_batch, pl)) < 0 ||
			    (rc = d->ops->attn_merge(d, o, l, p, pl, cp->B, cp->NH, cp->Tc, cp->hs,
						     C, o_batch)) < 0)
				return rc;
		}
	}
	return d->ops->to_act(d, out, cp->o32, rows * C);
}

int mr_cp_attn_bwd(struct mr_cp *cp, mr_act *dqkv, const mr_act *dout, const mr_act *qkv,
		   const mr_act *out, const float *lse)
{
	struct mr_dev *d = cp->dev;
	size_t C = (size_t)cp->C, row = 3 * C, rows = (size_t)cp->B * cp->Tl, n = rows * row;
	size_t o_batch = (size_t)cp->Tl * C, batch = (size_t)cp->Tl * row;
	size_t nl = (size_t)cp->B * cp->NH * cp->Tc;
	int qk, g, rc;

	if ((rc = gather(cp, qkv)) < 0 ||
	    (rc = d->ops->zero(d, cp->dall, (size_t)cp->size * n * sizeof(float))) < 0)
		return rc;
	for (qk = 0; qk < 2; qk++) {
		size_t q0 = (size_t)qk * cp->Tc;
		const mr_act *dq_out = mr_dev_at(d, dout, q0 * C), *o = mr_dev_at(d, out, q0 * C);
		const float *l = lse + (size_t)qk * nl;
		float *delta = cp->delta + (size_t)qk * nl;
		float *dq = cp->dall + (size_t)cp->rank * cp->B * batch + q0 * row;
		if ((rc = d->ops->attn_delta(d, delta, dq_out, o, cp->B, cp->NH, cp->Tc, cp->hs, C,
					     o_batch)) < 0)
			return rc;
		for (g = 0; g <= chunk_of(cp, qk); g++) {
			struct mr_dev_attn a = slice(cp, qkv, qk, g);
			int owner = g < cp->size ? g : 2 * cp->size - 1 - g, kk = g >= cp->size;
			float *dkv = cp->dall + (size_t)owner * cp->B * batch +
				     (size_t)kk * cp->Tc * row;
			if ((rc = d->ops->attn_part_bwd(d, &a, dq_out, C, o_batch, l, delta, dq, row,
							batch, dkv + C, dkv + 2 * C, row,
							batch)) < 0)
				return rc;
		}
	}
	/* every rank's contributions to this rank's q|k|v rows, summed */
	if ((rc = d->ops->sync(d)) < 0 ||
	    (rc = mr_comm_reduce_scatter(cp->comm, cp->dall, cp->dmine, n, MR_COMM_F32,
					 MR_COMM_SUM)) < 0)
		return rc;
	return d->ops->to_act(d, dqkv, cp->dmine, n);
}

int mr_cp_sum_routed(void *ctx, int *routed, int E)
{
	struct mr_cp *cp = ctx;

	return mr_comm_allreduce(cp->comm, routed, routed, (size_t)E, MR_COMM_I32, MR_COMM_SUM);
}
