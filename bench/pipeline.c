/*
 * pipeline.c - pipeline parallelism on this machine: the bubble each
 * schedule leaves against its formula, the activations a stage keeps,
 * and throughput against one rank (make bench-pipeline).
 *
 *   build/bench/pipeline [-L layers] [-C d_model] [-H heads] [-T seq]
 *                        [-V vocab] [-B micro-batch] [-w warm-up] [-s steps]
 *                        [-p 2|4] [-q]
 *
 * Ranks are threads of this process, one pool thread each, with the
 * worker's own communicators (mr_groups_create over an in-memory KV: pp
 * group, tied-embedding group); stage s's threads are pinned to CPU
 * s mod CPUs (unpinned, the two stages of pp 2 traded cores and ran up to
 * 2 % apart, which alone moved the m = 16 bubble by +0.01). Default
 * model L8 d256 h4 T128, B8 rows per micro-batch, vocab 64: L8 so that
 * interleaved at pp 4, v 2 gets a block per virtual stage; B8 so that a
 * pass (~60 ms forward on this machine) dwarfs the hand-offs on the
 * critical path (1f1b's gradient hand-off has no slack at all; each cost
 * ~1 ms until the runner kicked its sends, mr_comm_kick); vocab 64
 * so that the last stage's head leaves the stages within ~1 % of each
 * other - the formulas assume equal stages, and with vocab 256 the last
 * stage is ~4 % slower, which alone adds ~0.02 to the measured bubble
 * (-V 256 shows it). For pp = 2 and 4, m = 4, 8, 16 micro-batches and
 * each schedule (gpipe, 1f1b, interleaved v=2, zb-h1) it runs warm-up
 * steps, then timed steps, and prints one row:
 *
 *   bubble    measured, the mean over timed steps of
 *             (p * makespan - sum_s busy_s) / sum_s busy_s  (mr_pp_stats:
 *             busy_s a stage's compute, makespan the longest stage wall)
 *   sd        its standard deviation over the timed steps
 *   formula   (p-1)/m for gpipe and 1f1b, (p-1)/(v m) for interleaved,
 *             (p-1)/(3m) for zb-h1 (F = B = W, m >= p; Qi et al.)
 *   ratio     bubble / formula
 *   sim       mr_pp_simulate with the F, B, W costs measured on one rank
 *             (zero communication, equal stages): what the schedule
 *             allows with this model's real pass costs
 *   wait      time stages blocked on receives and sends, share of their
 *             compute: the bubble is spent there, so wait ~ bubble when
 *             transfers hide behind compute
 *   busy_x1   the stages' compute over one rank's F + B + W passes for the
 *             same micro-batches: about 1.00 on an idle machine (a whole
 *             backward costs a little less than its two halves); well
 *             above, the stages were slowed (other load, oversubscription)
 *             and the bubble is not the schedule's alone
 *   tokens/s  B*T*m per step over the slowest stage's step time, x1 its
 *             ratio to one rank (same model, accum m, same global batch)
 *             and eff = tokens/s / (p * one rank): "p ranks' ideal"
 *   slots, act_MiB  per stage: micro-batches held at once and the peak of
 *             the MR_MEM_ACTS ledger (slot arenas, zb-h1's stashes)
 *
 * With 2 cores, pp = 4 runs 4 compute threads on 2 cores: busy times
 * include preemption, so those rows (marked "oversub") show the
 * schedule's shape, not its bubble. The targets are judged on pp = 2:
 *   gpipe and 1f1b bubble within 10 % (relative) of the formula, all m;
 *   zb-h1 bubble <= half of 1f1b's at the same m;
 *   1f1b throughput >= 0.8 x (2 x one rank) at m = 16;
 *   gpipe's activations grow with m, 1f1b's do not.
 * Each prints PASS or MISS; the exit status is 0 unless a run fails.
 * Last line, pp = 2 at m = 8: 10 % of its formula is 0.0125, above what
 * a 1 % stage imbalance (+0.005) and the transfers on 1f1b's critical
 * path (~2 per micro-batch) add; at m = 16 the band is 0.006 (measured
 * 4-7 % over, see docs/PERFORMANCE.md):
 *   pipeline bubble_1f1b=<measured> formula=<f> bubble_zb=<z>
 *   act_ratio_gpipe_1f1b=<r>
 * (act ratio: the largest stage's ACTS peak, gpipe over 1f1b.)
 *
 * Default 1 warm-up step (the stage's slots are allocated in it) and 3
 * timed steps: about 4 minutes on an idle 2-core machine. -q (or
 * PIPELINE_QUICK=1): 2 timed steps and pp = 2 only (under 2 minutes);
 * -p 2 runs only pp = 2 (the rows the targets need; -p 4 skips the
 * targets and prints the pp4 rows alone).
 * Non-goals: validation (tests/parity), data parallelism under the pipe.
 */
