/*
 * plan.c - `meshrun plan`: the mesh to run a model on a cluster with,
 * before launch (runtime/plan/mr_plan.h has the memory and time model).
 *
 *   meshrun plan --model gpt2-1.5b --cluster h100 --gpus 16 --global-batch 512
 *   meshrun plan --model gpt3-175b --cluster a100-80g --gpus 1536 --global-batch 1536 \
 *       --impl megatron --precision mixed --recompute full --micro-batch 1
 *   meshrun plan --workload-config job.json --cluster local --gpus 4
 *   meshrun plan --model gpt2-350m --gpus 16 --global-batch 256 --explain tp=2,pp=2,dp=4,mb=4
 *   meshrun plan --model llama3-8b --gpus 1 --global-batch 8 --offload optimizer+master \
 *       --recompute full
 *   meshrun plan --config inputs.json       (the options as JSON keys)
 *
 * Prints the best plans that fit, ranked by predicted step time; with
 * --explain MESH, that mesh's ranks (common/mr_mesh.h's table), each
 * stage's layers and memory, and each mode's communication per step.
 * Exit 0 with a plan, 1 when nothing fits or no mesh is valid (the
 * closest plan and what limits it are printed), 2 for bad input (the
 * message names the flag).
 *
 * Non-goals: launching (`meshrun local --mesh auto`, the agent's --mesh
 * auto).
 */
#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mr_cli.h"
#include "mr_config.h"
#include "mr_gpt_worker.h"
#include "mr_mesh.h"
#include "model/mr_gpt.h"
#include "parallel/mr_pp_sched.h"
#include "plan/mr_plan.h"

struct plan_opts {
	char model[64], cluster[32], workload_config[4096], explain[256], topology_file[1024];
	int n_layer, d_model, n_head, vocab, seq_len, moe_every, n_experts, top_k, dropless;
	double capacity_factor;
	int gpus, gpus_per_node, threads;
	double mem_gb, reserve_gb, peak_tflops, mfu, mem_bw, overlap, bw_intra, bw_inter, lat_intra, lat_inter;
	double bw_cross, lat_cross, host_bw, pcie_bw;
	int global_batch, micro_batch, impl, precision, zero, recompute, sp, schedule, v;
	int recompute_layers, offload;
	int tp, pp, cp, ep, hsdp_shard, cp_algo, top, presets;
};

static const char *const impls[] = { "meshrun", "megatron", NULL };
static const char *const precs[] = { "auto", "fp32", "bf16", "mixed", NULL };
static const char *const rcs[] = { "auto", "none", "selective", "full", NULL };
static const char *const offs[] = { "auto", "none", "optimizer", "optimizer+master", NULL };
static const char *const sps[] = { "auto", "off", "on", NULL };
static const char *const scheds[] = { "auto", "gpipe", "1f1b", "interleaved", "zb-h1", NULL };
static const char *const algos[] = { "ring", "allgather", "ulysses", NULL };

