/*
 * gpu.c - training throughput and MFU of the runtime on this machine's GPUs
 * (make bench-gpu).
 *
 *   build/bench/gpu [-m 124m|350m|1b|all] [-p bf16|fp32] [-B batch] [-s steps]
 *                   [-r none|selective|full] [-o none|optimizer|optimizer+master]
 *                   [-P peak_flops] [-t]
 *
 * Ranks are threads of this process, one per GPU (local rank = GPU index),
 * each running the gpt worker exactly as an agent runs it: "device": "cuda",
 * the communicators bootstrapped through an in-memory KV, NCCL where the
 * build has it and every rank has its own GPU (runtime/gpt_worker_setup.c
 * logs the choice). With G GPUs present it runs
 *
 *   GPT-2 124M (L12 d768 h12) and 350M (L24 d1024 h16), T 1024, vocab 50304
 *   (50257 padded to a multiple of 128, as Megatron-LM and llm.c do), on
 *   one GPU; and, when G > 1, 350M data-parallel over G GPUs and
 *   tensor-parallel over G GPUs (G must divide the 16 heads); then a 1.1B
 *   llama on one GPU (L16 d2048 h32, 8 key/value heads, SwiGLU 8192,
 *   untied head, vocab 32768, T 1024: Llama 3.2 1B's block at a smaller
 *   vocabulary);
 *
 * 2 warm-up steps, then -s timed steps (default 10), B sequences per rank
 * (default 8; tp ranks share theirs). Per run one line with tokens/s of the
 * job and MFU: each rank's 6N + 6LCT FLOPs per token of its own slice
 * (mr_gpt_flops_per_token) at its token rate, over the device's dense peak
 * at the run's precision from runtime/device/peak.c (by device name; -P
 * overrides it, and an unknown device reports mfu=0), averaged over ranks.
 * Each run's line ends with rank 0's device and host memory after the
 * timed steps (the ledger: dev_MiB, host_MiB) and its CUDA graph launches
 * (graphs: 0 where a rank's passes talk to other ranks, or where a
 * capture was refused - its log says why). -r and -o pass "recompute"
 * and "offload" to every run (issue 29's GPU half: what recomputation and
 * ZeRO-Offload save and cost on a GPU; offload needs bf16).
 * After each run's line, `gpu <model> kinds: attention=..% gemm=..%
 * optimizer=..% copy=..% other=..% idle=..%  step_ms=<x>`: one more step
 * of rank 0 after the timed ones, broken down by kind of device operation
 * with CUDA events (the worker's "profile_step"; idle: the gaps between
 * operations, the host late or waiting). A run whose loss is not finite
 * or did not fall over the timed steps fails the bench.
 * Last line: `gpu tokens_per_s=<x> mfu=<y>` of 350M on one GPU (with -m 124m
 * or 1b, of that model).
 *
 * -t: tiny models (L2 d64 h2 T64 vocab 256, B 2, 2 timed steps; a tiny
 * llama with 1 key/value head for the 1B) through every run, for
 * tests/gpu-emul on the emulated device: it checks that this program
 * runs, not how fast.
 *
 * On a machine without a GPU it says "skipped" and exits 0; where a GPU
 * is (an NVIDIA device node) and the CUDA side cannot load or see it (the
 * plugin missing, a library it needs), it says FAILED naming the file and
 * the reason, and exits 1.
 * Built a second time against the CUDA emulation ($(BUILD)/emul/bench-gpu,
 * tests/gpu-emul/test_bench_gpu runs it with -t).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device/mr_device.h"
#include "mr_gpt_worker.h"
#include "../tests/comm/kv_mem.h"

#define WARMUP 2
#define MAX_GPUS 8

struct model {
	const char *name, *arch;
	int L, C, H, T, V;
	int KV, ffn; /* llama: key/value heads, SwiGLU hidden size */
};