#include <cblas.h>
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
#include "parallel/mr_pp.h"
#include "../tests/comm/kv_mem.h"

#define MAX_P 4
#define MAX_STEPS 64
#define NM 3
#define NK MR_PP__KIND_COUNT
#define TIMEOUT_MS 300000
#define CALIB_REPS 5 /* passes timed for the costs (the fastest counts) */

static const int ms[NM] = { 4, 8, 16 };

struct bench {
	struct mr_gpt_config cfg;
	int B, T, warm, steps;
	int np, pps[2];         /* pipeline sizes to run: 2 and 4, or -p's */
	struct mr_pp_cost cost; /* one rank's passes per micro-batch (whole model) */
	double x1[NM];          /* one rank's tokens/s at each m */
};

/* One configuration's pipeline: its stages' per-step numbers. */
struct run {
	const struct bench *b;
	int p, m, v, gen;
	enum mr_pp_kind kind;
	struct mr_kv kv;
	double busy[MAX_P][MAX_STEPS], wall[MAX_P][MAX_STEPS], wait[MAX_P][MAX_STEPS];
	double secs[MAX_P];     /* timed seconds per step */
	size_t acts[MAX_P];     /* ACTS ledger peak */
	int slots[MAX_P], rc[MAX_P];
};

struct row {
	double bubble, sd, formula, sim, wait, slow, tps, busy_ms[MAX_P];
	size_t acts[MAX_P];
	int slots[MAX_P];
};

struct stage_arg {
	struct run *r;
	int rank;
};

static const struct mr_adamw_config ocfg = { 1e-3f, 0.1f, 2, 100, 0.9f, 0.95f, 1e-8f,
					     0.1f, 1.0f, MR_LR_COSINE, 0.0f };

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The step's m micro-batches: m consecutive (B,T) blocks of the synthetic
 * task, rows after the previous steps'. */
static void batch(const struct bench *b, int step, int m, int *in, int *tg)
{
	mr_synth_batch(1, 0, (uint64_t)step * (uint64_t)(b->B * m), b->cfg.vocab, b->B * m, b->T,
		       in, tg);
}

/* One pipeline stage: the worker's groups and placement, the model's
 * stage, the step driver with the schedule; records every step. */
