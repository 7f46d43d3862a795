/*
 * gpt_worker_config.c - the gpt worker's config (see mr_gpt_worker.h): its
 * keys, their types and bounds, read into the model, optimizer and worker
 * settings; and the same check for the agent before the job starts.
 *
 * Non-goals: what needs the mesh (gpt_worker_setup.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_worker_int.h"
#include "mr_json.h"

static const char *const keys[] = {
	"vocab_size", "max_seq", "n_layer", "d_model", "n_head", "moe_every", "n_experts",
	"top_k", "capacity_factor", "aux_coef", "batch_size", "seq_len", "steps",
	"grad_accum", "lr", "min_lr_frac", "warmup_steps", "beta1", "beta2", "eps",
	"weight_decay", "grad_clip", "seed", "threads", "peak_flops", "eval_every",
	"eval_batches", "train_data", "val_data", "sequence_parallel", "zero", "hsdp_shard",
	"comm_timeout_ms", "loss_log", "save_weights", "bucket_mb", "overlap_grad_reduce",
	"device", "precision", "comm_backend", "debug_stall_rank", "debug_stall_step",
	"debug_slow_rank", "debug_slow_ms", "pp_schedule", "pp_virtual", "pp_layers", "pp_p2p",
	"moe_policy", "cp_algo", "ckpt_dir", "ckpt_every", "ckpt_keep", "ckpt_async", "resume",
	"debug_ckpt_fail_rank", "debug_ckpt_fail_step", "debug_ckpt_fail_unmarked", NULL,
};

static int get_choice(const json_t *c, const char *key, const char *const *choices,
		      const char **out, struct mr_errbuf *eb);

static int geti(const json_t *c, const char *k, int64_t lo, int64_t hi, int def, int *out,
		struct mr_errbuf *eb)
{
	int64_t v = def;
	int rc = c ? mr_json_get_int(c, k, 0, lo, hi, &v, eb) : 0;

	*out = (int)v;
	return rc;
}

static int getf(const json_t *c, const char *k, double lo, double hi, double def, float *out,
		struct mr_errbuf *eb)
{
	double v = def;
	int rc = c ? mr_json_get_double(c, k, 0, lo, hi, &v, eb) : 0;

	*out = (float)v;
	return rc;
}

/* "pp_layers": an array of block counts (one per virtual stage), checked
 * against the mesh at placement (mr_pp_split_check). */
static int get_layers(const json_t *c, struct gw *w, struct mr_errbuf *eb)
{
	const json_t *a = c ? json_object_get(c, "pp_layers") : NULL;
	size_t i, n;

	w->n_pp_layers = 0;
	if (!a)
		return 0;
	n = json_is_array(a) ? json_array_size(a) : 0;
	if (n < 1 || n > MR_PP_MAX_VSTAGES)
		return mr_errf_field(eb, MR_EINVAL, "pp_layers",
				     "'pp_layers' must be an array of 1 to %d block counts",
				     MR_PP_MAX_VSTAGES);
	if (!(w->pp_layers = calloc(n, sizeof(int))))
		return mr_errf(eb, MR_ENOMEM, "out of memory");
	for (i = 0; i < n; i++) {
		const json_t *e = json_array_get(a, i);
		if (!json_is_integer(e) || json_integer_value(e) < 1 ||
		    json_integer_value(e) > 1024)
			return mr_errf_field(eb, MR_EINVAL, "pp_layers",
					     "'pp_layers' entry %zu must be an integer in [1, "
					     "1024]", i);
		w->pp_layers[i] = (int)json_integer_value(e);
	}
	w->n_pp_layers = (int)n;
	return 0;
}

/* The pipeline's keys: schedule (default 1f1b), chunks per stage
 * (default 2 for interleaved, else 1) and the explicit split. */
