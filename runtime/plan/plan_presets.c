/*
 * plan_presets.c - the planner's tables: named models, named clusters,
 * the precision rows, the names of the enums; the inputs' defaults and
 * this machine as a cluster.
 *
 * Model shapes: GPT-2 (Radford et al. 2019; the 124M .. 1.5B sizes),
 * GPT-3 175B (Brown et al. 2020), Megatron-LM 2021's Table 1 (Narayanan
 * et al.: heads, hidden size, layers; vocabulary 51,200, sequence 2,048),
 * and a LLaMA-7B-like shape (Touvron et al. 2023: 32 layers, 4096 hidden,
 * 32 heads, 32,000 tokens, 4,096 positions) in the GPT-2 block (a 4x
 * GELU MLP instead of SwiGLU); the llama family's own blocks for Llama 3
 * (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3: layers,
 * model dimension, FFN dimension, attention and key/value heads,
 * vocabulary 128,256; untied embeddings, as the released models have
 * them); Mixtral 8x7B (Jiang et al. 2024, "Mixtral of Experts", Table 1:
 * llama blocks whose MLP is 8 SwiGLU experts, top-2, every layer;
 * vocabulary 32,000, untied; its 32K context; rope_theta is ignored by
 * the plan, so the row keeps Llama 3's).
 * Cluster figures are the vendors'
 * dense peaks and what ring collectives reach on their links (NVLink
 * within a node, one InfiniBand NIC per GPU across nodes).
 *
 * Non-goals: measuring anything but this machine's sgemm peak.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "device/mr_peak.h"
#include "plan_int.h"

/* ---- precision rows ----------------------------------------------------- */

/* The optimizer touches per owned parameter (AdamW): fp32 reads p, g, m,
 * v and writes p, m, v (28 bytes); bf16 also writes the weight copy (30);
 * mixed reads the fp32 master, m, v and a 16-bit gradient and writes them
 * and the 16-bit weight (28). */

static const struct mr__plan_prec precs[MR_PLAN__PRECS] = {
	[MR_PLAN_FP32] = { "fp32", 4, 4, 4, 28, 3,
			   { { 4, MR_MEM_PARAMS, 3 }, { 4, MR_MEM_GRADS, 2 },
			     { 8, MR_MEM_OPTIM, 1 } },
			   "fp32 weights, gradients and AdamW m, v (meshrun on the cpu)" },
	[MR_PLAN_BF16] = { "bf16", 2, 4, 4, 30, 4,
			   { { 2, MR_MEM_PARAMS, MR__PLAN_SLOTS }, { 4, MR_MEM_PARAMS, 3 },
			     { 4, MR_MEM_GRADS, 2 }, { 8, MR_MEM_OPTIM, 1 } },
			   "bf16 activations and weight copy, fp32 master, gradients and "
			   "AdamW (meshrun on cuda)" },
	[MR_PLAN_MIXED] = { "mixed", 2, 2, 2, 28, 3,
			    { { 2, MR_MEM_PARAMS, 3 }, { 2, MR_MEM_GRADS, 2 },
			      { 12, MR_MEM_OPTIM, 1 } },
			    "16-bit weights and gradients, fp32 master + Adam m, v (K = 12; "
			    "the ZeRO paper's count)" },
};

const struct mr__plan_prec *mr__plan_prec(int prec)
{
	return prec >= 0 && prec < MR_PLAN__PRECS ? &precs[prec] : &precs[MR_PLAN_FP32];
}

/* ---- names -------------------------------------------------------------- */

static const char *const impl_names[] = { "meshrun", "megatron", NULL };
static const char *const prec_names[] = { "fp32", "bf16", "mixed", NULL };
static const char *const rc_names[] = { "none", "selective", "full", NULL };
static const char *const off_names[] = { "none", "optimizer", "optimizer+master", NULL };

const char *mr_plan_impl_name(int impl)
{
	return impl >= 0 && impl < MR_PLAN__IMPLS ? impl_names[impl] : "?";
}

const char *mr_plan_prec_name(int prec)
{
	return prec >= 0 && prec < MR_PLAN__PRECS ? prec_names[prec] : "?";
}

const char *mr_plan_rc_name(int rc)
{
	return rc >= 0 && rc < MR_PLAN__RCS ? rc_names[rc] : "?";
}

const char *mr_plan_offload_name(int off)
{
	return off >= 0 && off < MR_PLAN__OFFS ? off_names[off] : "?";
}

int mr_plan_name_parse(const char *field, const char *s, int *out, struct mr_errbuf *eb)
{
	const char *const *names = !strcmp(field, "impl")	 ? impl_names
				   : !strcmp(field, "precision") ? prec_names
				   : !strcmp(field, "offload")	 ? off_names
								 : rc_names;
	char list[96] = "";

	for (int i = 0; names[i]; i++) {
		if (s && !strcmp(s, names[i])) {
			*out = i;
			return 0;
		}
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? ", " : "",
			 names[i]);
	}
	return mr_errf_field(eb, MR_EINVAL, field, "%s: '%s' is not one of %s", field,
			     s ? s : "", list);
}