static int stage_run(struct run *r, int rank)
{
	const struct bench *b = r->b;
	struct mr_worker_env env = { 0 };
	struct mr_errbuf eb = { "", "" };
	struct mr_groups g;
	struct mr_pool *pool = NULL;
	struct mr_gpt m;
	struct mr_step drv = { 0 };
	struct mr_step_result res;
	struct mr_pp_stats st;
	size_t N = (size_t)b->B * b->T * (size_t)r->m;
	int *in = malloc(N * sizeof(int)), *tg = malloc(N * sizeof(int)), s, rc, have_m = 0;
	double t0 = 0.0;

	env.rank = env.local_rank = rank;
	env.world_size = env.local_world_size = r->p;
	env.tp = env.cp = env.ep = 1;
	env.pp = r->p;
	env.generation = r->gen;
	env.kv = &r->kv;
	env.host = "127.0.0.1";
	env.host_id = "bench";
	if ((rc = mr_groups_create(&g, &env, 0, 0, TIMEOUT_MS, NULL, NULL, &eb)) < 0)
		goto out_free;
	if (!in || !tg || (rc = mr_pool_create(&pool, 1)) < 0) {
		rc = mr_errf(&eb, MR_ENOMEM, "unable to allocate the stage");
		goto out;
	}
	if ((rc = mr_groups_place_layers(&g.place, &b->cfg, b->T, r->v, NULL, 0, &eb)) < 0 ||
	    (rc = mr_gpt_create_placed(&m, &b->cfg, b->B, b->T, pool, &g.place,
				       mr_dp_model_flags(0), &eb)) < 0)
		goto out;
	have_m = 1;
	{
		struct mr_dp_config dc = { 0, 0, 0, MR_DP_OFFLOAD_NONE };
		struct mr_dp_comms cc = { g.shard, g.replica, g.group[MR_GROUP_WORLD],
					  g.group[MR_GROUP_EDP] };
		struct mr_pp_config pc = { r->kind, r->v, g.group[MR_GROUP_PP], g.embed,
					   mr_comm_p2p_in_order(g.group[MR_GROUP_PP]) };

		mr_pp_dp_config(&dc);
		if ((rc = mr_step_init(&drv, &m, &ocfg, &dc, &cc, 1, &eb)) < 0 ||
		    (rc = mr_step_pipeline(&drv, &pc, &eb)) < 0)
			goto out;
	}
	for (s = 0; s < b->warm + b->steps && rc == 0; s++) {
		if (s == b->warm)
			t0 = now_s();
		batch(b, s, r->m, in, tg);
		if ((rc = mr_step_run(&drv, in, tg, r->m, &res, &eb)) < 0)
			break;
		mr_pp_stats(drv.pp, &st);
		if (s >= b->warm) {
			r->busy[rank][s - b->warm] = st.busy_s;
			r->wall[rank][s - b->warm] = st.wall_s;
			r->wait[rank][s - b->warm] = st.wait_s;
		}
		r->slots[rank] = st.slots;
	}
	r->secs[rank] = (now_s() - t0) / b->steps;
	r->acts[rank] = m.mem.peak[MR_MEM_ACTS];
out:
	mr_step_release(&drv);
	if (have_m)
		mr_gpt_release(&m);
	mr_pool_free(pool);
	mr_groups_release(&g);
out_free:
	if (rc < 0)
		fprintf(stderr, "bench pipeline: pp%d %s m=%d stage %d: %s\n", r->p,
			mr_pp_kind_name(r->kind), r->m, rank, eb.msg);
	free(in);
	free(tg);
	return rc;
}

/* Stage s's compute thread on CPU s mod ncpu (with p <= CPUs one each, so
 * the stages do not trade cores mid-step); unset when it cannot be. */
static void pin(int s)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	cpu_set_t set;

	if (n < 1)
		return;
	CPU_ZERO(&set);
	CPU_SET((int)(s % n), &set);
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static void *stage_thread(void *p)
{
	struct stage_arg *a = p;

	pin(a->rank); /* before stage_run: its pool and comm threads inherit it */
	a->r->rc[a->rank] = stage_run(a->r, a->rank);
	return NULL;
}

/* The closed-form bubble of the schedule with F = B = W (see the header). */
static double formula(enum mr_pp_kind k, int p, int m, int v)
{
	if (k == MR_PP_INTERLEAVED)
		return (double)(p - 1) / ((double)v * m);
	if (k == MR_PP_ZBH1)
		return (double)(p - 1) / (3.0 * m);
	return (double)(p - 1) / m;
}

