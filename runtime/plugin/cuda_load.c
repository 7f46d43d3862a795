/*
 * cuda_load.c - finding the CUDA side's table (see cuda_entry.h): the one
 * linked into this program if there is one, else meshrun-cuda.so, loaded
 * once, from the first of
 *   $MESHRUN_CUDA_PLUGIN                        (a path)
 *   <program's dir>/meshrun-cuda.so             (build/)
 *   <program's dir>/../lib/meshrun/meshrun-cuda.so   (installed: make install)
 *   <program's dir>/../meshrun-cuda.so, ../../  (build/bench/, build/tests/<part>/;
 *                                              only in a build with CUDA)
 * The plugin's references to the core (mr_errf, the log, ...) resolve
 * against the program, which exports them (the Makefile links with
 * -rdynamic and keeps every symbol the plugin names).
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plugin/cuda_entry.h"
#include "mr_log.h"

/* defined only where the CUDA side is linked in */
#pragma weak mr__cuda_table

#define PLUGIN "meshrun-cuda.so"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const struct mr__cuda_entry *table;
static char why[2 * PATH_MAX + 256];

/* Tries one path; 1 = loaded. A file that is there but will not load (a
 * missing libcublasLt, an unresolved symbol) is the reason to report. */
static int try_path(const char *path)
{
	char *real;
	void *h;

	if (access(path, F_OK) != 0)
		return 0;
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h)
		table = dlsym(h, "mr__cuda_table");
	if (!table) {
		snprintf(why, sizeof(why), "unable to load %s: %s", path,
			 h ? "it has no mr__cuda_table" : dlerror());
		if (h)
			dlclose(h);
		return 0;
	}
	real = realpath(path, NULL);
	mr_log_debug("cuda_plugin_loaded", "path=%s", mr_log_q(real ? real : path));
	free(real);
	return 1;
}

static void load(void)
{
	/* a build tree's tests and benchmarks sit one or two levels down; a
	 * build without CUDA (the sanitizer one, inside the CUDA build's
	 * tree) must not find the other build's plugin there */
	static const char *const rel[] = { "", "/../lib/meshrun",
#ifdef MR_HAVE_CUDA
					   "/..", "/../..",
#endif
	};
	const char *env = getenv("MESHRUN_CUDA_PLUGIN");
	char exe[PATH_MAX], path[PATH_MAX + 64];
	ssize_t n;

	if (&mr__cuda_table) {
		table = &mr__cuda_table;
		return;
	}
	if (env && *env) {
		if (!try_path(env) && !why[0])
			snprintf(why, sizeof(why), "MESHRUN_CUDA_PLUGIN '%s' does not exist", env);
		return;
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0) {
		snprintf(why, sizeof(why), "unable to find this program's directory");
		return;
	}
	exe[n] = '\0';
	if (strrchr(exe, '/'))
		*strrchr(exe, '/') = '\0';
	for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]) && !table; i++) {
		snprintf(path, sizeof(path), "%s%s/" PLUGIN, exe, rel[i]);
		if (try_path(path))
			return;
	}
	if (!why[0])
		snprintf(why, sizeof(why),
			 "this build has no CUDA (no " PLUGIN " in %s or %s/../lib/meshrun; "
			 "nvcc was not found when it was built)",
			 exe, exe);
}

const struct mr__cuda_entry *mr__cuda_entry(struct mr_errbuf *eb)
{
	pthread_once(&once, load);
	if (!table)
		mr_errf(eb, MR_ENOTSUP, "%s", why);
	return table;
}

const char *mr_dev_gpu_node(void)
{
	const char *env = getenv("MESHRUN_NVIDIA_DEV");
	static const char *const nodes[] = { "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2",
					     "/dev/nvidia3" };

	if (env && *env) /* tests: this path stands for the device node */
		return access(env, F_OK) == 0 ? env : NULL;
	for (size_t i = 0; i < sizeof(nodes) / sizeof(nodes[0]); i++)
		if (access(nodes[i], F_OK) == 0)
			return nodes[i];
	return NULL;
}

int mr_dev_cuda_count(struct mr_errbuf *why)
{
	struct mr_errbuf own = { "", "" };
	const struct mr__cuda_entry *e = mr__cuda_entry(&own);
	const char *node;
	int n = e ? e->device_count(&own) : 0;

	if (n > 0)
		return n;
	/* none: a machine without a GPU is a skip; one with a GPU the CUDA
	 * side cannot use is an error, never a skip */
	if ((node = mr_dev_gpu_node()))
		return mr_errf(why, MR_ENOTSUP, "an NVIDIA GPU is present (%s) but %s", node,
			       own.msg);
	mr_errf(why, MR_ENOTSUP, "%s", own.msg);
	return 0;
}