#define O struct plan_opts
static const struct mr_config_opt plan_table[] = {
	MR_CONFIG_STRING("model", O, model, NULL,
			 "A named model (see --presets); the sizes below override it."),
	MR_CONFIG_INT("n_layer", O, n_layer, "0", 0, 1024, "Transformer blocks."),
	MR_CONFIG_INT("d_model", O, d_model, "0", 0, 65536, "Hidden size."),
	MR_CONFIG_INT("n_head", O, n_head, "0", 0, 65536, "Attention heads."),
	MR_CONFIG_INT("vocab", O, vocab, "0", 0, 1 << 20, "Vocabulary size."),
	MR_CONFIG_INT("seq_len", O, seq_len, "0", 0, 1 << 20, "Sequence length."),
	MR_CONFIG_INT("moe_every", O, moe_every, "-1", -1, 1024,
		      "MoE MLP on every k-th layer; 0 dense; -1 the preset's."),
	MR_CONFIG_INT("n_experts", O, n_experts, "0", 0, 1024, "Experts of a MoE layer."),
	MR_CONFIG_INT("top_k", O, top_k, "0", 0, 2, "Experts per token (1 or 2)."),
	MR_CONFIG_DOUBLE("capacity_factor", O, capacity_factor, "0", 0, 1000,
			 "Expert capacity factor; 0 the preset's (1.25)."),
	MR_CONFIG_BOOL("dropless", O, dropless, "false", "MoE experts take every routed token."),
	MR_CONFIG_STRING("workload_config", O, workload_config, NULL,
			 "The job's workload config (inline JSON or a file, as `meshrun local` "
			 "takes it) instead of --model: its model, micro-batch, precision and "
			 "fixed choices; the global batch of a pure data-parallel job of --gpus "
			 "ranks. What --mesh auto plans from."),
	MR_CONFIG_STRING("cluster", O, cluster, "h100",
			 "A named cluster (see --presets), or local: this machine."),
	MR_CONFIG_INT("gpus", O, gpus, "8", 1, 1 << 20, "GPUs (ranks) of the job."),
	MR_CONFIG_INT("gpus_per_node", O, gpus_per_node, "0", 0, 1 << 16,
		      "GPUs per node; 0 the cluster's."),
	MR_CONFIG_STRING("topology_file", O, topology_file, NULL,
			 "Where the nodes sit: one topology path per node in pod-index order "
			 "(block-0/rack-3/node-12), or 'LEVEL COUNT' lines widest first; ranks "
			 "follow rank_order topology, and groups that span narrowest domains "
			 "run at bw_cross. Sets gpus to nodes x gpus_per_node unless given."),
	MR_CONFIG_DOUBLE("bw_cross_gbs", O, bw_cross, "0", 0, 1e6,
			 "Per-GPU link between narrowest domains of the topology, GB/s; 0 "
			 "bw_inter's (a non-blocking fabric)."),
	MR_CONFIG_DOUBLE("lat_cross_us", O, lat_cross, "-1", -1, 1e6,
			 "Latency between narrowest domains, us; -1 lat_inter's."),
	MR_CONFIG_DOUBLE("mem_gb", O, mem_gb, "0", 0, 1e6, "Memory per GPU, GB; 0 the cluster's."),
	MR_CONFIG_DOUBLE("reserve_gb", O, reserve_gb, "0", 0, 1e6,
			 "Memory per GPU kept from the model (CUDA context, allocator), GB."),
	MR_CONFIG_DOUBLE("peak_tflops", O, peak_tflops, "0", 0, 1e6,
			 "Dense peak per GPU, TFLOP/s; 0 the cluster's."),
	MR_CONFIG_DOUBLE("mfu", O, mfu, "0", 0, 1,
			 "Fraction of peak the compute reaches; 0 the cluster's."),
	MR_CONFIG_DOUBLE("mem_bw_gbs", O, mem_bw, "0", 0, 1e6,
			 "Memory bandwidth per GPU (the optimizer's pace), GB/s; 0 the cluster's."),
	MR_CONFIG_DOUBLE("overlap", O, overlap, "-1", -1, 1,
			 "How much of the overlappable communication compute hides, 0..1; -1 "
			 "the cluster's (1 on GPUs, 0 on the local CPU ranks)."),
	MR_CONFIG_DOUBLE("bw_intra_gbs", O, bw_intra, "0", 0, 1e6,
			 "Intra-node collective bandwidth per GPU, GB/s; 0 the cluster's."),
	MR_CONFIG_DOUBLE("bw_inter_gbs", O, bw_inter, "0", 0, 1e6,
			 "Inter-node bandwidth per GPU, GB/s; 0 the cluster's."),
	MR_CONFIG_DOUBLE("lat_intra_us", O, lat_intra, "-1", -1, 1e6,
			 "Intra-node latency per step, us; -1 the cluster's."),
	MR_CONFIG_DOUBLE("lat_inter_us", O, lat_inter, "-1", -1, 1e6,
			 "Inter-node latency per step, us; -1 the cluster's."),
	MR_CONFIG_DOUBLE("host_bw_gbs", O, host_bw, "0", 0, 1e6,
			 "A GPU's share of host memory bandwidth (an offloaded optimizer "
			 "step's pace), GB/s; 0 the cluster's."),
	MR_CONFIG_DOUBLE("pcie_bw_gbs", O, pcie_bw, "0", 0, 1e6,
			 "GPU <-> host bandwidth each way (offload's copies), GB/s; 0 the "
			 "cluster's."),
	MR_CONFIG_INT("threads", O, threads, "1", 1, 1024,
		      "Threads per rank (the local cluster's peak; cpu workspace)."),
	MR_CONFIG_INT("global_batch", O, global_batch, "0", 0, 1 << 24,
		      "Sequences per optimizer step (required without --workload-config)."),
	MR_CONFIG_INT("micro_batch", O, micro_batch, "0", 0, 1 << 20,
		      "Sequences per micro-batch on a rank; 0 searched."),
	MR_CONFIG_ENUM("impl", O, impl, "meshrun", impls,
		       "Whose memory layout and overlap to model: meshrun (this runtime) or "
		       "megatron (Megatron-LM as its papers describe it)."),
	MR_CONFIG_ENUM("precision", O, precision, "auto", precs,
		       "fp32, bf16 (meshrun on cuda) or mixed (16-bit + fp32 Adam, 16 bytes "
		       "per parameter); auto: fp32 on the local cluster, bf16 for meshrun, "
		       "mixed for megatron."),
	MR_CONFIG_INT("zero", O, zero, "-1", -1, 3, "ZeRO stage; -1 searched."),
	MR_CONFIG_ENUM("recompute", O, recompute, "auto", rcs,
		       "Activation recomputation: none, selective (meshrun: the norms and "
		       "GELU / SwiGLU; megatron: the attention core) or full; auto searched "
		       "(meshrun: only when nothing fits without)."),
	MR_CONFIG_INT("recompute_layers", O, recompute_layers, "0", 0, 1024,
		      "meshrun: only the first this many blocks of each pipeline chunk "
		      "recompute; 0 every block."),
	MR_CONFIG_ENUM("offload", O, offload, "none", offs,
		       "meshrun on GPUs: keep the AdamW moments (optimizer), and the fp32 "
		       "master (optimizer+master), in host memory, stepped by the CPU; auto "
		       "searched when nothing fits without. A workload config's own key (or "
		       "its absence: searched) applies unless this is given."),
	MR_CONFIG_ENUM("sp", O, sp, "auto", sps, "Sequence parallel with tp > 1."),
	MR_CONFIG_ENUM("schedule", O, schedule, "auto", scheds, "Pipeline schedule."),
	MR_CONFIG_INT("pp_virtual", O, v, "0", 0, 64,
		      "Model chunks per stage for interleaved; 0: 2."),
	MR_CONFIG_INT("tp", O, tp, "0", 0, 1 << 20, "Fix tp; 0 searched."),
	MR_CONFIG_INT("pp", O, pp, "0", 0, 1 << 20, "Fix pp; 0 searched."),
	MR_CONFIG_INT("cp", O, cp, "0", 0, 1 << 20, "Fix cp; 0 searched."),
	MR_CONFIG_INT("ep", O, ep, "0", 0, 1 << 20, "Fix ep; 0 searched."),
	MR_CONFIG_INT("hsdp_shard", O, hsdp_shard, "0", 0, 1 << 20,
		      "HSDP: shard within groups of this many dp ranks."),
	MR_CONFIG_ENUM("cp_algo", O, cp_algo, "ring", algos, "Context-parallel attention."),
	MR_CONFIG_INT("top", O, top, "5", 1, 1000, "Plans to print."),
	MR_CONFIG_STRING("explain", O, explain, NULL,
			 "Explain one mesh instead of searching: tp=8,pp=16,dp=12,mb=1,zero=1,"
			 "schedule=1f1b,sp=1 (unset keys as searched: the best such plan)."),
	MR_CONFIG_BOOL("presets", O, presets, "false", "List the models and clusters, then exit."),
};
#undef O