/* Runs one configuration (p stage threads) into *out; -1 on failure. */
static int pipeline(struct bench *b, int p, int mi, enum mr_pp_kind kind, struct row *out)
{
	static int gen;
	struct run *r = calloc(1, sizeof(*r));
	struct kv_mem *kv;
	struct stage_arg args[MAX_P];
	pthread_t th[MAX_P];
	struct mr_pp_spec sp;
	struct mr_pp_sim sim;
	struct mr_errbuf eb = { "", "" };
	int m = ms[mi];
	double sum_bubble = 0.0, sum_sq = 0.0, busy_all = 0.0, wait_all = 0.0, worst = 0.0;
	int i, s, rc = 0;

	if (!r)
		return -1;
	r->b = b;
	r->p = p;
	r->m = m;
	r->kind = kind;
	r->v = kind == MR_PP_INTERLEAVED ? 2 : 1;
	r->gen = gen++;
	kv = kv_mem_new(&r->kv);
	for (i = 0; i < p; i++) {
		args[i].r = r;
		args[i].rank = i;
		if (pthread_create(&th[i], NULL, stage_thread, &args[i]) != 0) {
			fprintf(stderr, "bench pipeline: unable to start stage %d\n", i);
			exit(1); /* the others wait for it: nothing to join */
		}
	}
	for (i = 0; i < p; i++)
		pthread_join(th[i], NULL);
	kv_mem_free(kv);
	memset(out, 0, sizeof(*out));
	for (i = 0; i < p; i++)
		rc |= r->rc[i] < 0;
	for (s = 0; s < b->steps && !rc; s++) {
		double span = 0.0, busy = 0.0;
		for (i = 0; i < p; i++) {
			span = r->wall[i][s] > span ? r->wall[i][s] : span;
			busy += r->busy[i][s];
			wait_all += r->wait[i][s];
		}
		sum_bubble += (p * span - busy) / busy;
		sum_sq += (p * span - busy) / busy * (p * span - busy) / busy;
		busy_all += busy;
	}
	for (i = 0; i < p && !rc; i++) {
		double t = 0.0;
		for (s = 0; s < b->steps; s++)
			t += r->busy[i][s];
		out->busy_ms[i] = 1e3 * t / b->steps;
		out->acts[i] = r->acts[i];
		out->slots[i] = r->slots[i];
		worst = r->secs[i] > worst ? r->secs[i] : worst;
	}
	if (!rc) {
		out->bubble = sum_bubble / b->steps;
		out->sd = sqrt(fmax(0.0, sum_sq / b->steps - out->bubble * out->bubble));
		out->wait = wait_all / busy_all;
		/* the stages' compute against one rank's passes for the same work */
		out->slow = busy_all / b->steps / (m * (b->cost.f + b->cost.b + b->cost.w));
		out->tps = (double)b->B * b->T * m / worst;
		out->formula = formula(kind, p, m, r->v);
		sp = (struct mr_pp_spec){ kind, p, m, r->v };
		memset(&sim, 0, sizeof(sim));
		out->sim = mr_pp_simulate(&sp, &b->cost, &sim, &eb) == 0 ? sim.bubble : NAN;
	}
	free(r);
	return rc ? -1 : 0;
}

/* One rank, the whole model, accum m: its tokens/s; with cost set, then
 * times F, the input half and the weight half of a split backward of one
 * micro-batch (the fastest of CALIB_REPS: the least disturbed by other
 * load). */
