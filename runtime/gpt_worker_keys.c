/*
 * gpt_worker_keys.c - every key of the gpt worker's config (see
 * mr_gpt_worker.h) in one table: its type, bounds, default and meaning.
 * The parser (gpt_worker_config.c) takes each key's bounds, default and
 * choices from here, and docs/WORKLOAD.md is this table printed
 * (`meshrun local --help-workload`; tests/runtime/test_workload_keys.c
 * checks the file is current),
 * so the documentation cannot drift from what the worker accepts.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_worker_int.h"

#define I(name, lo, hi, def, group, help) { name, GWK_INT, lo, hi, def, NULL, group, help }
#define F(name, lo, hi, def, group, help) { name, GWK_NUM, lo, hi, def, NULL, group, help }
#define B(name, def, group, help) { name, GWK_BOOL, 0, 0, def, NULL, group, help }
#define S(name, group, help) { name, GWK_STR, 0, 0, "", NULL, group, help }
#define C(name, choices, def, group, help) { name, GWK_CHOICE, 0, 0, def, choices, group, help }

const struct mr__gw_key mr__gw_keys[] = {
	/* model */
	I("vocab_size", 2, 1 << 20, "256", "model", "Vocabulary size (token ids 0..vocab_size-1)."),
	I("seq_len", 1, 1 << 16, "64", "model", "Tokens per sequence (T)."),
	I("max_seq", 1, 1 << 16, "seq_len", "model",
	  "Rows of the position table (at least seq_len)."),
	I("n_layer", 1, 1024, "2", "model", "Transformer blocks."),
	I("d_model", 1, 65536, "128", "model", "Width of the residual stream (C)."),
	I("n_head", 1, 65536, "4", "model",
	  "Attention heads; divides d_model (cuda: a head size that is a multiple of 32, up "
	  "to 128)."),
	I("moe_every", 0, 1024, "0", "model",
	  "Every this many blocks the MLP is a mixture of experts (0: dense)."),
	I("n_experts", 1, 1024, "4", "model", "Experts of each MoE layer."),
	I("top_k", 1, 2, "1", "model", "Experts each token is routed to."),
	F("capacity_factor", -1e9, 1e9, "1.25", "model",
	  "moe_policy capacity: each expert takes ceil(capacity_factor * N * top_k / E) of a "
	  "micro-batch's N tokens, the rest are dropped."),
	F("aux_coef", 0, 1e3, "0.01", "model", "Weight of the MoE load-balancing loss."),
	C("moe_policy", "capacity|dropless", "capacity", "model",
	  "capacity (a fixed share per expert, the rest dropped) or dropless (every expert "
	  "takes all its tokens)."),
	B("moe_norm_topk", "true when top_k is 2", "model",
	  "Renormalise each token's gates over its top_k chosen experts (Mixtral, Qwen3-MoE: "
	  "Hugging Face's norm_topk_prob); false: the router's softmax probabilities."),
	C("arch", "gpt2|llama", "gpt2", "model",
	  "The model family: gpt2 (LayerNorm, learned positions, GELU MLP, tied head) or llama "
	  "(RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, no biases, untied "
	  "head)."),
	I("n_kv_head", 0, 65536, "0", "model",
	  "llama: key/value heads, dividing n_head (grouped-query attention; 0: n_head). tp "
	  "must divide it (heads split) or be a multiple of it (heads replicated, one a rank)."),
	I("ffn_hidden", 0, 1 << 20, "0", "model",
	  "llama: SwiGLU hidden size (0: 2/3 of 4 d_model rounded up to a multiple of 256, as "
	  "Llama computes it)."),
	F("norm_eps", 1e-12, 1, "1e-05", "model", "llama: RMSNorm epsilon."),
	F("rope_theta", 1, 1e12, "500000", "model", "llama: base of the rotary frequencies."),
	C("rope_scaling", "none|llama3", "none", "model",
	  "llama: llama3 applies Llama 3.1's long-context frequency scaling with the four "
	  "rope_* keys below (their defaults are Llama 3.1's)."),
	F("rope_factor", 1, 1e6, "8", "model", "llama, rope_scaling llama3: the scaling factor."),
	F("rope_low_freq_factor", 1e-6, 1e6, "1", "model",
	  "llama, rope_scaling llama3: wavelengths above original / low_freq_factor are scaled."),
	F("rope_high_freq_factor", 1e-6, 1e6, "4", "model",
	  "llama, rope_scaling llama3: wavelengths below original / high_freq_factor are kept."),
	I("rope_original_max_pos", 1, 1 << 30, "8192", "model",
	  "llama, rope_scaling llama3: the context the model was pre-trained on."),
	B("tie_embeddings", "false", "model",
	  "llama: the LM head is the token embedding (gpt2 always ties it)."),
	/* training */
	I("batch_size", 1, 1 << 16, "8", "training", "Sequences per micro-batch per dp rank."),
	I("steps", 1, 1 << 30, "100", "training", "Optimizer steps."),
	I("grad_accum", 1, 1 << 16, "1", "training",
	  "Micro-batches per step (under a pipeline: its micro-batch count)."),
	F("lr", 0, 10, "0.001", "training", "Peak learning rate (after warm-up; see lr_schedule)."),
	F("min_lr_frac", 0, 1, "0.1", "training",
	  "Final learning rate as a fraction of lr (cosine, linear, wsd)."),
	I("warmup_steps", 0, 1 << 30, "10", "training",
	  "Linear warm-up steps (lr * (step+1) / warmup_steps), every schedule."),
	C("lr_schedule", "cosine|linear|constant|wsd", "cosine", "training",
	  "After warm-up: cosine down to lr * min_lr_frac at steps (llm.c's); linear down to "
	  "lr * min_lr_frac at the last step; constant lr; wsd (warmup-stable-decay, as "
	  "MiniCPM): lr, then the last decay_frac of the steps fall linearly to lr * "
	  "min_lr_frac at the last step."),
	F("decay_frac", 0, 1, "0.2", "training",
	  "wsd: the share of steps (rounded to whole steps) of the final linear decay; 0: "
	  "none."),
	F("beta1", 0, 0.999999, "0.9", "training", "AdamW beta1."),
	F("beta2", 0, 0.999999, "0.95", "training", "AdamW beta2."),
	F("eps", 1e-30, 1, "1e-08", "training", "AdamW epsilon."),
	F("weight_decay", 0, 10, "0.1", "training",
	  "AdamW weight decay (matrices only, not biases or norms)."),
	F("grad_clip", 0, 1e9, "1", "training", "Clip the global gradient norm to this (0: off)."),
	I("seed", 0, 0x7fffffff, "1337", "training", "Seed of the initial weights and the data."),
	/* data and evaluation */
	S("train_data", "data",
	  "llm.c token shard(s) to train on (`meshrun data`); without it the built-in "
	  "synthetic task."),
	S("val_data", "data", "Token shard(s) for the validation loss."),
	I("eval_every", 0, 1 << 30, "max(1, steps/10) with val_data, else 0", "data",
	  "Steps between validation losses, and the last step (0: never). With train_data "
	  "but no val_data there is none (a warning says so): never the synthetic task's."),
	I("eval_batches", 1, 1 << 16, "4", "data", "Micro-batches per validation loss."),
	/* run */
	C("device", "cpu|cuda", "cpu", "run", "Where a rank computes (cuda: GPU local_rank)."),
	C("precision", "fp32|bf16", "device's", "run",
	  "cpu: fp32. cuda: bf16 (activations and a weight copy in bf16; fp32 master "
	  "weights, gradients, AdamW) or fp32."),
	C("comm_backend", "auto|host|nccl", "auto", "run",
	  "auto: nccl where every local rank has its own GPU, else host (device buffers "
	  "staged through host memory)."),
	I("threads", 0, 1024, "0", "run", "Compute threads per rank (0: CPUs / local ranks)."),
	F("peak_flops", 0, 1e20, "0", "run",
	  "FLOP/s the MFU is measured against (0: the device's own figure)."),
	I("comm_timeout_ms", 100, 1 << 30, "60000", "run",
	  "Every collective and pipeline transfer fails after this long (a lost peer)."),
	S("tensorboard_dir", "run",
	  "Rank 0 writes a TensorBoard event file here (loss, aux_loss with MoE, val_loss, lr, "
	  "grad_norm, tokens_per_s, mfu per step; a new file per run or resume); empty: off."),
	/* parallelism */
	B("sequence_parallel", "false", "parallel", "Megatron sequence parallelism (tp > 1)."),
	I("zero", 0, 3, "0", "parallel",
	  "0 DDP; 1, 2, 3 shard optimizer state, + gradients, + parameters (FSDP); under a "
	  "pipeline 2 and 3 run as 1."),
	I("hsdp_shard", 0, 1 << 20, "0", "parallel",
	  "Shard ZeRO state within groups of this many dp ranks, replicate across them "
	  "(HSDP; 0: all dp ranks)."),
	F("bucket_mb", 0.001, 4096, "1", "parallel", "DDP gradient bucket size (MB)."),
	B("overlap_grad_reduce", "true", "parallel",
	  "Reduce gradient buckets while the backward runs."),
	C("cp_algo", "allgather|ring|ulysses", "ring", "parallel",
	  "Context parallelism (cp > 1): K/V around a ring, all-gathered, or heads exchanged "
	  "all-to-all (Ulysses)."),
	C("pp_schedule", "gpipe|1f1b|interleaved|zb-h1", "1f1b", "parallel",
	  "Pipeline schedule (pp > 1)."),
	I("pp_virtual", 1, MR_PP_MAX_VIRTUAL, "2 for interleaved, else 1", "parallel",
	  "Model chunks per pipeline stage."),
	{ "pp_layers", GWK_LIST, 1, 1024, "balanced by cost", NULL, "parallel",
	  "Blocks per virtual stage, in order (an array)." },
	C("pp_p2p", "auto|ahead|paired", "auto", "parallel",
	  "Pipeline transfers: receives posted as early as their buffers allow (ahead), or "
	  "each at its pass grouped with the send before it (paired; auto: paired on "
	  "NCCL)."),
	C("recompute", "none|selective|full", "none", "parallel",
	  "Activation recomputation: none; selective (each block's norms and activation "
	  "function are recomputed in its backward, the GEMM and attention outputs kept); full "
	  "(a block keeps only its input and re-runs its forward inside its backward)."),
	I("recompute_layers", 0, 1024, "0", "parallel",
	  "With recompute: only the first this many blocks of each pipeline chunk recompute "
	  "(Megatron's block method; 0: every block)."),
	C("offload", "none|optimizer|optimizer+master", "none", "parallel",
	  "cuda: keep this rank's AdamW moments (and with optimizer+master its fp32 master "
	  "shard) in host memory and step them on the CPU (ZeRO-Offload). cpu: accepted, "
	  "changes nothing (the state is in host memory already)."),
	/* checkpoints and output */
	S("ckpt_dir", "checkpoint", "Where checkpoints are written and resumed from."),
	I("ckpt_every", 0, 1 << 30, "0", "checkpoint",
	  "Steps between checkpoints (0: only when preempted); needs ckpt_dir."),
	I("ckpt_keep", 1, 1 << 20, "2", "checkpoint", "Checkpoints kept."),
	B("ckpt_async", "true", "checkpoint", "Write checkpoints while training goes on."),
	C("resume", "auto|never", "auto", "checkpoint",
	  "auto: resume from the newest checkpoint every rank can load."),
	S("loss_log", "output",
	  "Rank 0 writes the header \"step loss aux_loss grad_norm lr val_loss\", then a line "
	  "per step (val_loss nan where no validation ran; `meshrun plot` draws it)."),
	I("profile_step", 0, 1 << 30, "0", "output",
	  "The step (1-based) whose device time is broken down by kind of operation: "
	  "attention, gemm, optimizer, copy, other kernels and idle (one line, event "
	  "step_kinds, from every rank; 0: none). The cuda device times each operation "
	  "with CUDA events; the cpu device has no breakdown."),
	I("log_every", 1, 1 << 30, "10", "output",
	  "Rank 0 logs a step line (event=step: loss, val_loss, grad_norm, lr, the job's "
	  "tokens/s, MFU, memory, ETA) every this many steps, at every evaluation and at the "
	  "last step."),
	S("save_weights", "output", "Write the trained model here at the end (a weights file)."),
	/* debugging */
	I("debug_stall_rank", -1, 1 << 30, "-1", "debug",
	  "Testing only: this rank stops at debug_stall_step until aborted (a hung rank)."),
	I("debug_stall_step", 0, 1 << 30, "0", "debug", "See debug_stall_rank."),
	I("debug_slow_rank", -1, 1 << 30, "-1", "debug",
	  "Testing only: this rank sleeps debug_slow_ms in every step (a straggler)."),
	I("debug_slow_ms", 0, 3600000, "0", "debug", "See debug_slow_rank."),
	I("debug_ckpt_fail_rank", -1, 1 << 30, "-1", "debug",
	  "Testing only: this rank's part of the checkpoint at debug_ckpt_fail_step fails."),
	I("debug_ckpt_fail_step", 0, 1 << 30, "0", "debug", "See debug_ckpt_fail_rank."),
	B("debug_ckpt_fail_unmarked", "false", "debug",
	  "With debug_ckpt_fail_rank: the failing rank leaves no marker for rank 0."),
	I("debug_ckpt_publish_delay_ms", 0, 3600000, "0", "debug",
	  "Testing only: rank 0 waits this long before publishing its first checkpoint (a "
	  "writer cut off mid-save)."),
	{ NULL, GWK_INT, 0, 0, NULL, NULL, NULL, NULL },
};

