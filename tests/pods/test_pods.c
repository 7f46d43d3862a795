/*
 * test_pods.c - pods as hosts (scripts/pods.sh): the controller and each
 * pod in a network namespace of its own, every process of a pod in its
 * own IPC namespace with its own /dev/shm, so pods meet only over TCP on
 * a test subnet, as Kubernetes pods on different nodes do. A dp2 job of
 * two pods, and tp2 x dp2, tp2 x pp2 and (MoE) cp2 x ep2 jobs of two pods
 * of two ranks each, train to the single-rank run's losses (relative
 * 1e-5 a step), and the host
 * backend says which transport it chose: TCP between pods, shared memory
 * inside one (`event=comm_transport`). The controller and every pod are
 * reached by their addresses from the test (the root namespace), as a
 * Prometheus would scrape them. A pod's link cut (its veth down) past the
 * heartbeat timeout is survived: the job re-forms when the link heals,
 * the stale pod rejoins, and training resumes from the newest checkpoint
 * to the uninterrupted run's losses.
 *
 * Needs root and network namespaces (`scripts/pods.sh check`); skipped
 * with the reason elsewhere. Everything the test makes is removed at exit,
 * after a failure too (`pods.sh down`, and every process dies with the test).
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mr_gpt_worker.h"
#include "proc.h"

#define STEPS 8        /* the equality jobs */
#define FAULT_STEPS 40 /* the fault job: long enough to cut it mid-way */
/* the MoE keys of the cp x ep job: experts in every layer, dropless */
#define MOE "\"moe_every\": 1, \"n_experts\": 2, \"top_k\": 1, \"moe_policy\": \"dropless\""

static char root[PATH_MAX]; /* the repository: where scripts/pods.sh is */
static char name[8];        /* this test's pods */
static const char *tmp;

/* One line "KEY VALUE" for make test-pods' summary ($MESHRUN_PODS_SUMMARY). */
static void note(const char *key, int value)
{
	const char *path = getenv("MESHRUN_PODS_SUMMARY");
	FILE *f = path && path[0] ? fopen(path, "a") : NULL;

	if (f) {
		fprintf(f, "%s %d\n", key, value);
		fclose(f);
	}
}

static void down(void)
{
	if (name[0])
		(void)!mr_test_sh(root, NULL, "scripts/pods.sh down %s", name);
}

/* n pods (and pod c) named after the test; skips where none can be made */
static void pods_up(const char *nm, int n)
{
	char *out = NULL;
	int rc;

	/* the repository: where scripts/pods.sh is */
	snprintf(root, sizeof(root), "%s", mr_test_repo_file("scripts/pods.sh"));
	if (strrchr(root, '/'))
		*strrchr(root, '/') = '\0';
	if (strrchr(root, '/'))
		*strrchr(root, '/') = '\0';
	else
		snprintf(root, sizeof(root), ".");
	rc = mr_test_sh(root, &out, "scripts/pods.sh check");
	if (rc == 77)
		cr_skip_test("pods as hosts need network namespaces: %s", out);
	cr_assert_eq(rc, 0, "pods.sh check: %s", out);
	free(out);
	snprintf(name, sizeof(name), "%s", nm);
	atexit(down);
	rc = mr_test_sh(root, &out, "scripts/pods.sh down %s; scripts/pods.sh up %s %d", nm, nm,
			n);
	cr_assert_eq(rc, 0, "pods.sh up: %s", out);
	note("hosts", n + 1);
	free(out);
	tmp = mr_test_scratch("mr-pods");
	cr_assert_not_null(tmp);
}

static void ip_of(const char *pod, char *buf, size_t cap)
{
	char *out = NULL;

	cr_assert_eq(mr_test_sh(root, &out, "scripts/pods.sh ip %s %s", name, pod), 0, "%s",
		     out);
	out[strcspn(out, "\n")] = 0;
	snprintf(buf, cap, "%s", out);
	free(out);
}