static int one_rank(struct bench *b, int m, double *tps, struct mr_pp_cost *cost)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_pool *pool = NULL;
	struct mr_gpt g;
	struct mr_step drv = { 0 };
	struct mr_step_result res;
	size_t N = (size_t)b->B * b->T * (size_t)m;
	int *in = malloc(N * sizeof(int)), *tg = malloc(N * sizeof(int)), s, rc, have_m = 0;
	double t0 = 0.0;

	if (!in || !tg || (rc = mr_pool_create(&pool, 1)) < 0) {
		rc = mr_errf(&eb, MR_ENOMEM, "unable to allocate the rank");
		goto out;
	}
	if ((rc = mr_gpt_create_placed(&g, &b->cfg, b->B, b->T, pool, NULL, mr_dp_model_flags(0),
				       &eb)) < 0)
		goto out;
	have_m = 1;
	if ((rc = mr_step_init(&drv, &g, &ocfg, NULL, NULL, 1, &eb)) < 0)
		goto out;
	for (s = 0; s < b->warm + b->steps && rc == 0; s++) {
		if (s == b->warm)
			t0 = now_s();
		batch(b, s, m, in, tg);
		rc = mr_step_run(&drv, in, tg, m, &res, &eb);
	}
	*tps = (double)b->B * b->T * m * b->steps / (now_s() - t0);
	if (rc == 0 && cost) {
		double t[3] = { INFINITY, INFINITY, INFINITY };
		int k;

		if ((rc = mr_gpt_split_bwd(&g)) < 0 || (rc = mr_gpt_set_batch(&g, in, tg, &eb)) < 0)
			goto out;
		for (k = 0; k < CALIB_REPS + 1 && rc == 0; k++) {
			double a = now_s(), bb, c, d;
			rc = mr_gpt_chunk_fwd(&g, 0, NULL);
			bb = now_s();
			if (rc == 0)
				rc = mr_gpt_chunk_bwd(&g, 0, NULL, 1.0f, MR_GPT_BWD_INPUT);
			c = now_s();
			if (rc == 0)
				rc = mr_gpt_chunk_bwd(&g, 0, NULL, 1.0f, MR_GPT_BWD_WEIGHT);
			d = now_s();
			if (k > 0) { /* the first one warms the stash */
				t[0] = fmin(t[0], bb - a);
				t[1] = fmin(t[1], c - bb);
				t[2] = fmin(t[2], d - c);
			}
		}
		*cost = (struct mr_pp_cost){ t[0], t[1], t[2] };
	}
out:
	if (rc < 0)
		fprintf(stderr, "bench pipeline: one rank m=%d: %s\n", m,
			eb.msg[0] ? eb.msg : mr_strerror(rc));
	mr_step_release(&drv);
	if (have_m)
		mr_gpt_release(&g);
	mr_pool_free(pool);
	free(in);
	free(tg);
	return rc;
}

/* v[0]/v[1]/... each printed with fmt (one double), scaled by 1/div. */
static const char *list(char *buf, size_t n, const double *v, int p, const char *fmt, double div)
{
	size_t at = 0;
	int i;

	buf[0] = 0;
	for (i = 0; i < p && at < n; i++) {
		if (i)
			at += (size_t)snprintf(buf + at, n - at, "/");
		if (at < n)
			at += (size_t)snprintf(buf + at, n - at, fmt, v[i] / div);
	}
	return buf;
}

static void print_row(const struct bench *b, int p, int mi, enum mr_pp_kind k,
		      const struct row *r)
{
	char s1[64], s2[64], s3[64];
	double x1 = b->x1[mi], slots[MAX_P], acts[MAX_P];
	int i;

	for (i = 0; i < p; i++) {
		slots[i] = r->slots[i];
		acts[i] = (double)r->acts[i];
	}
	printf("pipeline pp%d m=%-2d %-11s bubble %6.3f sd %5.3f formula %6.3f ratio %5.2f "
	       "sim %6.3f wait %4.1f%% busy_x1 %4.2f tokens/s %6.0f x1 %4.2f eff %4.2f busy_ms %s "
	       "slots %s act_MiB %s%s\n",
	       p, ms[mi], mr_pp_kind_name(k), r->bubble, r->sd, r->formula, r->bubble / r->formula,
	       r->sim, 100.0 * r->wait, r->slow, r->tps, r->tps / x1, r->tps / (p * x1),
	       list(s1, sizeof(s1), r->busy_ms, p, "%.0f", 1.0),
	       list(s2, sizeof(s2), slots, p, "%.0f", 1.0),
	       list(s3, sizeof(s3), acts, p, "%.1f", 1048576.0), p > 2 ? " oversub" : "");
	fflush(stdout);
}

static size_t max_of(const size_t *v, int p)
{
	size_t x = 0;
	int i;

	for (i = 0; i < p; i++)
		x = v[i] > x ? v[i] : x;
	return x;
}

/* PASS or MISS with the reason; returns 1 on a miss. */
static int check(int ok, const char *what)
{
	printf("%s %s\n", ok ? "PASS" : "MISS", what);
	return !ok;
}