static int get_pipeline(const json_t *c, struct gw *w, struct mr_errbuf *eb)
{
	const char *name = NULL;
	int rc;

	w->pp_kind = MR_PP_1F1B;
	if (c && (rc = mr_json_get_str(c, "pp_schedule", 0, 32, &name, eb)) < 0)
		return rc;
	if (name && (rc = mr_pp_kind_parse(name, &w->pp_kind, eb)) < 0)
		return rc;
	if ((rc = geti(c, "pp_virtual", 1, MR_PP_MAX_VIRTUAL,
		       w->pp_kind == MR_PP_INTERLEAVED ? 2 : 1, &w->pp_virtual, eb)) < 0)
		return rc;
	/* transfers: "auto" (paired where the backend needs it), "ahead", "paired" */
	name = NULL;
	w->pp_p2p = -1;
	if (c && (rc = mr_json_get_str(c, "pp_p2p", 0, 16, &name, eb)) < 0)
		return rc;
	if (name && strcmp(name, "auto"))
		w->pp_p2p = !strcmp(name, "paired") ? 1 : !strcmp(name, "ahead") ? 0 : -2;
	if (name && w->pp_p2p == -2)
		return mr_errf_field(eb, MR_EINVAL, "pp_p2p",
				     "'pp_p2p' must be one of \"auto\", \"ahead\", \"paired\", "
				     "got \"%s\"", name);
	return get_layers(c, w, eb);
}


int mr__gw_parse(const json_t *c, struct mr_gpt_config *mc, struct mr_adamw_config *oc,
		 struct gw *w, int *B, int *T, struct mr_errbuf *eb)
{
	static const char *const moe_policies[] = { "capacity", "dropless", NULL };
	static const char *const cp_algos[] = { "allgather", "ring", "ulysses", NULL };
	static const char *const resumes[] = { "auto", "never", NULL };
	const char *policy = NULL, *cp_algo = NULL, *resume = NULL;
	int rc = 0, seed = 1337, tmo = 60000;
	float peak = 0.0f;