const struct mr__gw_key *mr__gw_key(const char *name)
{
	for (const struct mr__gw_key *k = mr__gw_keys; k->name; k++)
		if (!strcmp(k->name, name))
			return k;
	return NULL;
}

/* Edit distance of a and b (short names only). */
static int distance(const char *a, const char *b)
{
	int la = (int)strlen(a), lb = (int)strlen(b), d[64], prev, tmp;

	if (la > 63 || lb > 63)
		return 64;
	for (int j = 0; j <= lb; j++)
		d[j] = j;
	for (int i = 1; i <= la; i++) {
		prev = d[0];
		d[0] = i;
		for (int j = 1; j <= lb; j++) {
			int best = prev + (a[i - 1] != b[j - 1]);
			tmp = d[j];
			if (d[j] + 1 < best)
				best = d[j] + 1;
			if (d[j - 1] + 1 < best)
				best = d[j - 1] + 1;
			prev = tmp;
			d[j] = best;
		}
	}
	return d[lb];
}

int mr__gw_check_keys(const json_t *c, struct mr_errbuf *eb)
{
	const char *key;
	json_t *val;

	json_object_foreach((json_t *)c, key, val) {
		const char *near = NULL;
		int best = 4; /* at most 3 edits away */

		(void)val;
		if (mr__gw_key(key))
			continue;
		for (const struct mr__gw_key *k = mr__gw_keys; k->name; k++) {
			int d = distance(key, k->name);
			if (d < best) {
				best = d;
				near = k->name;
			}
		}
		if (near)
			return mr_errf_field(eb, MR_EINVAL, key,
					     "'%s': unknown field (did you mean '%s'?)", key, near);
		return mr_errf_field(eb, MR_EINVAL, key,
				     "'%s': unknown field (docs/WORKLOAD.md lists them)", key);
	}
	return 0;
}

