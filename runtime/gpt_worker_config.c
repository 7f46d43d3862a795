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

static int get_choice(const json_t *c, const char *key, const char **out,
		      struct mr_errbuf *eb);

/* A number's default: the table's, or dyn where the table's is not a
 * number (max_seq's is seq_len, pp_virtual's the schedule's). */
static double default_of(const struct mr__gw_key *d, double dyn)
{
	char *end;
	double v = strtod(d->def, &end);

	return end != d->def && !*end ? v : dyn;
}

/* An integer key, bounds and default from the table (gpt_worker_keys.c);
 * dyn where its default is not a number. */
static int geti_dyn(const json_t *c, const char *k, int dyn, int *out, struct mr_errbuf *eb)
{
	const struct mr__gw_key *d = mr__gw_key(k);
	int64_t v = (int64_t)default_of(d, dyn);
	int rc = c ? mr_json_get_int(c, k, 0, (int64_t)d->lo, (int64_t)d->hi, &v, eb) : 0;

	*out = (int)v;
	return rc;
}

static int geti(const json_t *c, const char *k, int *out, struct mr_errbuf *eb)
{
	return geti_dyn(c, k, 0, out, eb);
}

static int getf(const json_t *c, const char *k, float *out, struct mr_errbuf *eb)
{
	const struct mr__gw_key *d = mr__gw_key(k);
	double v = default_of(d, 0);
	int rc = c ? mr_json_get_double(c, k, 0, d->lo, d->hi, &v, eb) : 0;

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
		const struct mr__gw_key *d = mr__gw_key("pp_layers");
		if (!json_is_integer(e) || json_integer_value(e) < (json_int_t)d->lo ||
		    json_integer_value(e) > (json_int_t)d->hi)
			return mr_errf_field(eb, MR_EINVAL, "pp_layers",
					     "'pp_layers' entry %zu must be an integer in [%.0f, "
					     "%.0f]",
					     i, d->lo, d->hi);
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
	if ((rc = geti_dyn(c, "pp_virtual", w->pp_kind == MR_PP_INTERLEAVED ? 2 : 1,
			   &w->pp_virtual, eb)) < 0)
		return rc;
	/* transfers: "auto" (paired where the backend needs it), "ahead", "paired" */
	name = NULL;
	if ((rc = get_choice(c, "pp_p2p", &name, eb)) < 0)
		return rc;
	w->pp_p2p = !name || !strcmp(name, "auto") ? -1 : !strcmp(name, "paired");
	return get_layers(c, w, eb);
}


/* The family and its keys (gpt2 ignores the llama ones). */
static int get_family(const json_t *c, struct mr_gpt_config *mc, struct mr_errbuf *eb)
{
	const char *arch = NULL, *scaling = NULL;
	struct mr_rope_scaling r;
	int rc;

	if ((rc = get_choice(c, "arch", &arch, eb)) < 0 ||
	    (rc = get_choice(c, "rope_scaling", &scaling, eb)) < 0 ||
	    (rc = geti(c, "n_kv_head", &mc->n_kv_head, eb)) < 0 ||
	    (rc = geti(c, "ffn_hidden", &mc->ffn_hidden, eb)) < 0 ||
	    (rc = getf(c, "norm_eps", &mc->norm_eps, eb)) < 0 ||
	    (rc = getf(c, "rope_theta", &mc->rope_theta, eb)) < 0)
		return rc;
	mc->tie_embeddings = 0;
	if (c && (rc = mr_json_get_bool(c, "tie_embeddings", 0, &mc->tie_embeddings, eb)) < 0)
		return rc;
	/* rope_scaling llama3's parameters, checked whether used or not */
	if ((rc = getf(c, "rope_factor", &r.factor, eb)) < 0 ||
	    (rc = getf(c, "rope_low_freq_factor", &r.low_freq_factor, eb)) < 0 ||
	    (rc = getf(c, "rope_high_freq_factor", &r.high_freq_factor, eb)) < 0 ||
	    (rc = geti(c, "rope_original_max_pos", &r.original_max_pos, eb)) < 0)
		return rc;
	mc->arch = arch && !strcmp(arch, "llama") ? MR_ARCH_LLAMA : MR_ARCH_GPT2;
	if (mc->arch == MR_ARCH_GPT2) { /* its config as before the family keys */
		mc->n_kv_head = mc->ffn_hidden = mc->tie_embeddings = 0;
		mc->norm_eps = mc->rope_theta = 0.0f;
	} else if (scaling && !strcmp(scaling, "llama3")) {
		if (!(r.high_freq_factor > r.low_freq_factor))
			return mr_errf_field(eb, MR_EINVAL, "rope_high_freq_factor",
					     "'rope_high_freq_factor' (%g) must exceed "
					     "'rope_low_freq_factor' (%g)",
					     (double)r.high_freq_factor, (double)r.low_freq_factor);
		mc->rope_scaling = r;
	}
	return 0;
}

