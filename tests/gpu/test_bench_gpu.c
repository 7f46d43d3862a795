/*
 * test_bench_gpu.c - `make bench-gpu`'s program (bench/gpu.c) runs: built
 * against the CUDA emulation ($MESHRUN_BUILD/emul/bench-gpu) on two
 * emulated GPUs with its tiny models (-t), it must train one GPU, dp over
 * both and tp over both, and the llama on one GPU (what stands for the
 * 1B), through the gpt worker on the cuda device, and
 * print a line per run and the summary line with a positive token rate
 * and an MFU against the peak it was given (-P: the emulated GPU has no
 * datasheet peak), and each model's step broken down by kind (the
 * shares sum to 100 %); one timed step, whose loss cannot have fallen,
 * fails it. Without a GPU it must say so and succeed. How fast the
 * runs are is the benchmark's business on a real GPU, not this test's.
 *
 * Emulation only (Makefile).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc.h"

/* Runs bench-gpu with env and args; its output (stdout + stderr) into out. */
static int run_bench(const char *env, const char *args, char *out, size_t cap)
{
	char cmd[2048];
	FILE *p;
	size_t n;
	int st;

	snprintf(cmd, sizeof(cmd), "%s timeout 600 '%s/emul/bench-gpu' %s 2>&1", env,
		 mr_proc_build_dir(), args);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	n = fread(out, 1, cap - 1, p);
	out[n] = '\0';
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The number after key on the line starting with prefix, or -1. */
static double field(const char *out, const char *prefix, const char *key)
{
	const char *l = out;

	while ((l = strstr(l, prefix))) {
		const char *eol = strchr(l, '\n'), *k = strstr(l, key);
		if (k && (!eol || k < eol))
			return atof(k + strlen(key));
		l += strlen(prefix);
	}
	return -1.0;
}

Test(bench_gpu, tiny_runs_on_one_gpu_dp_and_tp, .timeout = 900)
{
	static char out[16384];
	const char *runs[] = { "tiny bf16  gpus=1 tp=1 dp=1", "tiny bf16  gpus=2 tp=1 dp=2",
			       "tiny bf16  gpus=2 tp=2 dp=1", "tinyllama bf16  gpus=1 tp=1 dp=1" };
	size_t i;

	cr_assert_eq(run_bench("MR_CUDA_EMUL_DEVICES=2", "-t -P 1e9", out, sizeof(out)), 0, "%s",
		     out);
	for (i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
		char prefix[64];
		snprintf(prefix, sizeof(prefix), "gpu %s", runs[i]);
		cr_expect_gt(field(out, prefix, "tokens_per_s="), 0.0, "%s missing:\n%s", runs[i],
			     out);
		cr_expect_gt(field(out, prefix, "mfu="), 0.0, "%s: no MFU:\n%s", runs[i], out);
		/* CUDA graphs where a rank's passes talk to no other rank */
		if (strstr(runs[i], "gpus=1"))
			cr_expect_gt(field(out, prefix, "graphs="), 0.0, "%s: no graph:\n%s",
				     runs[i], out);
		else
			cr_expect_eq(field(out, prefix, "graphs="), 0.0, "%s: graphs:\n%s",
				     runs[i], out);
	}
	/* each model's step by kind: shares of its span, summing to 100 % */
	for (i = 0; i < 2; i++) {
		const char *kinds = i ? "gpu tinyllama kinds:" : "gpu tiny kinds:";
		const char *names[] = { "attention=", "gemm=", "optimizer=", "copy=",
					"other=",     "idle=" };
		double sum = 0.0;
		size_t k;
		for (k = 0; k < sizeof(names) / sizeof(names[0]); k++)
			sum += field(out, kinds, names[k]);
		cr_expect(fabs(sum - 100.0) < 1.0, "%s shares sum to %.1f:\n%s", kinds, sum, out);
		cr_expect_gt(field(out, kinds, "gemm="), 0.0, "%s", out);
		cr_expect_gt(field(out, kinds, "attention="), 0.0, "%s", out);
		cr_expect_gt(field(out, kinds, "step_ms="), 0.0, "%s", out);
	}
	cr_expect_gt(field(out, "gpu tokens_per_s=", "tokens_per_s="), 0.0, "%s", out);
	cr_expect_gt(field(out, "gpu tokens_per_s=", "mfu="), 0.0, "%s", out);
}

/* One timed step: the loss cannot have fallen, and the bench says so. */
Test(bench_gpu, a_loss_that_does_not_fall_fails_the_bench, .timeout = 600)
{
	static char out[16384];

	cr_expect_eq(run_bench("MR_CUDA_EMUL_DEVICES=1", "-t -s 1 -m 124m -P 1e9", out,
			       sizeof(out)),
		     1, "%s", out);
	cr_expect(strstr(out, "over the timed steps: not training") != NULL, "%s", out);
}

Test(bench_gpu, without_a_gpu_it_says_so_and_succeeds, .timeout = 120)
{
	static char out[4096];

	cr_assert_eq(run_bench("MR_CUDA_EMUL_NODEV=1", "", out, sizeof(out)), 0, "%s", out);
	cr_expect(strstr(out, "bench gpu: skipped - no cuda device") != NULL, "%s", out);
	cr_expect(strstr(out, "tokens_per_s") == NULL, "%s", out);
}

Test(bench_gpu, bad_arguments_are_refused, .timeout = 120)
{
	static char out[4096];

	cr_expect_eq(run_bench("", "-m 7b", out, sizeof(out)), 2, "%s", out);
	cr_expect(strstr(out, "-m 124m, 350m, 1b or all") != NULL, "%s", out);
}
