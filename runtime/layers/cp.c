/*
 * cp.c - context parallelism's attention across the sequence split (see
 * mr_cp.h): the ring and the allgather algorithm over the same slices,
 * and ulysses' all-to-all around the device's plain attention.
 */
#include <math.h>
#include <string.h>

#include "device/mr_dev_comm.h"
#include "mr_cp.h"

enum {
	O32, P32, PLSE, DELTA, DMINE, ALL, DALL, KV0, KV1, DKV0, DKV1,
	XS, XR, HQ, HO, HD, DHQ, WS, NBUF
};

enum { TAG_KV = 1, TAG_DKV, TAG_HOME };

/* Rows of one key chunk: k at k (v at k + kvw), and where its gradients
 * go (dk at dk, dv at dk + kvw), with their row and batch strides. */
struct kblock {
	const mr_act *k;
	size_t row, batch;
	float *dk;
	size_t drow, dbatch;
};

/* Where each buffer lives in struct mr_cp, in enum order. */
static void **buffer(struct mr_cp *cp, int i)
{
	void **p[NBUF] = {
		(void **)&cp->o32,   (void **)&cp->p32,    (void **)&cp->plse,   (void **)&cp->delta,
		(void **)&cp->dmine, (void **)&cp->all,    (void **)&cp->dall,   (void **)&cp->kv[0],
		(void **)&cp->kv[1], (void **)&cp->dkv[0], (void **)&cp->dkv[1], (void **)&cp->xs,
		(void **)&cp->xr,    (void **)&cp->hq,     (void **)&cp->ho,     (void **)&cp->hd,
		(void **)&cp->dhq,   (void **)&cp->ws,
	};
	return p[i];
}

/* Bytes of every buffer the algorithm uses (0: not used). */
static void buffer_bytes(const struct mr_cp *cp, struct mr_dev *dev, size_t *bytes)
{
	size_t rows = (size_t)cp->B * (size_t)cp->Tl, C = (size_t)cp->C, n = (size_t)cp->size;
	size_t row = cp->row, kv2 = 2 * cp->kvw;

	memset(bytes, 0, NBUF * sizeof(*bytes));
	if (cp->algo == MR_CP_ULYSSES) {
		/* the head group's whole sequences hold as many elements as
		 * the local rows of every head: rows * width per section */
		bytes[XS] = bytes[XR] = bytes[HQ] = bytes[DHQ] = mr_dev_act_bytes(dev, rows * row);
		bytes[HO] = bytes[HD] = mr_dev_act_bytes(dev, rows * C);
		bytes[WS] = dev->ops->ws_bytes(dev, cp->T, cp->C / cp->size, cp->NH / cp->size);
		return;
	}
	bytes[O32] = bytes[P32] = rows * C * sizeof(float);
	bytes[PLSE] = bytes[DELTA] = rows * (size_t)cp->NH * sizeof(float);
	bytes[DMINE] = rows * row * sizeof(float);
	if (cp->algo == MR_CP_ALLGATHER) {
		/* the whole sequence's q|k|v and gradients */
		bytes[ALL] = mr_dev_act_bytes(dev, n * rows * row);
		bytes[DALL] = n * rows * row * sizeof(float);
	} else {
		/* ring: two blocks of k|v and of their gradients in flight */
		bytes[KV0] = bytes[KV1] = mr_dev_act_bytes(dev, rows * kv2);
		bytes[DKV0] = bytes[DKV1] = rows * kv2 * sizeof(float);
	}
}