int mr__gw_parse(const json_t *c, struct mr_gpt_config *mc, struct mr_adamw_config *oc,
		 struct gw *w, int *B, int *T, struct mr_errbuf *eb)
{
	const char *policy = NULL, *cp_algo = NULL, *resume = NULL, *schedule = NULL;
	const char *recompute = NULL, *offload = NULL;
	int rc = 0, seed = 1337, tmo = 60000;
	float peak = 0.0f;

	if (c && (rc = mr__gw_check_keys(c, eb)) < 0)
		return rc;
	memset(mc, 0, sizeof(*mc));
	memset(oc, 0, sizeof(*oc));
	if ((rc = geti(c, "vocab_size", &mc->vocab, eb)) < 0 ||
	    (rc = geti(c, "seq_len", T, eb)) < 0 ||
	    (rc = geti_dyn(c, "max_seq", *T, &mc->max_seq, eb)) < 0 ||
	    (rc = geti(c, "n_layer", &mc->n_layer, eb)) < 0 ||
	    (rc = geti(c, "d_model", &mc->d_model, eb)) < 0 ||
	    (rc = geti(c, "n_head", &mc->n_head, eb)) < 0 ||
	    (rc = geti(c, "moe_every", &mc->moe_every, eb)) < 0 ||
	    (rc = geti(c, "n_experts", &mc->n_experts, eb)) < 0 ||
	    (rc = geti(c, "top_k", &mc->top_k, eb)) < 0 ||
	    (rc = getf(c, "capacity_factor", &mc->capacity_factor, eb)) < 0 ||
	    (rc = getf(c, "aux_coef", &mc->aux_coef, eb)) < 0 ||
	    (rc = geti(c, "batch_size", B, eb)) < 0 ||
	    (rc = geti(c, "steps", &w->steps, eb)) < 0 ||
	    (rc = geti(c, "grad_accum", &w->accum, eb)) < 0 ||
	    (rc = getf(c, "lr", &oc->lr, eb)) < 0 ||
	    (rc = getf(c, "min_lr_frac", &oc->min_lr_frac, eb)) < 0 ||
	    (rc = geti(c, "warmup_steps", &oc->warmup_steps, eb)) < 0 ||
	    (rc = getf(c, "decay_frac", &oc->decay_frac, eb)) < 0 ||
	    (rc = getf(c, "beta1", &oc->beta1, eb)) < 0 ||
	    (rc = getf(c, "beta2", &oc->beta2, eb)) < 0 ||
	    (rc = getf(c, "eps", &oc->eps, eb)) < 0 ||
	    (rc = getf(c, "weight_decay", &oc->weight_decay, eb)) < 0 ||
	    (rc = getf(c, "grad_clip", &oc->grad_clip, eb)) < 0 ||
	    (rc = geti(c, "seed", &seed, eb)) < 0 ||
	    (rc = geti(c, "threads", &w->threads, eb)) < 0 ||
	    (rc = getf(c, "peak_flops", &peak, eb)) < 0 ||
	    (rc = geti_dyn(c, "eval_every", -1, &w->eval_every, eb)) < 0 || /* -1: unset */
	    (rc = geti(c, "eval_batches", &w->eval_batches, eb)) < 0 ||
	    (rc = geti(c, "log_every", &w->log_every, eb)) < 0 ||
	    (rc = geti(c, "profile_step", &w->profile_step, eb)) < 0 ||
	    (rc = geti(c, "zero", &w->zero, eb)) < 0 ||
	    (rc = geti(c, "hsdp_shard", &w->hsdp_shard, eb)) < 0 ||
	    (rc = geti(c, "comm_timeout_ms", &tmo, eb)) < 0 ||
	    (rc = getf(c, "bucket_mb", &w->bucket_mb, eb)) < 0 ||
	    (rc = geti(c, "debug_stall_rank", &w->stall_rank, eb)) < 0 ||
	    (rc = geti(c, "debug_stall_step", &w->stall_step, eb)) < 0 ||
	    (rc = geti(c, "debug_slow_rank", &w->slow_rank, eb)) < 0 ||
	    (rc = geti(c, "debug_slow_ms", &w->slow_ms, eb)) < 0 ||
	    (rc = geti(c, "debug_ckpt_fail_rank", &w->ckpt_fail_rank, eb)) < 0 ||
	    (rc = geti(c, "debug_ckpt_fail_step", &w->ckpt_fail_step, eb)) < 0 ||
	    (rc = geti(c, "debug_ckpt_publish_delay_ms", &w->ckpt_publish_delay_ms, eb)) < 0 ||
	    (rc = geti(c, "ckpt_every", &w->ckpt_every, eb)) < 0 ||
	    (rc = geti(c, "ckpt_keep", &w->ckpt_keep, eb)) < 0 ||
	    (rc = get_pipeline(c, w, eb)) < 0)
		return rc;
	if ((rc = get_choice(c, "moe_policy", &policy, eb)) < 0 ||
	    (rc = get_choice(c, "lr_schedule", &schedule, eb)) < 0)
		return rc;
	if (schedule)
		mr_lr_schedule_parse(schedule, &oc->schedule); /* one of the choices */
	mc->moe_dropless = policy && !strcmp(policy, "dropless");
	mc->moe_norm_topk = 0; /* absent: top_k's default */
	if (c && json_object_get(c, "moe_norm_topk")) {
		int norm = 0;

		if ((rc = mr_json_get_bool(c, "moe_norm_topk", 0, &norm, eb)) < 0)
			return rc;
		mc->moe_norm_topk = norm ? 1 : -1;
	}
	if ((rc = get_family(c, mc, eb)) < 0)
		return rc;
	if ((rc = get_choice(c, "cp_algo", &cp_algo, eb)) < 0)
		return rc;
	if ((rc = get_choice(c, "resume", &resume, eb)) < 0 ||
	    (rc = get_choice(c, "recompute", &recompute, eb)) < 0 ||
	    (rc = get_choice(c, "offload", &offload, eb)) < 0 ||
	    (rc = geti(c, "recompute_layers", &w->recompute_layers, eb)) < 0)
		return rc;
	w->recompute = !recompute || !strcmp(recompute, "none") ? MR_GPT_RC_NONE
		       : !strcmp(recompute, "selective")         ? MR_GPT_RC_SELECTIVE
								 : MR_GPT_RC_FULL;
	w->offload = !offload || !strcmp(offload, "none") ? MR_DP_OFFLOAD_NONE
		     : !strcmp(offload, "optimizer")       ? MR_DP_OFFLOAD_OPTIM
							   : MR_DP_OFFLOAD_MASTER;
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

/* A string key that must be one of the table's choices (NULL when
 * absent); the message names the key and the choices. */
static int get_choice(const json_t *c, const char *key, const char **out,
		      struct mr_errbuf *eb)
{
	const char *choices = mr__gw_key(key)->choices, *p = choices;
	char list[128] = "";
	int rc = c ? mr_json_get_str(c, key, 0, 32, out, eb) : 0;