/* Rewrites eb's "field: reason" as "--field-name: reason" (flag, or the
 * field eb names, with '_' as '-'). Returns rc. */
static int as_flag(struct mr_errbuf *eb, int rc, const char *flag)
{
	char msg[sizeof(eb->msg)], name[64];
	const char *colon = strchr(eb->msg, ':');

	snprintf(name, sizeof(name), "%.60s", flag ? flag : eb->field);
	for (char *p = name; *p; p++)
		if (*p == '_')
			*p = '-';
	/* a leading "field:" (one word) goes; the reason stays */
	if (colon && !memchr(eb->msg, ' ', (size_t)(colon - eb->msg)))
		snprintf(msg, sizeof(msg), "%.*s", (int)sizeof(msg) - 80, colon + 1);
	else
		snprintf(msg, sizeof(msg), " %.*s", (int)sizeof(msg) - 80, eb->msg);
	mr_errbuf_clear(eb);
	mr_errf_field(eb, rc, name, "--%s:%s", name, msg);
	return rc;
}

/* Inline JSON (starting with '{') or a file; NULL with eb set. */
static json_t *load_json(const char *src, const char *field, struct mr_errbuf *eb)
{
	json_error_t je;
	json_t *j;

	while (isspace((unsigned char)*src))
		src++;
	j = *src == '{' ? json_loads(src, JSON_REJECT_DUPLICATES, &je)
			: json_load_file(src, JSON_REJECT_DUPLICATES, &je);
	if (!j && je.line > 0)
		mr_errf_field(eb, MR_EINVAL, field, "--%s: %s (line %d)", field, je.text, je.line);
	else if (!j) /* no line: the file could not be read */
		mr_errf_field(eb, MR_EINVAL, field, "--%s: %s", field, je.text);
	else if (!json_is_object(j)) {
		mr_errf_field(eb, MR_EINVAL, field, "--%s: not a JSON object", field);
		json_decref(j);
		j = NULL;
	}
	return j;
}

