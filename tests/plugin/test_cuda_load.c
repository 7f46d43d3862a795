/*
 * test_cuda_load.c - the CUDA side is loaded only when asked for
 * (runtime/plugin/cuda_entry.h, cuda_load.c):
 *   - a CPU job's process maps no CUDA library: training on the cpu
 *     device never loads meshrun-cuda.so, cuBLAS or cudart (their start-up
 *     cost every process ~0.35 s of CPU when they were linked in);
 *   - asking for the cuda device where no GPU can be opened fails naming
 *     "device" and the reason: in a build with CUDA it is the plugin's (it
 *     was loaded), in one without (the sanitizer build) "no CUDA";
 *   - MESHRUN_CUDA_PLUGIN naming a missing file is reported by its path;
 *   - where a GPU is (a device node; MESHRUN_NVIDIA_DEV stands for one
 *     here) and the CUDA side cannot use it, bench/gpu, make bench-gpu's
 *     script and the GPU parity tests fail naming why - never "skipped".
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/wait.h>

#include "device/mr_device.h"
#include "mr_gpt_worker.h"
#include "proc.h"

/* 1 if a mapping of this process has needle in its path. */
static int mapped(const char *needle)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[1024];
	int found = 0;

	cr_assert_not_null(f);
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, needle) != NULL;
	fclose(f);
	return found;
}

Test(cuda_load, a_cpu_job_loads_no_cuda_library)
{
	struct mr_worker_env env = { .job = "ns/test", .world_size = 1, .local_world_size = 1,
				     .tp = 1, .pp = 1, .cp = 1, .ep = 1, .dp = 1 };
	struct mr_errbuf eb = { "", "" };
	struct mr_worker_stats st = { 0 };
	json_error_t jerr;
	json_t *cfg = json_loads("{\"n_layer\": 1, \"d_model\": 32, \"n_head\": 2, "
				 "\"seq_len\": 8, \"batch_size\": 1, \"steps\": 2, \"threads\": 1}",
				 0, &jerr);
	void *w = NULL;
	int rc;

	cr_assert_not_null(cfg);
	env.config = cfg;
	cr_assert_eq(mr_gpt_worker.create(&w, &env, &eb), 0, "%s", eb.msg);
	while ((rc = mr_gpt_worker.step(w, &st, &eb)) == MR_WORKER_MORE)
		;
	cr_expect_eq(rc, MR_WORKER_DONE, "%s", eb.msg);
	mr_gpt_worker.destroy(w);
	json_decref(cfg);
	cr_expect(!mapped("meshrun-cuda.so"), "a cpu job loaded the CUDA plugin");
	cr_expect(!mapped("libcublas"), "a cpu job loaded cuBLAS");
	cr_expect(!mapped("libcudart"), "a cpu job loaded cudart");
}

Test(cuda_load, cuda_without_a_gpu_names_device_and_why)
{
	struct mr_errbuf eb = { "", "" }, why = { "", "" };
	struct mr_dev d;

	if (mr_dev_cuda_count(&why) > 0)
		cr_skip_test("this machine has a GPU: the cuda device opens");
	cr_assert_eq(mr_dev_open(&d, "cuda", 0, NULL, NULL, &eb), MR_ENOTSUP);
	cr_assert_str_eq(eb.field, "device");
	cr_assert(strstr(eb.msg, why.msg) != NULL, "'%s' lacks the reason '%s'", eb.msg,
		  why.msg);
#ifdef MR_HAVE_CUDA
	cr_expect(mapped("meshrun-cuda.so"), "the plugin was not loaded: %s", why.msg);
#else
	cr_expect(strstr(eb.msg, "this build has no CUDA") != NULL, "%s", eb.msg);
#endif
}

