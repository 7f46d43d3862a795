/*
 * gpt_family.h - what a model family adds to the model (model/gpt2.c,
 * model/llama.c): its block's forward and backward, its MLP's
 * activation (selective recomputation runs it again), which norm it uses,
 * and its table of tensors, written through the table builder of
 * gpt_table.c. Everything around the blocks - embedding, head and loss,
 * hooks, the micro-batch state, recomputation, checkpoints - is the model's
 * (gpt.c, gpt_params.c, gpt_table.c), and tensor, sequence, context and
 * expert parallel are the layers of layers/ a block calls through m->par
 * (attached by mr_layers_attach), so a third family is one more file with
 * one more struct mr__gpt_family.
 */
#ifndef MR_GPT_FAMILY_H
#define MR_GPT_FAMILY_H

#include <stddef.h>

#include "gpt_int.h"

/* The table being built (gpt_table.c): tensors in order, units, the
 * split degrees; a family's table sets experts and rep around the
 * tensors they concern. */
struct mr__gpt_table {
	struct mr_gpt_tensor *t;
	int n, cap;
	size_t off;
	int tp;            /* tensor parallel degree: local = full / tp on the tp split */
	int ep;            /* expert parallel degree: experts = full / ep on dim 0 */
	int experts;       /* the tensors being added hold experts (dim 0) */
	int rep;           /* the tensors being added are replicated key/value
			    * heads shared by rep tp ranks (0: not) */
	int *unit_first;   /* (units + 1), filled when t is */
	int unit;          /* units held so far */
	const unsigned char *hold; /* per unit of the whole model: 1 held here; NULL: all */
	int gunit, gi;     /* units and tensors of the whole model so far */
	size_t full_off;   /* elements of the whole model so far */
	int held;          /* the current unit is held */
};

/* Starts the next unit of the whole model at the next tensor. */
void mr__gpt_table_unit(struct mr__gpt_table *tb);
/* Adds a tensor of full shape (d0, d1, d2) (0 = absent dim), split along
 * dim split (-1: replicated) viewed as parts blocks, bound to the view at
 * offset view of block layer's views (layer -1: the model's own). */
void mr__gpt_table_add(struct mr__gpt_table *tb, const char *name, int d0, int d1, int d2,
		       enum mr_gpt_init init, float std, int split, int parts, int layer,
		       size_t view);
/* The view offsets a table binds: a block's (struct mr_gpt_layer_w) and
 * the model's own (struct mr_gpt_weights). */
#define LV(f) offsetof(struct mr_gpt_layer_w, f)
#define MV(f) offsetof(struct mr_gpt_weights, f)

struct mr__gpt_family {
	const char *name;
	/* its tensors in the model's units (mr_gpt.h): the embeddings, each
	 * block's attention half and MLP half, the final norm (and head) */
	void (*table)(const struct mr_gpt_config *c, struct mr__gpt_table *tb);
	/* block l: res (Nl,C) in, its output at mr__gpt_block_out; and its
	 * backward (mr_gpt_blocks_bwd's phases) */
	int (*block_fwd)(struct mr_gpt *m, int l, const mr_act *res);
	int (*block_bwd)(struct mr_gpt *m, int l, const mr_act *res, float dscale, int phase);
	/* a dense MLP's activation of block l: a->fch into a->fch_gelu */
	int (*mlp_act)(struct mr_gpt *m, int l);
	int rms_norm;      /* its norms: RMSNorm without bias (1), LayerNorm (0) */
};

extern const struct mr__gpt_family mr__gpt2_family, mr__llama_family;

/* The family of config c's arch. */
const struct mr__gpt_family *mr__gpt_family_of(const struct mr_gpt_config *c);

#endif