/* The model: a preset or the workload config, then the flags' sizes. */
static int model_of(const struct plan_opts *o, struct mr_plan_input *in, struct mr_errbuf *eb)
{
	struct mr_plan_model *m = &in->model;
	int rc = 0;

	if (o->workload_config[0]) {
		json_t *j = load_json(o->workload_config, "workload-config", eb);
		if (!j)
			return MR_EINVAL;
		rc = mr_plan_from_workload(j, o->gpus, in, eb);
		json_decref(j);
		if (rc < 0) {
			char msg[sizeof(eb->msg)];
			snprintf(msg, sizeof(msg), "%s", eb->msg);
			mr_errbuf_clear(eb);
			return mr_errf_field(eb, rc, "workload-config", "--workload-config: %s",
					     msg);
		}
	} else if (o->model[0]) {
		if ((rc = mr_plan_model_preset(o->model, m, eb)) < 0)
			return as_flag(eb, rc, "model");
	} else {
		snprintf(m->name, sizeof(m->name), "custom");
	}
#define SET(f, v) if ((v) > 0) m->f = (v)
	SET(n_layer, o->n_layer);
	SET(d_model, o->d_model);
	SET(n_head, o->n_head);
	SET(vocab, o->vocab);
	SET(n_experts, o->n_experts);
	SET(top_k, o->top_k);
	SET(capacity_factor, o->capacity_factor);
#undef SET
	if (o->seq_len > 0)
		m->seq_len = m->max_seq = o->seq_len;
	if (o->moe_every >= 0)
		m->moe_every = o->moe_every;
	if (m->moe_every && m->capacity_factor <= 0)
		m->capacity_factor = 1.25;
	if (o->dropless)
		m->dropless = 1;
	if (!m->n_layer)
		return mr_errf_field(eb, MR_EINVAL, "model",
				     "--model: give a preset (--presets lists them), "
				     "--workload-config or the sizes (--n-layer ...)");
	return 0;
}

static int cluster_of(const struct plan_opts *o, struct mr_plan_input *in,
		      struct mr_errbuf *eb)
{
	struct mr_plan_cluster *c = &in->cluster;
	int rc = !strcmp(o->cluster, "local") ? mr_plan_cluster_local(o->gpus, o->threads, c, eb)
					      : mr_plan_cluster_preset(o->cluster, o->gpus, c, eb);

	if (rc < 0)
		return as_flag(eb, rc, "cluster");
	if (o->gpus_per_node > 0)
		c->gpus_per_node = o->gpus_per_node;
	if (o->mem_gb > 0)
		c->mem_bytes = o->mem_gb * 1e9;
	c->reserve_bytes = o->reserve_gb * 1e9;
	if (o->peak_tflops > 0)
		c->peak_flops = o->peak_tflops * 1e12;
	if (o->mfu > 0)
		c->mfu = o->mfu;
	if (o->overlap >= 0)
		c->overlap = o->overlap;
	if (o->mem_bw > 0)
		c->mem_bw = o->mem_bw * 1e9;
	if (o->bw_intra > 0)
		c->bw_intra = o->bw_intra * 1e9;
	if (o->bw_inter > 0)
		c->bw_inter = o->bw_inter * 1e9;
	if (o->lat_intra >= 0)
		c->lat_intra = o->lat_intra * 1e-6;
	if (o->lat_inter >= 0)
		c->lat_inter = o->lat_inter * 1e-6;
	if (o->bw_cross > 0)
		c->bw_cross = o->bw_cross * 1e9;
	if (o->lat_cross >= 0)
		c->lat_cross = o->lat_cross * 1e-6;
	if (o->host_bw > 0)
		c->host_bw = o->host_bw * 1e9;
	if (o->pcie_bw > 0)
		c->pcie_bw = o->pcie_bw * 1e9;
	return 0;
}

