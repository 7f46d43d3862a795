/*
 * plan_rules.c - which inputs and meshes the planner takes: the inputs'
 * bounds (mr_plan_check), the rules every mesh obeys (mr_plan_mesh_check)
 * and a table of what each implementation refuses today.
 *
 * The table is the one place a mode landing in the runtime changes: when
 * expert parallelism came to run under ZeRO, its row went (and the
 * experts' own shards joined plan_mem.c's layout), and when meshrun
 * learnt to recompute activations, its "no recomputation" row went;
 * context parallel's algorithms are rows of plan_cp.c's table, Ulysses
 * the latest.
 *
 * Non-goals: costs (plan_mem.c, plan_time.c).
 */
#include <stdio.h>
#include <string.h>

#include "plan_int.h"

/* ---- inputs ---------------------------------------------------------------- */

static int in_range(struct mr_errbuf *eb, const char *f, double v, double lo, double hi)
{
	if (v >= lo && v <= hi)
		return 0;
	return mr_errf_field(eb, MR_EINVAL, f, "%s: %g is out of range [%g, %g]", f, v, lo, hi);
}

int mr_plan_check(const struct mr_plan_input *in, struct mr_errbuf *eb)
{
	const struct mr_plan_model *m = &in->model;
	const struct mr_plan_cluster *c = &in->cluster;
	int rc;

	if ((rc = in_range(eb, "n_layer", m->n_layer, 1, 1024)) < 0 ||
	    (rc = in_range(eb, "d_model", m->d_model, 1, 65536)) < 0 ||
	    (rc = in_range(eb, "n_head", m->n_head, 1, 65536)) < 0 ||
	    (rc = in_range(eb, "vocab_size", m->vocab, 2, 1 << 20)) < 0 ||
	    (rc = in_range(eb, "seq_len", m->seq_len, 1, 1 << 20)) < 0 ||
	    (rc = in_range(eb, "max_seq", m->max_seq, 0, 1 << 20)) < 0 ||
	    (rc = in_range(eb, "global_batch", in->global_batch, 1, 1 << 24)) < 0 ||
	    (rc = in_range(eb, "gpus", c->gpus, 1, 1 << 20)) < 0 ||
	    (rc = in_range(eb, "gpus_per_node", c->gpus_per_node, 1, 1 << 16)) < 0 ||
	    (rc = in_range(eb, "mem_gb", c->mem_bytes / 1e9, 1e-6, 1e6)) < 0 ||
	    (rc = in_range(eb, "reserve_gb", c->reserve_bytes / 1e9, 0, c->mem_bytes / 1e9)) < 0 ||
	    (rc = in_range(eb, "peak_tflops", c->peak_flops / 1e12, 1e-6, 1e6)) < 0 ||
	    (rc = in_range(eb, "mfu", c->mfu, 1e-3, 1)) < 0 ||
	    (rc = in_range(eb, "mem_bw_gbs", c->mem_bw / 1e9, 1e-3, 1e6)) < 0 ||
	    (rc = in_range(eb, "overlap", c->overlap, 0, 1)) < 0 ||
	    (rc = in_range(eb, "bw_intra_gbs", c->bw_intra / 1e9, 1e-6, 1e6)) < 0 ||
	    (rc = in_range(eb, "bw_inter_gbs", c->bw_inter / 1e9, 1e-6, 1e6)) < 0 ||
	    (rc = in_range(eb, "lat_intra_us", c->lat_intra * 1e6, 0, 1e6)) < 0 ||
	    (rc = in_range(eb, "lat_inter_us", c->lat_inter * 1e6, 0, 1e6)) < 0 ||
	    (rc = in_range(eb, "host_bw_gbs", c->host_bw / 1e9, 0, 1e6)) < 0 ||
	    (rc = in_range(eb, "pcie_bw_gbs", c->pcie_bw / 1e9, 0, 1e6)) < 0 ||
	    (rc = in_range(eb, "threads", in->threads, 1, 1024)) < 0)
		return rc;
	if (in->topo && (long)in->topo->nodes * c->gpus_per_node != c->gpus)
		return mr_errf_field(eb, MR_EINVAL, "topology_file",
				     "topology_file: %d nodes x gpus_per_node %d is not gpus %d",
				     in->topo->nodes, c->gpus_per_node, c->gpus);
	if (m->d_model % m->n_head != 0)
		return mr_errf_field(eb, MR_EINVAL, "n_head",
				     "n_head: %d does not divide d_model %d", m->n_head, m->d_model);
	if (m->max_seq && m->max_seq < m->seq_len)
		return mr_errf_field(eb, MR_EINVAL, "max_seq",
				     "max_seq: %d is below seq_len %d", m->max_seq, m->seq_len);
	if (m->arch != MR_ARCH_GPT2 && m->arch != MR_ARCH_LLAMA)
		return mr_errf_field(eb, MR_EINVAL, "arch", "arch: %d is not a model family",
				     m->arch);
	if (m->arch == MR_ARCH_LLAMA) {
		if ((rc = in_range(eb, "n_kv_head", m->n_kv_head, 0, m->n_head)) < 0 ||
		    (rc = in_range(eb, "ffn_hidden", m->ffn_hidden, 0, 1 << 20)) < 0)
			return rc;
		if (m->n_kv_head && m->n_head % m->n_kv_head)
			return mr_errf_field(eb, MR_EINVAL, "n_kv_head",
					     "n_kv_head: %d does not divide n_head %d",
					     m->n_kv_head, m->n_head);
	}
	if (m->moe_every) {
		if ((rc = in_range(eb, "moe_every", m->moe_every, 0, m->n_layer)) < 0 ||
		    (rc = in_range(eb, "n_experts", m->n_experts, 1, 1024)) < 0 ||
		    (rc = in_range(eb, "top_k", m->top_k, 1, 2)) < 0 ||
		    (rc = in_range(eb, "top_k", m->top_k, 1, m->n_experts)) < 0 ||
		    (rc = in_range(eb, "capacity_factor", m->capacity_factor, 1e-3, 1e3)) < 0)
			return rc;
	}
	if (in->impl < 0 || in->impl >= MR_PLAN__IMPLS)
		return mr_errf_field(eb, MR_EINVAL, "impl", "impl: %d is unknown", in->impl);
	if (in->prec < 0 || in->prec >= MR_PLAN__PRECS)
		return mr_errf_field(eb, MR_EINVAL, "precision", "precision: %d is unknown",
				     in->prec);
	if (in->fix.zero > 3 || in->fix.recompute >= MR_PLAN__RCS ||
	    in->fix.schedule >= MR_PP__KIND_COUNT || in->fix.offload >= MR_PLAN__OFFS)
		return mr_errf_field(eb, MR_EINVAL,
				     in->fix.zero > 3 ? "zero"
				     : in->fix.recompute >= MR_PLAN__RCS ? "recompute"
				     : in->fix.offload >= MR_PLAN__OFFS	 ? "offload"
									 : "schedule",
				     "a fixed zero, recompute, offload or schedule is out of range");
	if ((rc = in_range(eb, "recompute_layers", in->fix.recompute_layers, 0, m->n_layer)) < 0)
		return rc;
	return 0;
}

