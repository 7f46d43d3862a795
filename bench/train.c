/*
 * train.c - training throughput of the meshrun runtime on one rank.
 *
 *   build/bench/train L D H [T B V STEPS THREADS [llama]]
 *
 * Trains a GPT (L layers, width D, H heads; defaults T 256, B 8, vocab 256;
 * llama: the llama family with H/2 key/value heads and rope_theta 10000)
 * on the synthetic task through the worker interface, skips 2 warm-up
 * steps, and prints one line:
 *   train meshrun L=2 D=128 H=4 T=256 B=8 tokens_per_s=... mfu=... loss=...
 *   cpu_ms_per_step=... tokens_per_cpu_s=...
 *   main_cpu_ms_per_step=...
 * (process CPU time over the timed steps, all threads: with N pool threads,
 * cpu_ms_per_step / N approximates the step time on an idle machine; the
 * calling thread's CPU time, which runs chunk 0 of every parallel region
 * and all serial code, approximates it including the serial parts - both
 * are less noisy than wall time when other processes share the cores)
 * (mfu against the sgemm peak the worker measures at start on its threads)
 * bench/train_torch.py does the same in PyTorch; bench/train.sh compares.
 *
 * Non-goals: a benchmark harness (hyperfine does not fit per-step timing).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mr_gpt_worker.h"

static double clock_s(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	int L, D, H, T = 256, B = 8, V = 256, steps = 10, threads = 0, i, rc = 0, llama;
	char js[640], family[128];
	json_t *cfg;
	json_error_t jerr;
	struct mr_worker_env env = { 0 };
	struct mr_errbuf eb = { "", "" };
	struct mr_worker_stats st = { 0 };
	void *w;
	double t0 = 0.0, c0 = 0.0, m0 = 0.0;
	long tokens = 0;

	if (argc < 4) {
		fprintf(stderr, "usage: train L D H [T B V STEPS THREADS [llama]]\n");
		return 2;
	}
	L = atoi(argv[1]);
	D = atoi(argv[2]);
	H = atoi(argv[3]);
	if (argc > 4)
		T = atoi(argv[4]);
	if (argc > 5)
		B = atoi(argv[5]);
	if (argc > 6)
		V = atoi(argv[6]);
	if (argc > 7)
		steps = atoi(argv[7]);
	if (argc > 8)
		threads = atoi(argv[8]);
	llama = argc > 9 && !strcmp(argv[9], "llama");
	family[0] = '\0';
	if (llama)
		snprintf(family, sizeof(family),
			 ",\"arch\":\"llama\",\"rope_theta\":10000,\"n_kv_head\":%d", H / 2);
	snprintf(js, sizeof(js),
		 "{\"n_layer\":%d,\"d_model\":%d,\"n_head\":%d,\"seq_len\":%d,"
		 "\"batch_size\":%d,\"vocab_size\":%d,\"steps\":%d,\"threads\":%d%s}",
		 L, D, H, T, B, V, steps + 2, threads, family);
	cfg = json_loads(js, 0, &jerr);
	if (!cfg)
		return 1;
	env.world_size = env.local_world_size = 1;
	env.tp = env.pp = env.cp = env.ep = env.dp = 1;
	env.config = cfg;
	if (mr_gpt_worker.create(&w, &env, &eb) < 0) {
		fprintf(stderr, "train: %s\n", eb.msg);
		json_decref(cfg);
		return 1;
	}
	for (i = 0; i < steps + 2; i++) {
		if (i == 2) {
			t0 = clock_s(CLOCK_MONOTONIC);
			c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
			m0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
		}
		rc = mr_gpt_worker.step(w, &st, &eb);
		if (rc < 0) {
			fprintf(stderr, "train: %s\n", eb.msg);
			break;
		}
		if (i >= 2)
			tokens += (long)B * T;
	}
	if (rc >= 0) {
		double dt = clock_s(CLOCK_MONOTONIC) - t0, tps = tokens / dt;
		double cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
		double mcpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - m0;
		/* the worker's MFU is per step; rescale it to the timed average */
		printf("train meshrun arch=%s L=%d D=%d H=%d T=%d B=%d tokens_per_s=%.1f mfu=%.3f "
		       "loss=%.4f cpu_ms_per_step=%.2f tokens_per_cpu_s=%.1f "
		       "main_cpu_ms_per_step=%.2f\n",
		       llama ? "llama" : "gpt2", L, D, H, T, B, tps, st.mfu * tps / st.tokens_per_s, st.loss,
		       1e3 * cpu / steps, tokens / cpu, 1e3 * mcpu / steps);
	}
	mr_gpt_worker.destroy(w);
	json_decref(cfg);
	return rc < 0;
}
