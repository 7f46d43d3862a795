/*
 * comm_mpi.c - the OpenMPI side of `make bench-comm`: the same operations,
 * sizes and output format as bench/comm.c, built with mpicc and run under
 * mpirun (btl self,vader for shared memory, self,tcp for TCP).
 *
 *   mpirun -np N build/bench/comm_mpi shm|tcp [MINBYTES] [MAXBYTES]
 *
 * Buffers come from MPI_Alloc_mem, as bench/comm.c's from
 * mr_comm_mem_alloc.
 *
 * Non-goals: validation.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *ops[] = { "allreduce", "allgather", "reduce_scatter", "alltoall", "sendrecv" };

static void run_op(int op, float *a, float *b, size_t bytes, int n, int me)
{
	int cnt = (int)(bytes / 4), per = cnt / n;

	switch (op) {
	case 0: MPI_Allreduce(a, b, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
	case 1: MPI_Allgather(a, per, MPI_FLOAT, b, per, MPI_FLOAT, MPI_COMM_WORLD); break;
	case 2: MPI_Reduce_scatter_block(a, b, per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
	case 3: MPI_Alltoall(a, per, MPI_FLOAT, b, per, MPI_FLOAT, MPI_COMM_WORLD); break;
	default:
		MPI_Sendrecv(a, cnt, MPI_FLOAT, (me + 1) % n, 0, b, cnt, MPI_FLOAT, (me + n - 1) % n,
			     0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	}
}

int main(int argc, char **argv)
{
	int n, me;
	const char *tr = argc > 1 ? argv[1] : "shm";
	size_t minb = argc > 2 ? strtoull(argv[2], NULL, 0) : 8;
	size_t maxb = argc > 3 ? strtoull(argv[3], NULL, 0) : (size_t)64 << 20;
	float *a, *b;

	MPI_Init(&argc, &argv);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	MPI_Comm_rank(MPI_COMM_WORLD, &me);
	/* MPI's own allocator, as bench/comm.c uses meshrun's (with vader it
	 * is plain memory unless XPMEM or KNEM is built in) */
	MPI_Alloc_mem((MPI_Aint)(maxb + 64), MPI_INFO_NULL, &a);
	MPI_Alloc_mem((MPI_Aint)(maxb + 64), MPI_INFO_NULL, &b);
	memset(a, 1, maxb + 64);
	memset(b, 0, maxb + 64);
	for (int op = 0; op < 5; op++) {
		const char *only = getenv("COMM_OPS"); /* e.g. "allreduce,allgather" */

		if (only && !strstr(only, ops[op]))
			continue;
		for (size_t bytes = minb; bytes <= maxb;) {
			size_t per = bytes / 4 / (size_t)n;
			size_t eff = op == 0 || op == 4 ? bytes / 4 * 4 : per * 4 * (size_t)n;
			int iters = bytes <= (64 << 10) ? 200 : bytes <= (1 << 20) ? 40 :
				    bytes <= (16 << 20) ? 10 : 4;
			double t0, t, tmax, algbw, factor;

			if (eff) {
				for (int w = 0; w < 2; w++)
					run_op(op, a, b, bytes, n, me);
				MPI_Barrier(MPI_COMM_WORLD);
				t0 = MPI_Wtime();
				for (int i = 0; i < iters; i++)
					run_op(op, a, b, bytes, n, me);
				t = (MPI_Wtime() - t0) / iters;
				MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
				algbw = (double)eff / tmax / 1e9;
				factor = op == 0 ? 2.0 * (n - 1) / n : op == 4 ? 1.0 : (double)(n - 1) / n;
				if (me == 0)
					printf("comm openmpi %s %s %d %zu %.2f %.3f %.3f\n", tr, ops[op], n,
					       eff, tmax * 1e6, algbw, algbw * factor);
				fflush(stdout);
			}
			if (bytes < (1 << 20) && bytes * 8 > (1 << 20))
				bytes = 1 << 20;
			else if (bytes < (16 << 20) && bytes * 8 > (16 << 20))
				bytes = 16 << 20;
			else
				bytes = bytes * 8 > maxb && bytes < maxb ? maxb : bytes * 8;
		}
	}
	MPI_Free_mem(a);
	MPI_Free_mem(b);
	MPI_Finalize();
	return 0;
}