/* ---- what an implementation refuses -------------------------------------- */

struct rule {
	int impl;               /* MR_PLAN__IMPLS: every implementation */
	const char *field;
	int (*refuses)(const struct mr_plan_input *in, const struct mr_plan_mesh *m);
	const char *why;
};

static int recompute_layers(const struct mr_plan_input *in, const struct mr_plan_mesh *m)
{
	(void)in;
	return m->recompute != MR_PLAN_RC_NONE && m->recompute_layers > 0;
}

static int offloads(const struct mr_plan_input *in, const struct mr_plan_mesh *m)
{
	(void)in;
	return m->offload != MR_PLAN_OFF_NONE;
}

/* fp32 on a GPU computes with the weights the optimizer updates: there is
 * no separate master copy to move */
static int fp32_master(const struct mr_plan_input *in, const struct mr_plan_mesh *m)
{
	return m->offload == MR_PLAN_OFF_MASTER && in->prec == MR_PLAN_FP32 && !in->cluster.cpu;
}

static int ep_hsdp(const struct mr_plan_input *in, const struct mr_plan_mesh *m)
{
	(void)in;
	return m->ep > 1 && m->hsdp_shard > 0 && m->hsdp_shard < m->dp;
}

static int cp_hsdp(const struct mr_plan_input *in, const struct mr_plan_mesh *m)
{
	(void)in;
	return m->cp > 1 && m->hsdp_shard > 0 && m->hsdp_shard < m->dp;
}

static int mixed(const struct mr_plan_input *in, const struct mr_plan_mesh *m)
{
	(void)m;
	return in->prec == MR_PLAN_MIXED;
}