/* Starts build/<bin> ARGS inside pod `pod`, output to log. */
static void spawn_in(struct mr_proc *p, const char *pod, const char *bin,
		     const char *const *args, const char *log)
{
	char script[PATH_MAX + 32], exe[PATH_MAX + 64];
	const char *argv[40];
	int n = 0;

	snprintf(script, sizeof(script), "%s/scripts/pods.sh", root);
	snprintf(exe, sizeof(exe), "%s/%s", mr_proc_build_dir(), bin);
	argv[n++] = "exec";
	argv[n++] = name;
	argv[n++] = pod;
	argv[n++] = exe;
	for (int i = 0; args[i] && n < 39; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	cr_assert_eq(mr_proc_spawn(p, script, argv, NULL, log), 0);
}

/* The controller in pod c on its own address; its base URL into url. */
static void controller(struct mr_proc *p, char *url, size_t cap)
{
	char cip[32], pf[300], dd[300], log[300];
	const char *args[] = { "--listen", "0.0.0.0", "--port", "29400", "--port-file", pf,
			       "--data-dir", dd, NULL };

	ip_of("c", cip, sizeof(cip));
	snprintf(pf, sizeof(pf), "%s/ctl.port", tmp);
	snprintf(dd, sizeof(dd), "%s/ctl", tmp);
	snprintf(log, sizeof(log), "%s/ctl.log", tmp);
	spawn_in(p, "c", "meshrun-controller", args, log);
	cr_assert_gt(mr_proc_wait_port(p, pf, 30000), 0, "controller did not start");
	snprintf(url, cap, "http://%s:29400", cip);
}

static int steps = STEPS;
#define KV_WRITES 20 /* acknowledged KV writes checked across a fault */
static int comm_timeout_ms = 20000; /* a cut peer fails the collective in time */
static const char *const fault_flags[] = { "--max-restarts", "5", "--last-call", "500ms", NULL };
static const char *nnodes = "2"; /* the pods' --nnodes: "1:2" for an elastic job */

static void config(char *buf, size_t cap, const char *tag, const char *extra)
{
	snprintf(buf, cap,
		 "{\"steps\": %d, \"d_model\": 32, \"n_layer\": 2, \"n_head\": 4, \"seq_len\": 16, "
		 "\"vocab_size\": 64, \"batch_size\": 4, \"threads\": 1, \"seed\": 7, "
		 "\"comm_timeout_ms\": %d, \"loss_log\": \"%s/%s.loss\"%s%s}",
		 steps, comm_timeout_ms, tmp, tag, extra ? ", " : "", extra ? extra : "");
}

static void losses(const char *tag, double *out)
{
	char path[300], head[128];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s.loss", tmp, tag);
	f = fopen(path, "r");
	cr_assert_not_null(f, "no loss log %s", path);
	cr_assert(fgets(head, sizeof(head), f) && !strcmp(head, MR_LOSS_LOG_HEADER "\n"));
	for (int i = 0; i < steps; i++) {
		long long s;

		cr_assert_eq(fscanf(f, "%lld %lf %*g %*g %*g %*s", &s, &out[i]), 2, "%s line %d",
			     path, i + 2);
	}
	fclose(f);
}

/* The single-rank run of the same rows (grad_accum = dp), in the root
 * namespace. */
static void reference_of(const char *tag, int accum, const char *more)
{
	char cfg[800], extra[300], *out = NULL;

	snprintf(extra, sizeof(extra), "\"grad_accum\": %d%s%s", accum, more ? ", " : "",
		 more ? more : "");
	config(cfg, sizeof(cfg), tag, extra);
	cr_assert_eq(mr_test_sh(tmp, &out, "timeout 300 '%s/meshrun' local --workload-config '%s'",
				mr_proc_build_dir(), cfg),
		     0, "%s", out);
	free(out);
}

/* Nothing of the test's pods is left once they are taken down: no
 * namespace, no process in one, no bridge (their /dev/shm went with the
 * mount namespaces). */
static void expect_clean(void)
{
	char *out = NULL;

	cr_assert_eq(mr_test_sh(root, &out, "scripts/pods.sh down %s && scripts/pods.sh list",
				name),
		     0, "%s", out);
	cr_expect(!strstr(out, name), "left behind: %s", out);
	free(out);
	cr_expect_eq(mr_test_sh(root, NULL, "ip netns list | grep -q '^mr-%s-'", name), 1,
		     "a namespace of '%s' is left", name);
}

static char job_url[160]; /* the last job started: its controller route */

/* Two pods of nproc ranks each start `mesh` (agent flags) with the
 * workload's extra keys. */
static void start_pods(struct mr_proc a[2], const char *url, const char *tag,
		       const char *nproc, const char *const *mesh, const char *extra,
		       const char *hb, char logs[2][300])
{
	static char cfg[800], ip[2][32], node[2][16], pod[2][4], job[32];

	config(cfg, sizeof(cfg), tag, extra);
	snprintf(job, sizeof(job), "t/%s", tag);
	snprintf(job_url, sizeof(job_url), "%s/v1/jobs/%s", url, job);
	for (int i = 0; i < 2; i++) {
		const char *args[32] = { "--controller", url, "--job", job, "--nnodes", nnodes,
					 "--nproc-per-node", nproc, "--node-id", node[i],
					 "--pod-index", pod[i], "--host", ip[i],
					 "--health-port", "29401", "--heartbeat-timeout", hb,
					 "--workload-config", cfg };
		int n = 20;


		snprintf(pod[i], sizeof(pod[i]), "%d", i);
		snprintf(node[i], sizeof(node[i]), "pod-%d", i);
		ip_of(pod[i], ip[i], sizeof(ip[i]));
		for (int k = 0; mesh && mesh[k]; k++)
			args[n++] = mesh[k];
		args[n] = NULL;
		snprintf(logs[i], 300, "%s/%s-%d.log", tmp, tag, i);
		spawn_in(&a[i], pod[i], "meshrun-agent", args, logs[i]);
	}
}

/* Both pods' agents exit 0 within 300 s. */
static void finish_pods(struct mr_proc a[2], char logs[2][300])
{
	for (int i = 0; i < 2; i++) {
		char tail[4000];

		cr_assert_eq(mr_proc_reap(&a[i], 300000), 0, "pod %d did not finish in time", i);
		mr_test_tail(logs[i], tail, sizeof(tail));
		cr_assert(WIFEXITED(a[i].status) && WEXITSTATUS(a[i].status) == 0,
			  "pod %d: status %d:\n%s", i, a[i].status, tail);
	}
	/* the agents' exit 0 is the controller's verdict */
	{
		struct mr_test_resp r;

		cr_expect_eq(mr_test_http(&r, "GET", job_url, NULL, 0, NULL, 10000), 200);
		cr_expect(strstr(r.body, "\"state\":\"succeeded\"") ||
				  strstr(r.body, "\"state\": \"succeeded\""),
			  "the controller's verdict: %s", r.body);
	}
}

static void reference(const char *tag, int accum)
{
	reference_of(tag, accum, NULL);
}

static void run_pods_with(const char *url, const char *tag, const char *nproc,
			  const char *const *mesh, const char *extra, char logs[2][300])
{
	struct mr_proc a[2];

	start_pods(a, url, tag, nproc, mesh, extra, "20s", logs);
	finish_pods(a, logs);
}

static void run_pods(const char *url, const char *tag, const char *nproc,
		     const char *const *mesh, char logs[2][300])
{
	run_pods_with(url, tag, nproc, mesh, NULL, logs);
}

static void expect_equal(const char *tag, const char *ref)
{
	double want[FAULT_STEPS], got[FAULT_STEPS];
	int equal = 1;

	losses(ref, want);
	losses(tag, got);
	for (int s = 0; s < steps; s++) {
		equal &= fabs(got[s] - want[s]) <= 1e-5 * fabs(want[s]);
		cr_expect(fabs(got[s] - want[s]) <= 1e-5 * fabs(want[s]),
			  "%s step %d: loss %.9g, one rank %.9g", tag, s + 1, got[s], want[s]);
	}
	note("job", equal);
}

static int has(const char *log, const char *what)
{
	char *text = mr_test_slurp(log, NULL);
	int yes = text && strstr(text, what);

	free(text);
	return yes;
}

/* scripts/pods.sh with arguments (a printf format), which must succeed. */
static void pods_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void pods_sh(const char *fmt, ...)
{
	char args[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	cr_assert_eq(mr_test_sh(root, NULL, "scripts/pods.sh %s", args), 0, "pods.sh %s failed",
		     args);
}

/* A fault test's job on two pods that are up: its controller, the
 * uninterrupted run `ref` to compare with, and the job `tag` started on
 * both pods (a 3 s heartbeat timeout, FAULT_STEPS steps, rank 0 slowed by
 * slow_ms a step so that faults land mid-training), with a checkpoint
 * every 5 steps under <tmp>/<ckpt> when ckpt is not NULL, and the
 * workload keys more ("" none). */
struct fault_job {
	const char *tag, *ref;
	struct mr_proc ctl, a[2];
	char url[64], logs[2][300];
};

static void fault_job(struct fault_job *j, const char *tag, const char *ref, const char *ckpt,
		      int slow_ms, const char *more)
{
	char extra[512];
	int n = 0;

	j->tag = tag;
	j->ref = ref;
	steps = FAULT_STEPS;
	controller(&j->ctl, j->url, sizeof(j->url));
	reference(ref, 2);
	if (ckpt)
		n = snprintf(extra, sizeof(extra), "\"ckpt_dir\": \"%s/%s\", \"ckpt_every\": 5, ",
			     tmp, ckpt);
	snprintf(extra + n, sizeof(extra) - (size_t)n,
		 "\"debug_slow_rank\": 0, \"debug_slow_ms\": %d%s%s", slow_ms, more[0] ? ", " : "",
		 more);
	start_pods(j->a, j->url, tag, "1", fault_flags, extra, "3s", j->logs);
}

/* The job to its end, its partitions noted, its losses the reference's. */
static void fault_job_finish(struct fault_job *j, int partitions)
{
	finish_pods(j->a, j->logs);
	note("partition", partitions);
	expect_equal(j->tag, j->ref);
}

Test(pods, jobs_across_network_namespaces_equal_one_rank, .timeout = 900, MR_NOT_UNDER_SAN)
{
	struct mr_proc ctl;
	struct mr_test_resp r;
	char url[64], logs[2][300], ip[32], probe[96];
	const char *tp2[] = { "--tp", "2", NULL };
	const char *tp2pp2[] = { "--tp", "2", "--pp", "2", NULL };
	const char *cp2ep2[] = { "--cp", "2", "--ep", "2", NULL };

	pods_up("pt", 2);
	controller(&ctl, url, sizeof(url));

	/* dp 2: one rank a pod, every peer across the network */
	reference("ref2", 2);
	run_pods(url, "dp2", "1", NULL, logs);
	expect_equal("dp2", "ref2");
	cr_expect(has(logs[0], "event=comm_transport") &&
			  has(logs[0], "size=2 shm_peers=0 tcp_peers=1"),
		  "pod 0 did not reach pod 1 over TCP (%s)", logs[0]);

	/* tp 2 inside each pod (shared memory), dp 2 across them (TCP) */
	run_pods(url, "tp2dp2", "2", tp2, logs);
	expect_equal("tp2dp2", "ref2");
	cr_expect(has(logs[0], "size=2 shm_peers=1 tcp_peers=0"),
		  "tp inside pod 0 is not on shared memory (%s)", logs[0]);
	cr_expect(has(logs[0], "size=2 shm_peers=0 tcp_peers=1"),
		  "dp between the pods is not on TCP (%s)", logs[0]);

	/* tp 2 inside each pod, pp 2 across (two micro-batches a step) */
	run_pods_with(url, "tp2pp2", "2", tp2pp2, "\"grad_accum\": 2", logs);
	expect_equal("tp2pp2", "ref2");

	/* cp 2 x ep 2 over the four ranks of a MoE model (dp 2) */
	reference_of("refmoe", 2, MOE);
	run_pods_with(url, "cp2ep2", "2", cp2ep2, MOE, logs);
	expect_equal("cp2ep2", "refmoe");

	/* the controller and the pods answer at their own addresses */
	snprintf(probe, sizeof(probe), "%s/metrics", url);
	cr_expect_eq(mr_test_http(&r, "GET", probe, NULL, 0, NULL, 10000), 200);
	cr_expect(strstr(r.body, "meshrun_"), "no metrics from the controller");
	ip_of("0", ip, sizeof(ip));
	snprintf(probe, sizeof(probe), "http://%s:29401/healthz", ip);
	/* the agents exited with their jobs: nothing may answer for pod 0 */
	cr_expect_eq(mr_test_http(&r, "GET", probe, NULL, 0, NULL, 3000), 0);
	mr_proc_stop(&ctl);
	expect_clean();
}

/* Waits until log holds `what` (60 s at most). */
static void wait_log(const char *log, const char *what)
{
	long long end = mr_test_now_ms() + 60000;

	char tail[4000];

	while (!has(log, what) && mr_test_now_ms() < end)
		usleep(50 * 1000);
	if (has(log, what))
		return;
	mr_test_tail(log, tail, sizeof(tail));
	cr_assert_fail("'%s' never appeared in %s:\n%s", what, log, tail);
}

/* A pod's link cut mid-training for longer than the heartbeat timeout:
 * the controller declares it dead, the other pod's ranks stop and wait in
 * the next generation (a fixed-size job needs both), the cut-off pod
 * learns on the healed link that its generation is stale and rejoins,
 * and the job resumes from the newest checkpoint to the uninterrupted
 * run's losses. */
Test(pods, a_cut_link_is_survived_and_the_stale_pod_rejoins, .timeout = 900,
     MR_NOT_UNDER_SAN)
{
	struct fault_job j;

	pods_up("pf", 2);
	fault_job(&j, "fault", "fref", "fault-ckpt", 150, "");
	wait_log(j.logs[0], "event=checkpoint_saved");
	note("partition_tried", 1);
	pods_sh("cut %s 1", name);
	/* past the heartbeat timeout (3 s): the controller declares pod 1 dead */
	wait_log(j.logs[0], "event=restarting");
	sleep(2);
	pods_sh("heal %s 1", name);
	fault_job_finish(&j, 1);
	cr_expect(has(j.logs[0], "event=checkpoint_resumed"), "pod 0 never resumed (%s)",
		  j.logs[0]);
	cr_expect(has(j.logs[1], "event=generation_changed") || has(j.logs[1], "event=restarting"),
		  "pod 1 never learned its generation was stale (%s)", j.logs[1]);
	mr_proc_stop(&j.ctl);
	expect_clean();
}

/* A free TCP port on 127.0.0.1 (for a server that cannot take port 0). */
static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
		  getsockname(fd, (struct sockaddr *)&a, &len) == 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

/* A rank of pod 1 stops calling collectives: `meshrun status --why`, run
 * where an operator would (outside the pods, at the controller's address),
 * names it; and a real Prometheus scrapes the controller and both pods'
 * agents at their own addresses. */
Test(pods, a_stalled_rank_is_named_and_prometheus_scrapes_every_pod, .timeout = 600,
     MR_NOT_UNDER_SAN)
{
	struct mr_proc ctl, a[2], prom;
	char url[64], logs[2][300], ip[2][32], cfgpath[300], args_web[64], args_cfg[320],
		args_db[320], q[128], *out = NULL;
	const char *mesh[] = { "--tp", "2", "--hang-timeout", "2s", "--heartbeat-interval",
			       "250ms", NULL };
	const char *pargs[] = { args_cfg, args_web, args_db, NULL };
	struct mr_test_resp r;
	long long end;
	int pport, rc = -1, up = 0;
	FILE *f;

	pods_up("ps", 2);
	controller(&ctl, url, sizeof(url));
	steps = 200;
	comm_timeout_ms = 300000; /* the others wait for the stalled rank meanwhile */
	start_pods(a, url, "stall", "2", mesh, "\"debug_stall_rank\": 3, \"debug_stall_step\": 2",
		   "60s", logs);
	end = mr_test_now_ms() + 120000;
	while (mr_test_now_ms() < end && mr_proc_alive(&a[0]) && mr_proc_alive(&a[1])) {
		free(out);
		out = NULL;
		rc = mr_test_sh(tmp, &out, "'%s/meshrun' status --controller %s --why t/stall",
				mr_proc_build_dir(), url);
		if (rc == 0 && strstr(out, "verdict:     stuck"))
			break;
		usleep(500 * 1000);
	}
	{
		char tail[3000];

		mr_test_tail(logs[1], tail, sizeof(tail));
		cr_assert(rc == 0 && strstr(out, "rank 3 (node pod-1, tp 1 cp 0 dp 1 pp 0) has "
						 "not entered "),
			  "status --why: %s\npod 1: %s", out, tail);
	}
	free(out);

	/* Prometheus, in the root namespace, scrapes the three addresses */
	ip_of("0", ip[0], sizeof(ip[0]));
	ip_of("1", ip[1], sizeof(ip[1]));
	snprintf(cfgpath, sizeof(cfgpath), "%s/prometheus.yml", tmp);
	f = fopen(cfgpath, "w");
	cr_assert_not_null(f);
	fprintf(f,
		"global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
		"scrape_configs:\n"
		"  - job_name: meshrun\n"
		"    static_configs:\n"
		"      - targets: ['%s', '%s:29401', '%s:29401']\n",
		url + strlen("http://"), ip[0], ip[1]);
	fclose(f);
	pport = free_port();
	snprintf(args_cfg, sizeof(args_cfg), "--config.file=%s", cfgpath);
	snprintf(args_web, sizeof(args_web), "--web.listen-address=127.0.0.1:%d", pport);
	snprintf(args_db, sizeof(args_db), "--storage.tsdb.path=%s/prom", tmp);
	if (access("/usr/bin/prometheus", X_OK) != 0) {
		cr_log_warn("prometheus not installed (Debian package prometheus): scrape skipped");
	} else {
		char plog[300];

		snprintf(plog, sizeof(plog), "%s/prometheus.log", tmp);
		cr_assert_eq(mr_proc_spawn(&prom, "/usr/bin/prometheus", pargs, NULL, plog), 0);
		snprintf(q, sizeof(q),
			 "http://127.0.0.1:%d/api/v1/query?query=sum(up%%7Bjob%%3D%%22meshrun%%22%%7D)",
			 pport);
		end = mr_test_now_ms() + 60000;
		while (mr_test_now_ms() < end && !up) {
			usleep(500 * 1000);
			if (mr_test_http(&r, "GET", q, NULL, 0, NULL, 5000) == 200)
				up = strstr(r.body, "\"3\"]") != NULL;
		}
		cr_expect(up, "Prometheus does not see the three targets up: %s", r.body);
		snprintf(q, sizeof(q),
			 "http://127.0.0.1:%d/api/v1/query?query=meshrun_job_stuck", pport);
		cr_expect_eq(mr_test_http(&r, "GET", q, NULL, 0, NULL, 5000), 200);
		cr_expect(strstr(r.body, "\"rank\":\"3\""), "meshrun_job_stuck not scraped: %s",
			  r.body);
		mr_proc_stop(&prom);
	}
	for (int i = 0; i < 2; i++)
		mr_proc_stop(&a[i]);
	mr_proc_stop(&ctl);
	expect_clean();
}

/* The controller's own link cut while training runs, past the heartbeat
 * timeout: it hears nobody, so it declares nobody dead (members_all_silent)
 * and the job trains on undisturbed, as it does while the controller
 * process is down: no restart, the uninterrupted run's losses. */
Test(pods, the_controller_cut_off_leaves_training_undisturbed, .timeout = 600,
     MR_NOT_UNDER_SAN)
{
	struct fault_job j;
	char ctl_log[300];

	pods_up("pc", 2);
	/* slower steps than the other fault jobs: the cut must land, and the
	 * heartbeat timeout pass, while both pods still train (the first step
	 * line comes at step 10; on a busy 2-core machine the KV writes and the
	 * cut itself take seconds). Were the job over first, a member done
	 * before the cut would make the silence that of one pod, not of all. */
	fault_job(&j, "ctlcut", "cref", NULL, 500, "");
	wait_log(j.logs[0], "event=step");
	/* writes the controller acknowledged before the cut must all be there
	 * after it (the job's generation never changes here) */
	for (int k = 0; k < KV_WRITES; k++) {
		struct mr_test_resp r;
		char key[160], val[16];

		snprintf(key, sizeof(key), "%s/v1/jobs/t/ctlcut/kv/acked-%d", j.url, k);
		snprintf(val, sizeof(val), "v%d", k);
		cr_assert_eq(mr_test_http(&r, "PUT", key, val, strlen(val), NULL, 10000), 200,
			     "%s", r.body);
	}
	note("partition_tried", 1);
	pods_sh("cut %s c", name);
	snprintf(ctl_log, sizeof(ctl_log), "%s/ctl.log", tmp);
	wait_log(ctl_log, "event=members_all_silent");
	sleep(1);
	pods_sh("heal %s c", name);
	{
		int lost = 0;

		for (int k = 0; k < KV_WRITES; k++) {
			struct mr_test_resp r;
			char key[160], val[16];

			snprintf(key, sizeof(key), "%s/v1/jobs/t/ctlcut/kv/acked-%d", j.url, k);
			snprintf(val, sizeof(val), "v%d", k);
			lost += mr_test_http(&r, "GET", key, NULL, 0, NULL, 10000) != 200 ||
				strcmp(r.body, val) != 0;
		}
		cr_expect_eq(lost, 0, "%d acknowledged KV writes of %d lost", lost, KV_WRITES);
		note("kv_acked", KV_WRITES);
		note("kv_lost", lost);
	}
	fault_job_finish(&j, 1);
	for (int i = 0; i < 2; i++)
		cr_expect(!has(j.logs[i], "event=restarting"), "pod %d restarted (%s)", i,
			  j.logs[i]);
	mr_proc_stop(&j.ctl);
	expect_clean();
}

/* Partitions by address (nftables in the pods' namespaces): the controller
 * and pod 1 cut from each other past the heartbeat timeout while the pods
 * still reach each other, then healed; then a one-way partition (what the
 * controller sends to pod 1 is dropped, pod 1's packets still arrive).
 * Either way the job ends with the uninterrupted run's losses: whatever
 * the controller concluded meanwhile (a dead member, or none), nothing is
 * lost or trained twice. Skipped where nftables is missing. */
Test(pods, partitions_of_the_controller_from_a_pod_are_survived, .timeout = 900,
     MR_NOT_UNDER_SAN)
{
	struct fault_job j;
	char *out = NULL;
	int rc;

	pods_up("pp", 2);
	rc = mr_test_sh(root, &out, "scripts/pods.sh block %s c 0 && scripts/pods.sh unblock %s c 0",
			name, name);
	if (rc == 77)
		cr_skip_test("partitions need nftables: %s", out);
	cr_assert_eq(rc, 0, "%s", out);
	free(out);
	fault_job(&j, "part", "pref", "part-ckpt", 150, "");
	wait_log(j.logs[0], "event=checkpoint_saved");
	note("partition_tried", 2);
	/* both ways, past the timeout: the controller declares pod 1 dead */
	pods_sh("block %s c 1", name);
	pods_sh("block %s 1 c", name);
	wait_log(j.logs[0], "event=restarting");
	sleep(2);
	pods_sh("unblock %s c 1", name);
	pods_sh("unblock %s 1 c", name);
	/* one way, for a while, once training runs again */
	wait_log(j.logs[0], "event=checkpoint_resumed");
	pods_sh("block %s c 1", name);
	sleep(4);
	pods_sh("unblock %s c 1", name);
	fault_job_finish(&j, 2);
	mr_proc_stop(&j.ctl);
	expect_clean();
}

/* An elastic job (1 to 2 pods) whose pod 1 is cut off: it re-forms
 * without it, on pod 0 alone (dp 1 takes both micro-batches: the same
 * global batch, `elastic_batch`), and takes it back when the link heals
 * (pod 1 learns it is stale and joins again: a scale-up). The losses
 * equal the uninterrupted run's throughout. */
Test(pods, an_elastic_job_goes_on_without_a_cut_pod_and_takes_it_back, .timeout = 900,
     MR_NOT_UNDER_SAN)
{
	struct fault_job j;

	pods_up("pe", 2);
	nnodes = "1:2";
	fault_job(&j, "elastic", "eref", "el-ckpt", 300, "");
	wait_log(j.logs[0], "event=checkpoint_saved");
	note("partition_tried", 1);
	pods_sh("cut %s 1", name);
	/* pod 0 goes on alone with the checkpoint's global batch */
	wait_log(j.logs[0], "event=elastic_batch dp_was=2 dp=1");
	wait_log(j.logs[0], "event=round gen=2 node_rank=0 nodes=1");
	pods_sh("heal %s 1", name);
	fault_job_finish(&j, 1);
	cr_expect(has(j.logs[1], "event=generation_changed") || has(j.logs[1], "event=restarting"),
		  "pod 1 never learned its generation was stale (%s)", j.logs[1]);
	mr_proc_stop(&j.ctl);
	expect_clean();
}

/* No split brain, across the network: the checkpoint writer (rank 0, pod
 * 0) is cut off in the middle of its first save (held before its publish
 * by debug_ckpt_publish_delay_ms) while the elastic job goes on without
 * it on pod 1. The stale writer's publish is fenced (it cannot confirm its
 * generation), its step never appears and is never loaded, and the job,
 * back on both pods, ends with the uninterrupted run's losses. */
Test(pods, a_cut_off_checkpoint_writer_never_publishes, .timeout = 900, MR_NOT_UNDER_SAN)
{
	struct fault_job j;
	int stale;

	pods_up("pw", 2);
	nnodes = "1:2";
	fault_job(&j, "writer", "wref", "w-ckpt", 200, "\"debug_ckpt_publish_delay_ms\": 2500");
	wait_log(j.logs[0], "event=debug_checkpoint_publish_delay step=5");
	note("partition_tried", 1);
	pods_sh("cut %s 0", name);
	/* pod 1 goes on alone; the stale writer wakes, cannot confirm, and
	 * drops its step */
	wait_log(j.logs[1], "event=round gen=2 node_rank=0 nodes=1");
	wait_log(j.logs[0], "event=checkpoint_fenced step=5");
	pods_sh("heal %s 0", name);
	fault_job_finish(&j, 1);
	/* the stale step was published by nobody: pod 0 saved no step 5 in
	 * its first generation (before its second round) */
	{
		char *text = mr_test_slurp(j.logs[0], NULL), *r1, *r2 = NULL, *saved;

		cr_assert_not_null(text);
		r1 = strstr(text, "event=round gen=");
		if (r1)
			r2 = strstr(r1 + 1, "event=round gen=");
		saved = strstr(text, "event=checkpoint_saved step=5 ");
		stale = saved && (!r2 || saved < r2);
		free(text);
	}
	cr_expect(!stale, "the cut-off writer published step 5");
	note("stale_publish", stale);
	mr_proc_stop(&j.ctl);
	expect_clean();
}