	if (c && (rc = mr_json_check_keys(c, keys, eb)) < 0)
		return rc;
	memset(mc, 0, sizeof(*mc));
	memset(oc, 0, sizeof(*oc));
	if ((rc = geti(c, "vocab_size", 2, 1 << 20, 256, &mc->vocab, eb)) < 0 ||
	    (rc = geti(c, "seq_len", 1, 1 << 16, 64, T, eb)) < 0 ||
	    (rc = geti(c, "max_seq", 1, 1 << 16, *T, &mc->max_seq, eb)) < 0 ||
	    (rc = geti(c, "n_layer", 1, 1024, 2, &mc->n_layer, eb)) < 0 ||
	    (rc = geti(c, "d_model", 1, 65536, 128, &mc->d_model, eb)) < 0 ||
	    (rc = geti(c, "n_head", 1, 65536, 4, &mc->n_head, eb)) < 0 ||
	    (rc = geti(c, "moe_every", 0, 1024, 0, &mc->moe_every, eb)) < 0 ||
	    (rc = geti(c, "n_experts", 1, 1024, 4, &mc->n_experts, eb)) < 0 ||
	    (rc = geti(c, "top_k", 1, 2, 1, &mc->top_k, eb)) < 0 ||
	    (rc = getf(c, "capacity_factor", -1e9, 1e9, 1.25, &mc->capacity_factor, eb)) < 0 ||
	    (rc = getf(c, "aux_coef", 0, 1e3, 0.01, &mc->aux_coef, eb)) < 0 ||
	    (rc = geti(c, "batch_size", 1, 1 << 16, 8, B, eb)) < 0 ||
	    (rc = geti(c, "steps", 1, 1 << 30, 100, &w->steps, eb)) < 0 ||
	    (rc = geti(c, "grad_accum", 1, 1 << 16, 1, &w->accum, eb)) < 0 ||
	    (rc = getf(c, "lr", 0, 10, 1e-3, &oc->lr, eb)) < 0 ||
	    (rc = getf(c, "min_lr_frac", 0, 1, 0.1, &oc->min_lr_frac, eb)) < 0 ||
	    (rc = geti(c, "warmup_steps", 0, 1 << 30, 10, &oc->warmup_steps, eb)) < 0 ||
	    (rc = getf(c, "beta1", 0, 0.999999, 0.9, &oc->beta1, eb)) < 0 ||
	    (rc = getf(c, "beta2", 0, 0.999999, 0.95, &oc->beta2, eb)) < 0 ||
	    (rc = getf(c, "eps", 1e-30, 1, 1e-8, &oc->eps, eb)) < 0 ||
	    (rc = getf(c, "weight_decay", 0, 10, 0.1, &oc->weight_decay, eb)) < 0 ||
	    (rc = getf(c, "grad_clip", 0, 1e9, 1.0, &oc->grad_clip, eb)) < 0 ||
	    (rc = geti(c, "seed", 0, 0x7fffffff, 1337, &seed, eb)) < 0 ||
	    (rc = geti(c, "threads", 0, 1024, 0, &w->threads, eb)) < 0 ||
	    (rc = getf(c, "peak_flops", 0, 1e20, 0, &peak, eb)) < 0 ||
	    (rc = geti(c, "eval_every", 0, 1 << 30, 0, &w->eval_every, eb)) < 0 ||
	    (rc = geti(c, "eval_batches", 1, 1 << 16, 4, &w->eval_batches, eb)) < 0 ||
	    (rc = geti(c, "zero", 0, 3, 0, &w->zero, eb)) < 0 ||
	    (rc = geti(c, "hsdp_shard", 0, 1 << 20, 0, &w->hsdp_shard, eb)) < 0 ||
	    (rc = geti(c, "comm_timeout_ms", 100, 1 << 30, 60000, &tmo, eb)) < 0 ||
	    (rc = getf(c, "bucket_mb", 0.001, 4096, 1, &w->bucket_mb, eb)) < 0 ||
	    (rc = geti(c, "debug_stall_rank", -1, 1 << 30, -1, &w->stall_rank, eb)) < 0 ||
	    (rc = geti(c, "debug_stall_step", 0, 1 << 30, 0, &w->stall_step, eb)) < 0 ||
	    (rc = geti(c, "debug_slow_rank", -1, 1 << 30, -1, &w->slow_rank, eb)) < 0 ||
	    (rc = geti(c, "debug_slow_ms", 0, 3600000, 0, &w->slow_ms, eb)) < 0 ||
	    (rc = geti(c, "debug_ckpt_fail_rank", -1, 1 << 30, -1, &w->ckpt_fail_rank, eb)) < 0 ||
	    (rc = geti(c, "debug_ckpt_fail_step", 0, 1 << 30, 0, &w->ckpt_fail_step, eb)) < 0 ||
	    (rc = geti(c, "ckpt_every", 0, 1 << 30, 0, &w->ckpt_every, eb)) < 0 ||
	    (rc = geti(c, "ckpt_keep", 1, 1 << 20, 2, &w->ckpt_keep, eb)) < 0 ||
	    (rc = get_pipeline(c, w, eb)) < 0)
		return rc;
	if ((rc = get_choice(c, "moe_policy", moe_policies, &policy, eb)) < 0)
		return rc;
	mc->moe_dropless = policy && !strcmp(policy, "dropless");
	if ((rc = get_choice(c, "cp_algo", cp_algos, &cp_algo, eb)) < 0)
		return rc;
	if ((rc = get_choice(c, "resume", resumes, &resume, eb)) < 0)
		return rc;
	w->resume = !resume || !strcmp(resume, "auto");
	w->cp_algo = !cp_algo || !strcmp(cp_algo, "ring") ? MR_CP_RING
		     : !strcmp(cp_algo, "allgather")        ? MR_CP_ALLGATHER
							    : MR_CP_ULYSSES;
	w->comm_timeout_ms = tmo;
	w->sp = 0;
	w->overlap = 1;
	w->ckpt_async = 1;
	if (c && ((rc = mr_json_get_bool(c, "sequence_parallel", 0, &w->sp, eb)) < 0 ||
		  (rc = mr_json_get_bool(c, "ckpt_async", 0, &w->ckpt_async, eb)) < 0 ||
		  (rc = mr_json_get_bool(c, "debug_ckpt_fail_unmarked", 0, &w->ckpt_fail_unmarked,
					 eb)) < 0 ||
		  (rc = mr_json_get_str(c, "ckpt_dir", 0, 4095, &w->ckpt_dir, eb)) < 0 ||
		  (rc = mr_json_get_bool(c, "overlap_grad_reduce", 0, &w->overlap, eb)) < 0 ||
		  (rc = mr_json_get_str(c, "loss_log", 0, 4095, &w->loss_log, eb)) < 0 ||
		  (rc = mr_json_get_str(c, "save_weights", 0, 4095, &w->save_weights, eb)) < 0))
		return rc;
	if (w->ckpt_every > 0 && !w->ckpt_dir)
		return mr_errf_field(eb, MR_EINVAL, "ckpt_every",
				     "'ckpt_every' needs 'ckpt_dir' (where to write)");
	oc->total_steps = w->steps;
	w->seed = (uint64_t)seed;
	w->peak_flops = peak;
	if (mc->moe_every == 0) {
		mc->moe_dropless = 0;
		mc->n_experts = 0;
		mc->top_k = 0;
		mc->capacity_factor = 0.0f;
		mc->aux_coef = 0.0f;
	}
	return 0;
}