static int inputs_of(const struct plan_opts *o, const struct mr_config *cfg,
		     const struct mr_plan_topo *topo, struct mr_plan_input *in,
		     struct mr_errbuf *eb)
{
	struct mr_plan_mesh *f = &in->fix;
	int rc;

	mr_plan_input_init(in);
	if ((rc = cluster_of(o, in, eb)) < 0 || (rc = model_of(o, in, eb)) < 0)
		return rc;
	in->impl = (enum mr_plan_impl)o->impl;
	in->threads = o->threads;
	if (!o->workload_config[0] || mr_config_is_set(cfg, "precision"))
		in->prec = o->precision ? (enum mr_plan_prec)(o->precision - 1)
			   : in->impl == MR_PLAN_MEGATRON ? MR_PLAN_MIXED
			   : !strcmp(o->cluster, "local") ? MR_PLAN_FP32
							  : MR_PLAN_BF16;
	if (o->global_batch > 0)
		in->global_batch = o->global_batch;
	if (in->global_batch < 1)
		return mr_errf_field(eb, MR_EINVAL, "global-batch",
				     "--global-batch: sequences per step are needed");
	if (o->micro_batch > 0)
		f->micro_batch = o->micro_batch;
#define FIX(field, flag, v) if (mr_config_is_set(cfg, flag) || !o->workload_config[0]) f->field = (v)
	FIX(zero, "zero", o->zero);
	FIX(recompute, "recompute", o->recompute - 1);
	FIX(recompute_layers, "recompute_layers", o->recompute_layers);
	FIX(offload, "offload", o->offload - 1);
	FIX(sp, "sp", o->sp - 1);
	FIX(schedule, "schedule", o->schedule - 1);
	FIX(cp_algo, "cp_algo", o->cp_algo);
#undef FIX
	if (o->v > 0)
		f->v = o->v;
	if (o->hsdp_shard > 0)
		f->hsdp_shard = o->hsdp_shard;
	f->tp = o->tp;
	f->pp = o->pp;
	f->cp = o->cp;
	f->ep = o->ep;
	if (topo) {
		in->topo = topo;
		if (!mr_config_is_set(cfg, "gpus"))
			in->cluster.gpus = topo->nodes * in->cluster.gpus_per_node;
	}
	return (rc = mr_plan_check(in, eb)) < 0 ? as_flag(eb, rc, NULL) : 0;
}

/* ---- printing ------------------------------------------------------------------ */

static void header(const struct mr_plan_input *in)
{
	const struct mr_plan_model *m = &in->model;
	const struct mr_plan_cluster *c = &in->cluster;

	printf("model %s (%s): %.2fB parameters, %d layers, d_model %d, %d heads",
	       m->name, m->arch == MR_ARCH_LLAMA ? "llama" : "gpt2", mr_plan_params(m) / 1e9,
	       m->n_layer, m->d_model, m->n_head);
	if (m->arch == MR_ARCH_LLAMA)
		printf(" (%d key/value)", m->n_kv_head ? m->n_kv_head : m->n_head);
	printf(", vocab %d, seq %d", m->vocab, m->seq_len);
	if (m->moe_every)
		printf(", MoE every %d: %d experts top-%d", m->moe_every, m->n_experts, m->top_k);
	printf("; global batch %d\n", in->global_batch);
	printf("cluster %s: %d GPUs, %d per node, %.1f GB (%.1f for the model), %.3g TFLOP/s at "
	       "mfu %.2f, links %.3g / %.3g GB/s\n",
	       c->name, c->gpus, c->gpus_per_node, c->mem_bytes / 1e9,
	       (c->mem_bytes - c->reserve_bytes) / 1e9, c->peak_flops / 1e12, c->mfu,
	       c->bw_intra / 1e9, c->bw_inter / 1e9);
	if (in->topo)
		printf("topology: %d nodes in %d narrowest domains, rank_order topology; "
		       "between domains %.3g GB/s\n",
		       in->topo->nodes, in->topo->domains,
		       (c->bw_cross > 0 ? c->bw_cross : c->bw_inter) / 1e9);
	printf("runtime %s, precision %s\n", mr_plan_impl_name(in->impl),
	       mr_plan_prec_name(in->prec));
}

