/*
 * comm.c - nccl-tests-style benchmark of the meshrun host communicator.
 *
 *   build/bench/comm -n RANKS -t shm|tcp [-b MINBYTES] [-e MAXBYTES]
 *
 * Forks RANKS processes (bootstrap through a temporary directory KV),
 * then for allreduce, allgather, reduce_scatter, alltoall and sendrecv
 * (ring: send to rank+1, receive from rank-1) and sizes MINBYTES..MAXBYTES
 * (x8 steps, plus 1 MiB and 16 MiB) prints one line per measurement
 * (COMM_OPS="allreduce,allgather" in the environment limits the ops):
 *
 *   comm meshrun <shm|tcp> <op> <ranks> <bytes> <time_us> <algbw> <busbw>
 *
 * bytes follow nccl-tests (allreduce: the buffer; allgather: the gathered
 * output; reduce_scatter: the input; alltoall: one rank's buffer), time is
 * the slowest rank's mean, algbw = bytes/time in GB/s and busbw = algbw x
 * the nccl-tests factor (allreduce 2(n-1)/n, allgather, reduce_scatter and
 * alltoall (n-1)/n, sendrecv 1). fp32 data.
 *
 * Ranks are pinned to CPU rank (sched_setaffinity) when RANKS <= CPUs, as
 * mpirun binds them by default (--bind-to core for np <= 2, nothing when
 * oversubscribed): same placement on both sides of the comparison.
 * COMM_BIND=0 leaves placement to the kernel.
 *
 * Buffers come from mr_comm_mem_alloc() (registered, as the training
 * runtime allocates what it communicates; bench/comm_mpi.c uses
 * MPI_Alloc_mem alike); COMM_MEM=malloc uses plain malloc() memory.
 *
 * Non-goals: validation (tests/comm does that).
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/mr_comm.h"
#include "../tests/comm/kv_mem.h"

static const char *ops[] = { "allreduce", "allgather", "reduce_scatter", "alltoall", "sendrecv" };

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int run_op(struct mr_comm *c, int op, float *a, float *b, size_t bytes)
{
	int n = mr_comm_size(c), me = mr_comm_rank(c);
	size_t cnt = bytes / 4, per = cnt / (size_t)n;

	switch (op) {
	case 0: return mr_comm_allreduce(c, a, b, cnt, MR_COMM_F32, MR_COMM_SUM);
	case 1: return mr_comm_allgather(c, a, b, per, MR_COMM_F32);
	case 2: return mr_comm_reduce_scatter(c, a, b, per, MR_COMM_F32, MR_COMM_SUM);
	case 3: return mr_comm_alltoall(c, a, b, per, MR_COMM_F32);
	default:
		/* like MPI_Sendrecv on the OpenMPI side */
		if (n == 1)
			return 0;
		return mr_comm_sendrecv(c, a, b, cnt, MR_COMM_F32, (me + 1) % n, (me + n - 1) % n, 0);
	}
}

static void release(int reg, float *a, float *b)
{
	if (reg) {
		mr_comm_mem_free(a);
		mr_comm_mem_free(b);
	} else {
		free(a);
		free(b);
	}
}