/* The targets on the pp = 2 rows (rows[mi][kind]). */
static int targets(const struct bench *b, struct row rows[NM][NK])
{
	char what[256];
	int mi, miss = 0, grows, flat;

	for (mi = 0; mi < NM; mi++) {
		enum mr_pp_kind ks[2] = { MR_PP_GPIPE, MR_PP_1F1B };
		for (int j = 0; j < 2; j++) {
			const struct row *r = &rows[mi][ks[j]];
			double rel = fabs(r->bubble / r->formula - 1.0);
			snprintf(what, sizeof(what),
				 "pp2 m=%d %s bubble %.3f within 10%% of formula %.3f (off %.1f%%)",
				 ms[mi], mr_pp_kind_name(ks[j]), r->bubble, r->formula, 100.0 * rel);
			miss += check(rel <= 0.10, what);
		}
	}
	for (mi = 0; mi < NM; mi++) {
		const struct row *z = &rows[mi][MR_PP_ZBH1], *o = &rows[mi][MR_PP_1F1B];
		snprintf(what, sizeof(what), "pp2 m=%d zb-h1 bubble %.3f <= half of 1f1b's %.3f "
			 "(%.2fx)", ms[mi], z->bubble, o->bubble, z->bubble / o->bubble);
		miss += check(z->bubble <= 0.5 * o->bubble, what);
	}
	{
		const struct row *r = &rows[NM - 1][MR_PP_1F1B];
		double ideal = 2.0 * b->x1[NM - 1];
		snprintf(what, sizeof(what), "pp2 m=%d 1f1b tokens/s %.0f >= 0.8 x 2 ranks' ideal "
			 "%.0f (%.2f)", ms[NM - 1], r->tps, ideal, r->tps / ideal);
		miss += check(r->tps >= 0.8 * ideal, what);
	}
	grows = max_of(rows[NM - 1][MR_PP_GPIPE].acts, 2) > max_of(rows[0][MR_PP_GPIPE].acts, 2);
	flat = max_of(rows[NM - 1][MR_PP_1F1B].acts, 2) == max_of(rows[0][MR_PP_1F1B].acts, 2);
	snprintf(what, sizeof(what), "pp2 activations: gpipe %.1f -> %.1f MiB (m %d -> %d), "
		 "1f1b %.1f -> %.1f MiB", max_of(rows[0][MR_PP_GPIPE].acts, 2) / 1048576.0,
		 max_of(rows[NM - 1][MR_PP_GPIPE].acts, 2) / 1048576.0, ms[0], ms[NM - 1],
		 max_of(rows[0][MR_PP_1F1B].acts, 2) / 1048576.0,
		 max_of(rows[NM - 1][MR_PP_1F1B].acts, 2) / 1048576.0);
	miss += check(grows && flat, what);
	return miss;
}

static double loadavg(void)
{
	FILE *f = fopen("/proc/loadavg", "r");
	double x = -1.0;

	if (f) {
		if (fscanf(f, "%lf", &x) != 1)
			x = -1.0;
		fclose(f);
	}
	return x;
}

