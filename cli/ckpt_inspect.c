/*
 * ckpt_inspect.c - `meshrun ckpt inspect DIR [--json]` (see ckpt.c): what
 * each step's manifest says - step, model, mesh, data position, training
 * config, every tensor's shape and layout, every shard - and every record
 * read back and checked against its CRC-32C (mr_ckpt_verify).
 *
 * A checkpoint directory lists its published steps, newest first, and any
 * temporary directory a save left behind (an interrupted save: never
 * loaded, removed by the next job's rank 0).
 */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/mr_ckpt.h"
#include "ckpt_int.h"

static const char *const kind_names[MR_CKPT_KINDS] = { "param", "adam_m", "adam_v" };

/* What the records say of each tensor: the slices it was saved in, its
 * bytes on disk, the kinds present (bit per kind). */
struct tinfo {
	int tp, ep;
	uint64_t bytes;
	unsigned kinds;
};

static struct tinfo *tensor_info(const struct mr_ckpt_manifest *mf, unsigned *kinds)
{
	struct tinfo *ti = calloc((size_t)mf->ntensors, sizeof(*ti));

	*kinds = 0;
	for (int i = 0; ti && i < mf->nrecs; i++) {
		const struct mr_ckpt_rec *r = &mf->recs[i];
		struct tinfo *t = &ti[r->tensor];
		t->tp = r->tp;
		t->ep = r->ep;
		t->bytes += r->n * sizeof(float);
		t->kinds |= 1u << r->kind;
		*kinds |= 1u << r->kind;
	}
	return ti;
}

static int shard_records(const struct mr_ckpt_manifest *mf, int s)
{
	int n = 0;

	for (int i = 0; i < mf->nrecs; i++)
		n += mf->recs[i].shard == s;
	return n;
}

static uint64_t full_n(const struct mr_ckpt_tensor *t)
{
	uint64_t n = 1;

	for (int k = 0; k < t->ndim; k++)
		n *= (uint64_t)t->full[k];
	return n;
}

/* "tp dim 0 over 2 (3 parts), experts over ep 2" */
static void layout_text(const struct mr_ckpt_tensor *t, const struct tinfo *ti, char *buf,
			size_t cap)
{
	int at = 0;

	if (t->tp_dim < 0 && !t->expert) {
		snprintf(buf, cap, "replicated");
		return;
	}
	if (t->tp_dim >= 0)
		at = snprintf(buf, cap, "tp dim %d%s, %d slice%s", t->tp_dim,
			      t->parts > 1 ? " (q|k|v)" : "", ti->tp, ti->tp == 1 ? "" : "s");
	if (t->expert && at >= 0 && (size_t)at < cap)
		snprintf(buf + at, cap - (size_t)at, "%sexperts, ep %d", at ? "; " : "", ti->ep);
}