/* Which node each node rank lands on (rank_order topology), and the
 * groups of each kind that cross domains. */
static void placement(const struct mr_plan_input *in, const struct mr_plan *p)
{
	static const char *const tiers[] = { "inside a node", "inside a domain",
					     "across domains" };
	static const struct {
		enum mr_axis axis;
		int group;
	} kinds[] = { { MR_AXIS_TP, MR_GROUP_TP }, { MR_AXIS_CP, MR_GROUP_CP },
		      { MR_AXIS_DP, MR_GROUP_DP }, { MR_AXIS_EP, MR_GROUP_EP },
		      { MR_AXIS_PP, MR_GROUP_PP } };
	const struct mr_plan_topo *t = in->topo;

	printf("placement (node rank: pod index, path):\n");
	for (int r = 0; r < t->nodes; r++)
		printf("  node %d: pod %d, %s (domain %d)\n", r, t->order[r],
		       t->paths[t->order[r]], t->domain[r]);
	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
		printf("  %s groups: %s\n", mr_axis_name(kinds[k].axis),
		       tiers[mr_plan_group_link(in, &p->mesh, kinds[k].group)]);
}

static void row(int i, const struct mr_plan *p)
{
	const struct mr_plan_mesh *m = &p->mesh;
	const struct mr_plan_mem *e = &p->mem;
	char sched[24] = "-", rc[24];

	if (m->recompute > 0 && m->recompute_layers > 0)
		snprintf(rc, sizeof(rc), "%s/%d", mr_plan_rc_name(m->recompute), m->recompute_layers);
	else
		snprintf(rc, sizeof(rc), "%s", mr_plan_rc_name(m->recompute));
	if (m->pp > 1)
		snprintf(sched, sizeof(sched), "%s%s", mr_pp_kind_name((enum mr_pp_kind)m->schedule),
			 m->v > 1 ? (m->v == 2 ? "/2" : "/v") : "");
	printf("%3d %3d %3d %4d %5d %3d %3s %4d %4d x %-5d %-13s %-11s %-16s %7.2f %7.2f %6.2f "
	       "%6.2f %6.2f %6.2f %6.2f %9.4g %10.4g %6.1f%% %6.1f%%\n",
	       i, m->tp, m->cp, m->pp, m->dp, m->ep, m->sp ? "sp" : "-", m->zero, m->micro_batch,
	       m->micro_batches, sched, rc, mr_plan_offload_name(m->offload), e->total / 1e9,
	       e->bytes[MR_MEM_PARAMS] / 1e9, e->bytes[MR_MEM_GRADS] / 1e9,
	       e->bytes[MR_MEM_OPTIM] / 1e9, e->bytes[MR_MEM_ACTS] / 1e9,
	       e->bytes[MR_MEM_WORKSPACE] / 1e9, e->bytes[MR_MEM_HOST] / 1e9, p->time.step_s,
	       p->time.tokens_per_s,
	       100 * p->time.bubble_s / p->time.step_s, 100 * p->time.exposed_s / p->time.step_s);
}

static void table_head(void)
{
	printf("%3s %3s %3s %4s %5s %3s %3s %4s %12s %-13s %-11s %-16s %7s %7s %6s %6s %6s %6s "
	       "%6s %9s %10s %7s %7s\n",
	       "#", "tp", "cp", "pp", "dp", "ep", "sp", "zero", "mb x m", "schedule",
	       "recompute", "offload", "mem GB", "params", "grads", "optim", "acts", "work",
	       "host", "step s", "tokens/s", "bubble", "comm");
}