/* ---- models --------------------------------------------------------------- */

struct model_row {
	const char *name;
	int L, C, NH, V, T;
	int moe_every, E, k;
	int arch, KV, F;     /* llama: key/value heads, SwiGLU hidden size */
	const char *what;
};

static const struct model_row models[] = {
	{ "gpt2-124m", 12, 768, 12, 50257, 1024, 0, 0, 0, MR_ARCH_GPT2, 0, 0, "GPT-2 small" },
	{ "gpt2-350m", 24, 1024, 16, 50257, 1024, 0, 0, 0, MR_ARCH_GPT2, 0, 0, "GPT-2 medium" },
	{ "gpt2-774m", 36, 1280, 20, 50257, 1024, 0, 0, 0, MR_ARCH_GPT2, 0, 0, "GPT-2 large" },
	{ "gpt2-1.5b", 48, 1600, 25, 50257, 1024, 0, 0, 0, MR_ARCH_GPT2, 0, 0, "GPT-2 XL" },
	{ "llama-7b-like", 32, 4096, 32, 32000, 4096, 0, 0, 0, MR_ARCH_GPT2, 0, 0,
	  "LLaMA-7B's shape in GPT-2 blocks (6.6B)" },
	{ "gpt3-175b", 96, 12288, 96, 51200, 2048, 0, 0, 0, MR_ARCH_GPT2, 0, 0,
	  "GPT-3 175B (Megatron vocab)" },
	{ "megatron-1.7b", 24, 2304, 24, 51200, 2048, 0, 0, 0, MR_ARCH_GPT2, 0, 0,
	  "Megatron-LM 2021 Table 1" },
	{ "megatron-3.6b", 30, 3072, 32, 51200, 2048, 0, 0, 0, MR_ARCH_GPT2, 0, 0,
	  "Megatron-LM 2021 Table 1" },
	{ "megatron-7.5b", 36, 4096, 32, 51200, 2048, 0, 0, 0, MR_ARCH_GPT2, 0, 0,
	  "Megatron-LM 2021 Table 1" },
	{ "megatron-18b", 40, 6144, 48, 51200, 2048, 0, 0, 0, MR_ARCH_GPT2, 0, 0,
	  "Megatron-LM 2021 Table 1" },
	{ "megatron-39b", 48, 8192, 64, 51200, 2048, 0, 0, 0, MR_ARCH_GPT2, 0, 0,
	  "Megatron-LM 2021 Table 1" },
	{ "megatron-76b", 60, 10240, 80, 51200, 2048, 0, 0, 0, MR_ARCH_GPT2, 0, 0,
	  "Megatron-LM 2021 Table 1" },
	{ "megatron-146b", 80, 12288, 96, 51200, 2048, 0, 0, 0, MR_ARCH_GPT2, 0, 0,
	  "Megatron-LM 2021 Table 1" },
	{ "megatron-310b", 96, 16384, 128, 51200, 2048, 0, 0, 0, MR_ARCH_GPT2, 0, 0,
	  "Megatron-LM 2021 Table 1" },
	{ "megatron-530b", 105, 20480, 128, 51200, 2048, 0, 0, 0, MR_ARCH_GPT2, 0, 0,
	  "Megatron-LM 2021 Table 1" },
	{ "megatron-1t", 128, 25600, 160, 51200, 2048, 0, 0, 0, MR_ARCH_GPT2, 0, 0,
	  "Megatron-LM 2021 Table 1" },
	{ "gpt2-moe-8x", 12, 768, 12, 50257, 1024, 2, 8, 2, MR_ARCH_GPT2, 0, 0,
	  "GPT-2 small, every 2nd MLP 8 experts, top-2" },
	{ "tiny", 4, 128, 4, 256, 64, 0, 0, 0, MR_ARCH_GPT2, 0, 0,
	  "the runtime's size for CPU jobs" },
	{ "tiny-moe", 4, 128, 4, 256, 64, 2, 4, 2, MR_ARCH_GPT2, 0, 0,
	  "tiny with 4 experts every 2nd layer" },
	/* Llama 3 (Dubey et al. 2024, Table 3), untied heads, rope_theta
	 * 500,000, pre-training's 8K sequence */
	{ "llama3-8b", 32, 4096, 32, 128256, 8192, 0, 0, 0, MR_ARCH_LLAMA, 8, 14336,
	  "Llama 3 8B (8.03B)" },
	{ "llama3-70b", 80, 8192, 64, 128256, 8192, 0, 0, 0, MR_ARCH_LLAMA, 8, 28672,
	  "Llama 3 70B (70.6B)" },
	{ "llama3-405b", 126, 16384, 128, 128256, 8192, 0, 0, 0, MR_ARCH_LLAMA, 8, 53248,
	  "Llama 3 405B (405.9B)" },
	{ "llama-tiny", 4, 128, 4, 256, 64, 0, 0, 0, MR_ARCH_LLAMA, 2, 384,
	  "a llama-family size for CPU jobs (GQA 4:2)" },
	{ "mixtral-8x7b", 32, 4096, 32, 32000, 32768, 1, 8, 2, MR_ARCH_LLAMA, 8, 14336,
	  "Mixtral 8x7B (46.7B, 8 SwiGLU experts top-2)" },
};