static void print_text(const struct mr_ckpt_manifest *mf, const struct tinfo *ti, unsigned kinds)
{
	const struct mr_gpt_config *c = &mf->model;
	uint64_t params = 0;
	int i;

	for (i = 0; i < mf->ntensors; i++)
		params += full_n(&mf->tensors[i]);
	printf("  step %ld, optimizer steps %ld, written by %d rank%s\n", mf->step, mf->opt_steps,
	       mf->nshards, mf->nshards == 1 ? "" : "s");
	printf("  model   vocab_size %d  max_seq %d  n_layer %d  d_model %d  n_head %d  (%llu "
	       "parameters)\n", c->vocab, c->max_seq, c->n_layer, c->d_model, c->n_head,
	       (unsigned long long)params);
	if (c->moe_every > 0)
		printf("          MoE every %d layers: %d experts, top_k %d, %s, capacity_factor "
		       "%g, aux_coef %g\n", c->moe_every, c->n_experts, c->top_k,
		       c->moe_dropless ? "dropless" : "capacity", (double)c->capacity_factor,
		       (double)c->aux_coef);
	printf("  mesh    world %d: tp %d  cp %d  dp %d  pp %d  ep %d  zero %d\n", mf->world,
	       mf->tp, mf->cp, mf->dp, mf->pp, mf->ep, mf->zero);
	printf("  data    %llu micro-batches consumed, train_data %s\n",
	       (unsigned long long)mf->micro_batches,
	       mf->train_data ? mf->train_data : "synthetic (the built-in task)");
	printf("  train   batch_size %d  seq_len %d  grad_accum %d  steps %ld  seed %llu\n",
	       mf->batch_size, mf->seq_len, mf->grad_accum, mf->total_steps,
	       (unsigned long long)mf->seed);
	printf("          lr %g  lr_schedule %s  decay_frac %g  min_lr_frac %g  warmup_steps %d  "
	       "beta1 %g  beta2 %g  eps %g  weight_decay %g  grad_clip %g\n", (double)mf->opt.lr,
	       mr_lr_schedule_name(mf->opt.schedule), (double)mf->opt.decay_frac,
	       (double)mf->opt.min_lr_frac, mf->opt.warmup_steps, (double)mf->opt.beta1,
	       (double)mf->opt.beta2,
	       (double)mf->opt.eps, (double)mf->opt.weight_decay, (double)mf->opt.grad_clip);
	printf("  state   %s\n", kinds == 1u ? "parameters only (no optimizer state: imported)"
			       : kinds == 7u ? "parameters, AdamW m and v"
					     : "parameters and part of the optimizer state");
	printf("  tensors (%d):\n    %-24s %-16s %-36s %s\n", mf->ntensors, "name", "shape",
	       "layout", "bytes on disk");
	for (i = 0; i < mf->ntensors; i++) {
		const struct mr_ckpt_tensor *t = &mf->tensors[i];
		char shape[64], lay[96];
		int at = 0;
		for (int k = 0; k < t->ndim; k++)
			at += snprintf(shape + at, sizeof(shape) - (size_t)at, "%s%d", k ? "x" : "",
				       t->full[k]);
		layout_text(t, &ti[i], lay, sizeof(lay));
		printf("    %-24s %-16s %-36s %llu\n", t->name, shape, lay,
		       (unsigned long long)ti[i].bytes);
	}
	printf("  shards (%d):\n", mf->nshards);
	for (i = 0; i < mf->nshards; i++)
		printf("    %-16s rank %-5d %12llu bytes  %d records\n", mf->shards[i].file,
		       mf->shards[i].rank, (unsigned long long)mf->shards[i].bytes,
		       shard_records(mf, i));
}

static json_t *step_json(const struct mr_ckpt_manifest *mf, const struct tinfo *ti,
			 unsigned kinds)
{
	const struct mr_gpt_config *c = &mf->model;
	json_t *ts = json_array(), *ss = json_array(), *ks = json_array();
	int i;

	for (i = 0; i < MR_CKPT_KINDS; i++)
		if (kinds & (1u << i))
			json_array_append_new(ks, json_string(kind_names[i]));
	for (i = 0; i < mf->ntensors; i++) {
		const struct mr_ckpt_tensor *t = &mf->tensors[i];
		json_t *shape = json_array();
		for (int k = 0; k < t->ndim; k++)
			json_array_append_new(shape, json_integer(t->full[k]));
		json_array_append_new(ts, json_pack("{s:s, s:o, s:i, s:i, s:b, s:i, s:i, s:I}",
						    "name", t->name, "shape", shape, "tp_dim",
						    t->tp_dim, "parts", t->parts, "expert", t->expert,
						    "tp", ti[i].tp, "ep", ti[i].ep, "bytes",
						    (json_int_t)ti[i].bytes));
	}
	for (i = 0; i < mf->nshards; i++)
		json_array_append_new(ss, json_pack("{s:s, s:i, s:I, s:i}", "file",
						    mf->shards[i].file, "rank", mf->shards[i].rank,
						    "bytes", (json_int_t)mf->shards[i].bytes,
						    "records", shard_records(mf, i)));
	return json_pack(
		"{s:s, s:I, s:I,"
		" s:{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:s},"
		" s:{s:i, s:i, s:i, s:i, s:i, s:i, s:i},"
		" s:{s:I, s:s?},"
		" s:{s:i, s:i, s:i, s:I, s:I, s:f, s:s, s:f, s:f, s:i, s:f, s:f, s:f, s:f, s:f},"
		" s:o, s:o, s:o}",
		"dir", mf->dir, "step", (json_int_t)mf->step, "optimizer_steps",
		(json_int_t)mf->opt_steps, "model", "vocab_size", c->vocab, "max_seq", c->max_seq,
		"n_layer", c->n_layer, "d_model", c->d_model, "n_head", c->n_head, "moe_every",
		c->moe_every, "n_experts", c->n_experts, "top_k", c->top_k, "capacity_factor",
		(double)c->capacity_factor, "aux_coef", (double)c->aux_coef, "moe_policy",
		c->moe_dropless ? "dropless" : "capacity", "mesh", "world", mf->world, "tp",
		mf->tp, "cp", mf->cp, "dp", mf->dp, "pp", mf->pp, "ep", mf->ep, "zero", mf->zero,
		"data", "micro_batches", (json_int_t)mf->micro_batches, "train_data", mf->train_data,
		"train",
		"batch_size", mf->batch_size, "seq_len", mf->seq_len, "grad_accum",
		mf->grad_accum, "seed", (json_int_t)mf->seed, "steps", (json_int_t)mf->total_steps,
		"lr", (double)mf->opt.lr, "lr_schedule", mr_lr_schedule_name(mf->opt.schedule),
		"decay_frac", (double)mf->opt.decay_frac, "min_lr_frac", (double)mf->opt.min_lr_frac,
		"warmup_steps", mf->opt.warmup_steps, "beta1", (double)mf->opt.beta1, "beta2",
		(double)mf->opt.beta2, "eps", (double)mf->opt.eps, "weight_decay",
		(double)mf->opt.weight_decay, "grad_clip", (double)mf->opt.grad_clip, "state", ks,
		"tensors", ts, "shards", ss);
}

