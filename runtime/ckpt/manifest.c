/*
 * manifest.c - the checkpoint's JSON (see mr_ckpt.h, docs/CHECKPOINTS.md):
 * a rank's index of what it wrote and the manifest merged from every
 * index, sealed with its checksum (manifest_read.c reads it back and
 * checks it against itself); finding tensors and listing steps.
 *
 * A record is a JSON array [tensor, kind, tp_rank, tp, ep_rank, ep, at,
 * n, offset, crc32c], tensor indexing the document's "tensors".
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_int.h"
#include "mr_crc32c.h"
#include "mr_json.h"


json_t *mr__ckpt_model_json(const struct mr_gpt_config *c)
{
	json_t *j = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:s}", "vocab_size",
			 c->vocab, "max_seq", c->max_seq, "n_layer", c->n_layer, "d_model",
			 c->d_model, "n_head", c->n_head, "moe_every", c->moe_every, "n_experts",
			 c->n_experts, "top_k", c->top_k, "capacity_factor",
			 (double)c->capacity_factor, "aux_coef", (double)c->aux_coef, "moe_policy",
			 c->moe_dropless ? "dropless" : "capacity");

	/* only when chosen: a model object without it is as it was before */
	if (j && c->moe_norm_topk &&
	    json_object_set_new(j, "moe_norm_topk", json_boolean(c->moe_norm_topk > 0)) < 0) {
		json_decref(j);
		return NULL;
	}
	/* a gpt2 model's object is as it was before the families */
	if (j && c->arch == MR_ARCH_LLAMA &&
	    json_object_update_new(
		    j, json_pack("{s:s, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:i, s:b}", "arch",
				 "llama", "n_kv_head", mr_gpt_kv_heads(c), "ffn_hidden",
				 mr_gpt_ffn(c), "norm_eps", (double)mr_gpt_norm_eps(c),
				 "rope_theta", (double)mr_gpt_rope_theta(c), "rope_scaling_factor",
				 (double)c->rope_scaling.factor, "rope_low_freq_factor",
				 (double)c->rope_scaling.low_freq_factor, "rope_high_freq_factor",
				 (double)c->rope_scaling.high_freq_factor, "rope_original_max_pos",
				 c->rope_scaling.original_max_pos, "tie_embeddings",
				 c->tie_embeddings)) < 0) {
		json_decref(j);
		return NULL;
	}
	return j;
}

uint32_t mr__ckpt_model_crc(const json_t *model)
{
	char *text = json_dumps(model, JSON_COMPACT | JSON_SORT_KEYS);
	uint32_t crc = text ? mr_crc32c(0, text, strlen(text)) : 0;

	free(text);
	return crc;
}

char *mr__ckpt_manifest_text(const json_t *doc, size_t *n)
{
	char *text = json_dumps(doc, JSON_COMPACT), *sealed;
	size_t len = text ? strlen(text) : 0, cap;

	if (len < 2 || text[len - 1] != '}') {
		free(text);
		return NULL;
	}
	/* {...} becomes {...,"manifest_crc32c":N}: N covers "{..." */
	cap = len + 40;
	if ((sealed = realloc(text, cap)))
		*n = len - 1 + (size_t)snprintf(sealed + len - 1, cap - len + 1,
						",\"manifest_crc32c\":%" PRIu32 "}\n",
						mr_crc32c(0, sealed, len - 1));
	else
		free(text);
	return sealed;
}

const char *mr_ckpt_model_diff(const struct mr_gpt_config *a, const struct mr_gpt_config *b)
{
	return a->vocab != b->vocab		      ? "vocab_size"
	       : a->max_seq != b->max_seq	      ? "max_seq"
	       : a->n_layer != b->n_layer	      ? "n_layer"
	       : a->d_model != b->d_model	      ? "d_model"
	       : a->n_head != b->n_head		      ? "n_head"
	       : a->moe_every != b->moe_every	      ? "moe_every"
	       : a->n_experts != b->n_experts	      ? "n_experts"
	       : a->top_k != b->top_k		      ? "top_k"
	       : a->capacity_factor != b->capacity_factor ? "capacity_factor"
	       : a->aux_coef != b->aux_coef	      ? "aux_coef"
	       : a->moe_dropless != b->moe_dropless   ? "moe_policy"
	       : a->moe_every && mr_gpt_moe_norm_topk(a) != mr_gpt_moe_norm_topk(b) ? "moe_norm_topk"
	       : a->arch != b->arch		      ? "arch"
	       : a->arch != MR_ARCH_LLAMA	      ? NULL
	       : mr_gpt_kv_heads(a) != mr_gpt_kv_heads(b) ? "n_kv_head"
	       : mr_gpt_ffn(a) != mr_gpt_ffn(b)	      ? "ffn_hidden"
	       : mr_gpt_norm_eps(a) != mr_gpt_norm_eps(b) ? "norm_eps"
	       : mr_gpt_rope_theta(a) != mr_gpt_rope_theta(b) ? "rope_theta"
	       : memcmp(&a->rope_scaling, &b->rope_scaling, sizeof(a->rope_scaling)) ? "rope_scaling"
	       : !a->tie_embeddings != !b->tie_embeddings ? "tie_embeddings"
						      : NULL;
}

