/*
 * cp_ep.c - context and expert parallelism on this machine: what context
 * parallelism saves in activation memory at a long sequence, and what the
 * expert all-to-all costs in a MoE step (make bench-cp-ep).
 *
 *   build/bench/cp_ep [-T seq] [-C d_model] [-L layers] [-s steps] [-q]
 *
 * Ranks are threads of this process, one pool thread each (OpenBLAS one
 * thread, as in the worker: one rank is one core's work), with the
 * worker's own communicators (mr_groups_create over an in-memory KV) and
 * the step driver (DDP), so every number comes from the runtime itself.
 *
 * Context parallel: GPT L2 d256 h4 (head size 64), one sequence of T =
 * 4096 tokens per step (-T), vocab 256, cp = 1, 2, 4 ranks (cp 4 is 4
 * threads on this 2-core machine: its rate is oversubscribed; its memory
 * is not). Per row: the peak of the rank's MR_MEM_ACTS ledger (what the
 * layers keep for their backward: every layer's q|k|v, attention output,
 * lse, LayerNorm, MLP activations and the logits - all of the local T/cp
 * rows) and of MR_MEM_WORKSPACE (the gathered q|k|v and the fp32 gradient
 * buffers of the allgather algorithm, one layer at a time: whole-sequence
 * sized; ulysses' all-to-all buffers and one head group's whole
 * sequences), tokens/s of the job and the ratio to cp 1 (the anchor: the
 * same sequence on one rank), for each cp_algo: ring, allgather, ulysses.
 *
 * Expert parallel: GPT L2 d256 h4, every layer MoE with 8 experts, top-2,
 * T 256, 8 sequences per rank, data parallel over ep ranks with the
 * experts split ep ways (ep = dp = 1, 2, 4), capacity factor 1.25 and
 * dropless. Per row: tokens/s of the job, its ratio to ep 1 (one rank
 * with all 8 experts on the same per-rank batch: ep 2 and 4 do 2x and 4x
 * the work on as many ranks), and a2a share = the seconds a rank spends
 * in expert exchanges (counts, rows, and the packing copies around them;
 * mr_ep's clock) over its step time, the mean over ranks.
 *
 * Last line: cp_ep act_ratio_cp2=<acts peak cp2 ring / cp1> a2a_share_ep2=<ep2
 * capacity share>; the target is act_ratio_cp2 <= 0.55 (activations fall
 * as 1/cp, plus what every rank keeps whole: the embeddings' and head's
 * rows are local too, so only fixed-size pieces stay).
 * -q: T 2048 and 2 timed steps (the test build runs it so).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "data/mr_synth.h"
#include "mr_groups.h"
#include "mr_step.h"
#include "../tests/comm/kv_mem.h"

void openblas_set_num_threads(int num_threads);

#define MAX_R 4
#define TIMEOUT_MS 300000

static const struct mr_adamw_config ocfg = { 1e-3f, 0.1f, 2, 100, 0.9f, 0.95f, 1e-8f,
					     0.1f, 1.0f, MR_LR_COSINE, 0.0f };

struct run {
	struct mr_gpt_config cfg;
	int B, T, warm, steps;
	int cp, ep, n;              /* mesh: n ranks */
	int algo;                   /* enum mr_cp_algo */
	struct mr_kv kv;
	int gen;
	/* per rank, out */
	int rc[MAX_R];
	double secs[MAX_R], xchg_s[MAX_R];
	size_t acts[MAX_R], ws[MAX_R];
};