int main(int argc, char **argv)
{
	static struct row rows[2][NM][NK];
	struct bench b;
	const char *q = getenv("PIPELINE_QUICK");
	int opt, pi, mi, k, quick = q && *q && strcmp(q, "0"), miss;
	size_t a1;

	memset(&b, 0, sizeof(b));
	b.cfg = (struct mr_gpt_config){ .vocab = 64, .max_seq = 128, .n_layer = 8, .d_model = 256,
					.n_head = 4 };
	b.B = 8;
	b.T = 128;
	b.warm = 1;
	b.steps = 3;
	b.np = 2;
	b.pps[0] = 2;
	b.pps[1] = 4;
	while ((opt = getopt(argc, argv, "L:C:H:T:V:B:w:s:p:q")) != -1) {
		switch (opt) {
		case 'L': b.cfg.n_layer = atoi(optarg); break;
		case 'C': b.cfg.d_model = atoi(optarg); break;
		case 'H': b.cfg.n_head = atoi(optarg); break;
		case 'T': b.T = b.cfg.max_seq = atoi(optarg); break;
		case 'V': b.cfg.vocab = atoi(optarg); break;
		case 'B': b.B = atoi(optarg); break;
		case 'w': b.warm = atoi(optarg); break;
		case 's': b.steps = atoi(optarg); break;
		case 'q': quick = 1; break;
		case 'p':
			b.np = 1;
			b.pps[0] = atoi(optarg);
			break;
		default:
			fprintf(stderr, "usage: %s [-L n] [-C d] [-H h] [-T seq] [-V vocab] [-B batch] "
					"[-w warm-up] [-s steps] [-p 2|4] [-q]\n", argv[0]);
			return 2;
		}
	}
	if (quick) {
		b.steps = 2;
		b.np = 1; /* pp2 (or -p's) */
	}
	if (b.steps < 1 || b.steps > MAX_STEPS || b.warm < 1 || b.cfg.n_layer < 8 ||
	    (b.pps[0] != 2 && b.pps[0] != 4)) {
		fprintf(stderr, "bench pipeline: -s must be in [1, %d], -w >= 1 (slots grow on "
				"first use), -L >= 8 (pp4 x v2), -p 2 or 4\n", MAX_STEPS);
		return 2;
	}
	/* one compute thread per rank, as the gpt worker runs it */
	openblas_set_num_threads(1);
	printf("pipeline config L%d d%d h%d T%d B%d vocab %d, %d warm-up + %d timed steps, "
	       "1 thread/rank, %ld cores, loadavg %.2f\n", b.cfg.n_layer, b.cfg.d_model,
	       b.cfg.n_head, b.T, b.B, b.cfg.vocab, b.warm, b.steps, sysconf(_SC_NPROCESSORS_ONLN),
	       loadavg());
	for (mi = 0; mi < NM; mi++) {
		if (one_rank(&b, ms[mi], &b.x1[mi], mi == 0 ? &b.cost : NULL) < 0)
			return 1;
		printf("pipeline one_rank m=%-2d tokens/s %6.0f\n", ms[mi], b.x1[mi]);
	}
	printf("pipeline pass costs (one rank, whole model, one micro-batch, fastest of %d): "
	       "F %.1f ms, B(input) %.1f ms, W %.1f ms; sim uses these ratios\n", CALIB_REPS,
	       1e3 * b.cost.f, 1e3 * b.cost.b, 1e3 * b.cost.w);
	for (pi = 0; pi < b.np; pi++) {
		if (b.pps[pi] > 2)
			printf("pipeline note: pp4 runs 4 compute threads on %ld cores (oversub): "
			       "busy times include preemption; targets are judged on pp2\n",
			       sysconf(_SC_NPROCESSORS_ONLN));
		for (mi = 0; mi < NM; mi++)
			for (k = 0; k < NK; k++) {
				if (pipeline(&b, b.pps[pi], mi, (enum mr_pp_kind)k,
					     &rows[pi][mi][k]) < 0)
					return 1;
				print_row(&b, b.pps[pi], mi, (enum mr_pp_kind)k, &rows[pi][mi][k]);
			}
	}
	if (b.pps[0] != 2)
		return 0; /* no pp2 rows: no targets, no last line */
	miss = targets(&b, rows[0]);
	printf("pipeline targets: %d missed (pp2 rows; loadavg now %.2f)\n", miss, loadavg());
	a1 = max_of(rows[0][1][MR_PP_1F1B].acts, 2);
	printf("pipeline bubble_1f1b=%.3f formula=%.3f bubble_zb=%.3f act_ratio_gpipe_1f1b=%.2f\n",
	       rows[0][1][MR_PP_1F1B].bubble, rows[0][1][MR_PP_1F1B].formula,
	       rows[0][1][MR_PP_ZBH1].bubble,
	       a1 ? (double)max_of(rows[0][1][MR_PP_GPIPE].acts, 2) / (double)a1 : 0.0);
	return 0;
}
