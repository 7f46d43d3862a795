/*
 * test_device_pack.c - what the GPU lease carries, checked here where no
 * GPU is: scripts/device-pack.sh's folder holds everything its programs
 * load - the CUDA plugin (meshrun-cuda.so) and every library beyond the
 * device image's own (glibc, libstdc++, libgcc, CUDA's runtime, cuBLAS
 * and NCCL) - and its script (scripts/device-run.sh, the pack's run.sh)
 * runs its whole check end to end on the emulated device, inside its time
 * budget, ending with its table; then its memory step (not in all), a
 * row per run with the run's figures; its compile step (torch.compile's
 * anchor, not in all) says there is no GPU. What travels is the archive
 * (pack.tgz, under its size limit): the script runs from a copy unpacked
 * from it, so the archive is proven whole.
 *
 * Skipped in a build without the plugin (the sanitizer build: no nvcc
 * there); the pack refuses such a build (its programs could not use a
 * GPU).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc.h"

/* What the device image has itself: no need to carry it. */
static int on_the_image(const char *lib)
{
	static const char *const own[] = { "linux-vdso", "ld-linux", "libc.so", "libm.so",
					   "libpthread.so", "librt.so", "libdl.so",
					   "libresolv.so", "libstdc++.so", "libgcc_s.so",
					   "libcudart.so", "libcublas.so", "libcublasLt.so",
					   "libnccl.so", "libcuda.so" };

	if (strrchr(lib, '/')) /* the loader names itself by its path */
		lib = strrchr(lib, '/') + 1;
	for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
		if (strstr(lib, own[i]) == lib)
			return 1;
	return 0;
}

/* Every library `file` loads (ldd, the pack's lib/ first) is the pack's
 * or the image's; the first one that is neither into bad. */
static int loads_only_the_pack(const char *pack, const char *file, char *bad, size_t cap)
{
	char cmd[PATH_MAX * 3], line[1024], libdir[PATH_MAX + 8];
	FILE *p;
	int ok = 1;

	snprintf(libdir, sizeof(libdir), "%s/lib/", pack);
	snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH='%s/lib' ldd '%s' 2>&1", pack, file);
	cr_assert_not_null(p = popen(cmd, "r"));
	while (fgets(line, sizeof(line), p)) {
		char name[512] = "", path[PATH_MAX] = "";
		if (sscanf(line, " %511s => %4095s", name, path) < 1 || !name[0])
			continue;
		if (strstr(line, "not found") || (!on_the_image(name) && strncmp(path, libdir,
									     strlen(libdir)))) {
			if (ok)
				snprintf(bad, cap, "%.300s: %.600s", file, line);
			ok = 0;
		}
	}
	pclose(p);
	return ok;
}

/* ELF files below dir, recursively, checked with loads_only_the_pack. */
static int check_tree(const char *pack, const char *dir, int *files, char *bad, size_t cap)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int ok = 1;

	cr_assert_not_null(d, "%s", dir);
	while ((e = readdir(d))) {
		char path[PATH_MAX], magic[4] = { 0 };
		struct stat st;
		FILE *f;
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (stat(path, &st) != 0)
			continue;
		if (S_ISDIR(st.st_mode)) {
			ok &= check_tree(pack, path, files, bad, cap);
			continue;
		}
		if (!(f = fopen(path, "rb")))
			continue;
		if (fread(magic, 1, 4, f) == 4 && !memcmp(magic, "\177ELF", 4)) {
			(*files)++;
			ok &= loads_only_the_pack(pack, path, bad, cap);
		}
		fclose(f);
	}
	closedir(d);
	return ok;
}

/* Runs the pack's script with STEPS on the emulated device from dir (its
 * logs under dir/<name>, its output in dir/<name>.out, whose tail goes to
 * table); expects exit 0 and every row of rows ("\0"-separated) in the
 * table. Returns the output file's path in out. */
