/*
 * plan_cp.c - context parallel's algorithms as rows of a table
 * (layers/mr_cp.h): what each sends per layer forward and backward,
 * whether the runtime hides it behind the attention, what it keeps as
 * workspace, and what it refuses. A new algorithm is a new row.
 *
 * Per layer and micro-batch, rows = b s/cp local tokens, Cl = C/tp
 * query channels, KVl = mr_gpt_kv_local hs key/value channels (Cl without
 * grouped-query attention), Q = Cl + 2 KVl the q|k|v row, NHl = heads/tp,
 * act = activation bytes (cp.c's buffer_bytes):
 *   ring       forward cp-1 hops of the k|v block (rows 2 KVl act), each
 *              passed on while the block it brought is computed against;
 *              backward cp hops (cp-1 and one home) of k|v with its fp32
 *              dk|dv; workspace two k|v and two dk|dv blocks, the merged
 *              and partial outputs, lse, delta, fp32 dq|dk|dv;
 *   allgather  the layer's q|k|v all-gathered (cp rows Q act) forward
 *              and again backward, the fp32 gradients reduce-scattered;
 *              workspace the gathered buffers;
 *   ulysses    all-to-alls (DeepSpeed-Ulysses): q|k|v to head groups and
 *              the output back forward; q|k|v, out, dout and the q|k|v
 *              gradients backward; workspace the send/receive and head
 *              group buffers; needs NHl and NKV/tp divisible by cp (a
 *              head group holds whole query and key/value heads).
 * Megatron-LM's ring (TransformerEngine's) passes the same k|v of its
 * query groups, so both implementations share the rows.
 *
 * Non-goals: the attention's compute (plan_time.c counts it).
 */
#include <math.h>
#include <string.h>

#include "plan_int.h"

static const char *never(const struct mr_plan_input *in, const struct mr_plan_mesh *m)
{
	(void)in;
	(void)m;
	return NULL;
}

static const char *heads_split(const struct mr_plan_input *in, const struct mr_plan_mesh *m)
{
	if ((in->model.n_head / m->tp) % m->cp)
		return "n_head";
	return mr__plan_kv_local(&in->model, m->tp) % m->cp ? "n_kv_head" : NULL;
}

void mr__plan_cpx(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
		  struct mr__plan_cpx *x)
{
	const struct mr_plan_model *md = &in->model;
	double hs = (double)(md->d_model / md->n_head);

	*x = (struct mr__plan_cpx){
		.rows = (double)m->micro_batch * md->seq_len / m->cp,
		.Cl = (double)md->d_model / m->tp,
		.NHl = (double)md->n_head / m->tp,
		.KVl = (double)mr__plan_kv_local(md, m->tp) * hs,
		.cp = m->cp,
		.act = mr__plan_prec(in->prec)->act,
		.T = md->seq_len,
		.threads = in->threads,
	};
}

/* The q|k|v row's channels. */
static double qkv(const struct mr__plan_cpx *x)
{
	return x->Cl + 2 * x->KVl;
}

/* The outputs, lse, delta and dq|dk|dv the sliced algorithms share. */
static double sliced_ws(const struct mr__plan_cpx *x)
{
	return x->rows * x->Cl * 4 * 2 + x->rows * x->NHl * 4 * 2 + x->rows * qkv(x) * 4;
}

static double ring_ws(const struct mr__plan_cpx *x)
{
	return sliced_ws(x) + 2 * x->rows * 2 * x->KVl * (x->act + 4);
}

static double allgather_ws(const struct mr__plan_cpx *x)
{
	return sliced_ws(x) + x->cp * x->rows * qkv(x) * (x->act + 4);
}

static double ulysses_ws(const struct mr__plan_cpx *x)
{
	return 4 * x->rows * qkv(x) * x->act + 2 * x->rows * x->Cl * x->act +
	       mr__plan_attn_ws((int)x->threads, x->T, x->Cl / x->NHl, x->Cl / x->cp);
}

static int ring_xfers(const struct mr__plan_cpx *x, int bwd, struct mr__plan_xfer *o)
{
	double kv = x->rows * 2 * x->KVl;

	o[0] = (struct mr__plan_xfer){ MR__OP_P2P, bwd ? kv * (x->act + 4) : kv * x->act,
				       bwd ? x->cp : x->cp - 1 };
	return 1;
}

static int allgather_xfers(const struct mr__plan_cpx *x, int bwd, struct mr__plan_xfer *o)
{
	double all = x->cp * x->rows * qkv(x);

	o[0] = (struct mr__plan_xfer){ MR__OP_ALLGATHER, all * x->act, 1 };
	if (!bwd)
		return 1;
	o[1] = (struct mr__plan_xfer){ MR__OP_REDUCE_SCATTER, all * 4, 1 };
	return 2;
}

static int ulysses_xfers(const struct mr__plan_cpx *x, int bwd, struct mr__plan_xfer *o)
{
	double tok = x->rows * x->act; /* a channel of every local token */

	o[0] = (struct mr__plan_xfer){ MR__OP_ALLTOALL, qkv(x) * tok, bwd ? 2 : 1 };
	o[1] = (struct mr__plan_xfer){ MR__OP_ALLTOALL, x->Cl * tok, bwd ? 2 : 1 };
	return 2;
}

static const struct mr__plan_cp rows[] = {
	{ MR_CP_RING, "ring", 1, never, NULL, ring_ws, ring_xfers },
	{ MR_CP_ALLGATHER, "allgather", 0, never, NULL, allgather_ws, allgather_xfers },
	{ MR_CP_ULYSSES, "ulysses", 0, heads_split,
	  "its heads per tp rank must divide by cp for cp_algo ulysses", ulysses_ws,
	  ulysses_xfers },
};

const struct mr__plan_cp *mr__plan_cp(int algo)
{
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		if (rows[i].algo == algo)
			return &rows[i];
	return NULL;
}

const char *mr_plan_cp_algo_name(int algo)
{
	const struct mr__plan_cp *r = mr__plan_cp(algo);

	return r ? r->name : "?";
}

int mr_plan_cp_algo_parse(const char *s, int *out, struct mr_errbuf *eb)
{
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		if (s && !strcmp(s, rows[i].name)) {
			*out = rows[i].algo;
			return 0;
		}
	return mr_errf_field(eb, MR_EINVAL, "cp_algo",
			     "cp_algo: '%s' is not one of ring, allgather, ulysses", s ? s : "");
}