static int bf16_copy(const struct mr_plan_input *in, const struct mr_plan_mesh *m)
{
	(void)m;
	return in->prec == MR_PLAN_BF16;
}

/* an offloaded step on GPUs needs the host's figures (the presets have them) */
static int no_host_link(const struct mr_plan_input *in, const struct mr_plan_mesh *m)
{
	return m->offload != MR_PLAN_OFF_NONE && !in->cluster.cpu &&
	       (in->cluster.host_bw <= 0 || in->cluster.pcie_bw <= 0);
}

static const struct rule rules[] = {
	{ MR_PLAN_MEGATRON, "recompute_layers", recompute_layers,
	  "Megatron-LM is priced with every layer recomputing (Korthikanti et al.)" },
	{ MR_PLAN_MEGATRON, "offload", offloads,
	  "Megatron-LM as its papers describe it keeps the optimizer state on the GPU" },
	{ MR_PLAN_MESHRUN, "offload", fp32_master,
	  "fp32 weights are the ones the GPU computes with, no master copy to move "
	  "(precision bf16, or offload optimizer)" },
	{ MR_PLAN_MESHRUN, "hsdp_shard", ep_hsdp,
	  "expert parallelism runs without HSDP so far" },
	{ MR_PLAN_MESHRUN, "hsdp_shard", cp_hsdp, "HSDP with cp > 1 is not implemented yet" },
	{ MR_PLAN_MESHRUN, "precision", mixed,
	  "meshrun keeps fp32 master weights and gradients: precision fp32 or bf16" },
	{ MR_PLAN__IMPLS, "host_bw_gbs", no_host_link,
	  "offload needs the cluster's host memory and PCIe bandwidths" },
	{ MR_PLAN_MEGATRON, "precision", bf16_copy,
	  "bf16 is meshrun's layout; Megatron-LM's mixed precision is \"mixed\"" },
};

int mr__plan_rules(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
		   struct mr_errbuf *eb)
{
	const struct mr__plan_cp *cp = mr__plan_cp(m->cp_algo);
	const char *f;

	if (m->cp > 1 && !cp)
		return mr_errf_field(eb, MR_ENOTSUP, "cp_algo", "cp_algo: %d is unknown",
				     m->cp_algo);
	if (m->cp > 1 && (f = cp->refuses(in, m))) {
		struct mr__plan_dims d;
		int kv = !strcmp(f, "n_kv_head");
		mr__plan_dims(&in->model, &d);
		return mr_errf_field(eb, MR_EINVAL, f, "%s: %s (%d %sheads, tp %d, cp %d)", f,
				     cp->why, kv ? d.kv_heads : in->model.n_head,
				     kv ? "key/value " : "", m->tp, m->cp);
	}
	for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++) {
		const struct rule *r = &rules[i];
		if ((r->impl == MR_PLAN__IMPLS || r->impl == (int)in->impl) && r->refuses(in, m))
			return mr_errf_field(eb, MR_ENOTSUP, r->field, "%s: %s (%s)", r->field,
					     r->why, mr_plan_impl_name(in->impl));
	}
	return 0;
}

/* ---- the rules of every mesh ------------------------------------------------ */

static int bad(struct mr_errbuf *eb, const char *field, const char *fmt, int a, int b)
{
	char msg[160];

	snprintf(msg, sizeof(msg), fmt, a, b);
	return mr_errf_field(eb, MR_EINVAL, field, "%s: %s", field, msg);
}

/* The pipeline part of a mesh: schedule, chunks and micro-batches. */
static int check_pipeline(const struct mr_plan_input *in, struct mr_plan_mesh *m,
			  struct mr_errbuf *eb)
{
	struct mr_pp_spec sp;

	if (m->pp == 1) {
		m->schedule = MR_PP_1F1B;
		m->v = 1;
		return 0;
	}
	if (m->schedule < 0 || m->schedule >= MR_PP__KIND_COUNT)
		return bad(eb, "schedule", "unknown schedule %d%.0d", m->schedule, 0);
	if (m->v < 1)
		m->v = m->schedule == MR_PP_INTERLEAVED ? 2 : 1;
	if (m->pp * m->v > in->model.n_layer)
		return bad(eb, m->v > 1 ? "v" : "pp",
			   "%d virtual stages need a layer each, the model has %d", m->pp * m->v,
			   in->model.n_layer);
	if ((m->schedule == MR_PP_1F1B || m->schedule == MR_PP_ZBH1) &&
	    m->micro_batches < m->pp)
		return bad(eb, "micro_batches", "%d micro-batches are fewer than pp %d",
			   m->micro_batches, m->pp);
	mr__plan_pp_spec(m, &sp);
	return mr_pp_check(&sp, eb);
}

