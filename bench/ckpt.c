/*
 * ckpt.c - what a checkpoint costs a training step (make bench-ckpt).
 *
 *   build/bench/ckpt [-s steps] [-k every] [-r rounds] [-d dir]
 *
 * One rank trains GPT L4 d256 h4, T 256, B 8, vocab 256 (bench-train's
 * L4/d256 config) through the worker interface, three ways per round and
 * the same number of steps each: without checkpoints, checkpointing every
 * k steps in the background (ckpt_async, the default) and checkpointing
 * every k steps blocking (the anchor: the save done in the step). The
 * cost of a checkpoint is (the run's seconds - the checkpoint-free run's
 * seconds) / the checkpoints it wrote, in milliseconds and as a share of
 * the checkpoint-free step, each run's seconds the fastest of the rounds
 * (the modes interleave; other processes on a shared machine only ever
 * add time, so the minimum is the run they disturbed least).
 * Background writes share the cores with training on a CPU: their CRC,
 * write and fsync are what the async share measures beyond the snapshot.
 *
 * Last line: `ckpt async_share=<a> blocking_share=<b>`; the target is
 * async_share <= 0.10 (a tenth of a step per checkpoint).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mr_gpt_worker.h"

#define MAX_ROUNDS 16

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Trains `steps` timed steps (after 2 warm-up ones, and before a last
 * one: the job's last step waits for the write in flight, a cost of
 * ending, not of a checkpoint) in mode 0 (no checkpoints), 1 (async every
 * k) or 2 (blocking every k); the timed seconds, the checkpoints written
 * in them and their bytes. */
static int run(int mode, int steps, int k, const char *dir, double *secs, int *ckpts,
	       unsigned long long *bytes)
{
	char js[1024], sub[600];
	struct mr_worker_env env = { 0 };
	struct mr_errbuf eb = { "", "" };
	struct mr_worker_stats st = { 0 };
	json_error_t jerr;
	json_t *cfg;
	void *w;
	double t0 = 0.0;
	int i, rc = 0;

	snprintf(sub, sizeof(sub), "%s/mode%d", dir, mode);
	snprintf(js, sizeof(js),
		 "{\"n_layer\": 4, \"d_model\": 256, \"n_head\": 4, \"seq_len\": 256, "
		 "\"batch_size\": 8, \"vocab_size\": 256, \"steps\": %d, \"warmup_steps\": 2, "
		 "\"resume\": \"never\"%s%s%s%s}",
		 steps + 3, mode ? ", \"ckpt_dir\": \"" : "", mode ? sub : "",
		 mode ? "\", \"ckpt_keep\": 1, \"ckpt_every\": " : "",
		 mode == 1 ? "K, \"ckpt_async\": true" : mode == 2 ? "K, \"ckpt_async\": false" : "");
	/* the interval, in place of the K placeholder */
	{
		char *p = strstr(js, "K,"), tail[1024];
		if (p) {
			snprintf(tail, sizeof(tail), "%s", p + 1);
			snprintf(p, sizeof(js) - (size_t)(p - js), "%d%s", k, tail);
		}
	}
	cfg = json_loads(js, 0, &jerr);
	if (!cfg) {
		fprintf(stderr, "ckpt: bad config: %s\n", jerr.text);
		return 2;
	}
	env.world_size = env.local_world_size = 1;
	env.config = cfg;
	if ((rc = mr_gpt_worker.create(&w, &env, &eb)) < 0) {
		fprintf(stderr, "ckpt: %s\n", eb.msg);
		json_decref(cfg);
		return 1;
	}
	*ckpts = 0;
	*bytes = 0;
	for (i = 0; i < steps + 3; i++) {
		if (i == 2)
			t0 = now_s();
		if (i == steps + 2)
			*secs = now_s() - t0;
		rc = mr_gpt_worker.step(w, &st, &eb);
		if (rc < 0)
			break;
		/* step i + 1 saves when k divides it (written or in flight) */
		if (mode && i >= 2 && i < steps + 2 && (i + 1) % k == 0)
			(*ckpts)++;
		if (st.ckpt_bytes)
			*bytes = st.ckpt_bytes;
	}
	mr_gpt_worker.destroy(w);
	json_decref(cfg);
	if (rc < 0) {
		fprintf(stderr, "ckpt: %s\n", eb.msg);
		return 1;
	}
	return 0;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double fastest(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp);
	return v[0];
}

int main(int argc, char **argv)
{
	int steps = 24, k = 4, rounds = 6, opt, r, m;
	char dir[512] = "";
	double secs[3][MAX_ROUNDS], step_s, c1, c2;
	int nck[3] = { 0, 0, 0 };
	unsigned long long bytes = 0;

	while ((opt = getopt(argc, argv, "s:k:r:d:")) != -1) {
		switch (opt) {
		case 's': steps = atoi(optarg); break;
		case 'k': k = atoi(optarg); break;
		case 'r': rounds = atoi(optarg); break;
		case 'd': snprintf(dir, sizeof(dir), "%s", optarg); break;
		default:
			fprintf(stderr, "usage: %s [-s steps] [-k every] [-r rounds] [-d dir]\n",
				argv[0]);
			return 2;
		}
	}
	if (steps < k || k < 1 || rounds < 1 || rounds > MAX_ROUNDS) {
		fprintf(stderr, "ckpt: steps >= every >= 1 and 1 <= rounds <= %d\n", MAX_ROUNDS);
		return 2;
	}
	if (!dir[0]) {
		snprintf(dir, sizeof(dir), "/tmp/meshrun-bench-ckpt.XXXXXX");
		if (!mkdtemp(dir)) {
			perror("ckpt: mkdtemp");
			return 1;
		}
	}
	printf("ckpt GPT L4 d256 h4 T256 B8, %d timed steps, a checkpoint every %d, %d rounds, "
	       "dir %s\n", steps, k, rounds, dir);
	for (r = 0; r < rounds; r++) {
		for (m = 0; m < 3; m++) {
			int n = 0;
			unsigned long long b = 0;
			if (run(m, steps, k, dir, &secs[m][r], &n, &b) != 0)
				return 1;
			if (b)
				bytes = b;
			nck[m] = n;
			printf("round %d %-8s seconds=%.3f checkpoints=%d\n", r + 1,
			       m == 0 ? "none" : m == 1 ? "async" : "blocking", secs[m][r], n);
		}
	}
	step_s = fastest(secs[0], rounds) / steps;
	c1 = (fastest(secs[1], rounds) - step_s * steps) / (nck[1] ? nck[1] : 1);
	c2 = (fastest(secs[2], rounds) - step_s * steps) / (nck[2] ? nck[2] : 1);
	printf("step_ms=%.1f checkpoint_MiB=%.1f async_cost_ms=%.1f blocking_cost_ms=%.1f "
	       "async_saves_x%.1f\n", 1e3 * step_s, (double)bytes / 1048576.0, 1e3 * c1, 1e3 * c2,
	       c1 > 0 ? c2 / c1 : 0.0);
	printf("ckpt async_share=%.3f blocking_share=%.3f\n", c1 / step_s, c2 / step_s);
	return 0;
}