static const struct model gpt2_124m = { "124M", "gpt2", 12, 768, 12, 1024, 50304, 0, 0 };
static const struct model gpt2_350m = { "350M", "gpt2", 24, 1024, 16, 1024, 50304, 0, 0 };
static const struct model llama_1b = { "1B", "llama", 16, 2048, 32, 1024, 32768, 8, 8192 };
static const struct model tiny = { "tiny", "gpt2", 2, 64, 2, 64, 256, 0, 0 };
static const struct model tiny_llama = { "tinyllama", "llama", 2, 64, 2, 64, 256, 1, 128 };

struct run {
	const struct model *m;
	const char *precision, *recompute, *offload;
	int gpus, tp, B, steps;
	double peak; /* 0: the device's */
	struct mr_kv kv;
	int generation;
	/* per rank */
	double secs[MAX_GPUS], mfu[MAX_GPUS], loss[MAX_GPUS], loss0[MAX_GPUS];
	long graphs[MAX_GPUS]; /* CUDA graph launches over the warm-up and timed steps */
	double kind_ms[MAX_GPUS][MR_DEV_KINDS + 1], span_ms[MAX_GPUS];
	double dev_bytes[MAX_GPUS], host_bytes[MAX_GPUS];
	char err[MAX_GPUS][MR_ERRBUF_SIZE];
	int rc[MAX_GPUS];
};

