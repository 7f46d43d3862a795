/*
 * test_chaos.c - fault injection over a real `meshrun local` job: kill -9
 * of random agents, workers and the controller at random moments (a fixed
 * seed, MESHRUN_CHAOS_SEED to try another), then one SIGTERM of an agent
 * (a node drain), while a writer stores keys in the controller's KV store.
 *
 * After every fault the job must come back (running again, at a newer
 * generation when a member was lost); at the end it must have succeeded,
 * every process's exit must read as what was done to it, every
 * acknowledged KV write must be in the journal (read back by a fresh
 * controller on the kept data dir), and the in-process run's final loss
 * must equal an uninterrupted run's (each generation resumes from the
 * newest checkpoint). Prints
 *   chaos kills=<n> recovered=<n> lost_writes=0 ...
 *
 * The recovery campaign: kill -9 of a random agent at a random moment, 5
 * times in each of four jobs checkpointing every 5 steps (dp with ZeRO-1;
 * tp + sp with ZeRO-2; pp 1F1B; cp x ep MoE with ZeRO-1): every job must
 * finish with a loss log - every step's loss, aux loss, grad norm and lr
 * - byte for byte the uninterrupted run's, having resumed from a
 * checkpoint rather than from step 0. The runs under faults are paced
 * (debug_slow_ms: rank 0 sleeps in each step, which changes no number)
 * so that they outlast the faults. Prints
 *   recovery kills=20 finished=<n> exact=<n> resumed=<n>
 *
 * Bounded: a fixed number of faults, each waited out with a timeout.
 */
#include "harness.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#include "proc.h"

#define CHAOS_KILLS 6
#define CHAOS_RECOVER_MS 90000
#define LEDGER "chaos/ledger"
#define LEDGER_MAX 100000

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state % n);
}

static uint64_t chaos_seed(void)
{
	const char *s = getenv("MESHRUN_CHAOS_SEED");

	return s && *s ? strtoull(s, NULL, 10) : 20261125;
}

/* ---- the KV writer: PUTs ledger keys, remembers the acknowledged ---- */

struct ledger {
	char url[64];
	pthread_t thr;
	atomic_int stop;
	int acked[LEDGER_MAX]; /* key numbers answered 200 */
	int nacked, tried;
};

static void *ledger_main(void *arg)
{
	struct ledger *l = arg;
	char url[256], val[32];

	while (!atomic_load(&l->stop) && l->tried < LEDGER_MAX) {
		struct mr_test_resp *r = malloc(sizeof(*r));
		int k = l->tried++;

		snprintf(url, sizeof(url), "%s/v1/jobs/" LEDGER "/kv/k%d", l->url, k);
		snprintf(val, sizeof(val), "v%d", k);
		if (r && mr_test_http(r, "PUT", url, val, strlen(val), NULL, 2000) == 200)
			l->acked[l->nacked++] = k;
		free(r);
		usleep(10 * 1000);
	}
	return NULL;
}

static void ledger_start(struct ledger *l, const char *ctl_url)
{
	char url[128];
	const char *spec = "{\"name\":\"" LEDGER "\",\"min_nodes\":1,\"max_nodes\":1}";
	struct mr_test_resp *r = malloc(sizeof(*r));

	cr_assert_not_null(r);
	snprintf(l->url, sizeof(l->url), "%s", ctl_url);
	snprintf(url, sizeof(url), "%s/v1/jobs", ctl_url);
	cr_assert_eq(mr_test_http(r, "POST", url, spec, strlen(spec), NULL, 10000), 201, "%s",
		     r->body);
	free(r);
	cr_assert_eq(pthread_create(&l->thr, NULL, ledger_main, l), 0);
}

static void ledger_stop(struct ledger *l)
{
	atomic_store(&l->stop, 1);
	pthread_join(l->thr, NULL);
}

/* Starts a fresh controller on the kept data dir and reads every
 * acknowledged key back; returns how many are missing or wrong. */
static int ledger_lost(const struct ledger *l, const char *datadir)
{
	struct h_ctl c = {0};
	char url[256], val[32];
	struct mr_test_resp *r = malloc(sizeof(*r));
	int lost = 0;

	cr_assert_not_null(r);
	snprintf(c.data, sizeof(c.data), "%s", datadir);
	h_path(c.log, sizeof(c.log), "chaos-verify-controller.log");
	h_ctl_start(&c, 0);
	for (int i = 0; i < l->nacked; i++) {
		snprintf(url, sizeof(url), "%s/v1/jobs/" LEDGER "/kv/k%d", c.url, l->acked[i]);
		snprintf(val, sizeof(val), "v%d", l->acked[i]);
		if (mr_test_http(r, "GET", url, NULL, 0, NULL, 10000) != 200 || strcmp(r->body, val))
			lost++;
	}
	free(r);
	h_kill(c.pid);
	return lost;
}

