/*
 * mr_place.h - where a rank's model sits in the mesh: its size and index
 * on each of the five parallel axes, the communicator of each axis group,
 * sequence parallelism, and the layers its pipeline stage holds.
 *
 * The model is cut by it (parameter table entries split per axis, the
 * stage's layer range) and calls the parallel layers of each axis with its
 * communicator; data parallelism and the step driver take the dp groups
 * from struct mr_groups (mr_groups.h), which also fills this struct from
 * common/mr_mesh.
 *
 * A zeroed struct (or NULL where one is taken) is one rank holding the
 * whole model: every size 1, no communicator. mr_place_one() fills it.
 *
 * Pipeline: a stage holds one or more model chunks (virtual stages of an
 * interleaved schedule, parallel/mr_pp_sched.h), each a contiguous range
 * of blocks, ascending and disjoint; chunks == 0 is the whole model.
 *
 * Ownership: the communicators are borrowed (mr_groups or the caller owns
 * them) and must outlive every model built on the placement.
 */
#ifndef MR_PLACE_H
#define MR_PLACE_H

struct mr_comm;

#define MR_PLACE_MAX_CHUNKS 64 /* == MR_PP_MAX_VIRTUAL */

/* Context parallel attention (layers/mr_cp.h): K/V blocks passed
 * around the cp ring, all-gathered, or heads exchanged all-to-all. */
enum mr_cp_algo { MR_CP_RING = 0, MR_CP_ALLGATHER = 1, MR_CP_ULYSSES = 2 };

/* The axes, in the order of common/mr_mesh's rank formula (tp fastest). */
enum mr_axis { MR_AXIS_TP, MR_AXIS_CP, MR_AXIS_DP, MR_AXIS_PP, MR_AXIS_EP, MR_AXIS__COUNT };

struct mr_place {
	int size[MR_AXIS__COUNT];             /* degree of each axis (0 reads as 1) */
	int index[MR_AXIS__COUNT];            /* this rank's coordinate on it */
	struct mr_comm *comm[MR_AXIS__COUNT]; /* its group; NULL when the size is 1 */
	struct mr_comm *kv;                   /* replicated key/value heads (mr_gpt_kv_rep > 1):
					       * the tp ranks sharing this rank's head, which
					       * sum its gradient (mr_groups_kv); else NULL */
	int sp;                               /* sequence parallel over tp (tp > 1) */
	int cp_algo;                          /* cp > 1: enum mr_cp_algo */
	int chunks;                           /* model chunks held; 0: the whole model */
	int layer_lo[MR_PLACE_MAX_CHUNKS];    /* chunk c holds blocks [lo[c], hi[c]) */
	int layer_hi[MR_PLACE_MAX_CHUNKS];
};

/* One rank, the whole model. */
void mr_place_one(struct mr_place *p);
/* Tensor parallel only (the common case of tests and benchmarks): size tp,
 * this rank's index, its communicator, sequence parallel or not. */
void mr_place_tp(struct mr_place *p, int tp, int index, struct mr_comm *comm, int sp);
/* Size of axis a (at least 1) and this rank's index on it. */
int mr_place_size(const struct mr_place *p, enum mr_axis a);
int mr_place_index(const struct mr_place *p, enum mr_axis a);
/* Chunks held (at least 1) and chunk c's blocks [*lo, *hi) of a model of
 * n_layer blocks. */
int mr_place_chunks(const struct mr_place *p);
void mr_place_chunk(const struct mr_place *p, int n_layer, int c, int *lo, int *hi);
/* "tp", "cp", "dp", "pp", "ep". */
const char *mr_axis_name(enum mr_axis a);

#endif