int mr_plan_mesh_check(const struct mr_plan_input *in, struct mr_plan_mesh *m,
		       struct mr_errbuf *eb)
{
	const struct mr_plan_model *md = &in->model;
	int world = in->cluster.gpus, mp, rc, T = md->seq_len;

	if (m->tp < 1 || m->cp < 1 || m->pp < 1 || m->ep < 1)
		return bad(eb, "tp", "tp, cp, pp and ep must be >= 1 (tp %d, pp %d)", m->tp,
			   m->pp);
	if (md->n_head % m->tp)
		return bad(eb, "tp", "tp %d does not divide the %d heads", m->tp, md->n_head);
	if (md->arch == MR_ARCH_LLAMA) {
		struct mr__plan_dims d;
		mr__plan_dims(md, &d);
		/* whole key/value heads per rank: split, or replicated when tp is
		 * a multiple of them (mr_gpt_kv_rep) */
		if (d.kv_heads % m->tp && m->tp % d.kv_heads)
			return bad(eb, "tp",
				   "tp %d neither divides the %d key/value heads nor is a "
				   "multiple of them", m->tp, d.kv_heads);
		if ((int)d.ffn % m->tp)
			return bad(eb, "tp", "tp %d does not divide the SwiGLU hidden size %d",
				   m->tp, (int)d.ffn);
	}
	if (m->tp > in->cluster.gpus_per_node)
		return bad(eb, "tp", "tp %d does not fit in a node of %d GPUs", m->tp,
			   in->cluster.gpus_per_node);
	mp = m->tp * m->cp * m->pp;
	if (m->dp == 0 && world % mp == 0)
		m->dp = world / mp;
	if (m->dp < 1 || m->dp * mp != world)
		return bad(eb, "dp", "tp*cp*pp*dp must be the %d GPUs (tp*cp*pp = %d)", world, mp);
	if (m->sp < 0 || m->sp > 1 || (m->sp && m->tp == 1))
		return bad(eb, "sp", "sequence parallel needs tp > 1 (tp %d, sp %d)", m->tp, m->sp);
	if (m->cp > 1 && T % (2 * m->cp))
		return bad(eb, "cp", "2 * cp (%d) does not divide seq_len %d", 2 * m->cp, T);
	if (m->sp && (T / m->cp) % m->tp)
		return bad(eb, "sp", "seq_len / cp (%d) is not divisible by tp %d", T / m->cp,
			   m->tp);
	if (m->ep > 1 && !md->moe_every)
		return bad(eb, "ep", "ep %d needs a MoE model%.0d", m->ep, 0);
	if (m->ep > 1 && (md->n_experts % m->ep || (m->dp * m->cp) % m->ep))
		return bad(eb, "ep", "ep %d must divide the experts (%d) and dp*cp", m->ep,
			   md->n_experts);
	if (m->hsdp_shard < 0 || (m->hsdp_shard > 0 && m->dp % m->hsdp_shard))
		return bad(eb, "hsdp_shard", "%d does not divide dp %d", m->hsdp_shard, m->dp);
	if (m->zero < 0 || m->zero > 3)
		return bad(eb, "zero", "stage %d is not 0..3%.0d", m->zero, 0);
	if (m->recompute < 0 || m->recompute >= MR_PLAN__RCS)
		return bad(eb, "recompute", "mode %d is unknown%.0d", m->recompute, 0);
	if (m->recompute_layers < 0 || m->recompute_layers > md->n_layer)
		return bad(eb, "recompute_layers", "%d is outside [0, %d layers]",
			   m->recompute_layers, md->n_layer);
	if (m->offload < 0 || m->offload >= MR_PLAN__OFFS)
		return bad(eb, "offload", "mode %d is unknown%.0d", m->offload, 0);
	if (m->micro_batch < 1 || in->global_batch % (m->dp * m->micro_batch))
		return bad(eb, "micro_batch",
			   "dp %d x micro-batch %d does not divide the global batch", m->dp,
			   m->micro_batch);
	m->micro_batches = in->global_batch / (m->dp * m->micro_batch);
	if ((rc = check_pipeline(in, m, eb)) < 0)
		return rc;
	return mr__plan_rules(in, m, eb);
}
