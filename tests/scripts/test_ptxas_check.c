/*
 * test_ptxas_check.c - the build's register-spill check
 * (scripts/ptxas-check.sh, run by the Makefile after every nvcc) against
 * what the real ptxas reports: a kernel squeezed into 24 registers that
 * must spill fails it, named; one that fits passes.
 *
 * Skipped where there is no nvcc ($CUDA_HOME/bin/nvcc, /usr/local/cuda by
 * default): there the build compiles no kernel to check.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A kernel that keeps 32 values live across a loop over all of them. */
static const char *const spilling =
	"__global__ void keeps_too_much(float *out, const float *in, int n)\n"
	"{\n"
	"\tfloat acc[32], s = 0.0f;\n"
	"#pragma unroll\n"
	"\tfor (int i = 0; i < 32; i++)\n"
	"\t\tacc[i] = in[threadIdx.x + i * n];\n"
	"#pragma unroll\n"
	"\tfor (int j = 0; j < 32; j++)\n"
	"#pragma unroll\n"
	"\t\tfor (int i = 0; i < 32; i++)\n"
	"\t\t\ts += acc[i] * acc[(i + j) & 31];\n"
	"\tout[threadIdx.x] = s;\n"
	"}\n";

static const char *const fitting =
	"__global__ void fits(float *out, const float *in)\n"
	"{\n"
	"\tout[threadIdx.x] = 2.0f * in[threadIdx.x];\n"
	"}\n";

static char nvcc[PATH_MAX];
static char dir[] = "/tmp/mr-ptxas-XXXXXX";

static void setup(void)
{
	const char *home = getenv("CUDA_HOME");

	snprintf(nvcc, sizeof(nvcc), "%s/bin/nvcc", home && *home ? home : "/usr/local/cuda");
	if (access(nvcc, X_OK) != 0)
		cr_skip_test("no nvcc at %s: no kernel is built here", nvcc);
	cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
	char cmd[PATH_MAX + 16];

	if (strcmp(dir, "/tmp/mr-ptxas-XXXXXX")) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		cr_expect_eq(system(cmd), 0);
	}
}

/* Compiles source for sm_90 in 24 registers; runs the check on what
 * ptxas said; its exit code, its stderr into out. */
static int check(const char *name, const char *source, char *out, size_t cap)
{
	char path[PATH_MAX], cmd[4 * PATH_MAX];
	FILE *f;
	size_t n;
	int rc;

	snprintf(path, sizeof(path), "%s/%s.cu", dir, name);
	cr_assert_not_null(f = fopen(path, "w"));
	fputs(source, f);
	fclose(f);
	snprintf(cmd, sizeof(cmd),
		 "'%s' -gencode arch=compute_90,code=sm_90 -O3 -maxrregcount=24 -Xptxas -v "
		 "-c -o '%s/%s.o' '%s' 2>'%s/%s.ptxas'",
		 nvcc, dir, name, path, dir, name);
	cr_assert_eq(system(cmd), 0, "nvcc failed: %s", cmd);
	snprintf(cmd, sizeof(cmd), "scripts/ptxas-check.sh '%s/%s.ptxas' 2>'%s/%s.out'", dir, name,
		 dir, name);
	rc = system(cmd);
	snprintf(path, sizeof(path), "%s/%s.out", dir, name);
	cr_assert_not_null(f = fopen(path, "r"));
	n = fread(out, 1, cap - 1, f);
	out[n] = '\0';
	fclose(f);
	return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

Test(ptxas_check, a_kernel_that_spills_fails_the_build_named, .init = setup, .fini = teardown,
     .timeout = 240)
{
	char out[4096];

	cr_expect_eq(check("spills", spilling, out, sizeof(out)), 1, "%s", out);
	cr_expect(strstr(out, "kernel spills registers: keeps_too_much(float*, float const*, "
			      "int) (sm_90)"),
		  "%s", out);
}

Test(ptxas_check, a_kernel_that_fits_passes, .init = setup, .fini = teardown, .timeout = 240)
{
	char out[4096];

	cr_expect_eq(check("fits", fitting, out, sizeof(out)), 0, "%s", out);
	cr_expect_null(strstr(out, "spills"), "%s", out);
}