struct rank_arg {
	struct run *r;
	int rank;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One rank through the worker interface; fills r's slots for rank. */
static void *rank_thread(void *p)
{
	struct rank_arg *a = p;
	struct run *r = a->r;
	const struct model *m = r->m;
	struct mr_worker_env env = { 0 };
	struct mr_errbuf eb = { "", "" };
	struct mr_worker_stats st = { 0 };
	json_error_t jerr;
	json_t *cfg;
	char js[640], peak[48] = "", arch[96] = "";
	void *w = NULL;
	double t0 = 0.0, mfu = 0.0;
	int s, rc = 0;

	if (r->peak > 0)
		snprintf(peak, sizeof(peak), ",\"peak_flops\":%g", r->peak);
	if (m->KV > 0)
		snprintf(arch, sizeof(arch), ",\"arch\":\"%s\",\"n_kv_head\":%d,\"ffn_hidden\":%d",
			 m->arch, m->KV, m->ffn);
	snprintf(js, sizeof(js),
		 "{\"device\":\"cuda\",\"precision\":\"%s\",\"n_layer\":%d,\"d_model\":%d,"
		 "\"n_head\":%d,\"seq_len\":%d,\"batch_size\":%d,\"vocab_size\":%d,"
		 "\"steps\":%d,\"profile_step\":%d,\"threads\":1,\"recompute\":\"%s\","
		 "\"offload\":\"%s\"%s%s}",
		 r->precision, m->L, m->C, m->H, m->T, r->B, m->V, WARMUP + r->steps + 1,
		 WARMUP + r->steps + 1, r->recompute, r->offload, peak, arch);
	cfg = json_loads(js, 0, &jerr);
	env.job = "bench/gpu";
	env.run_id = "bench";
	env.generation = r->generation;
	env.rank = env.local_rank = a->rank;
	env.world_size = env.local_world_size = r->gpus;
	env.num_nodes = 1;
	env.tp = r->tp;
	env.pp = env.cp = env.ep = 1;
	env.dp = r->gpus / r->tp;
	env.host = "127.0.0.1";
	env.host_id = "bench-gpu";
	env.kv = &r->kv;
	env.config = cfg;
	rc = cfg ? mr_gpt_worker.create(&w, &env, &eb) : MR_ENOMEM;
	for (s = 0; s < WARMUP + r->steps && rc >= 0; s++) {
		if (s == WARMUP)
			t0 = now_s();
		rc = mr_gpt_worker.step(w, &st, &eb);
		/* the worker's MFU is of the step's token rate; average it */
		if (rc >= 0 && s >= WARMUP)
			mfu += st.mfu / r->steps;
		if (rc >= 0 && s == WARMUP)
			r->loss0[a->rank] = st.loss;
	}
	r->secs[a->rank] = now_s() - t0;
	r->mfu[a->rank] = mfu;
	r->loss[a->rank] = st.loss;
	r->graphs[a->rank] = st.dev_graph_launches;
	/* one more step, untimed: the device's time by kind */
	if (rc >= 0)
		rc = mr_gpt_worker.step(w, &st, &eb);
	memcpy(r->kind_ms[a->rank], st.dev_kind_ms, sizeof(st.dev_kind_ms));
	r->span_ms[a->rank] = st.dev_span_ms;
	r->dev_bytes[a->rank] = r->host_bytes[a->rank] = 0.0;
	for (int k = 0; k < MR_MEM_KINDS; k++)
		*(k == MR_MEM_HOST ? &r->host_bytes[a->rank] : &r->dev_bytes[a->rank]) +=
			(double)st.mem_bytes[k];
	r->rc[a->rank] = rc < 0 ? rc : 0;
	snprintf(r->err[a->rank], MR_ERRBUF_SIZE, "%s", eb.msg);
	mr_gpt_worker.destroy(w);
	json_decref(cfg);
	return NULL;
}

/* Rank 0's step after the timed ones, by kind of device operation: the
 * share of the step's device span and the span itself. */
static void kinds_line(const struct run *r)
{
	double span = r->span_ms[0];
	int k;

	printf("gpu %-4s kinds:", r->m->name);
	for (k = 0; k <= MR_DEV_KINDS; k++)
		printf(" %s=%.1f%%", mr_dev_kind_name(k),
		       span > 0 ? 100.0 * r->kind_ms[0][k] / span : 0.0);
	printf("  step_ms=%.1f\n", span);
}

/*
 * Runs m on `gpus` ranks with tensor-parallel size tp (the rest data
 * parallel); prints its line and returns tokens/s of the job (0 on failure),
 * with the mean MFU over ranks in *mfu.
 */
static double run(struct run *r, const struct model *m, int gpus, int tp, double *mfu)
{
	pthread_t th[MAX_GPUS];
	struct rank_arg args[MAX_GPUS];
	struct kv_mem *kvm = kv_mem_new(&r->kv);
	double worst = 0.0, tps;
	int i, failed = 0;

	r->m = m;
	r->gpus = gpus;
	r->tp = tp;
	r->generation++;
	*mfu = 0.0;
	for (i = 0; i < gpus; i++) {
		args[i] = (struct rank_arg){ r, i };
		if (pthread_create(&th[i], NULL, rank_thread, &args[i])) {
			fprintf(stderr, "bench gpu: unable to start rank %d\n", i);
			exit(1);
		}
	}
	for (i = 0; i < gpus; i++)
		pthread_join(th[i], NULL);
	kv_mem_free(kvm);
	for (i = 0; i < gpus; i++) {
		if (r->rc[i] < 0) {
			fprintf(stderr, "bench gpu: %s on %d GPU(s), rank %d: %s\n", m->name, gpus,
				i, r->err[i]);
			failed = 1;
		}
		if (r->secs[i] > worst)
			worst = r->secs[i];
		*mfu += r->mfu[i] / gpus;
	}
	if (failed || worst <= 0.0)
		return 0.0;
	tps = (double)r->B * m->T * (gpus / tp) * r->steps / worst;
	printf("gpu %-4s %s  gpus=%d tp=%d dp=%d B=%d/rank  tokens_per_s=%.0f  mfu=%.3f  "
	       "loss=%.4f  recompute=%s offload=%s dev_MiB=%.1f host_MiB=%.1f graphs=%ld\n",
	       m->name, r->precision, gpus, tp, gpus / tp, r->B, tps, *mfu, r->loss[0],
	       r->recompute, r->offload, r->dev_bytes[0] / (1 << 20), r->host_bytes[0] / (1 << 20),
	       r->graphs[0]);
	kinds_line(r);
	if (!isfinite(r->loss[0]) || !(r->loss[0] < r->loss0[0])) {
		fprintf(stderr, "bench gpu: %s on %d GPU(s): the loss went from %.4f to %.4f over "
				"the timed steps: not training\n",
			m->name, gpus, r->loss0[0], r->loss[0]);
		return 0.0;
	}
	return tps;
}

int main(int argc, char **argv)
{
	static struct run r;
	struct mr_errbuf why = { "", "" };
	const char *which = "all";
	const struct model *small = &gpt2_124m, *big = &gpt2_350m, *llama = &llama_1b;
	double tps = 0.0, mfu = 0.0, f;
	int opt, gpus;

	r.precision = "bf16";
	r.recompute = r.offload = "none";
	r.B = 8;
	r.steps = 10;
	while ((opt = getopt(argc, argv, "m:p:B:s:r:o:P:t")) != -1) {
		switch (opt) {
		case 'm': which = optarg; break;
		case 'p': r.precision = optarg; break;
		case 'B': r.B = atoi(optarg); break;
		case 's': r.steps = atoi(optarg); break;
		case 'r': r.recompute = optarg; break;
		case 'o': r.offload = optarg; break;
		case 'P': r.peak = atof(optarg); break;
		case 't':
			small = big = &tiny;
			llama = &tiny_llama;
			r.B = 2;
			r.steps = 16; /* past the warm-up of the lr: the loss falls */
			break;
		default:
			fprintf(stderr, "usage: %s [-m 124m|350m|1b|all] [-p bf16|fp32] [-B batch] "
					"[-s steps] [-r recompute] [-o offload] [-P peak_flops] "
					"[-t]\n", argv[0]);
			return 2;
		}
	}
	if (r.B < 1 || r.steps < 1 ||
	    (strcmp(which, "all") && strcmp(which, "124m") && strcmp(which, "350m") &&
	     strcmp(which, "1b"))) {
		fprintf(stderr, "bench gpu: -B and -s must be >= 1, -m 124m, 350m, 1b or all\n");
		return 2;
	}
	gpus = mr_dev_cuda_count(&why);
	if (gpus < 0) { /* a GPU is here and the CUDA side cannot use it */
		printf("bench gpu: FAILED - %s\n", why.msg);
		return 1;
	}
	if (gpus == 0) {
		printf("bench gpu: skipped - %s\n", why.msg);
		return 0;
	}
	if (gpus > MAX_GPUS)
		gpus = MAX_GPUS;
	printf("gpu %d GPU(s), %s, T %d, %d timed steps after %d warm-up\n", gpus, r.precision,
	       big->T, r.steps, WARMUP);
	if ((!strcmp(which, "all") || !strcmp(which, "124m")) &&
	    (tps = run(&r, small, 1, 1, &mfu)) <= 0.0)
		return 1;
	if (!strcmp(which, "all") || !strcmp(which, "350m")) {
		if ((tps = run(&r, big, 1, 1, &mfu)) <= 0.0)
			return 1;
		/* dp over every GPU; tp where the GPUs divide the heads */
		if (gpus > 1 && (run(&r, big, gpus, 1, &f) <= 0.0 ||
				 (big->H % gpus == 0 && run(&r, big, gpus, gpus, &f) <= 0.0)))
			return 1;
	}
	/* the summary line stays 350M's under "all" */
	if (!strcmp(which, "all") && run(&r, llama, 1, 1, &f) <= 0.0)
		return 1;
	if (!strcmp(which, "1b") && (tps = run(&r, llama, 1, 1, &mfu)) <= 0.0)
		return 1;
	printf("gpu tokens_per_s=%.0f mfu=%.3f\n", tps, mfu);
	return 0;
}
