/*
 * dp_int.h - internals shared by dp.c (layout, create), dp_hooks.c (the
 * model hooks: bucket reductions, ZeRO slots, gathers; finishing the
 * gradients) and dp_optim.c (norm, clipping, AdamW, re-gather).
 */
#ifndef MR_DP_INT_H
#define MR_DP_INT_H

#include "comm/mr_comm.h"
#include "device/mr_device.h"
#include "mr_dp.h"

#define DP_MAX_ALLOCS 20
#define DP_MAX_WORLD 64 /* ranks whose norm and loss are summed exactly */

/* One unit: [off, off+n) of the model's table; padded to S*sn elements at
 * poff of the padded full buffers; this rank's shard at soff (sn). */
struct dp_unit {
	size_t off, n, sn, poff, soff;
};

/* A piece of one tensor inside the arrays this rank updates (DDP: the
 * whole table; ZeRO: the shard arrays): so = offset there. */
struct dp_seg {
	size_t so, n;
	int unit, tensor, decay, count; /* count: contributes to the grad norm */
};

/* A unit-sized buffer (gather slot or grad scratch) and its request. */
struct dp_slot {
	float *buf;               /* (S * sn) padded unit */
	float *out;               /* (sn) reduce-scatter output (grad slots) */
	int unit;                 /* held unit, -1 none */
	int pending;              /* grad slot: out not yet added to the shard */
	struct mr_comm_req *req;  /* in flight, or NULL */
};

struct dp_alloc {
	void *p;
	size_t bytes;
	int kind;
};

struct mr_dp {
	struct mr_gpt *m;
	struct mr_dp_config cfg;
	struct mr_dp_comms c;
	struct mr_gpt_hooks hooks;
	struct mr_dev *dev;       /* the model's: every buffer below lives there */
	struct mr_adamw_config oc;
	long t;                   /* optimizer steps taken */
	float *om, *ov;           /* AdamW m, v over the owned arrays (nshard) */
	int zero, S, srank, R, rrank, W, dpn;
	int nunits;
	struct dp_unit *u;        /* (nunits) */
	size_t np, nshard;        /* padded total, shard total */
	struct dp_seg *seg;
	int nseg;
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
	struct mr_comm_req **req; /* (max(nunits, nbuckets)) pending grad ops */

	/* expert parallel (ep > 1, DDP only): the table as ranges, each
	 * reduced over the shard group (dense) or the expert group (experts) */
	int ep, erank, nrange;
	struct dp_range { size_t off, n; int experts; } *range;

	int final;                /* current micro-batch is the last one */
	double t_first, t_last;   /* grad collective span (comm_s) */
	struct mr_dp_stats st;
	struct dp_alloc al[DP_MAX_ALLOCS];
	int nal;
};

double mr__dp_now(void);
/* Waits req (NULL ok), accounting the blocked time; *req cleared. */
int mr__dp_wait(struct mr_dp *d, struct mr_comm_req **req, int grad);
/* Hook table for d->m. */
void mr__dp_set_hooks(struct mr_dp *d);
/* Slot index of unit u: 0 embeddings, 1 final LN, 2 + (u & 1) layers. */
int mr__dp_slot_of(const struct mr_dp *d, int u);
/* zero 3: all-gathers the padded unit u from the shards into dst. */
int mr__dp_gather_unit(struct mr_dp *d, int u, float *dst, struct mr_comm_req **req);

#endif