static int bench_rank(int me, int n, int tcp, size_t minb, size_t maxb, const struct mr_kv *kv)
{
	char hid[32];
	struct mr_comm *c;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	int reg = !getenv("COMM_MEM") || strcmp(getenv("COMM_MEM"), "malloc");
	float *a = reg ? mr_comm_mem_alloc(maxb + 64) : malloc(maxb + 64);
	float *b = reg ? mr_comm_mem_alloc(maxb + 64) : malloc(maxb + 64);
	int rc;

	snprintf(hid, sizeof(hid), "bench-%d", tcp ? me : 0);
	struct mr_comm_config cfg = { .id = "bench", .rank = me, .world_size = n,
				      .host_id = hid, .kv = kv, .timeout_ms = 120000 };
	if (!a || !b || (rc = mr_comm_init(&c, &cfg, &eb))) {
		fprintf(stderr, "bench: rank %d: %s\n", me, eb.msg);
		release(reg, a, b);
		return 1;
	}
	memset(a, 1, maxb + 64);
	memset(b, 0, maxb + 64);
	for (int op = 0; op < 5; op++) {
		const char *only = getenv("COMM_OPS");

		if (only && !strstr(only, ops[op]))
			continue;
		for (size_t bytes = minb; bytes <= maxb;) {
			size_t per = bytes / 4 / (size_t)n;
			int iters = bytes <= (64 << 10) ? 200 : bytes <= (1 << 20) ? 40 :
				    bytes <= (16 << 20) ? 10 : 4;
			double t0, t;
			size_t eff = op == 0 || op == 4 ? bytes / 4 * 4 : per * 4 * (size_t)n;
			double algbw, factor;

			if (eff == 0)
				goto next;
			for (int w = 0; w < 2; w++)
				if ((rc = run_op(c, op, a, b, bytes)))
					goto fail;
			mr_comm_barrier(c);
			t0 = now_s();
			for (int i = 0; i < iters; i++)
				if ((rc = run_op(c, op, a, b, bytes)))
					goto fail;
			t = (now_s() - t0) / iters;
			{
				float tf = (float)t;
				mr_comm_allreduce(c, &tf, &tf, 1, MR_COMM_F32, MR_COMM_MAX);
				t = tf;
			}
			algbw = (double)eff / t / 1e9;
			factor = op == 0 ? 2.0 * (n - 1) / n : op == 4 ? 1.0 : (double)(n - 1) / n;
			if (me == 0)
				printf("comm meshrun %s %s %d %zu %.2f %.3f %.3f\n", tcp ? "tcp" : "shm",
				       ops[op], n, eff, t * 1e6, algbw, algbw * factor);
			fflush(stdout);
next:
			if (bytes < (1 << 20) && bytes * 8 > (1 << 20))
				bytes = 1 << 20;
			else if (bytes < (16 << 20) && bytes * 8 > (16 << 20))
				bytes = 16 << 20;
			else
				bytes = bytes * 8 > maxb && bytes < maxb ? maxb : bytes * 8;
		}
	}
	mr_comm_free(c);
	release(reg, a, b);
	return 0;
fail:
	fprintf(stderr, "bench: rank %d: failed: %s\n", me, mr_err_name(rc));
	mr_comm_free(c);
	release(reg, a, b);
	return 1;
}

int main(int argc, char **argv)
{
	int n = 2, tcp = 0, opt, bad = 0;
	size_t minb = 8, maxb = 64 << 20;
	struct kv_dir d = { { 0 } };
	struct mr_kv kv;
	pid_t pid[64];

	while ((opt = getopt(argc, argv, "n:t:b:e:")) != -1) {
		switch (opt) {
		case 'n': n = atoi(optarg); break;
		case 't': tcp = !strcmp(optarg, "tcp"); break;
		case 'b': minb = strtoull(optarg, NULL, 0); break;
		case 'e': maxb = strtoull(optarg, NULL, 0); break;
		default:
			fprintf(stderr, "usage: comm -n RANKS -t shm|tcp [-b MIN] [-e MAX]\n");
			return 2;
		}
	}
	if (n < 1 || n > 64 || minb < 4 || maxb < minb) {
		fprintf(stderr, "comm: bad arguments\n");
		return 2;
	}
	if (kv_dir_init(&d, &kv) < 0)
		return 1;
	for (int i = 0; i < n; i++) {
		pid[i] = fork();
		if (pid[i] == 0) {
			const char *bind = getenv("COMM_BIND");
			cpu_set_t all, one;

			/* rank i on the i-th CPU this process may use */
			if (!(bind && !strcmp(bind, "0")) &&
			    !sched_getaffinity(0, sizeof(all), &all) && n <= CPU_COUNT(&all)) {
				for (int cpu = 0, k = 0; cpu < CPU_SETSIZE; cpu++) {
					if (!CPU_ISSET(cpu, &all) || k++ != i)
						continue;
					CPU_ZERO(&one);
					CPU_SET(cpu, &one);
					sched_setaffinity(0, sizeof(one), &one);
					break;
				}
			}
			_exit(bench_rank(i, n, tcp, minb, maxb, &kv));
		}
	}
	for (int i = 0; i < n; i++) {
		int st;

		waitpid(pid[i], &st, 0);
		bad += !WIFEXITED(st) || WEXITSTATUS(st);
	}
	kv_dir_remove(&d);
	return bad ? 1 : 0;
}