static void run_steps(const char *dir, const char *pack, const char *name, const char *steps,
		      const char *rows, char *table, size_t cap, char *out, size_t out_cap)
{
	char cmd[PATH_MAX * 3];
	int st;

	snprintf(out, out_cap, "%s/%s.out", dir, name);
	snprintf(cmd, sizeof(cmd),
		 "cd '%s' && env -u BXFI_MAP EMUL=1 BUDGET=400 OUT='%s/%s' '%s/run.sh' %s >'%s' 2>&1",
		 dir, dir, name, pack, steps, out);
	st = system(cmd);
	mr_test_tail(out, table, cap);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "run.sh %s failed:\n%s", steps, table);
	for (const char *row = rows; *row; row += strlen(row) + 1)
		cr_expect(strstr(table, row), "no row '%s' in:\n%s", row, table);
}

Test(device_pack, the_pack_holds_what_it_loads_and_its_script_runs_on_the_emulation,
     .timeout = 600)
{
	const char *b = mr_proc_build_dir(), *dir = mr_test_scratch("mr-devpack");
	char pack[PATH_MAX], cmd[PATH_MAX * 3], plugin[PATH_MAX + 32], bad[1024] = "";
	char table[8192];
	int files = 0, used = -1, budget = 0;
	struct stat st;
	FILE *f;

	snprintf(plugin, sizeof(plugin), "%s/meshrun-cuda.so", b);
	if (access(plugin, F_OK) != 0)
		cr_skip_test("this build has no CUDA plugin (no nvcc: nothing to pack)");
	cr_assert_not_null(dir);
	snprintf(pack, sizeof(pack), "%s/pack", dir);
	snprintf(cmd, sizeof(cmd), "scripts/device-pack.sh '%s' '%s' >'%s/pack.out' 2>&1", b, pack,
		 dir);
	cr_assert_eq(system(cmd), 0, "device-pack.sh failed (%s/pack.out)", dir);
	snprintf(plugin, sizeof(plugin), "%s/build/meshrun-cuda.so", pack);
	cr_assert_eq(access(plugin, F_OK), 0, "the pack has no CUDA plugin");
	cr_expect(check_tree(pack, pack, &files, bad, sizeof(bad)), "%s", bad);
	cr_expect_geq(files, 12, "only %d programs and libraries in the pack", files);

	/* what travels: the archive, under the limit, unpacked elsewhere */
	snprintf(cmd, sizeof(cmd), "%s.tgz", pack);
	cr_assert_eq(stat(cmd, &st), 0, "no %s", cmd);
	cr_expect_leq(st.st_size, 48L << 20, "the pack's archive is %ld bytes",
		      (long)st.st_size);
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s/unpacked' && tar xzf '%s.tgz' -C '%s/unpacked'",
		 dir, pack, dir);
	cr_assert_eq(system(cmd), 0, "the archive does not unpack");
	snprintf(pack, sizeof(pack), "%s/unpacked/pack", dir);

	/* the script, whole, on the emulated device, from another directory */
	run_steps(dir, pack, "run", "all",
		  "test_device_cuda       0\0test_cuda_model        0\0bf16_vs_fp32\0"
		  "parity_fp32            0\0parity_bf16            0\0bench_gpu              0\0"
		  "kinds_tiny             -         0s  attention=\0",
		  table, sizeof(table), cmd, sizeof(cmd));
	cr_expect(!strstr(table, "Tested: 0 "), "a step ran no test:\n%s", table);
	cr_assert_not_null(f = fopen(cmd, "r"));
	while (fgets(cmd, sizeof(cmd), f))
		if (sscanf(cmd, "device-run: %ds of %ds", &used, &budget) == 2)
			break;
	fclose(f);
	cr_expect(used >= 0 && used <= budget, "the script took %d s of its %d s:\n%s", used,
		  budget, table);
	cr_log_info("the emulated device run took %d s of %d s", used, budget);

	/* the memory step (not in all): four runs, each with its figures */
	run_steps(dir, pack, "mem", "memory",
		  "memory_none_none       0\0memory_full_none       0\0"
		  "memory_none_optimizer  0\0memory_none_optimizer+master 0\0"
		  "memory_full_none_figures -         0s  tokens_per_s=\0",
		  table, sizeof(table), cmd, sizeof(cmd));
	/* the torch.compile anchor's step (not in all): no GPU here, says so */
	run_steps(dir, pack, "compile", "compile", "bench_gpu_compile      n/a  \0", table,
		  sizeof(table), cmd, sizeof(cmd));
}
