/*
 * gpt_worker_plan.c - the planner (plan/mr_plan.h) and a job's workload
 * config (this worker's keys, mr_gpt_worker.h): the inputs it describes,
 * and a plan written back into it - what `--mesh auto` runs.
 *
 * The config is checked as the worker checks it first, and read with the
 * worker's defaults. What it sets is fixed (zero, sequence_parallel,
 * pp_schedule, pp_virtual, cp_algo, hsdp_shard, recompute,
 * recompute_layers, offload, the micro-batch batch_size); the rest is
 * searched, and the plan's recompute and offload are written back with
 * its mesh. The global batch kept is the one a
 * pure data-parallel job of this world would train on (batch_size x
 * grad_accum x world sequences a step); a plan with dp replicas runs it as
 * grad_accum = global / (dp x batch_size), the same rows each step.
 * The model's family comes from "arch" with its keys (n_kv_head,
 * ffn_hidden, tie_embeddings, rope_theta); norm_eps and rope_scaling
 * change neither memory nor time, so they are checked (by the worker's
 * check) and not kept.
 *
 * Non-goals: the cluster (the caller's), pp_layers (an explicit split
 * fixes the pipeline: refused here, naming the key).
 */
#include <jansson.h>
#include <string.h>

#include "mr_gpt_worker.h"
#include "model/mr_gpt.h"
#include "mr_json.h"
#include "parallel/mr_pp_sched.h"
#include "plan/mr_plan.h"

static int geti(const json_t *c, const char *k, int def, int *out, struct mr_errbuf *eb)
{
	int64_t v = def;
	int rc = mr_json_get_int(c, k, 0, 0, 1 << 30, &v, eb);

	*out = (int)v;
	return rc;
}

static const char *gets(const json_t *c, const char *k)
{
	return json_string_value(json_object_get(c, k));
}

int mr_plan_from_workload(const struct json_t *cfg_, int world, struct mr_plan_input *in,
			  struct mr_errbuf *eb)
{
	const json_t *c = (const json_t *)cfg_;
	json_t *empty = NULL;
	struct mr_plan_model *m = &in->model;
	struct mr_plan_cluster keep = in->cluster;
	int B, accum, rc, v;
	double cf = 1.25, theta = 500000.0;
	const char *s;