/* ---- the job as the controller sees it ---- */

/* Generation and state of job; 0, or -1 when the controller did not answer. */
static int job_state(const char *ctl_url, const char *job, long long *gen, char *state,
		     size_t cap)
{
	char url[256];
	struct mr_test_resp *r = malloc(sizeof(*r));
	json_t *j;
	int rc = -1;

	cr_assert_not_null(r);
	snprintf(url, sizeof(url), "%s/v1/jobs/%s", ctl_url, job);
	if (mr_test_http(r, "GET", url, NULL, 0, NULL, 2000) == 200 &&
	    (j = json_loads(r->body, 0, NULL))) {
		const char *st = json_string_value(json_object_get(j, "state"));

		*gen = json_integer_value(json_object_get(j, "generation"));
		snprintf(state, cap, "%s", st ? st : "");
		json_decref(j);
		rc = 0;
	}
	free(r);
	return rc;
}

/* Waits until the job runs again (at a generation above min_gen); 0 or -1. */
static int wait_running(const char *ctl_url, const char *job, long long min_gen,
			long long *gen)
{
	long long end = h_now_ms() + CHAOS_RECOVER_MS;
	char state[32];

	while (h_now_ms() < end) {
		if (job_state(ctl_url, job, gen, state, sizeof(state)) == 0 &&
		    !strcmp(state, "running") && *gen > min_gen)
			return 0;
		usleep(50 * 1000);
	}
	return -1;
}

/* ---- the chaos run ---- */

struct chaos {
	pid_t local;
	char log[300], datadir[320], ctl_url[64], job[128];
	int kills, recovered;           /* kill -9 faults, and those recovered from */
	int sigterms, sigterm_recovered;
	int worker_kills;
	char expect[CHAOS_KILLS + 2][96]; /* lines local must print */
	int nexpect;
};

