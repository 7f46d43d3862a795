/*
 * test_cuda_load.c - the CUDA side is loaded only when asked for
 * (runtime/device/cuda_entry.h, cuda_load.c):
 *   - a CPU job's process maps no CUDA library: training on the cpu
 *     device never loads meshrun-cuda.so, cuBLAS or cudart (their start-up
 *     cost every process ~0.35 s of CPU when they were linked in);
 *   - asking for the cuda device where no GPU can be opened fails naming
 *     "device" and the reason: in a build with CUDA it is the plugin's (it
 *     was loaded), in one without (the sanitizer build) "no CUDA";
 *   - MESHRUN_CUDA_PLUGIN naming a missing file is reported by its path.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/mr_device.h"
#include "mr_gpt_worker.h"

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
