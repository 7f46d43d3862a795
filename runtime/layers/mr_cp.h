/*
 * mr_cp.h - context parallelism: each sequence split over the cp group,
 * attention computed across the split.
 *
 * Layout (load-balanced, as Megatron-Core and torchtitan lay out causal
 * sequences): a sequence of T tokens is cut into 2*cp chunks of Tc =
 * T/(2cp); cp rank r holds chunks r and 2cp-1-r, back to back, so its
 * local sequence is Tl = T/cp rows and every rank has the same causal
 * work. Every per-token layer (embeddings, LayerNorm, MLP, MoE, the loss)
 * runs on the local rows unchanged; only positions (mr_cp_pos0) and
 * attention cross ranks.
 *
 * Attention works on slices: one local query chunk against one key chunk
 * (device attn_part_fwd, at their absolute positions), merged by
 * log-sum-exp (attn_merge); key chunks after a query's are causally
 * invisible and skipped. The backward recomputes per slice against the
 * final lse and delta (attn_part_bwd). Three algorithms ("cp_algo"):
 *   ring (default; Liu et al. 2023, Megatron-Core's and torchtitan's):
 *     the rank's k|v block goes around the cp ring, each block passed on
 *     (mr_comm_isendrecv) while it is computed against, cp steps; in the
 *     backward each block travels with its fp32 dk|dv, every rank adding
 *     its queries' share, and after the last step takes one hop home.
 *     Memory: two k|v blocks and two gradient blocks of the local rows;
 *   allgather: the layer's q|k|v rows all-gathered over cp (again in the
 *     backward: the buffer holds one layer at a time), dk|dv accumulated
 *     at their owners' places of a gathered fp32 buffer and reduce-
 *     scattered back. Simpler, with whole-sequence buffers;
 *   ulysses (DeepSpeed-Ulysses, Jacobs et al. 2023): no slices. One all-
 *     to-all turns the local rows of every head into the whole sequence
 *     of NH/cp heads (head group j to cp rank j, rows put back in
 *     position order), the device's plain causal attention runs on it
 *     (attn_fwd/attn_bwd), and one all-to-all takes the output back. The
 *     backward exchanges q|k|v, out and dout the same way again, and the
 *     q|k|v gradients back. Needs the rank's heads (n_head / tp)
 *     divisible by cp; its lse is (B, NH/cp, T), as many floats.
 * Whatever the algorithm, what a layer keeps for its backward is local
 * (Tl rows), so activations fall as 1/cp.
 */
#ifndef MR_CP_H
#define MR_CP_H

#include "comm/mr_comm.h"
#include "core/mr_mem.h"
#include "core/mr_place.h"
#include "device/mr_device.h"

struct mr_cp {
	struct mr_dev *dev;
	struct mr_mem *mem;
	struct mr_comm *comm;   /* the cp group; NULL when size 1 */
	int algo;               /* enum mr_cp_algo (mr_place.h) */
	int size, rank;
	int B, T, Tl, Tc;       /* batch, sequence, local rows, chunk rows */
	int C, NH, hs;          /* this rank's attention channels (C/tp), heads */
	int NKV;                /* its key/value heads (grouped-query: < NH) */
	size_t kvw, row;        /* k's (and v's) columns NKV*hs; a q|k|v row's C +
				 * 2 kvw (3C below is that row) */
	float *o32, *p32;       /* (B, Tl, C) merged and partial outputs */
	float *plse, *delta;    /* (2, B, NH, Tc) partial lse; delta */
	float *dmine;           /* (B, Tl, 3C) this rank's q|k|v gradients, fp32 */
	mr_act *all;            /* allgather: (cp, B, Tl, 3C) gathered q|k|v */
	float *dall;            /* allgather: (cp, B, Tl, 3C) their gradients, fp32 */
	mr_act *kv[2];          /* ring: (B, Tl, 2C) the k|v block held, the next */
	float *dkv[2];          /* ring: (B, Tl, 2C) its gradients, fp32 */
	mr_act *xs, *xr;        /* ulysses: (B, Tl, 3C) all-to-all send, receive */
	mr_act *hq, *ho, *hd;   /* ulysses: (B, T, 3C/cp) q|k|v of this rank's head
				 * group; (B, T, C/cp) its out and dout */
	mr_act *dhq;            /* ulysses: (B, T, 3C/cp) their gradients */
	void *ws;               /* ulysses: the device's attention workspace */
	size_t bytes[18];
};

/* The rows of sequence position: chunk k (0 or 1) of rank r starts at
 * position mr_cp_pos0(cp, r, k); local row t of a sequence is chunk
 * t / Tc, offset t % Tc. */
static inline int mr_cp_pos0(int size, int Tc, int r, int k)
{
	return (k ? 2 * size - 1 - r : r) * Tc;
}

/* cp over comm for B sequences of T tokens (2 * cp must divide T, named
 * "seq_len"), C attention channels in NH query heads and NKV key/value
 * heads on this rank (mr_gpt_kv_local: one when tp replicates them;
 * ulysses: cp must divide NH and NKV, named "n_head" and "n_kv_head"). */
int mr_cp_create(struct mr_cp *cp, struct mr_comm *comm, struct mr_dev *dev, struct mr_mem *mem,
		 int algo, int B, int T, int C, int NH, int NKV, struct mr_errbuf *eb);
void mr_cp_release(struct mr_cp *cp);
/* out (B,Tl,C) (=) and lse ((2, B, NH, Tc): per local chunk) from the
 * local qkv (B,Tl,3C). */
int mr_cp_attn_fwd(struct mr_cp *cp, mr_act *out, float *lse, const mr_act *qkv);
/* dqkv (B,Tl,3C) (=) from dout and the forward's qkv, out and lse. */
int mr_cp_attn_bwd(struct mr_cp *cp, mr_act *dqkv, const mr_act *dout, const mr_act *qkv,
		   const mr_act *out, const float *lse);
/* struct mr_moe_xchg's count_reduce under cp (ctx: the struct mr_cp):
 * the MoE routed counts summed over the sequence split. */
int mr_cp_sum_routed(void *ctx, int *routed, int E);
/* The local rows (B, T/cp) of full rows (B, T) of token ids. */
void mr_cp_select(int size, int rank, const int *full, int B, int T, int *local);

#endif
