/*
 * dp_int.h - internals shared by dp.c (layout, create), dp_hooks.c (the
 * model hooks: bucket reductions, ZeRO slots, gathers; finishing the
 * gradients) and dp_optim.c (norm, clipping, AdamW, re-gather).
 */
#ifndef MR_DP_INT_H
#define MR_DP_INT_H

#include "comm/mr_comm.h"
#include "device/mr_dev_comm.h"
#include "device/mr_device.h"
#include "mr_dp.h"

#define DP_MAX_ALLOCS 24
#define DP_MAX_WORLD 64 /* ranks whose norm and loss are summed exactly */

/* A piece of one model unit: the whole unit or, under expert parallelism
 * with ZeRO, its dense tensors or its experts (last in the unit), which
 * shard over the expert-data-parallel group. Tensors [t0, t1), elements
 * [off, off+n) of the model's table; padded to pn = S*sn elements at poff
 * of the padded full buffers (loff within its unit's padded span, the
 * unit's pieces back to back); this rank's shard at soff (sn). */
struct dp_piece {
	size_t off, n, sn, pn, poff, loff, soff;
	int unit, t0, t1;
	int experts;          /* the expert tensors of a MoE unit */
	struct mr_comm *comm; /* the group it shards (and averages) over; NULL: 1 rank */
	int S, srank;         /* that group's size and this rank's index */
};

#define DP_MAX_PIECES 2 /* per unit */

/* A piece of one tensor inside the arrays this rank updates (DDP: the
 * whole table; ZeRO: the shard arrays): so = offset there. */
struct dp_seg {
	size_t so, n;
	size_t at;                       /* its first element's offset in the tensor */
	int piece, tensor, decay, count; /* count: contributes to the grad norm (and is
					  * the one copy a checkpoint writes) */
};

/* A unit-sized buffer (gather slot or grad scratch) and its request. */
struct dp_slot {
	float *buf;               /* (S * sn) padded unit */
	float *out;               /* (sn) reduce-scatter output (grad slots) */
	mr_act *cbuf;             /* param slots on a bf16 device: the compute copy */
	int unit;                 /* held unit, -1 none */
	int pending;              /* grad slot: out not yet added to the shard */
	struct mr_comm_req *req[DP_MAX_PIECES]; /* in flight per piece, or NULL */
};

struct dp_alloc {
	void *p;
	size_t bytes;
	int kind;
	int host; /* mr_dev_host_alloc'd (offload) */
};

struct mr_dp {
	struct mr_gpt *m;
	struct mr_dp_config cfg;
	struct mr_dp_comms c;
	struct mr_gpt_hooks hooks;
	struct mr_dev *dev;       /* the model's: every buffer below lives there */
	struct mr_adamw_config oc;
	long t;                   /* optimizer steps taken */
	float clip, lr;           /* mr_dp_update_args': the clip factor, the rate */
	float *om, *ov;           /* AdamW m, v over the owned arrays (nshard); host
				   * memory with offload */
	int off;                  /* enum mr_dp_offload in effect (NONE on a device
				   * whose memory is host memory) */
	float *hg, *hp;           /* offload: host copies of the owned grads and
				   * params (nshard; hp the master under MASTER) */
	/* MASTER in effect (mr__dp_mb): the device holds its weights in the
	 * activation type only, published from hp through an fp32 staging
	 * buffer (nstage floats): zero 0 the model's compute copy, zero 1/2 Pc
	 * (padded, the bf16 all-gather's target, fed from the shard sc), zero
	 * 3 pshard_c (the shard the bf16 gathers read) */
	struct mr_pool *host_pool; /* the host AdamW's threads (NULL: the caller's) */
	mr_act *Pc, *sc, *pshard_c;
	float *stage;
	size_t nstage;
	int zero, S, srank, R, rrank, W, dpn;
	int nunits, npieces;
	struct dp_piece *pc;      /* (npieces) in table order */
	int *pfirst;              /* (nunits + 1) unit u's pieces start at pfirst[u] */
	size_t np, nshard;        /* padded total, shard total */
	struct dp_seg *seg;
	int nseg;
	struct mr_dev_adamw_range *ranges; /* (nseg) the device's AdamW, a range per segment */
	size_t *cnt_off, *cnt_n;  /* (ncnt) the segments that count in the norm */
	double *part;             /* (ncnt) their sums of squares */
	int ncnt;

	float *P, *G;             /* zero 1/2: padded full params; zero 1: grads */
	float *pshard;            /* zero 3: param shard (nshard) */
	float *gshard;            /* zero >= 1: grad shard (nshard) */
	struct dp_slot gs[4], ps[4]; /* zero >= 2 grad slots; zero 3 param slots */

	/* DDP buckets: unit -> bucket, bucket's table range */
	int nbuckets, *bucket_of, *bucket_low;
	size_t *boff, *bn;
	struct mr_comm_req **req; /* (npieces >= nbuckets) pending grad ops */

	/* expert parallel with DDP: the table as ranges, each reduced over
	 * the shard group (dense) or the expert group (experts) */
	int ep, erank, nrange;
	struct dp_range { size_t off, n; int experts; } *range;

	int final;                /* current micro-batch is the last one */
	double t_first, t_last;   /* grad collective span (comm_s) */
	struct mr_dp_stats st;
	struct dp_alloc al[DP_MAX_ALLOCS];
	int nal;
};

/* The master on the host, bf16 weights alone on the device: optimizer+
 * master in effect (offload takes effect only where device memory is not
 * host memory). */
static inline int mr__dp_mb(const struct mr_dp *d)
{
	return d->off == MR_DP_OFFLOAD_MASTER;
}

double mr__dp_now(void);
/* Waits req (NULL ok), accounting the blocked time; *req cleared. */
int mr__dp_wait(struct mr_dp *d, struct mr_comm_req **req, int grad);
/* Before collectives on buffers the device's queued work writes: the
 * device's sync unless the groups are stream-ordered (mr_dev_comm_sync). */
int mr__dp_sync(struct mr_dp *d);
/* Hook table for d->m. */
void mr__dp_set_hooks(struct mr_dp *d);
/* Slot index of unit u: 0 embeddings, 1 final LN, 2 + (u & 1) layers. */
int mr__dp_slot_of(const struct mr_dp *d, int u);
/* Unit u's padded span (its pieces' pn) and shard span (their sn). */
size_t mr__dp_unit_padded(const struct mr_dp *d, int u);
size_t mr__dp_unit_shard(const struct mr_dp *d, int u);
/* zero 3: all-gathers the padded unit u from the shards into dst, one
 * request per piece into req[] (NULL where nothing is in flight). */
int mr__dp_gather_unit(struct mr_dp *d, int u, float *dst, struct mr_comm_req **req);
/* The same from src: act = 0 the unit's span of an fp32 shard (its first
 * piece at src); act = 1 a whole shard in the activation type (MASTER's
 * d->pshard_c), gathered as it is. */
int mr__dp_gather_unit_from(struct mr_dp *d, int u, const void *src, int act, void *dst,
			    struct mr_comm_req **req);
/* MASTER: the owned master d->hp onto the device in the activation type,
 * and (zero 1/2) all-gathered into Pc; zero 3's slots are stale after. */
int mr__dp_publish(struct mr_dp *d);
/* Points unit u's views at its padded span in buf (parameters: grads =
 * 0; gradients: grads = 1). */
void mr__dp_bind_unit(struct mr_dp *d, int u, float *buf, int grads);

#endif