static void chaos_start(struct chaos *ch, char *const *args, char *const *env, const char *name)
{
	char *argv[H_MAX_ARGS], *s;
	int n = 0;

	h_path(ch->log, sizeof(ch->log), name);
	snprintf(ch->datadir, sizeof(ch->datadir), "%s-data", ch->log);
	argv[n++] = "meshrun";
	argv[n++] = "local";
	argv[n++] = "--data-dir";
	argv[n++] = ch->datadir;
	for (int i = 0; args[i]; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	ch->local = h_spawn(argv, env, ch->log);
	cr_assert_eq(h_wait_log(ch->log, "meshrun local: controller on ", 1, 60000), 0);
	s = h_read(ch->log);
	cr_assert_eq(sscanf(strstr(s, "controller on "), "controller on %63[^,], %*d node(s), job %127s",
			    ch->ctl_url, ch->job),
		     2, "%s", s);
	free(s);
}

/*
 * One fault: kind 'a' kill -9 of agent `node`, 'c' of the controller, 'w'
 * of a worker process of agent `node`, 't' SIGTERM of agent `node`. Waits
 * until the job runs again.
 */
static void fault(struct chaos *ch, int kind, int node)
{
	long long gen = 0, now_gen = 0;
	char state[32] = "";
	pid_t victim;

	cr_assert_eq(wait_running(ch->ctl_url, ch->job, 0, &gen), 0, "job never ran");
	if (kind == 'c') {
		victim = h_child(ch->local, "meshrun-controller", 0);
	} else {
		victim = h_child(ch->local, "meshrun-agent", node);
		if (kind == 'w')
			victim = h_child(victim, "sh", 0);
	}
	kill(victim, kind == 't' ? SIGTERM : SIGKILL);
	if (kind == 'c')
		snprintf(ch->expect[ch->nexpect++], sizeof(ch->expect[0]),
			 "controller (pid %d) killed by signal 9: restart", (int)victim);
	else if (kind == 'a' || kind == 't')
		snprintf(ch->expect[ch->nexpect++], sizeof(ch->expect[0]),
			 "(pid %d) %s: restart", (int)victim,
			 kind == 't' ? "exited 143" : "killed by signal 9");
	ch->kills += kind != 't';
	ch->sigterms += kind == 't';
	ch->worker_kills += kind == 'w';
	/* a lost member bumps the generation; a controller restart does not */
	if (wait_running(ch->ctl_url, ch->job, kind == 'c' ? gen - 1 : gen, &now_gen) == 0) {
		ch->recovered += kind != 't';
		ch->sigterm_recovered += kind == 't';
	} else
		job_state(ch->ctl_url, ch->job, &now_gen, state, sizeof(state));
	fprintf(stderr, "chaos: %c node %d pid %d: gen %lld -> %lld\n", kind, node, (int)victim,
		gen, now_gen);
}

/* The local job ended with 0 and said what happened to every process. */
static char *chaos_finish(struct chaos *ch)
{
	int code = h_wait(ch->local, 300000);
	char *out;

	if (code < 0)
		h_kill(ch->local);
	out = h_read(ch->log);
	cr_assert_eq(code, 0, "meshrun local exit %d:\n%s", code, out);
	cr_expect(strstr(out, "succeeded\n"), "%s", out);
	for (int i = 0; i < ch->nexpect; i++)
		cr_expect(strstr(out, ch->expect[i]), "'%s' not reported:\n%s", ch->expect[i], out);
	cr_expect(strstr(out, "node 0 (pid") && strstr(out, "exited 0: done"), "%s", out);
	return out;
}

/* "loss=X" of the last worker_done line of rank 0 in out that has one: a
 * generation that starts after the last step was checkpointed (a node
 * drained at the very end) trains nothing and reports no loss
 * (already_finished). */
static void final_loss(const char *out, char *buf, size_t cap)
{
	const char *p = out, *last = NULL;

	while ((p = strstr(p, "event=worker_done rank=0 "))) {
		const char *loss = strstr(p, " loss="), *eol = strchr(p, '\n');

		if (loss && (!eol || loss < eol))
			last = loss;
		p++;
	}
	cr_assert_not_null(last, "no worker_done line of rank 0 with a loss");
	snprintf(buf, cap, "%.*s", (int)strcspn(last + 1, " \n"), last + 1);
}

#define TRAIN_CONFIG "{\"steps\": 400, \"d_model\": 64, \"n_layer\": 2, \"seq_len\": 32, " \
		     "\"batch_size\": 8, \"threads\": 1, \"peak_flops\": 1e9, " \
		     "\"ckpt_every\": 25, \"ckpt_dir\": \"%s\"}"

/* (not in the sanitizer pass, the longest test there: the same agent,
 * controller and recovery paths run under it in the campaign below and in
 * test_recovery.c and test_lifecycle.c) */
Test(chaos, in_process_dp_tp_training_survives_kills_of_agents_and_controller,
     MR_NOT_UNDER_SAN)
{
	char cfg[2][1400], ck[2][300];
	char *args[] = {"--nodes", "2", "--nproc-per-node", "2", "--tp", "2", "--max-restarts",
			"20", "--heartbeat-timeout", "2s", "--workload-config", cfg[0], NULL};
	struct ledger *l = calloc(1, sizeof(*l));
	struct chaos ref = {0}, ch = {0};
	char want[64], got[64], *out;
	int lost, prev = 'a';

	cr_assert_not_null(l);
	rng_state = chaos_seed();
	for (int i = 0; i < 2; i++) {
		h_path(ck[i], sizeof(ck[i]), i ? "chaos-ckpt" : "chaos-ref-ckpt");
		snprintf(cfg[i], sizeof(cfg[i]), TRAIN_CONFIG, ck[i]);
	}
	/* the uninterrupted run: its final loss is the target */
	chaos_start(&ref, args, NULL, "chaos-ref.log");
	out = chaos_finish(&ref);
	final_loss(out, want, sizeof(want));
	free(out);

	args[11] = cfg[1];
	chaos_start(&ch, args, NULL, "chaos.log");
	ledger_start(l, ch.ctl_url);
	for (int i = 0; i < CHAOS_KILLS; i++) {
		/* a controller kill does not restart training: the next fault
		 * is an agent, so the training always outlasts the faults */
		int kind = prev == 'c' || rnd(3) ? 'a' : 'c';
		int node = (int)rnd(2); /* one draw per statement: the same plan everywhere */

		usleep((useconds_t)(200 + rnd(1000)) * 1000);
		fault(&ch, kind, node);
		prev = kind;
	}
	fault(&ch, 't', (int)rnd(2)); /* a node drain */
	ledger_stop(l);
	out = chaos_finish(&ch);
	final_loss(out, got, sizeof(got));
	free(out);
	lost = ledger_lost(l, ch.datadir);
	fprintf(stderr, "chaos kills=%d recovered=%d lost_writes=%d sigterms=%d/%d "
			"acked_writes=%d final_%s reference_%s seed=%llu\n",
		ch.kills, ch.recovered, lost, ch.sigterm_recovered, ch.sigterms, l->nacked, got,
		want, (unsigned long long)chaos_seed());
	cr_expect_eq(ch.recovered, ch.kills);
	cr_expect_eq(ch.sigterm_recovered, ch.sigterms);
	cr_expect_eq(lost, 0, "%d of %d acknowledged writes lost", lost, l->nacked);
	cr_expect_gt(l->nacked, 0);
	cr_expect_str_eq(got, want, "final %s, uninterrupted run %s", got, want);
	free(l);
}

/* Exec-mode workers are processes: kill them too. They run until the test
 * creates $MR_TEST_GO, so the faults decide the timing. */
Test(chaos, exec_workers_agents_and_controller_killed_at_random)
{
	char go[300], genv[400];
	char *env[] = {genv, NULL};
	char *args[] = {"--nodes", "2", "--nproc-per-node", "2", "--max-restarts", "20",
			"--heartbeat-timeout", "2s", "--grace-period", "500ms", "--", "sh", "-c",
			"echo UP $RANK gen=$MESHRUN_GENERATION; "
			"while [ ! -f $MR_TEST_GO ]; do sleep 0.05; done; echo DONE $RANK",
			NULL};
	struct ledger *l = calloc(1, sizeof(*l));
	struct chaos ch = {0};
	char *out;
	int lost;
	FILE *f;

	cr_assert_not_null(l);
	rng_state = chaos_seed() + 1;
	h_path(go, sizeof(go), "chaos-go");
	snprintf(genv, sizeof(genv), "MR_TEST_GO=%s", go);
	chaos_start(&ch, args, env, "chaos-exec.log");
	ledger_start(l, ch.ctl_url);
	for (int i = 0; i < CHAOS_KILLS; i++) {
		static const int kinds[] = {'a', 'w', 'w', 'c'};
		int kind = kinds[rnd(4)];
		int node = (int)rnd(2);

		usleep((useconds_t)(200 + rnd(1000)) * 1000);
		fault(&ch, kind, node);
	}
	fault(&ch, 't', (int)rnd(2));
	ledger_stop(l);
	f = fopen(go, "w");
	cr_assert_not_null(f);
	fclose(f);
	out = chaos_finish(&ch);
	/* a killed worker reads as SIGKILL in its agent's log */
	{
		int seen = 0;

		for (const char *p = out; (p = strstr(p, "exited with code 137")); p++)
			seen++;
		cr_expect_geq(seen, ch.worker_kills, "%d worker kills, %d reported:\n%s",
			      ch.worker_kills, seen, out);
	}
	free(out);
	lost = ledger_lost(l, ch.datadir);
	fprintf(stderr, "chaos kills=%d recovered=%d lost_writes=%d sigterms=%d/%d "
			"worker_kills=%d acked_writes=%d seed=%llu\n",
		ch.kills, ch.recovered, lost, ch.sigterm_recovered, ch.sigterms, ch.worker_kills,
		l->nacked, (unsigned long long)chaos_seed() + 1);
	cr_expect_eq(ch.recovered, ch.kills);
	cr_expect_eq(ch.sigterm_recovered, ch.sigterms);
	cr_expect_eq(lost, 0, "%d of %d acknowledged writes lost", lost, l->nacked);
	cr_expect_gt(l->nacked, 0);
	free(l);
}

/* ---- the recovery campaign ---- */

/* The sanitizer pass (MR_SANITIZED) runs a shorter campaign: two of the
 * jobs, two kills each; the first pass runs all four, five kills each. */
#ifdef MR_SANITIZED
#define CAMPAIGN_KILLS 2
#define CAMPAIGN_JOBS 2
#else
#define CAMPAIGN_KILLS 5
#define CAMPAIGN_JOBS 4
#endif

/* Whether files a and b hold the same bytes. */
static int same_bytes(const char *a, const char *b)
{
	char *x = h_read(a), *y = h_read(b);
	int same = x && y && !strcmp(x, y);

	free(x);
	free(y);
	return same;
}

/* One job of the campaign: `mesh` flags and workload keys `keys`, run
 * once uninterrupted and once under CAMPAIGN_KILLS kills of agents. */
static void campaign(const char *name, const char *mesh, const char *keys, int *finished,
		     int *exact, int *resumed)
{
	char cfg[2][1400], ck[2][300], loss[2][300], logname[2][80], flags[128];
	char *args[H_MAX_ARGS];
	struct chaos ch[2];
	int n = 0, i;
	char *out;

	snprintf(flags, sizeof(flags), "%s", mesh);
	args[n++] = "--nodes";
	args[n++] = "2";
	args[n++] = "--nproc-per-node";
	args[n++] = "2";
	for (char *t = strtok(flags, " "); t; t = strtok(NULL, " "))
		args[n++] = t;
	args[n++] = "--max-restarts";
	args[n++] = "20";
	args[n++] = "--heartbeat-timeout";
	args[n++] = "2s";
	args[n++] = "--workload-config";
	args[n + 1] = NULL;
	for (i = 0; i < 2; i++) {
		char what[64];
		snprintf(what, sizeof(what), "recovery-%s-%s", name, i ? "kills" : "ref");
		h_path(ck[i], sizeof(ck[i]), what);
		snprintf(logname[i], sizeof(logname[i]), "%s.loss", what);
		h_path(loss[i], sizeof(loss[i]), logname[i]);
		snprintf(cfg[i], sizeof(cfg[i]),
			 "{\"steps\": 200, \"d_model\": 32, \"n_layer\": 4, \"n_head\": 4, "
			 "\"seq_len\": 32, \"batch_size\": 4, \"threads\": 1, \"peak_flops\": 1e9, "
			 "\"ckpt_every\": 5, \"ckpt_dir\": \"%s\", \"loss_log\": \"%s\", "
			 "\"comm_timeout_ms\": 60000, %s%s}",
			 ck[i], loss[i], keys,
			 i ? ", \"debug_slow_rank\": 0, \"debug_slow_ms\": 80" : "");
		args[n] = cfg[i];
		memset(&ch[i], 0, sizeof(ch[i]));
		snprintf(what, sizeof(what), "recovery-%s-%s.log", name, i ? "kills" : "ref");
		chaos_start(&ch[i], args, NULL, what);
		/* the kills begin once a checkpoint is published, so every job
		 * resumes from one (a slow start, under the sanitizers, could
		 * otherwise take every kill before the first) */
		if (i)
			cr_assert_eq(h_wait_log(ch[i].log, "event=checkpoint_saved", 1, 120000), 0,
				     "%s: no checkpoint", name);
		for (int k = 0; i && k < CAMPAIGN_KILLS; k++) {
			usleep((useconds_t)(500 + rnd(2500)) * 1000);
			fault(&ch[i], 'a', (int)rnd(2));
		}
		out = chaos_finish(&ch[i]);
		if (i) {
			*finished += ch[i].recovered == CAMPAIGN_KILLS && strstr(out, "succeeded\n");
			*resumed += strstr(out, "event=checkpoint_resumed") != NULL;
		}
		free(out);
	}
	*exact += same_bytes(loss[0], loss[1]);
	cr_expect(same_bytes(loss[0], loss[1]), "%s: the loss log differs from the uninterrupted "
		  "run's (%s, %s)", name, loss[0], loss[1]);
	cr_expect_eq(ch[1].recovered, CAMPAIGN_KILLS, "%s: %d of %d kills recovered", name,
		     ch[1].recovered, CAMPAIGN_KILLS);
}

Test(chaos, recovery_campaign_20_kills_across_dp_tp_pp_cp_ep, .timeout = 1500)
{
	int finished = 0, exact = 0, resumed = 0;

	rng_state = chaos_seed() + 2;
	campaign("dp", "", "\"zero\": 1", &finished, &exact, &resumed);
	if (CAMPAIGN_JOBS == 4) {
		campaign("tp", "--tp 2 --sequence-parallel", "\"zero\": 2", &finished, &exact,
			 &resumed);
		campaign("pp", "--pp 2", "\"grad_accum\": 4, \"pp_schedule\": \"1f1b\"",
			 &finished, &exact, &resumed);
	}
	campaign("cp_ep", "--cp 2 --ep 2",
		 "\"zero\": 1, \"moe_every\": 2, \"n_experts\": 4, \"top_k\": 2, "
		 "\"moe_policy\": \"dropless\"",
		 &finished, &exact, &resumed);
	fprintf(stderr, "recovery kills=%d finished=%d exact=%d resumed=%d seed=%llu\n",
		CAMPAIGN_JOBS * CAMPAIGN_KILLS, finished, exact, resumed,
		(unsigned long long)chaos_seed() + 2);
	cr_expect_eq(finished, CAMPAIGN_JOBS);
	cr_expect_eq(exact, CAMPAIGN_JOBS);
	cr_expect_eq(resumed, CAMPAIGN_JOBS, "every job resumes from a checkpoint at least once");
}