static void comm_lines(const struct mr_plan *p)
{
	static const char *const what[MR_AXIS__COUNT] = {
		[MR_AXIS_TP] = "all-reduce / all-gather + reduce-scatter of activations",
		[MR_AXIS_CP] = "K/V blocks around the ring, or all-gathered q|k|v",
		[MR_AXIS_DP] = "gradient reduction, parameter gathers (ZeRO)",
		[MR_AXIS_PP] = "activations and their gradients between stages",
		[MR_AXIS_EP] = "token dispatch and combine all-to-alls",
	};
	static const enum mr_axis order[] = { MR_AXIS_TP, MR_AXIS_CP, MR_AXIS_PP, MR_AXIS_DP,
					      MR_AXIS_EP };

	printf("communication per step and rank (the critical stage):\n");
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		const struct mr_plan_comm *c = &p->time.comm[order[i]];
		if (!c->ops)
			continue;
		printf("  %-3s %10.3f GB in %7ld ops (%s) %8.4f s, %8.4f s exposed: %s\n",
		       mr_axis_name(order[i]), c->bytes / 1e9, c->ops,
		       c->inter > 1 ? "cross-domain" : c->inter ? "inter-node" : "intra-node",
		       c->time_s, c->exposed_s,
		       what[order[i]]);
	}
	printf("step %.4g s = compute %.4g + pipeline bubble %.4g + exposed communication "
	       "%.4g + optimizer %.4g%s\n",
	       p->time.step_s, p->time.compute_s, p->time.bubble_s, p->time.exposed_s,
	       p->time.optim_s,
	       p->mesh.offload > 0 ? " (offloaded: the host's cores and PCIe copies)" : "");
	if (p->mesh.recompute > 0)
		printf("recompute %s%s: the extra passes are in the compute\n",
		       mr_plan_rc_name(p->mesh.recompute),
		       p->mesh.recompute_layers > 0 ? " (the first blocks of each chunk)" : "");
}

static int explain(const struct mr_plan_input *in, const struct mr_plan *p)
{
	const struct mr_plan_mesh *m = &p->mesh;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_mesh mesh;
	char line[256];

	mr_plan_mesh_format(m, line, sizeof(line));
	printf("plan %s\n", line);
	printf("memory per GPU, worst stage (%d): %.2f GB\n", p->mem.stage, p->mem.total / 1e9);
	for (int s = 0; s < m->pp; s++) {
		struct mr_plan_mem e;
		if (mr_plan_mem_stage(in, m, s, &e, &eb) < 0)
			break;
		printf("  stage %d: params %.3f grads %.3f optim %.3f acts %.3f workspace %.3f "
		       "= %.3f GB",
		       s, e.bytes[MR_MEM_PARAMS] / 1e9, e.bytes[MR_MEM_GRADS] / 1e9,
		       e.bytes[MR_MEM_OPTIM] / 1e9, e.bytes[MR_MEM_ACTS] / 1e9,
		       e.bytes[MR_MEM_WORKSPACE] / 1e9, e.total / 1e9);
		if (e.bytes[MR_MEM_HOST] > 0)
			printf("; host %.3f GB (offloaded)", e.bytes[MR_MEM_HOST] / 1e9);
		printf("\n");
	}
	comm_lines(p);
	if (in->topo)
		placement(in, p);
	if (mr_mesh_init(&mesh, in->cluster.gpus, m->tp, m->pp, m->cp, m->ep, m->dp, &eb) < 0) {
		fprintf(stderr, "meshrun plan: %s\n", eb.msg);
		return 1;
	}
	printf("\n");
	return mr_mesh_format_table(&mesh, stdout) < 0 ? 1 : 0;
}