/* One step directory: described (text, or appended to arr) and verified;
 * 0 when everything verified. */
static int inspect_step(const char *dir, json_t *arr)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_ckpt_manifest mf;
	struct tinfo *ti = NULL;
	json_t *js = NULL;
	uint64_t bytes = 0;
	unsigned kinds = 0;
	int rc;

	if (!arr)
		printf("%s\n", dir);
	rc = mr_ckpt_manifest_read(&mf, dir, &eb);
	if (rc == 0 && !(ti = tensor_info(&mf, &kinds)))
		rc = mr_errf(&eb, MR_ENOMEM, "out of memory");
	if (rc == 0) {
		if (arr)
			js = step_json(&mf, ti, kinds);
		else
			print_text(&mf, ti, kinds);
		rc = mr_ckpt_verify(&mf, &bytes, &eb);
	}
	if (!js)
		js = json_pack("{s:s}", "dir", dir);
	if (rc == 0) {
		if (!arr)
			printf("  verified %llu bytes\n", (unsigned long long)bytes);
		json_object_set_new(js, "verified", json_true());
		json_object_set_new(js, "verified_bytes", json_integer((json_int_t)bytes));
	} else {
		if (!arr)
			printf("  CORRUPT: %s\n", eb.msg);
		fprintf(stderr, "meshrun ckpt inspect: %s\n", eb.msg);
		json_object_set_new(js, "verified", json_false());
		json_object_set_new(js, "error", json_string(eb.msg));
	}
	if (arr)
		json_array_append_new(arr, js);
	else
		json_decref(js);
	free(ti);
	mr_ckpt_manifest_release(&mf); /* a failed read left it empty */
	return rc;
}

/* The temporary directories a save left in dir (names into arr). */
static void leftovers(const char *dir, json_t *arr)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	while (d && (e = readdir(d)))
		if (!strncmp(e->d_name, ".tmp-step-", 10) ||
		    !strncmp(e->d_name, ".replaced-step-", 15))
			json_array_append_new(arr, json_string(e->d_name));
	if (d)
		closedir(d);
}

int mr__ckpt_inspect(const char *dir, int json)
{
	json_t *steps = json_array(), *left = json_array(), *doc;
	char **dirs = NULL;
	int n = 0, is_step, i, bad = 0, rc;
	size_t k;

	if ((rc = mr__ckpt_resolve("inspect", dir, &dirs, &n, &is_step))) {
		json_decref(steps);
		json_decref(left);
		return rc;
	}
	if (!is_step)
		leftovers(dir, left);
	if (!json && !is_step) {
		printf("checkpoint directory '%s': %d published step%s, newest first:", dir, n,
		       n == 1 ? "" : "s");
		for (i = 0; i < n; i++)
			printf(" %s", strrchr(dirs[i], '/') ? strrchr(dirs[i], '/') + 1 : dirs[i]);
		printf("\n");
		for (k = 0; k < json_array_size(left); k++)
			printf("  not published: %s (an interrupted save; the next job removes "
			       "it)\n", json_string_value(json_array_get(left, k)));
	}
	for (i = 0; i < n; i++) {
		if (!json && !is_step)
			printf("\n");
		bad |= inspect_step(dirs[i], json ? steps : NULL) != 0;
	}
	if (json) {
		doc = json_pack("{s:s, s:o, s:o, s:b}", "dir", dir, "steps", steps, "unpublished",
				left, "ok", !bad);
		json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		printf("\n");
		json_decref(doc);
	} else {
		json_decref(steps);
		json_decref(left);
	}
	mr_ckpt_list_free(dirs, n);
	return bad ? CKPT_EXIT_FAIL : CKPT_EXIT_OK;
}