/* A bound as a person writes it. */
static void bound(char *buf, size_t cap, double v)
{
	if (fabs(v) >= (1 << 20) && v == floor(v) && fmod(v, 1024) == 0)
		snprintf(buf, cap, "%.0f", v);
	else
		snprintf(buf, cap, "%g", v);
}

void mr_gpt_worker_keys_doc(FILE *f)
{
	static const char *const types[] = { "integer", "number", "boolean", "string", "choice",
					     "array" };
	const char *group = "";

	fputs("# Workload keys\n\n"
	      "The keys of `--workload-config` (the JSON object the in-process GPT workload\n"
	      "reads; every key optional, an unknown one refused naming the nearest valid\n"
	      "name). This file is printed by `meshrun local --help-workload` from the table\n"
	      "the worker parses with (runtime/gpt_worker_keys.c); a test checks it is\n"
	      "current.\n",
	      f);
	for (const struct mr__gw_key *k = mr__gw_keys; k->name; k++) {
		char lo[32], hi[32], range[80] = "";

		if (strcmp(group, k->group)) {
			group = k->group;
			fprintf(f, "\n## %s\n\n| key | type | range | default | meaning |\n"
				   "| --- | --- | --- | --- | --- |\n",
				group);
		}
		if (k->type == GWK_INT || k->type == GWK_NUM || k->type == GWK_LIST) {
			bound(lo, sizeof(lo), k->lo);
			bound(hi, sizeof(hi), k->hi);
			snprintf(range, sizeof(range), "%s .. %s", lo, hi);
		} else if (k->type == GWK_CHOICE) {
			for (const char *p = k->choices; *p; p++)
				snprintf(range + strlen(range), sizeof(range) - strlen(range), "%s",
					 *p == '|' ? ", " : (char[]){ *p, 0 });
		}
		fprintf(f, "| `%s` | %s | %s | %s | %s |\n", k->name, types[k->type], range,
			k->def[0] ? k->def : "none", k->help);
	}
}