static int run(const struct mr_plan_input *in, const struct plan_opts *o)
{
	struct mr_plan_result res = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	char why[512];
	int n;

	if (mr_plan_search(in, &res, &eb) < 0) {
		fprintf(stderr, "meshrun plan: %s\n", eb.msg);
		return eb.field[0] ? 2 : 1;
	}
	if (o->explain[0] && res.n == 0) {
		/* the mesh asked for, with what it leaves open at its simplest */
		struct mr_plan_mesh m = in->fix;
		m.tp = m.tp ? m.tp : 1;
		m.cp = m.cp ? m.cp : 1;
		m.pp = m.pp ? m.pp : 1;
		m.ep = m.ep ? m.ep : 1;
		mr_plan_mesh_worker_defaults(&m);
		m.micro_batch = m.micro_batch ? m.micro_batch : 1;
		if (mr_plan_mesh_check(in, &m, &eb) < 0)
			fprintf(stderr, "meshrun plan: --explain: %s\n", eb.msg);
		else
			fprintf(stderr, "meshrun plan: --explain: %s\n", res.refused);
		mr_plan_result_release(&res);
		return MR_CONFIG_EXIT_USAGE;
	}
	header(in);
	printf("%ld meshes considered, %d valid, %d fit\n", res.considered, res.n, res.fitting);
	fflush(stdout);
	if (res.n == 0) {
		fprintf(stderr, "meshrun plan: no valid mesh for %d GPUs: %s\n", in->cluster.gpus,
			res.refused);
		mr_plan_result_release(&res);
		return 1;
	}
	if (o->explain[0]) {
		int rc = explain(in, &res.plan[0]);
		if (!res.plan[0].fits) {
			mr_plan_limit(in, &res.plan[0], why, sizeof(why));
			fflush(stdout);
			fprintf(stderr, "meshrun plan: this mesh does not fit: %s\n", why);
			rc = 1;
		}
		mr_plan_result_release(&res);
		return rc;
	}
	table_head();
	n = res.fitting ? res.fitting : 1;
	for (int i = 0; i < n && i < o->top; i++)
		row(i + 1, &res.plan[i]);
	fflush(stdout);
	if (!res.fitting) {
		mr_plan_limit(in, &res.plan[0], why, sizeof(why));
		fprintf(stderr, "meshrun plan: nothing fits in %.1f GB per GPU; the closest plan "
				"(above) %s\n",
			(in->cluster.mem_bytes - in->cluster.reserve_bytes) / 1e9, why);
		mr_plan_result_release(&res);
		return 1;
	}
	printf("\n");
	comm_lines(&res.plan[0]);
	mr_plan_result_release(&res);
	return 0;
}

int mr_cli_plan(int argc, char **argv)
{
	struct plan_opts o;
	struct mr_config cfg = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_plan_input in;
	struct mr_plan_topo topo = { 0 };
	int rc;

	rc = mr_config_init(&cfg, plan_table, sizeof(plan_table) / sizeof(plan_table[0]), &o, &eb);
	cfg.prog = "meshrun plan";
	cfg.usage = "[--model NAME | --workload-config JSON] [--cluster NAME] [--gpus N] "
		    "--global-batch N [options] [--explain MESH]";
	cfg.summary = "Choose the mesh (tp, cp, pp, dp, ep), ZeRO stage, micro-batches and "
		      "pipeline schedule for a model on a cluster: predicted memory per GPU "
		      "and step time of every valid mesh, the fastest that fit first. "
		      "--config FILE reads these options as JSON keys. docs/PLANNER.md.";
	if (rc == 0)
		rc = mr_config_parse(&cfg, argc, argv, &eb);
	if (rc == MR_CONFIG_HELP) {
		mr_config_release(&cfg);
		return 0;
	}
	if (rc == 0 && o.presets) {
		mr_config_release(&cfg);
		mr_plan_presets_print(stdout);
		return 0;
	}
	if (rc == 0)
		rc = o.topology_file[0] ? mr_plan_topo_read(o.topology_file, &topo, &eb) : 0;
	if (rc == 0)
		rc = inputs_of(&o, &cfg, o.topology_file[0] ? &topo : NULL, &in, &eb);
	if (rc == 0 && o.explain[0]) {
		struct mr_plan_mesh m;
		if ((rc = mr_plan_mesh_parse(o.explain, &m, &eb)) < 0) {
			mr_errf_field(&eb, rc, "explain", "--explain: %s", eb.msg);
		} else {
			/* what the mesh leaves open is searched as usual */
			if (m.cp_algo == 0)
				m.cp_algo = in.fix.cp_algo;
#define KEEP(f, any) if (m.f != (any)) in.fix.f = m.f
			KEEP(tp, 0); KEEP(cp, 0); KEEP(pp, 0); KEEP(dp, 0); KEEP(ep, 0);
			KEEP(sp, -1); KEEP(zero, -1); KEEP(micro_batch, 0); KEEP(schedule, -1);
			KEEP(v, 0); KEEP(recompute, -1); KEEP(hsdp_shard, 0); KEEP(cp_algo, 0);
			KEEP(recompute_layers, 0); KEEP(offload, -1);
#undef KEEP
		}
	}
	mr_config_release(&cfg);
	if (rc < 0) {
		fprintf(stderr, "meshrun plan: %s\n", eb.msg);
		mr_plan_topo_release(&topo);
		return MR_CONFIG_EXIT_USAGE;
	}
	rc = run(&in, &o);
	mr_plan_topo_release(&topo);
	return rc;
}