Test(cuda_load, a_missing_plugin_path_is_named)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_dev d;

	setenv("MESHRUN_CUDA_PLUGIN", "/nonexistent/meshrun-cuda.so", 1);
	cr_assert_eq(mr_dev_open(&d, "cuda", 0, NULL, NULL, &eb), MR_ENOTSUP);
	cr_assert_str_eq(eb.field, "device");
	cr_assert(strstr(eb.msg, "/nonexistent/meshrun-cuda.so") != NULL, "%s", eb.msg);
}

/* Runs cmd (a shell command line) with MESHRUN_NVIDIA_DEV standing for a
 * GPU's device node (a file of the test's) when fake_gpu; its exit code,
 * its output in out (cap bytes). */
static int run_as_on(int fake_gpu, const char *cmd, char *out, size_t cap)
{
	char node[512], full[2048];
	const char *dir = mr_test_scratch("mr-cuda-load");
	FILE *p;
	size_t n = 0;
	int st;

	cr_assert_not_null(dir);
	snprintf(node, sizeof(node), "%s/nvidia0", dir);
	if (fake_gpu)
		cr_assert_not_null(fopen(node, "w"));
	/* a Criterion program inside this one: not as its worker (BXFI_MAP) */
	snprintf(full, sizeof(full), "env -u BXFI_MAP MESHRUN_NVIDIA_DEV='%s' %s 2>&1", node, cmd);
	cr_assert_not_null(p = popen(full, "r"));
	while (n + 1 < cap && fgets(out + n, (int)(cap - n), p))
		n += strlen(out + n);
	out[n] = '\0';
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Where a GPU is, a GPU entry point that cannot use it fails, naming why;
 * "skipped" is only for a machine without one: bench/gpu, bench/gpu.sh
 * (make bench-gpu: its exit status is bench/gpu's) and, in a build with
 * CUDA, the GPU parity tests. */
Test(cuda_load, a_gpu_the_cuda_side_cannot_use_fails_every_entry_point, .timeout = 300)
{
	char cmd[1024], out[16384];
	const char *b = mr_proc_build_dir();

	if (mr_dev_gpu_node() && !getenv("MESHRUN_NVIDIA_DEV"))
		cr_skip_test("this machine has a GPU: the fake one would be no test");
	snprintf(cmd, sizeof(cmd), "'%s/bench/gpu' -t", b);
	cr_expect_eq(run_as_on(0, cmd, out, sizeof(out)), 0, "%s", out);
	cr_expect(strstr(out, "bench gpu: skipped"), "%s", out);
	cr_expect_eq(run_as_on(1, cmd, out, sizeof(out)), 1, "%s", out);
	cr_expect(strstr(out, "bench gpu: FAILED - an NVIDIA GPU is present"), "%s", out);
	snprintf(cmd, sizeof(cmd), "MESHRUN_CUDA_PLUGIN=/nonexistent/meshrun-cuda.so '%s/bench/gpu'",
		 b);
	cr_expect_eq(run_as_on(1, cmd, out, sizeof(out)), 1, "%s", out);
	cr_expect(strstr(out, "/nonexistent/meshrun-cuda.so"), "the plugin is not named: %s", out);
	snprintf(cmd, sizeof(cmd), "sh bench/gpu.sh '%s'", b);
	cr_expect_eq(run_as_on(1, cmd, out, sizeof(out)), 1, "make bench-gpu passed: %s", out);
#ifdef MR_HAVE_CUDA
	snprintf(cmd, sizeof(cmd), "'%s/tests/gpu/test_parity_fp32' --filter 'parity/dp2_moe'", b);
	cr_expect_neq(run_as_on(1, cmd, out, sizeof(out)), 0, "a GPU parity test passed: %s",
		      out);
	cr_expect(strstr(out, "an NVIDIA GPU is present"), "%s", out);
	cr_expect(!strstr(out, "Skipping"), "%s", out);
	cr_expect_eq(run_as_on(0, cmd, out, sizeof(out)), 0, "without a GPU it skips: %s", out);
#endif
}