/* A string key that must be one of the NULL-terminated choices (NULL when
 * absent); the message names the key and the choices. */
static int get_choice(const json_t *c, const char *key, const char *const *choices,
		      const char **out, struct mr_errbuf *eb)
{
	char list[64] = "";
	int rc = c ? mr_json_get_str(c, key, 0, 16, out, eb) : 0;

	if (rc < 0 || !*out)
		return rc;
	for (int i = 0; choices[i]; i++) {
		if (!strcmp(*out, choices[i]))
			return 0;
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s\"%s\"",
			 i ? ", " : "", choices[i]);
	}
	return mr_errf_field(eb, MR_EINVAL, key, "'%s' must be one of %s, got \"%s\"", key, list,
			     *out);
}

int mr__gw_run_keys(const json_t *c, struct gw *w, struct mr_errbuf *eb)
{
	static const char *const devices[] = { "cpu", "cuda", NULL };
	static const char *const precisions[] = { "fp32", "bf16", NULL };
	static const char *const backends[] = { "auto", "host", "nccl", NULL };
	int rc;

	w->device = w->precision = w->comm_backend = NULL;
	if ((rc = get_choice(c, "device", devices, &w->device, eb)) < 0 ||
	    (rc = get_choice(c, "precision", precisions, &w->precision, eb)) < 0 ||
	    (rc = get_choice(c, "comm_backend", backends, &w->comm_backend, eb)) < 0)
		return rc;
	if (!w->device)
		w->device = "cpu";
	return 0;
}

int mr_gpt_worker_check_config(const json_t *c, struct mr_errbuf *eb)
{
	struct gw *w = calloc(1, sizeof(*w));
	struct mr_gpt_config mc;
	struct mr_adamw_config oc;
	const char *s = NULL;
	int B, T, rc;

	if (!w)
		return mr_errf(eb, MR_ENOMEM, "out of memory");
	rc = mr__gw_parse(c, &mc, &oc, w, &B, &T, eb);
	if (rc == 0)
		rc = mr__gw_run_keys(c, w, eb);
	if (rc == 0 && c)
		rc = mr_json_get_str(c, "train_data", 0, 255, &s, eb);
	if (rc == 0 && c)
		rc = mr_json_get_str(c, "val_data", 0, 255, &s, eb);
	free(w->pp_layers);
	free(w);
	return rc < 0 ? rc : 0;
}