	if (rc < 0 || !*out)
		return rc;
	while (*p) {
		size_t n = strcspn(p, "|");
		if (strlen(*out) == n && !strncmp(*out, p, n))
			return 0;
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s\"%.*s\"",
			 p == choices ? "" : ", ", (int)n, p);
		p += n + (p[n] == '|');
	}
	return mr_errf_field(eb, MR_EINVAL, key, "'%s' must be one of %s, got \"%s\"", key, list,
			     *out);
}

int mr__gw_run_keys(const json_t *c, struct gw *w, struct mr_errbuf *eb)
{
	int rc;

	w->device = w->precision = w->comm_backend = NULL;
	if ((rc = get_choice(c, "device", &w->device, eb)) < 0 ||
	    (rc = get_choice(c, "precision", &w->precision, eb)) < 0 ||
	    (rc = get_choice(c, "comm_backend", &w->comm_backend, eb)) < 0)
		return rc;
	if (!w->device)
		w->device = "cpu";
	w->tensorboard_dir = NULL;
	if (c && (rc = mr_json_get_str(c, "tensorboard_dir", 0, 4095, &w->tensorboard_dir, eb)) < 0)
		return rc;
	if (w->tensorboard_dir && !w->tensorboard_dir[0])
		w->tensorboard_dir = NULL;
	return mr_dev_check_precision(w->device, w->precision, eb);
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