struct rank_arg {
	struct run *r;
	int rank;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int rank_run(struct run *r, int rank)
{
	struct mr_worker_env env = { 0 };
	struct mr_errbuf eb = { "", "" };
	struct mr_groups g;
	struct mr_pool *pool = NULL;
	struct mr_gpt m;
	struct mr_step drv = { 0 };
	struct mr_step_result res;
	int dp = r->n / r->cp, dpr = rank / r->cp, Tl = r->T / r->cp, s, rc, have_m = 0;
	size_t N = (size_t)r->B * r->T;
	int *in = malloc(N * sizeof(int)), *tg = malloc(N * sizeof(int));
	int *li = malloc(N * sizeof(int)), *lt = malloc(N * sizeof(int));
	double t0 = 0.0, x0 = 0.0;

	env.rank = env.local_rank = rank;
	env.world_size = env.local_world_size = r->n;
	env.tp = env.pp = 1;
	env.cp = r->cp;
	env.ep = r->ep;
	env.generation = r->gen;
	env.kv = &r->kv;
	env.host = "127.0.0.1";
	env.host_id = "bench";
	if ((rc = mr_groups_create(&g, &env, 0, 0, TIMEOUT_MS, NULL, NULL, &eb)) < 0)
		goto out_free;
	if (!in || !tg || !li || !lt || (rc = mr_pool_create(&pool, 1)) < 0) {
		rc = mr_errf(&eb, MR_ENOMEM, "unable to allocate the rank");
		goto out;
	}
	g.place.cp_algo = r->algo;
	if ((rc = mr_gpt_create_placed(&m, &r->cfg, r->B, r->T, pool, &g.place,
				       mr_dp_model_flags(0), &eb)) < 0)
		goto out;
	have_m = 1;
	{
		struct mr_dp_config dc = { 0, 0, 0, MR_DP_OFFLOAD_NONE };
		struct mr_dp_comms cc = { g.shard, g.replica, g.group[MR_GROUP_WORLD],
					  g.group[MR_GROUP_EDP] };
		if ((rc = mr_step_init(&drv, &m, &ocfg, &dc, &cc, 1, &eb)) < 0)
			goto out;
	}
	for (s = 0; s < r->warm + r->steps && rc == 0; s++) {
		if (s == r->warm) {
			t0 = now_s();
			x0 = m.par.ep.xchg_s;
		}
		/* the dp rank's sequences; a cp rank takes its chunks of them */
		mr_synth_batch(7, 0, ((uint64_t)s * dp + dpr) * r->B, r->cfg.vocab, r->B, r->T, in,
			       tg);
		if (r->cp > 1) {
			mr_cp_select(r->cp, m.par.cp.rank, in, r->B, r->T, li);
			mr_cp_select(r->cp, m.par.cp.rank, tg, r->B, r->T, lt);
		}
		rc = mr_step_run(&drv, r->cp > 1 ? li : in, r->cp > 1 ? lt : tg, 1, &res, &eb);
	}
	r->secs[rank] = (now_s() - t0) / r->steps;
	r->xchg_s[rank] = (m.par.ep.xchg_s - x0) / r->steps;
	r->acts[rank] = m.mem.peak[MR_MEM_ACTS];
	r->ws[rank] = m.mem.peak[MR_MEM_WORKSPACE];
	(void)Tl;
out:
	mr_step_release(&drv);
	if (have_m)
		mr_gpt_release(&m);
	mr_pool_free(pool);
	mr_groups_release(&g);
out_free:
	if (rc < 0)
		fprintf(stderr, "bench cp_ep: cp%d ep%d rank %d: %s\n", r->cp, r->ep, rank, eb.msg);
	free(in);
	free(tg);
	free(li);
	free(lt);
	return rc;
}

static void *rank_thread(void *p)
{
	struct rank_arg *a = p;

	a->r->rc[a->rank] = rank_run(a->r, a->rank);
	return NULL;
}

/* Runs r's mesh to the end; 0, or -1 when a rank failed. */
static int run_mesh(struct run *r)
{
	static int gen;
	struct rank_arg args[MAX_R];
	pthread_t th[MAX_R];
	struct kv_mem *kv;
	int i, rc = 0;

	r->gen = gen++;
	kv = kv_mem_new(&r->kv);
	for (i = 0; i < r->n; i++) {
		args[i].r = r;
		args[i].rank = i;
		if (pthread_create(&th[i], NULL, rank_thread, &args[i]) != 0) {
			fprintf(stderr, "bench cp_ep: unable to start rank %d\n", i);
			exit(1); /* the others wait for it: nothing to join */
		}
	}
	for (i = 0; i < r->n; i++)
		pthread_join(th[i], NULL);
	kv_mem_free(kv);
	for (i = 0; i < r->n; i++)
		rc |= r->rc[i] < 0;
	return rc ? -1 : 0;
}

static double slowest(const double *v, int n)
{
	double w = 0.0;

	for (int i = 0; i < n; i++)
		w = v[i] > w ? v[i] : w;
	return w;
}

static size_t largest(const size_t *v, int n)
{
	size_t w = 0;

	for (int i = 0; i < n; i++)
		w = v[i] > w ? v[i] : w;
	return w;
}

int main(int argc, char **argv)
{
	static struct run r;
	struct mr_gpt_config base = { .vocab = 256, .n_layer = 2, .d_model = 256, .n_head = 4 };
	int T = 4096, steps = 3, quick = 0, opt, i, k, eps[3] = { 1, 2, 4 };
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	double tps1 = 0.0, tpe1[2] = { 0.0, 0.0 }, share_ep2 = NAN;
	size_t acts1 = 0, acts2 = 0;

	while ((opt = getopt(argc, argv, "T:C:L:s:q")) != -1) {
		switch (opt) {
		case 'T': T = atoi(optarg); break;
		case 'C': base.d_model = atoi(optarg); break;
		case 'L': base.n_layer = atoi(optarg); break;
		case 's': steps = atoi(optarg); break;
		case 'q': quick = 1; break;
		default:
			fprintf(stderr, "usage: %s [-T seq] [-C d_model] [-L layers] [-s steps] [-q]\n",
				argv[0]);
			return 2;
		}
	}
	/* one compute thread per rank: each rank's pool runs its GEMMs as
	 * single-threaded sgemm calls (kernels/matmul.c), as the worker does */
	openblas_set_num_threads(1);
	if (quick || getenv("CP_EP_QUICK")) {
		T = 2048;
		steps = 2;
	}
	printf("cp_ep %ld CPU(s); GPT L%d d%d h%d vocab %d, 1 warm-up + %d timed steps\n", ncpu,
	       base.n_layer, base.d_model, base.n_head, base.vocab, steps);
	printf("context parallel: one sequence of T %d per step, cp ranks\n", T);
	for (i = 0; i < 7; i++) {
		/* cp 1, then ring, allgather and ulysses at cp 2 and 4 */
		static const char *const names[] = { "ring", "allgather", "ulysses" };
		int cp = i == 0 ? 1 : i < 4 ? 2 : 4, algo = i ? (i - 1) % 3 : MR_CP_RING;
		memset(&r, 0, sizeof(r));
		r.cfg = base;
		r.cfg.max_seq = T;
		r.B = 1;
		r.T = T;
		r.warm = 1;
		r.steps = steps;
		r.cp = r.n = cp;
		r.ep = 1;
		r.algo = algo;
		if (run_mesh(&r) < 0)
			return 1;
		{
			double tps = (double)T / slowest(r.secs, r.n);
			size_t acts = largest(r.acts, r.n), ws = largest(r.ws, r.n);
			if (i == 0) {
				tps1 = tps;
				acts1 = acts;
			}
			if (i == 1)
				acts2 = acts;
			printf("cp %d %-9s  acts_MiB=%.1f (x%.3f of cp 1)  workspace_MiB=%.1f  "
			       "tokens/s=%.0f (x%.2f)%s\n",
			       r.cp, i == 0 ? "" : names[algo], acts / 1048576.0,
			       (double)acts / (double)acts1, ws / 1048576.0, tps, tps / tps1,
			       r.n > ncpu ? "  oversub" : "");
		}
	}
	printf("expert parallel: every layer MoE, 8 experts top-2, T 256, 8 sequences per rank, "
	       "dp = ep ranks\n");
	for (k = 0; k < 2; k++)
		for (i = 0; i < 3; i++) {
			double share = 0.0, tps;
			memset(&r, 0, sizeof(r));
			r.cfg = base;
			r.cfg.max_seq = 256;
			r.cfg.moe_every = 1;
			r.cfg.n_experts = 8;
			r.cfg.top_k = 2;
			r.cfg.capacity_factor = 1.25f;
			r.cfg.aux_coef = 0.01f;
			r.cfg.moe_dropless = k;
			r.B = 8;
			r.T = 256;
			r.warm = 1;
			r.steps = steps;
			r.cp = 1;
			r.ep = r.n = eps[i];
			if (run_mesh(&r) < 0)
				return 1;
			for (int q = 0; q < r.n; q++)
				share += r.xchg_s[q] / r.secs[q] / r.n;
			tps = (double)r.B * r.T * r.n / slowest(r.secs, r.n);
			if (i == 0)
				tpe1[k] = tps;
			if (i == 1 && k == 0)
				share_ep2 = share;
			printf("ep %d %-9s tokens/s=%.0f (x%.2f of ep 1)  a2a_share=%.3f%s\n", r.ep,
			       k ? "dropless" : "capacity", tps, tps / tpe1[k], share,
			       r.n > ncpu ? "  oversub" : "");
		}
	printf("cp_ep act_ratio_cp2=%.3f a2a_share_ep2=%.3f\n", (double)acts2 / (double)acts1,
	       share_ep2);
	return 0;
}