int mr_cp_create(struct mr_cp *cp, struct mr_comm *comm, struct mr_dev *dev, struct mr_mem *mem,
		 int algo, int B, int T, int C, int NH, int NKV, struct mr_errbuf *eb)
{
	int n = comm ? mr_comm_size(comm) : 1, i;
	size_t bytes[NBUF];

	memset(cp, 0, sizeof(*cp));
	if (T % (2 * n) != 0)
		return mr_errf_field(eb, MR_EINVAL, "seq_len",
				     "'seq_len' (%d) is not divisible by 2 * cp (%d), as context "
				     "parallel's load-balanced chunks need", T, 2 * n);
	if (algo == MR_CP_ULYSSES && NH % n != 0)
		return mr_errf_field(eb, MR_EINVAL, "n_head",
				     "'n_head' gives this rank %d heads (n_head / tp), not divisible "
				     "by cp (%d), as cp_algo \"ulysses\" needs", NH, n);
	if (algo == MR_CP_ULYSSES && NKV % n != 0)
		return mr_errf_field(eb, MR_EINVAL, "n_kv_head",
				     "'n_kv_head' gives this rank %d key/value heads (n_kv_head / "
				     "tp), not divisible by cp (%d), as cp_algo \"ulysses\" needs",
				     NKV, n);
	if (algo != MR_CP_ULYSSES && !dev->ops->attn_part_fwd)
		return mr_errf_field(eb, MR_ENOTSUP, "cp", "device %s has no attention slices",
				     dev->ops->name);
	cp->dev = dev;
	cp->mem = mem;
	cp->comm = comm;
	cp->algo = algo;
	cp->size = n;
	cp->rank = comm ? mr_comm_rank(comm) : 0;
	cp->B = B;
	cp->T = T;
	cp->Tl = T / n;
	cp->Tc = T / (2 * n);
	cp->C = C;
	cp->NH = NH;
	cp->NKV = NKV;
	cp->hs = C / NH;
	cp->kvw = (size_t)NKV * (size_t)cp->hs;
	cp->row = (size_t)C + 2 * cp->kvw;
	buffer_bytes(cp, dev, bytes);
	for (i = 0; i < NBUF; i++) {
		cp->bytes[i] = bytes[i];
		if (bytes[i] &&
		    !(*buffer(cp, i) = dev->ops->alloc(dev, mem, MR_MEM_WORKSPACE, bytes[i]))) {
			mr_cp_release(cp);
			return mr_errf(eb, MR_ENOMEM, "unable to allocate context-parallel buffers");
		}
	}
	return 0;
}