	if ((rc = mr_gpt_worker_check_config(c, eb)) < 0)
		return rc;
	if (!c && !(c = empty = json_object()))
		return mr_errf(eb, MR_ENOMEM, "out of memory");
	mr_plan_input_init(in);
	in->cluster = keep;
	snprintf(m->name, sizeof(m->name), "workload");
	if (json_object_get(c, "pp_layers")) {
		rc = mr_errf_field(eb, MR_EINVAL, "pp_layers",
				   "'pp_layers' fixes the pipeline split: drop it to let the "
				   "planner choose the mesh");
		goto out;
	}
	if ((rc = geti(c, "vocab_size", 256, &m->vocab, eb)) < 0 ||
	    (rc = geti(c, "seq_len", 64, &m->seq_len, eb)) < 0 ||
	    (rc = geti(c, "max_seq", m->seq_len, &m->max_seq, eb)) < 0 ||
	    (rc = geti(c, "n_layer", 2, &m->n_layer, eb)) < 0 ||
	    (rc = geti(c, "d_model", 128, &m->d_model, eb)) < 0 ||
	    (rc = geti(c, "n_head", 4, &m->n_head, eb)) < 0 ||
	    (rc = geti(c, "moe_every", 0, &m->moe_every, eb)) < 0 ||
	    (rc = geti(c, "n_experts", 4, &m->n_experts, eb)) < 0 ||
	    (rc = geti(c, "top_k", 1, &m->top_k, eb)) < 0 ||
	    (rc = mr_json_get_double(c, "capacity_factor", 0, -1e9, 1e9, &cf, eb)) < 0 ||
	    (rc = geti(c, "batch_size", 8, &B, eb)) < 0 ||
	    (rc = geti(c, "grad_accum", 1, &accum, eb)) < 0 ||
	    (rc = geti(c, "threads", 1, &in->threads, eb)) < 0)
		goto out;
	m->capacity_factor = cf;
	m->arch = (s = gets(c, "arch")) && !strcmp(s, "llama") ? MR_ARCH_LLAMA : MR_ARCH_GPT2;
	if (m->arch == MR_ARCH_LLAMA &&
	    ((rc = geti(c, "n_kv_head", 0, &m->n_kv_head, eb)) < 0 ||
	     (rc = geti(c, "ffn_hidden", 0, &m->ffn_hidden, eb)) < 0 ||
	     (rc = mr_json_get_double(c, "rope_theta", 0, 1, 1e12, &theta, eb)) < 0))
		goto out;
	m->tie_embeddings = m->arch == MR_ARCH_LLAMA &&
			    json_is_true(json_object_get(c, "tie_embeddings"));
	m->rope_theta = m->arch == MR_ARCH_LLAMA ? theta : 0;
	m->dropless = (s = gets(c, "moe_policy")) && !strcmp(s, "dropless");
	if (!m->moe_every)
		m->n_experts = m->top_k = 0;
	if (in->threads < 1)
		in->threads = 1;
	in->global_batch = B * accum * (world > 0 ? world : 1);
	in->fix.micro_batch = B;
	in->prec = (s = gets(c, "precision")) ? (strcmp(s, "bf16") ? MR_PLAN_FP32 : MR_PLAN_BF16)
		   : (s = gets(c, "device")) && !strcmp(s, "cuda") ? MR_PLAN_BF16
								   : MR_PLAN_FP32;
	if (json_object_get(c, "zero") && (rc = geti(c, "zero", 0, &in->fix.zero, eb)) < 0)
		goto out;
	if (json_object_get(c, "sequence_parallel"))
		in->fix.sp = json_is_true(json_object_get(c, "sequence_parallel"));
	if ((rc = geti(c, "hsdp_shard", 0, &in->fix.hsdp_shard, eb)) < 0)
		goto out;
	if ((s = gets(c, "pp_schedule"))) {
		enum mr_pp_kind k;
		if ((rc = mr_pp_kind_parse(s, &k, eb)) < 0)
			goto out;
		in->fix.schedule = (int)k;
	}
	if (json_object_get(c, "pp_virtual") && (rc = geti(c, "pp_virtual", 1, &v, eb)) == 0)
		in->fix.v = v;
	if (rc < 0)
		goto out;
	if ((s = gets(c, "cp_algo")) && (rc = mr_plan_cp_algo_parse(s, &in->fix.cp_algo, eb)) < 0)
		goto out;
	/* recompute and offload: fixed when set, else searched (meshrun's
	 * search reaches for them only when nothing fits without) */
	if ((s = gets(c, "recompute")) &&
	    (rc = mr_plan_name_parse("recompute", s, &in->fix.recompute, eb)) < 0)
		goto out;
	if ((rc = geti(c, "recompute_layers", 0, &in->fix.recompute_layers, eb)) < 0)
		goto out;
	if ((s = gets(c, "offload")) &&
	    (rc = mr_plan_name_parse("offload", s, &in->fix.offload, eb)) < 0)
		goto out;
	rc = 0;
out:
	json_decref(empty);
	return rc;
}

int mr_plan_to_workload(const struct mr_plan_mesh *m, struct json_t *cfg_)
{
	json_t *c = (json_t *)cfg_;
	int rc = 0;

	rc |= json_object_set_new(c, "batch_size", json_integer(m->micro_batch));
	rc |= json_object_set_new(c, "grad_accum", json_integer(m->micro_batches));
	rc |= json_object_set_new(c, "zero", json_integer(m->zero));
	rc |= json_object_set_new(c, "sequence_parallel", json_boolean(m->sp));
	rc |= json_object_set_new(c, "recompute", json_string(mr_plan_rc_name(m->recompute)));
	if (m->recompute != MR_PLAN_RC_NONE && m->recompute_layers > 0)
		rc |= json_object_set_new(c, "recompute_layers",
					  json_integer(m->recompute_layers));
	else
		json_object_del(c, "recompute_layers");
	rc |= json_object_set_new(c, "offload", json_string(mr_plan_offload_name(m->offload)));
	if (m->pp > 1) {
		rc |= json_object_set_new(
			c, "pp_schedule",
			json_string(mr_pp_kind_name((enum mr_pp_kind)m->schedule)));
		rc |= json_object_set_new(c, "pp_virtual", json_integer(m->v));
	} else if (json_object_get(c, "pp_schedule")) {
		/* interleaved's default of 2 chunks needs a pipeline */
		rc |= json_object_set_new(c, "pp_virtual", json_integer(1));
	} else {
		json_object_del(c, "pp_virtual");
	}
	return rc ? MR_ENOMEM : 0;
}

void mr_plan_mesh_worker_defaults(struct mr_plan_mesh *m)
{
	m->zero = m->zero < 0 ? 0 : m->zero;
	m->sp = m->sp < 0 ? 0 : m->sp;
	m->schedule = m->schedule < 0 ? MR_PP_1F1B : m->schedule;
	m->recompute = m->recompute < 0 ? MR_PLAN_RC_NONE : m->recompute;
	m->recompute_layers = m->recompute_layers < 0 ? 0 : m->recompute_layers;
	m->offload = m->offload < 0 ? MR_PLAN_OFF_NONE : m->offload;
}