static json_t *tensor_json(const struct mr_gpt_tensor *t)
{
	json_t *shape = json_array();

	for (int k = 0; k < t->ndim; k++)
		json_array_append_new(shape, json_integer(t->full[k]));
	return json_pack("{s:s, s:o, s:i, s:i, s:b}", "name", t->name, "shape", shape, "tp_dim",
			 t->tp_dim, "parts", t->split_parts, "expert", t->expert);
}

json_t *mr__ckpt_index_json(const struct mr_ckpt_job *job, const struct ckpt_piece *p, int np,
			    int kinds, uint64_t bytes)
{
	const struct mr_gpt *m = job->m;
	const struct mr_tp *tp = &m->par.tp;
	const struct mr_ep *ep = &m->par.ep;
	json_t *tensors = json_array(), *recs = json_array();
	int *local = calloc((size_t)m->ntensors, sizeof(int)), i, k, nt = 0;
	char file[32];

	if (!local || !tensors || !recs) {
		free(local);
		json_decref(tensors);
		json_decref(recs);
		return NULL;
	}
	for (i = 0; i < np; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[p[i].tensor];
		/* a replicated key/value tensor names its shared slice: one of
		 * tp / tp_rep (mr_gpt_tensor_tp_slice), as a mesh of that tp would */
		int tps = mr_gpt_tensor_tp_slices(t, tp->size), ep_split = t->split[MR_AXIS_EP] >= 0;
		if (!local[p[i].tensor]) {
			json_array_append_new(tensors, tensor_json(t));
			local[p[i].tensor] = ++nt;
		}
		for (k = 0; k < kinds; k++)
			json_array_append_new(
				recs, json_pack("[i, i, i, i, i, i, I, I, I, I]",
						local[p[i].tensor] - 1, k,
						mr_gpt_tensor_tp_slice(t, tp->size, tp->rank), tps,
						ep_split ? ep->rank : -1, ep_split ? ep->size : 1,
						(json_int_t)p[i].at, (json_int_t)p[i].n,
						(json_int_t)(p[i].offset +
							     (uint64_t)k * p[i].n * sizeof(float)),
						(json_int_t)p[i].crc[k]));
	}
	free(local);
	snprintf(file, sizeof(file), "rank-%05d.bin", job->rank);
	return json_pack("{s:i, s:s, s:I, s:o, s:o}", "rank", job->rank, "file", file, "bytes",
			 (json_int_t)bytes, "tensors", tensors, "records", recs);
}

/* Index of the tensor named like t in merged (appending it), -1 when a
 * tensor of that name is there with another description. */
static int merge_tensor(json_t *merged, json_t *t)
{
	const char *name = json_string_value(json_object_get(t, "name"));
	size_t i;
	json_t *v;

	json_array_foreach(merged, i, v)
	{
		if (strcmp(json_string_value(json_object_get(v, "name")), name) == 0)
			return json_equal(v, t) ? (int)i : -1;
	}
	json_array_append(merged, t);
	return (int)json_array_size(merged) - 1;
}