void mr_cp_release(struct mr_cp *cp)
{
	int i;

	for (i = 0; cp->dev && i < NBUF; i++)
		if (*buffer(cp, i))
			cp->dev->ops->free(cp->dev, cp->mem, MR_MEM_WORKSPACE, *buffer(cp, i),
					   cp->bytes[i]);
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

int mr_cp_sum_routed(void *ctx, int *routed, int E)
{
	struct mr_cp *cp = ctx;

	return mr_comm_allreduce(cp->comm, routed, routed, (size_t)E, MR_COMM_I32, MR_COMM_SUM);
}

/* The global chunk index of rank r's local chunk k. */
static int chunk_of(const struct mr_cp *cp, int r, int k)
{
	return k ? 2 * cp->size - 1 - r : r;
}

static int act_dtype(const struct mr_cp *cp)
{
	return cp->dev->act_bytes == 2 ? MR_COMM_BF16 : MR_COMM_F32;
}

/* Local query chunk qk against key chunk g (global index) in kb. */
static struct mr_dev_attn slice(const struct mr_cp *cp, const mr_act *qkv, int qk, int g,
				const struct kblock *kb)
{
	struct mr_dev *d = cp->dev;
	struct mr_dev_attn a;

	memset(&a, 0, sizeof(a));
	a.q = mr_dev_at(d, qkv, (size_t)qk * cp->Tc * cp->row);
	a.k = kb->k;
	a.v = mr_dev_at(d, kb->k, cp->kvw);
	a.q_row = cp->row;
	a.q_batch = (size_t)cp->Tl * cp->row;
	a.kv_row = kb->row;
	a.kv_batch = kb->batch;
	a.B = cp->B;
	a.NH = cp->NH;
	a.NKV = cp->NKV;
	a.hs = cp->hs;
	a.tq = a.tk = cp->Tc;
	a.q_pos0 = chunk_of(cp, cp->rank, qk) * cp->Tc;
	a.k_pos0 = g * cp->Tc;
	a.causal = 1;
	a.scale = 1.0f / sqrtf((float)cp->hs);
	return a;
}

/* Chunk kk of rank `owner`'s rows in the gathered buffers (allgather). */
static struct kblock gathered(const struct mr_cp *cp, int owner, int kk)
{
	size_t C = (size_t)cp->C, row = cp->row, batch = (size_t)cp->Tl * row;
	size_t off = (size_t)owner * cp->B * batch + (size_t)kk * cp->Tc * row;
	struct kblock kb = { mr_dev_at(cp->dev, cp->all, off + C), row, batch,
			     cp->dall ? cp->dall + off + C : NULL, row, batch };
	return kb;
}

/* Chunk kk of the k|v block in kv and its gradients in dkv (ring). */
static struct kblock ring_block(const struct mr_cp *cp, const mr_act *kv, float *dkv, int kk)
{
	size_t row = 2 * cp->kvw, batch = (size_t)cp->Tl * row, off = (size_t)kk * cp->Tc * row;
	struct kblock kb = { mr_dev_at(cp->dev, kv, off), row, batch, dkv ? dkv + off : NULL, row,
			     batch };
	return kb;
}

/* Forward: local query chunk qk attends to key chunk g of kb, merged into
 * the running output and lse (the first one writes them). */
static int attend(struct mr_cp *cp, const mr_act *qkv, float *lse, int qk, int g,
		  const struct kblock *kb, int *first)
{
	struct mr_dev *d = cp->dev;
	size_t C = (size_t)cp->C, o_batch = (size_t)cp->Tl * C, q0 = (size_t)qk * cp->Tc * C;
	size_t nl = (size_t)cp->B * cp->NH * cp->Tc;
	struct mr_dev_attn a = slice(cp, qkv, qk, g, kb);
	float *l = lse + (size_t)qk * nl;
	int rc;

	if (first[qk]) {
		first[qk] = 0;
		return d->ops->attn_part_fwd(d, &a, cp->o32 + q0, C, o_batch, l);
	}
	if ((rc = d->ops->attn_part_fwd(d, &a, cp->p32 + q0, C, o_batch,
					cp->plse + (size_t)qk * nl)) < 0)
		return rc;
	return d->ops->attn_merge(d, cp->o32 + q0, l, cp->p32 + q0, cp->plse + (size_t)qk * nl,
				  cp->B, cp->NH, cp->Tc, cp->hs, C, o_batch);
}

/* Backward: query chunk qk against key chunk g of kb: dq into dq (rows
 * of q|k|v: this rank's gradient layout), dk and dv into kb's. */
static int attend_bwd(struct mr_cp *cp, const mr_act *qkv, const mr_act *dout, const float *lse,
		      float *dq, int qk, int g, const struct kblock *kb)
{
	struct mr_dev *d = cp->dev;
	size_t C = (size_t)cp->C, row = cp->row, q0 = (size_t)qk * cp->Tc;
	size_t nl = (size_t)cp->B * cp->NH * cp->Tc;
	struct mr_dev_attn a = slice(cp, qkv, qk, g, kb);

	return d->ops->attn_part_bwd(d, &a, mr_dev_at(d, dout, q0 * C), C, (size_t)cp->Tl * C,
				     lse + (size_t)qk * nl, cp->delta + (size_t)qk * nl,
				     dq + q0 * row, row, (size_t)cp->Tl * row, kb->dk,
				     kb->dk + cp->kvw, kb->drow, kb->dbatch);
}

/* Every rank's q|k|v rows of this layer into cp->all (the buffer serves
 * one layer at a time: the backward gathers its layer's again). */
static int gather(struct mr_cp *cp, const mr_act *qkv)
{
	struct mr_dev *d = cp->dev;
	size_t n = (size_t)cp->B * cp->Tl * cp->row;
	int rc = mr_dev_comm_sync(d, cp->comm);

	return rc < 0 ? rc : mr_comm_allgather(cp->comm, qkv, cp->all, n, act_dtype(cp));
}

/* This rank's k|v rows out of its packed q|k|v, into kv (ring). */
static int pack_kv(struct mr_cp *cp, mr_act *kv, const mr_act *qkv)
{
	struct mr_dev *d = cp->dev;
	size_t kv2 = 2 * cp->kvw;

	return d->ops->copy2d(d, kv, mr_dev_act_bytes(d, kv2), mr_dev_at(d, qkv, (size_t)cp->C),
			      mr_dev_act_bytes(d, cp->row), mr_dev_act_bytes(d, kv2),
			      (size_t)cp->B * cp->Tl);
}

/* Starts passing `send` to the next rank of the ring and receiving the
 * previous rank's into `recv`. */
static int pass(struct mr_cp *cp, const void *send, void *recv, size_t n, int dtype, int tag,
		struct mr_comm_req **req)
{
	int next = (cp->rank + 1) % cp->size, prev = (cp->rank + cp->size - 1) % cp->size;
	int rc = mr_dev_comm_sync(cp->dev, cp->comm);

	if (rc < 0 || (rc = mr_comm_isendrecv(cp->comm, send, recv, n, dtype, next, prev, tag,
					     req)) < 0)
		return rc;
	mr_comm_kick(cp->comm);
	return 0;
}

/* ---- ulysses: heads exchanged all-to-all ---------------------------------- */

/* A (B, Tl, W) block of chunk-ordered local rows and (B, T, W) whole
 * sequences, one direction or the other: rank j's chunks k go to their
 * positions (whole = 1) or come from them (whole = 0). */
static int reorder(struct mr_cp *cp, mr_act *whole, mr_act *local, size_t W, int j, int to_whole)
{
	struct mr_dev *d = cp->dev;
	size_t tl = mr_dev_act_bytes(d, (size_t)cp->Tl * W), t = mr_dev_act_bytes(d, (size_t)cp->T * W);
	size_t tc = mr_dev_act_bytes(d, (size_t)cp->Tc * W);
	int k, rc = 0;

	for (k = 0; k < 2 && rc == 0; k++) {
		mr_act *w = mr_dev_at(d, whole, (size_t)mr_cp_pos0(cp->size, cp->Tc, j, k) * W);
		mr_act *l = mr_dev_at(d, local, ((size_t)j * cp->B * cp->Tl + (size_t)k * cp->Tc) * W);
		rc = to_whole ? d->ops->copy2d(d, w, t, l, tl, tc, (size_t)cp->B)
			      : d->ops->copy2d(d, l, tl, w, t, tc, (size_t)cp->B);
	}
	return rc;
}

static int exchange(struct mr_cp *cp, size_t W)
{
	int rc = mr_dev_comm_sync(cp->dev, cp->comm);

	return rc < 0 ? rc : mr_comm_alltoall(cp->comm, cp->xs, cp->xr,
					      (size_t)cp->B * cp->Tl * W, act_dtype(cp));
}

/* The columns of a group's share of nsec sections of widths sw[s] (q, k,
 * v: C, kvw, kvw; out: C): section s's share sw[s]/cp at *at in a row of
 * the group's W (the sum). */
static size_t share_at(const struct mr_cp *cp, const size_t *sw, int s, size_t *W)
{
	size_t at = 0, w = 0;
	int i;

	for (i = 0; i < 3 && sw[i]; i++) {
		if (i < s)
			at += sw[i] / (size_t)cp->size;
		w += sw[i] / (size_t)cp->size;
	}
	*W = w;
	return at;
}

/* nsec sections of local rows (src[s]: B*Tl rows of sw[s] channels,
 * pitch spitch elements) into whole sequences of this rank's head group:
 * dst (B, T, W), rows [q|k|v] of the group's heads. */
static int to_heads(struct mr_cp *cp, mr_act *dst, int nsec, const size_t *sw,
		    const mr_act *const *src, size_t spitch)
{
	struct mr_dev *d = cp->dev;
	size_t rows = (size_t)cp->B * cp->Tl, W = 0;
	int j, s, rc = 0;

	for (j = 0; j < cp->size && rc == 0; j++)
		for (s = 0; s < nsec && rc == 0; s++) {
			size_t Ch = sw[s] / (size_t)cp->size, at = share_at(cp, sw, s, &W);
			rc = d->ops->copy2d(d, mr_dev_at(d, cp->xs, j * rows * W + at),
					    mr_dev_act_bytes(d, W), mr_dev_at(d, src[s], j * Ch),
					    mr_dev_act_bytes(d, spitch), mr_dev_act_bytes(d, Ch), rows);
		}
	if (rc < 0 || (rc = exchange(cp, W)) < 0)
		return rc;
	for (j = 0; j < cp->size && rc == 0; j++)
		rc = reorder(cp, dst, cp->xr, W, j, 1);
	return rc;
}

/* The reverse: whole sequences of this rank's head group (src, B x T
 * rows of W) into the group's columns of local rows dst[s]. */
static int from_heads(struct mr_cp *cp, mr_act *const *dst, int nsec, const size_t *sw,
		      size_t dpitch, mr_act *src)
{
	struct mr_dev *d = cp->dev;
	size_t rows = (size_t)cp->B * cp->Tl, W = 0;
	int j, s, rc = 0;

	share_at(cp, sw, 0, &W);
	for (j = 0; j < cp->size && rc == 0; j++)
		rc = reorder(cp, src, cp->xs, W, j, 0);
	if (rc < 0 || (rc = exchange(cp, W)) < 0)
		return rc;
	for (j = 0; j < cp->size && rc == 0; j++)
		for (s = 0; s < nsec && rc == 0; s++) {
			size_t Ch = sw[s] / (size_t)cp->size, at = share_at(cp, sw, s, &W);
			rc = d->ops->copy2d(d, mr_dev_at(d, dst[s], j * Ch),
					    mr_dev_act_bytes(d, dpitch),
					    mr_dev_at(d, cp->xr, j * rows * W + at),
					    mr_dev_act_bytes(d, W), mr_dev_act_bytes(d, Ch), rows);
		}
	return rc;
}

/* This rank's head group's q|k|v, whole sequences, into cp->hq. */
static int heads_qkv(struct mr_cp *cp, const mr_act *qkv)
{
	struct mr_dev *d = cp->dev;
	size_t C = (size_t)cp->C, sw[3] = { C, cp->kvw, cp->kvw };
	const mr_act *src[3] = { qkv, mr_dev_at(d, qkv, C), mr_dev_at(d, qkv, C + cp->kvw) };

	return to_heads(cp, cp->hq, 3, sw, src, cp->row);
}

static int ulysses_fwd(struct mr_cp *cp, mr_act *out, float *lse, const mr_act *qkv)
{
	struct mr_dev *d = cp->dev;
	size_t sw[3] = { (size_t)cp->C, 0, 0 };
	int rc;

	if ((rc = heads_qkv(cp, qkv)) < 0 ||
	    (rc = d->ops->attn_fwd(d, cp->ho, lse, cp->hq, cp->B, cp->T, cp->C / cp->size,
				   cp->NH / cp->size, cp->NKV / cp->size, cp->ws)) < 0)
		return rc;
	return from_heads(cp, &out, 1, sw, (size_t)cp->C, cp->ho);
}

static int ulysses_bwd(struct mr_cp *cp, mr_act *dqkv, const mr_act *dout, const mr_act *qkv,
		       const mr_act *out, const float *lse)
{
	struct mr_dev *d = cp->dev;
	size_t C = (size_t)cp->C, sw[3] = { C, cp->kvw, cp->kvw }, so[3] = { C, 0, 0 };
	mr_act *dst[3] = { dqkv, mr_dev_at(d, dqkv, C), mr_dev_at(d, dqkv, C + cp->kvw) };
	int rc;

	/* the forward's head-sharded tensors again (the buffers serve one
	 * layer at a time), bit for bit */
	if ((rc = heads_qkv(cp, qkv)) < 0 || (rc = to_heads(cp, cp->ho, 1, so, &out, C)) < 0 ||
	    (rc = to_heads(cp, cp->hd, 1, so, &dout, C)) < 0 ||
	    (rc = d->ops->attn_bwd(d, cp->dhq, cp->hd, cp->hq, cp->ho, lse, cp->B, cp->T,
				   cp->C / cp->size, cp->NH / cp->size, cp->NKV / cp->size,
				   cp->ws)) < 0)
		return rc;
	return from_heads(cp, dst, 3, sw, cp->row, cp->dhq);
}

/* Calls fn for every (query chunk, key chunk) pair of the block rank s
 * holds that the query sees (key chunk at or before it). */
#define FOR_VISIBLE(cp, s, qk, kk, g)                                             \
	for (qk = 0; qk < 2; qk++)                                                 \
		for (kk = 0; kk < 2; kk++)                                         \
			if ((g = chunk_of(cp, s, kk)) <= chunk_of(cp, (cp)->rank, qk))

int mr_cp_attn_fwd(struct mr_cp *cp, mr_act *out, float *lse, const mr_act *qkv)
{
	struct mr_dev *d = cp->dev;
	size_t kvn = (size_t)cp->B * cp->Tl * 2 * cp->kvw;
	int first[2] = { 1, 1 }, qk, kk, g, i, rc = 0;

	if (cp->algo == MR_CP_ULYSSES)
		return ulysses_fwd(cp, out, lse, qkv);
	if (cp->algo == MR_CP_ALLGATHER) {
		if ((rc = gather(cp, qkv)) < 0)
			return rc;
		/* key chunks in position order up to each query's own */
		for (qk = 0; qk < 2 && rc == 0; qk++)
			for (g = 0; g <= chunk_of(cp, cp->rank, qk) && rc == 0; g++) {
				int owner = g < cp->size ? g : 2 * cp->size - 1 - g;
				struct kblock kb = gathered(cp, owner, g >= cp->size);
				rc = attend(cp, qkv, lse, qk, g, &kb, first);
			}
	} else if ((rc = pack_kv(cp, cp->kv[0], qkv)) == 0) {
		/* step i holds rank (rank - i)'s block, passing it on meanwhile */
		for (i = 0; i < cp->size && rc == 0; i++) {
			int s = (cp->rank - i + cp->size) % cp->size;
			mr_act *cur = cp->kv[i % 2], *nxt = cp->kv[(i + 1) % 2];
			struct mr_comm_req *req = NULL;
			if (i + 1 < cp->size &&
			    (rc = pass(cp, cur, nxt, kvn, act_dtype(cp), TAG_KV, &req)) < 0)
				break;
			FOR_VISIBLE(cp, s, qk, kk, g)
			{
				struct kblock kb = ring_block(cp, cur, NULL, kk);
				if (rc == 0)
					rc = attend(cp, qkv, lse, qk, g, &kb, first);
			}
			if (req) {
				int wrc = mr_comm_wait(req);
				rc = rc ? rc : wrc;
			}
		}
	}
	if (rc < 0)
		return rc;
	return d->ops->to_act(d, out, cp->o32, (size_t)cp->B * cp->Tl * (size_t)cp->C);
}

/* delta of both local query chunks; dmine zeroed (the ring's dq adds
 * into it; allgather's reduce-scatter writes it). */
static int bwd_begin(struct mr_cp *cp, const mr_act *dout, const mr_act *out)
{
	struct mr_dev *d = cp->dev;
	size_t C = (size_t)cp->C, nl = (size_t)cp->B * cp->NH * cp->Tc;
	int qk, rc;

	if ((rc = d->ops->zero(d, cp->dmine, cp->bytes[DMINE])) < 0)
		return rc;
	for (qk = 0; qk < 2; qk++) {
		size_t q0 = (size_t)qk * cp->Tc * C;
		if ((rc = d->ops->attn_delta(d, cp->delta + (size_t)qk * nl, mr_dev_at(d, dout, q0),
					     mr_dev_at(d, out, q0), cp->B, cp->NH, cp->Tc, cp->hs,
					     C, (size_t)cp->Tl * C)) < 0)
			return rc;
	}
	return 0;
}

static int ring_bwd(struct mr_cp *cp, const mr_act *dout, const mr_act *qkv, const float *lse)
{
	struct mr_dev *d = cp->dev;
	size_t C = (size_t)cp->C, rows = (size_t)cp->B * cp->Tl, kv2 = 2 * cp->kvw;
	size_t kvn = rows * kv2;
	int qk, kk, g, i, rc;

	if ((rc = pack_kv(cp, cp->kv[0], qkv)) < 0 ||
	    (rc = d->ops->zero(d, cp->dkv[0], cp->bytes[DKV0])) < 0)
		return rc;
	/* each block travels with its gradients: every rank adds its
	 * queries' share, then passes both on */
	for (i = 0; i < cp->size && rc == 0; i++) {
		int s = (cp->rank - i + cp->size) % cp->size, to = (i + 1) % 2;
		mr_act *cur = cp->kv[i % 2];
		float *dcur = cp->dkv[i % 2];
		struct mr_comm_req *req = NULL;
		if (i + 1 < cp->size &&
		    (rc = pass(cp, cur, cp->kv[to], kvn, act_dtype(cp), TAG_KV, &req)) < 0)
			break;
		FOR_VISIBLE(cp, s, qk, kk, g)
		{
			struct kblock kb = ring_block(cp, cur, dcur, kk);
			if (rc == 0)
				rc = attend_bwd(cp, qkv, dout, lse, cp->dmine, qk, g, &kb);
		}
		if (req) {
			int wrc = mr_comm_wait(req);
			rc = rc ? rc : wrc;
		}
		/* the gradients follow their block; after the last step the
		 * block's owner is the next rank: one hop home */
		if (rc == 0)
			rc = pass(cp, dcur, cp->dkv[to], kvn, MR_COMM_F32,
				  i + 1 < cp->size ? TAG_DKV : TAG_HOME, &req);
		if (rc == 0)
			rc = mr_comm_wait(req);
	}
	if (rc < 0)
		return rc;
	/* this rank's own block's dk|dv into dmine beside dq */
	return d->ops->copy2d(d, cp->dmine + C, cp->row * sizeof(float), cp->dkv[cp->size % 2],
			      kv2 * sizeof(float), kv2 * sizeof(float), rows);
}

int mr_cp_attn_bwd(struct mr_cp *cp, mr_act *dqkv, const mr_act *dout, const mr_act *qkv,
		   const mr_act *out, const float *lse)
{
	struct mr_dev *d = cp->dev;
	size_t n = (size_t)cp->B * cp->Tl * cp->row;
	int qk, g, rc;

	if (cp->algo == MR_CP_ULYSSES)
		return ulysses_bwd(cp, dqkv, dout, qkv, out, lse);
	if ((rc = bwd_begin(cp, dout, out)) < 0)
		return rc;
	if (cp->algo == MR_CP_RING) {
		if ((rc = ring_bwd(cp, dout, qkv, lse)) < 0)
			return rc;
		return d->ops->to_act(d, dqkv, cp->dmine, n);
	}
	/* allgather: dq at this rank's place in dall, dk|dv at their owners' */
	if ((rc = gather(cp, qkv)) < 0 ||
	    (rc = d->ops->zero(d, cp->dall, cp->bytes[DALL])) < 0)
		return rc;
	for (qk = 0; qk < 2; qk++)
		for (g = 0; g <= chunk_of(cp, cp->rank, qk); g++) {
			int owner = g < cp->size ? g : 2 * cp->size - 1 - g;
			struct kblock kb = gathered(cp, owner, g >= cp->size);
			if ((rc = attend_bwd(cp, qkv, dout, lse, cp->dall + (size_t)cp->rank * n, qk,
					     g, &kb)) < 0)
				return rc;
		}
	/* every rank's contributions to this rank's q|k|v rows, summed */
	if ((rc = mr_dev_comm_sync(d, cp->comm)) < 0 ||
	    (rc = mr_comm_reduce_scatter(cp->comm, cp->dall, cp->dmine, n, MR_COMM_F32,
					 MR_COMM_SUM)) < 0)
		return rc;
	return d->ops->to_act(d, dqkv, cp->dmine, n);
}