#define NMODELS (sizeof(models) / sizeof(models[0]))

int mr_plan_model_preset(const char *name, struct mr_plan_model *out, struct mr_errbuf *eb)
{
	char list[512] = "";

	for (size_t i = 0; i < NMODELS; i++) {
		const struct model_row *r = &models[i];
		if (name && !strcasecmp(name, r->name)) {
			memset(out, 0, sizeof(*out));
			snprintf(out->name, sizeof(out->name), "%s", r->name);
			out->n_layer = r->L;
			out->d_model = r->C;
			out->n_head = r->NH;
			out->vocab = r->V;
			out->seq_len = out->max_seq = r->T;
			out->moe_every = r->moe_every;
			out->n_experts = r->E;
			out->top_k = r->k;
			out->capacity_factor = r->E ? 1.25 : 0.0;
			out->arch = r->arch;
			out->n_kv_head = r->KV;
			out->ffn_hidden = r->F;
			out->rope_theta = r->arch == MR_ARCH_LLAMA ? 500000.0 : 0.0;
			return 0;
		}
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? ", " : "",
			 r->name);
	}
	return mr_errf_field(eb, MR_ENOTFOUND, "model", "model: no preset '%s' (presets: %s)",
			     name ? name : "", list);
}

/* ---- clusters ------------------------------------------------------------- */

/* host_bw: a GPU's share of its node's host memory bandwidth (the CPUs'
 * DDR channels at about two thirds of their peak, over the node's GPUs),
 * the pace of an offloaded AdamW step; pcie_bw: what pinned copies reach
 * each way on the GPU's host link (PCIe Gen5 x16 on H100/H200 nodes, Gen4
 * on A100's, Gen3 on V100's). */
struct cluster_row {
	const char *name;
	int per_node;
	double mem, peak, mfu, mem_bw, bw_in, lat_in, bw_out, lat_out, host_bw, pcie_bw;
	const char *what;
};

static const struct cluster_row clusters[] = {
	{ "h100", 8, 80e9, 989e12, 0.40, 3.35e12, 360e9, 3e-6, 45e9, 8e-6, 50e9, 50e9,
	  "nodes of 8 x H100 80GB SXM, NVLink 4, 400 Gb/s InfiniBand per GPU" },
	{ "h200", 8, 141e9, 989e12, 0.40, 4.8e12, 360e9, 3e-6, 45e9, 8e-6, 50e9, 50e9,
	  "nodes of 8 x H200 141GB, NVLink 4, 400 Gb/s InfiniBand per GPU" },
	{ "a100-80g", 8, 80e9, 312e12, 0.45, 2.0e12, 230e9, 4e-6, 23e9, 8e-6, 33e9, 25e9,
	  "nodes of 8 x A100 80GB, NVLink 3, 200 Gb/s HDR per GPU (Selene)" },
	{ "a100-40g", 8, 40e9, 312e12, 0.45, 1.55e12, 230e9, 4e-6, 23e9, 8e-6, 33e9, 25e9,
	  "nodes of 8 x A100 40GB, NVLink 3, 200 Gb/s HDR per GPU" },
	{ "v100-32g", 16, 32e9, 125e12, 0.30, 0.9e12, 120e9, 5e-6, 5.6e9, 10e-6, 10e9, 12e9,
	  "DGX-2 nodes of 16 x V100 32GB, NVSwitch, 8 x 100 Gb/s per node" },
};

#define NCLUSTERS (sizeof(clusters) / sizeof(clusters[0]))

int mr_plan_cluster_preset(const char *name, int gpus, struct mr_plan_cluster *out,
			   struct mr_errbuf *eb)
{
	char list[256] = "local";

