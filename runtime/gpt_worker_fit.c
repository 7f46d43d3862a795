/*
 * gpt_worker_fit.c - whether a job's ranks fit this machine's memory
 * before anything is allocated (see mr_gpt_worker.h): the planner's
 * ledger of each rank (runtime/plan; equal to the runtime's own to the
 * byte for parameters, gradients and optimizer state, tests/plan/
 * test_plan_ledger.c) against the host memory this process may still use
 * (MemAvailable, within its memory cgroup's limit).
 *
 * A model that does not fit fails the same way on every run: the agent
 * and `meshrun local` refuse it before launch, naming the sizes, rather
 * than retrying an allocation that fails (or, overcommitted, an
 * out-of-memory kill in the middle of a step).
 *
 * Non-goals: GPU memory (a cuda job's model lives there), what the
 * planner cannot model (a fixed pp_layers split): those are left to the
 * allocation.
 */
#include <stdio.h>
#include <string.h>

#include "mr_gpt_worker.h"
#include "plan/mr_plan.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* A number from the first line of path, or -1 ("max" and absent: -1). */
static double read_number(const char *path)
{
	FILE *f = fopen(path, "r");
	double v = -1;

	if (f) {
		if (fscanf(f, "%lf", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

/* Room left under this process's memory cgroup (v2 memory.max -
 * memory.current, v1 memory.limit_in_bytes - memory.usage_in_bytes),
 * or -1 without a limit. */
static double cgroup_room(void)
{
	char line[512], path[1024], *p;
	double room = -1, lim, use;
	FILE *f = fopen("/proc/self/cgroup", "r");

	while (f && fgets(line, sizeof(line), f)) {
		int v2 = !strncmp(line, "0::", 3);
		if (!v2 && !strstr(line, ":memory:"))
			continue;
		p = strchr(strchr(line, ':') + 1, ':') + 1;
		p[strcspn(p, "\n")] = '\0';
		/* the cgroup's own files, or the mount's (a cgroup namespace) */
		for (int own = 1; own >= 0 && room < 0; own--) {
			const char *dir = own ? p : "";
			snprintf(path, sizeof(path), "/sys/fs/cgroup/%s%s/%s", v2 ? "" : "memory",
				 dir, v2 ? "memory.max" : "memory.limit_in_bytes");
			lim = read_number(path);
			snprintf(path, sizeof(path), "/sys/fs/cgroup/%s%s/%s", v2 ? "" : "memory",
				 dir, v2 ? "memory.current" : "memory.usage_in_bytes");
			use = read_number(path);
			/* v1 says "no limit" with a page-rounded LONG_MAX */
			if (lim > 0 && lim < 1e18 && use >= 0)
				room = lim > use ? lim - use : 0;
		}
	}
	if (f)
		fclose(f);
	return room;
}

/* Bytes this process may still allocate on the host; 0 when unknown. */
static double host_available(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	double kb = 0, room = cgroup_room();
	char line[128];

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return room >= 0 && room < kb * 1024.0 ? room : kb * 1024.0;
}

/* The planner's ledger of ranks r: *need their sum, *worst the rank
 * that needs the most; -1 when the planner cannot model the job (a cuda
 * device, a pp_layers split, a mesh it refuses). */
static int estimate(const json_t *config, const struct mr_gpt_worker_ranks *r, double avail,
		    double *need, struct mr_plan_mem *worst)
{
	struct mr_errbuf pe = { "", "" };
	struct mr_plan_input in;
	struct mr_plan_mesh mesh;
	struct mr_plan_mem rank;
	const json_t *dev = config ? json_object_get(config, "device") : NULL;
	int per_stage, accum = 1, B = 8;

	if ((dev && json_is_string(dev) && strcmp(json_string_value(dev), "cpu")) ||
	    r->world < 1 || r->n < 1 || r->tp < 1 || r->pp < 1 || r->cp < 1)
		return -1;
	memset(&in, 0, sizeof(in));
	memset(worst, 0, sizeof(*worst));
	*need = 0;
	/* the planner's cluster: only its memory matters here */
	in.cluster.gpus = r->world;
	in.cluster.gpus_per_node = r->n;
	in.cluster.mem_bytes = avail > 0 ? avail / r->n : 1e18;
	in.cluster.peak_flops = in.cluster.mfu = in.cluster.mem_bw = 1;
	in.cluster.bw_intra = in.cluster.bw_inter = 1;
	if (mr_plan_from_workload(config, r->world, &in, &pe) < 0)
		return -1;
	if (config && json_integer_value(json_object_get(config, "grad_accum")) > 0)
		accum = (int)json_integer_value(json_object_get(config, "grad_accum"));
	if (config && json_integer_value(json_object_get(config, "batch_size")) > 0)
		B = (int)json_integer_value(json_object_get(config, "batch_size"));
	mesh = in.fix;
	mesh.tp = r->tp;
	mesh.pp = r->pp;
	mesh.cp = r->cp;
	mesh.ep = r->ep;
	mesh.dp = r->world / (r->tp * r->pp * r->cp);
	mr_plan_mesh_worker_defaults(&mesh);
	in.global_batch = mesh.dp * accum * B;
	if (mesh.dp < 1 || mr_plan_mesh_check(&in, &mesh, &pe) < 0)
		return -1;
	/* a pipeline stage is a contiguous block of world / pp ranks */
	per_stage = r->world / r->pp;
	for (int k = r->first; k < r->first + r->n; k++) {
		if (mr_plan_mem_stage(&in, &mesh, k / per_stage, &rank, &pe) < 0)
			return -1;
		*need += rank.total;
		if (rank.total > worst->total)
			*worst = rank;
	}
	return 0;
}

int mr_gpt_worker_need(const json_t *config, const struct mr_gpt_worker_ranks *r, char *buf,
		       size_t cap)
{
	double avail = host_available(), need;
	struct mr_plan_mem w;

	if (estimate(config, r, avail, &need, &w) < 0)
		return -1;
	snprintf(buf, cap,
		 "%d rank(s) here need %.1f GiB and the machine has %.1f GiB available (a rank: "
		 "parameters %.2f, gradients %.2f, optimizer %.2f, activations %.2f, workspace "
		 "%.2f GiB)", r->n, need / GIB, avail / GIB, w.bytes[MR_MEM_PARAMS] / GIB,
		 w.bytes[MR_MEM_GRADS] / GIB, w.bytes[MR_MEM_OPTIM] / GIB, w.bytes[MR_MEM_ACTS] / GIB,
		 w.bytes[MR_MEM_WORKSPACE] / GIB);
	return need <= avail || avail <= 0 ? 0 : 1;
}

int mr_gpt_worker_fits(const json_t *config, const struct mr_gpt_worker_ranks *r,
		       struct mr_errbuf *eb)
{
	char what[400];

	if (mr_gpt_worker_need(config, r, what, sizeof(what)) <= 0)
		return 0;
	return mr_errf(eb, MR_ELIMIT, "the model does not fit: %s; use %s", what,
		       r->world == r->n ? "a smaller model, or more machines with a higher 'zero' "
					  "stage, pp or tp"
					: "a smaller model, a higher 'zero' stage, pp or tp, or fewer "
					  "ranks per machine");
}