json_t *mr__ckpt_manifest_json(const struct mr_ckpt_job *job, long step, long opt_steps,
			       json_t *const *indexes, int n, struct mr_errbuf *eb)
{
	const struct mr_adamw_config *o = job->opt;
	json_t *tensors = json_array(), *shards = json_array(), *model, *doc;
	uint32_t crc;
	int r;

	for (r = 0; r < n; r++) {
		json_t *ts = json_object_get(indexes[r], "tensors"), *rs, *rec, *recs = json_array();
		int *map = calloc(json_array_size(ts) + 1, sizeof(int));
		size_t i;
		json_t *v;
		json_array_foreach(ts, i, v)
		{
			if ((map[i] = merge_tensor(tensors, v)) < 0) {
				mr_errf(eb, MR_ECORRUPT,
					"rank %d describes tensor '%s' unlike another rank", r,
					json_string_value(json_object_get(v, "name")));
				free(map);
				json_decref(recs);
				json_decref(tensors);
				json_decref(shards);
				return NULL;
			}
		}
		rs = json_object_get(indexes[r], "records");
		json_array_foreach(rs, i, rec)
		{
			json_t *c = json_copy(rec);
			json_array_set_new(c, 0,
					   json_integer(map[json_integer_value(json_array_get(rec, 0))]));
			json_array_append_new(recs, c);
		}
		free(map);
		json_array_append_new(shards,
				      json_pack("{s:O, s:O, s:O, s:o}", "file",
						json_object_get(indexes[r], "file"), "rank",
						json_object_get(indexes[r], "rank"), "bytes",
						json_object_get(indexes[r], "bytes"), "records", recs));
	}
	model = mr__ckpt_model_json(&job->m->cfg);
	crc = mr__ckpt_model_crc(model);
	doc = json_pack("{s:s, s:i, s:I, s:I, s:o, s:I,"
			" s:{s:i, s:i, s:i, s:I, s:I, s:f, s:f, s:i, s:s, s:f, s:f, s:f, s:f, s:f,"
			" s:f},"
			" s:{s:i, s:i, s:i, s:i, s:i, s:i, s:i},"
			" s:{s:I, s:s?}, s:{s:I}, s:o, s:o}",
			"format", "meshrun-checkpoint", "version", MR_CKPT_VERSION, "step",
			(json_int_t)step, "optimizer_steps", (json_int_t)opt_steps, "model", model,
			"config_crc32c", (json_int_t)crc,
			"train", "batch_size", job->batch_size, "seq_len", job->seq_len,
			"grad_accum", job->grad_accum, "seed", (json_int_t)job->seed, "steps",
			(json_int_t)job->total_steps, "lr", (double)o->lr, "min_lr_frac",
			(double)o->min_lr_frac, "warmup_steps", o->warmup_steps, "lr_schedule",
			mr_lr_schedule_name(o->schedule), "decay_frac", (double)o->decay_frac, "beta1",
			(double)o->beta1, "beta2", (double)o->beta2, "eps", (double)o->eps,
			"weight_decay", (double)o->weight_decay, "grad_clip", (double)o->grad_clip,
			"mesh", "world", job->world, "tp", job->tp, "cp", job->cp, "dp", job->dp, "pp",
			job->pp, "ep", job->ep, "zero", job->zero,
			"data", "micro_batches",
			(json_int_t)((uint64_t)step * (uint64_t)job->dp * (uint64_t)job->grad_accum),
			"train_data", job->train_data, "rng", "seed", (json_int_t)job->seed, "tensors",
			tensors, "shards", shards);
	if (!doc)
		mr_errf(eb, MR_ENOMEM, "unable to build the manifest");
	return doc;
}

void mr_ckpt_manifest_release(struct mr_ckpt_manifest *mf)
{
	free(mf->train_data);
	mf->train_data = NULL;
	free(mf->tensors);
	free(mf->recs);
	free(mf->shards);
	mf->tensors = NULL;
	mf->recs = NULL;
	mf->shards = NULL;
	mf->ntensors = mf->nrecs = mf->nshards = 0;
}

int mr_ckpt_manifest_find(const struct mr_ckpt_manifest *mf, const char *name)
{
	for (int i = 0; i < mf->ntensors; i++)
		if (strcmp(mf->tensors[i].name, name) == 0)
			return i;
	return -1;
}

int mr_ckpt_list(const char *ckpt_dir, char ***dirs, int *n, struct mr_errbuf *eb)
{
	long steps[CKPT_MAX_STEPS];
	int k = mr__ckpt_steps(ckpt_dir, steps, CKPT_MAX_STEPS, eb), i;

	*dirs = NULL;
	*n = 0;
	if (k <= 0)
		return k;
	if (!(*dirs = calloc((size_t)k, sizeof(char *))))
		return mr_errf(eb, MR_ENOMEM, "out of memory listing '%s'", ckpt_dir);
	for (i = 0; i < k; i++) {
		char buf[4200];
		mr__ckpt_step_dir(buf, sizeof(buf), ckpt_dir, steps[i]);
		if (!((*dirs)[i] = strdup(buf))) {
			mr_ckpt_list_free(*dirs, i);
			*dirs = NULL;
			return mr_errf(eb, MR_ENOMEM, "out of memory listing '%s'", ckpt_dir);
		}
	}
	*n = k;
	return 0;
}

void mr_ckpt_list_free(char **dirs, int n)
{
	for (int i = 0; dirs && i < n; i++)
		free(dirs[i]);
	free(dirs);
}