	if (name && !strcasecmp(name, "local"))
		return mr_plan_cluster_local(gpus, 1, out, eb);
	for (size_t i = 0; i < NCLUSTERS; i++) {
		const struct cluster_row *r = &clusters[i];
		if (name && !strcasecmp(name, r->name)) {
			memset(out, 0, sizeof(*out));
			snprintf(out->name, sizeof(out->name), "%s", r->name);
			out->gpus = gpus;
			out->gpus_per_node = r->per_node;
			out->mem_bytes = r->mem;
			out->peak_flops = r->peak;
			out->mfu = r->mfu;
			out->mem_bw = r->mem_bw;
			out->overlap = 1.0;
			out->bw_intra = r->bw_in;
			out->lat_intra = r->lat_in;
			out->bw_inter = r->bw_out;
			out->lat_inter = r->lat_out;
			out->host_bw = r->host_bw;
			out->pcie_bw = r->pcie_bw;
			return 0;
		}
		snprintf(list + strlen(list), sizeof(list) - strlen(list), ", %s", r->name);
	}
	return mr_errf_field(eb, MR_ENOTFOUND, "cluster",
			     "cluster: no preset '%s' (presets: %s)", name ? name : "", list);
}

/* MemTotal from /proc/meminfo, in bytes; 0 if unknown. */
static double mem_total(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[128];
	double kb = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemTotal: %lf kB", &kb) == 1)
			break;
	fclose(f);
	return kb * 1024.0;
}

int mr_plan_cluster_local(int ranks, int threads, struct mr_plan_cluster *out,
			  struct mr_errbuf *eb)
{
	double mem = mem_total(), peak = mr_cpu_sgemm_peak(), share;
	long cores = sysconf(_SC_NPROCESSORS_ONLN);

	if (ranks < 1 || threads < 1)
		return mr_errf_field(eb, MR_EINVAL, "gpus",
				     "local cluster: ranks %d and threads %d must be >= 1", ranks,
				     threads);
	memset(out, 0, sizeof(*out));
	snprintf(out->name, sizeof(out->name), "local");
	out->gpus = out->gpus_per_node = ranks;
	out->mem_bytes = mem > 0 ? mem / ranks : 1e9;
	/* a rank's threads, or its share of the cores when the ranks'
	 * threads are more than the cores */
	share = cores > 0 && (double)ranks * threads > (double)cores
			? (double)cores / ((double)ranks * threads)
			: 1.0;
	/* one thread's sgemm peak (0 where it could not be measured: a
	 * nominal 50 GFLOP/s keeps the ranking, which is all a guess gives) */
	out->peak_flops = (peak > 0 ? peak : 50e9) * threads * share;
	out->mfu = 0.6;
	out->mem_bw = 8e9 * threads * share;
	out->overlap = 0.0; /* the host backend's copies take the same cores */
	out->cpu = 1;       /* the state is in host memory already: offload moves nothing */
	out->host_bw = out->mem_bw;
	/* the host backend between ranks of a machine: shared memory; TCP
	 * figures for completeness (every rank is in the one node) */
	out->bw_intra = 4e9 * share;
	out->lat_intra = 20e-6;
	out->bw_inter = 1e9;
	out->lat_inter = 50e-6;
	return 0;
}

void mr_plan_presets_print(FILE *out)
{
	fprintf(out, "models:\n");
	for (size_t i = 0; i < NMODELS; i++) {
		const struct model_row *r = &models[i];
		fprintf(out, "  %-14s L=%-3d d=%-5d heads=%-3d vocab=%-6d seq=%-4d", r->name, r->L,
			r->C, r->NH, r->V, r->T);
		if (r->moe_every)
			fprintf(out, " moe_every=%d experts=%d top_k=%d", r->moe_every, r->E, r->k);
		if (r->arch == MR_ARCH_LLAMA)
			fprintf(out, " llama kv_heads=%d ffn=%d", r->KV, r->F);
		fprintf(out, "  %s\n", r->what);
	}
	fprintf(out, "clusters:\n");
	for (size_t i = 0; i < NCLUSTERS; i++) {
		const struct cluster_row *r = &clusters[i];
		fprintf(out, "  %-10s %2d/node %4.0f GB %5.0f TFLOP/s mfu %.2f  %s\n", r->name,
			r->per_node, r->mem / 1e9, r->peak / 1e12, r->mfu, r->what);
	}
	fprintf(out, "  %-10s this machine: CPU ranks in one node, memory and sgemm peak "
		     "measured\n",
		"local");
	fprintf(out, "precisions:\n");
	for (int p = 0; p < MR_PLAN__PRECS; p++)
		fprintf(out, "  %-10s %s\n", precs[p].name, precs[p].what);
}

void mr_plan_input_init(struct mr_plan_input *in)
{
	memset(in, 0, sizeof(*in));
	mr_plan_cluster_preset("h100", 8, &in->cluster, NULL);
	in->impl = MR_PLAN_MESHRUN;
	in->prec = MR_PLAN_BF16;
	in->threads = 1;
	in->fix.sp = in->fix.zero = in->fix.schedule = in->fix.recompute = -1;
	in->fix.offload = -1;
	in->fix.cp_algo = MR_CP_RING;
}
