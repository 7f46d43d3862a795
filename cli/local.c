/*
 * local.c - `meshrun local`: a whole job on this machine. Starts
 * meshrun-controller (from the directory of the meshrun binary) on an
 * ephemeral loopback port with a temporary data dir, then N meshrun-agent
 * processes joined to it, merges their output with "[node i] " /
 * "[controller] " prefixes, prints a line whenever the job's generation or
 * state changes, and ends with the job's status as the controller
 * recorded it: 0 when it succeeded, else the code of the agent that
 * failed first (2 for a bad config or a permanent failure), 128+N when
 * stopped by signal N.
 *
 * It supervises its processes as Kubernetes supervises pods
 * (local_pods.c): an agent or the controller that dies is restarted on
 * the same node id / port and data dir, with backoff, at most
 * --max-restarts times each; an agent that exits 0 or 2 is done. When the
 * job is over at the controller, agents still running
 * LOCAL_STOP_AFTER_MS later get SIGTERM (a safety net: they normally stop
 * within a round trip), as a Job's failure policy stops its pods.
 *
 *   meshrun local --nodes N --nproc-per-node K [agent flags] [-- CMD ARGS]
 *
 * Every option besides --nodes is an agent option and is passed on as is
 * (checked here first with the agent's own table, so a typo exits 2 before
 * anything starts). Without `-- CMD` the agents run the in-process GPT
 * runtime (tune it with --workload-config JSON); `--demo` runs a shell
 * command printing each rank's placement instead.
 *
 * On a terminal the agents' output goes through pview.c, which folds the
 * training progress lines into one status line redrawn in place; the
 * status messages of this file go through the same pipe so they do not
 * land in the middle of it.
 *
 * The controller's journal lives in a temporary directory removed at the
 * end, or in --data-dir DIR, which is kept (inspect it afterwards with
 * meshrun-controller --data-dir DIR and meshrun status).
 *
 * Non-goals: remote nodes, containers.
 */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "local_int.h"
#include "mr_cli.h"
#include "mr_gpt_worker.h"
#include "mr_httpc.h"
#include "pview.h"
#include "workenv.h"

extern char **environ;

#define LOCAL_MAX_NODES 64
#define LOCAL_MAX_ARGS 512
#define LOCAL_STOP_AFTER_MS 10000 /* safety net, see the header */
#define LOCAL_FINAL_POLL_MS 10000 /* how long the report waits for the controller */

static const char demo_script[] =
	"echo \"hello from rank $RANK of $WORLD_SIZE (node $GROUP_RANK, local rank "
	"$LOCAL_RANK; tp=$MESHRUN_TP_RANK cp=$MESHRUN_CP_RANK dp=$MESHRUN_DP_RANK "
	"pp=$MESHRUN_PP_RANK; master $MASTER_ADDR:$MASTER_PORT; generation "
	"$MESHRUN_GENERATION)\"";

static volatile sig_atomic_t local_stop;

static void on_signal(int sig)
{
	local_stop = sig;
}

static void usage(FILE *out)
{
	fprintf(out,
		"usage: meshrun local [--nodes N] [--data-dir DIR] [agent options] [-- CMD ARGS...]\n\n"
		"Runs a whole job on this machine: an embedded controller on loopback and N\n"
		"agents (default 1), restarted when they die, as Kubernetes restarts pods.\n"
		"--data-dir DIR keeps the controller's journal there (default: a temporary\n"
		"directory, removed at the end). Every other option is a meshrun-agent option (see\n"
		"`meshrun-agent --help`), e.g. --nproc-per-node, --tp, --max-restarts.\n"
		"Without a command the agents train the in-process GPT runtime\n"
		"(--workload-config '{\"steps\": 20}'; --help-workload lists its keys);\n"
		"--demo runs a shell command printing each rank's placement instead.\n"
		"On a terminal the run shows the model, a line per logged step and a summary;\n"
		"every agent line goes to --log-file FILE (default /tmp/meshrun-<job>.log).\n"
		"Off a terminal (or with --log-format json) the agents' structured lines go to\n"
		"stderr as they are.\n");
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

static int has_flag(char **args, int n, const char *flag)
{
	size_t fl = strlen(flag);

	for (int i = 0; i < n; i++)
		if (!strncmp(args[i], flag, fl) && (args[i][fl] == '\0' || args[i][fl] == '='))
			return 1;
	return 0;
}

static void self_dir(char *buf, size_t size)
{
	ssize_t n = readlink("/proc/self/exe", buf, size - 1);
	char *slash;

	buf[n > 0 ? n : 0] = '\0';
	slash = strrchr(buf, '/');
	if (slash)
		*slash = '\0';
	else
		snprintf(buf, size, ".");
}

static int read_port(const char *path, int timeout_ms)
{
	for (int waited = 0; waited < timeout_ms; waited += 20) {
		FILE *f = fopen(path, "r");
		int port = 0;

		if (f) {
			if (fscanf(f, "%d", &port) != 1)
				port = 0;
			fclose(f);
		}
		if (port > 0)
			return port;
		usleep(20 * 1000);
	}
	return -1;
}


/* One `meshrun local` run: its options, processes and what it learned. */
struct local_run {
	int nodes, demo, npass, ncmd, max_restarts;
	char *pass[LOCAL_MAX_ARGS], *cmd[LOCAL_MAX_ARGS], *av[2 * LOCAL_MAX_ARGS];
	char *cav[16];
	char job[256], nodes_s[16], url[64], port_s[16];
	char ctl_bin[PATH_MAX + 32], agent_bin[PATH_MAX + 32];
	char tmp[32], portfile[64];
	char datadir[1024];  /* the controller's; --data-dir keeps it, else in tmp */
	char logfile[1024];  /* the agents' lines on a terminal; --log-file, else /tmp */
	const char *log_format; /* --log-format, for the controller too (NULL: logfmt) */
	struct local_proc ctl;
	struct local_proc *agent; /* nodes of them */
	struct mr_workenv envs[LOCAL_MAX_NODES];
	int nenv;
	struct local_job js;
	struct mr_httpc hc;
	int hc_on;
	struct mr_pview view;
	int msg_fd;        /* stderr, or the view's pipe on a terminal */
	int first_rc;      /* exit code of the first agent that failed for good
			    * (2, a permanent failure, wins over the others) */
	int stop_sig;      /* SIGTERM/SIGINT received */
	int winding_down;  /* the safety net stopped the rest */
};

/* "--flag PATH" or "--flag=PATH" at argv[*i] into buf: 1 (taken, *i
 * past it), 0 (another option), -1 (empty or too long: said). */
static int path_option(int argc, char **argv, int *i, const char *flag, char *buf, size_t cap)
{
	size_t fl = strlen(flag);
	const char *v;

	if (strncmp(argv[*i], flag, fl) || (argv[*i][fl] != '\0' && argv[*i][fl] != '='))
		return 0;
	v = argv[*i][fl] == '=' ? argv[*i] + fl + 1 : (*i + 1 < argc ? argv[++*i] : "");
	if (!*v || strlen(v) >= cap) {
		fprintf(stderr, "meshrun local: %s: '%s' is empty or longer than %zu bytes\n", flag,
			v, cap - 1);
		return -1;
	}
	snprintf(buf, cap, "%s", v);
	return 1;
}

/* Options: --nodes, --demo, --data-dir and --log-file are ours (the
 * agents see --log-format too), the rest is the agents'. 0, or the exit
 * code (help: -1). */
static int parse_args(struct local_run *r, int argc, char **argv)
{
	int k;

	r->nodes = 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--")) {
			for (i++; i < argc && r->ncmd < LOCAL_MAX_ARGS - 1; i++)
				r->cmd[r->ncmd++] = argv[i];
			break;
		}
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return -1;
		}
		if (!strcmp(argv[i], "--help-workload")) { /* docs/WORKLOAD.md */
			mr_gpt_worker_keys_doc(stdout);
			return -1;
		}
		if (!strcmp(argv[i], "--demo")) {
			r->demo = 1;
			continue;
		}
		if ((k = path_option(argc, argv, &i, "--data-dir", r->datadir, sizeof(r->datadir))) ||
		    (k = path_option(argc, argv, &i, "--log-file", r->logfile, sizeof(r->logfile)))) {
			if (k < 0)
				return 2;
			continue;
		}
		if (!strcmp(argv[i], "--log-format") || !strncmp(argv[i], "--log-format=", 13))
			r->log_format = argv[i][12] == '=' ? argv[i] + 13
							   : (i + 1 < argc ? argv[i + 1] : "");
		if (!strcmp(argv[i], "--nodes") || !strncmp(argv[i], "--nodes=", 8)) {
			const char *v = argv[i][7] == '=' ? argv[i] + 8 : (i + 1 < argc ? argv[++i] : "");
			char *end;

			errno = 0;
			r->nodes = (int)strtol(v, &end, 10);
			if (errno || end == v || *end || r->nodes < 1 || r->nodes > LOCAL_MAX_NODES) {
				fprintf(stderr, "meshrun local: --nodes: '%s' is not in [1, %d]\n", v,
					LOCAL_MAX_NODES);
				return 2;
			}
			continue;
		}
		if (r->npass >= LOCAL_MAX_ARGS - 64) {
			fprintf(stderr, "meshrun local: too many arguments\n");
			return 2;
		}
		r->pass[r->npass++] = argv[i];
	}
	if (r->ncmd == 0 && r->demo) {
		r->cmd[r->ncmd++] = "sh";
		r->cmd[r->ncmd++] = "-c";
		r->cmd[r->ncmd++] = (char *)demo_script;
	}
	r->cmd[r->ncmd] = NULL;
	return 0;
}

/* The agent command line, checked with the agent's own table (a bad
 * option exits 2 before anything starts). 0 or 2. */
static int agent_argv(struct local_run *r)
{
	struct mr_agent_config check;
	struct mr_errbuf eb = {0};
	char **av = r->av;
	int n = 0, err;

	snprintf(r->job, sizeof(r->job), "local/job-%d", (int)getpid());
	snprintf(r->nodes_s, sizeof(r->nodes_s), "%d", r->nodes);
	av[n++] = r->agent_bin;
	av[n++] = "--controller";
	av[n++] = r->url;
	if (!has_flag(r->pass, r->npass, "--job")) {
		av[n++] = "--job";
		av[n++] = r->job;
	}
	av[n++] = "--nnodes";
	av[n++] = r->nodes_s;
	if (!has_flag(r->pass, r->npass, "--host")) {
		av[n++] = "--host";
		av[n++] = "127.0.0.1";
	}
	if (!has_flag(r->pass, r->npass, "--health-port")) {
		av[n++] = "--health-port";
		av[n++] = "0";
	}
	if (!has_flag(r->pass, r->npass, "--health-addr")) {
		av[n++] = "--health-addr";
		av[n++] = "127.0.0.1";
	}
	for (int i = 0; i < r->npass; i++)
		av[n++] = r->pass[i];
	if (r->ncmd > 0)
		av[n++] = "--";
	for (int i = 0; i < r->ncmd; i++)
		av[n++] = r->cmd[i];
	av[n] = NULL;
	snprintf(r->url, sizeof(r->url), "http://127.0.0.1:1");
	err = mr_agent_config_load(&check, "meshrun local", n, av, &eb);
	if (!err) {
		snprintf(r->job, sizeof(r->job), "%s", check.job);
		r->max_restarts = check.max_restarts;
	}
	/* every rank is on this machine: a model it cannot hold is refused
	 * before anything starts (an in-process job; --mesh auto plans one
	 * that fits) */
	if (!err && check.mode == MR_AGENT_MODE_INPROC && !check.mesh[0]) {
		int world = r->nodes * check.nproc_per_node;
		err = mr_gpt_worker_fits(check.workload_json,
					 &(struct mr_gpt_worker_ranks){ world, check.tp, check.pp,
									check.cp, check.ep, 0, world },
					 &eb);
	}
	mr_agent_config_release(&check);
	if (err) {
		fprintf(stderr, "meshrun local: %s\n", eb.msg[0] ? eb.msg : mr_strerror(err));
		return 2;
	}
	return 0;
}

/* The controller on an ephemeral port (kept for its restarts) and a
 * client for the job's status. 0 or 1. */
static int start_controller(struct local_run *r)
{
	struct mr_errbuf eb = {0};
	char **c = r->cav;
	int port, n = 0;

	snprintf(r->portfile, sizeof(r->portfile), "%s/port", r->tmp);
	if (!r->datadir[0])
		snprintf(r->datadir, sizeof(r->datadir), "%s/data", r->tmp);
	snprintf(r->port_s, sizeof(r->port_s), "0");
	c[n++] = r->ctl_bin;
	c[n++] = "--listen";
	c[n++] = "127.0.0.1";
	c[n++] = "--port";
	c[n++] = r->port_s;
	c[n++] = "--port-file";
	c[n++] = r->portfile;
	c[n++] = "--data-dir";
	c[n++] = r->datadir;
	c[n++] = "--no-fsync"; /* process deaths, not power loss: the page cache keeps it */
	c[n++] = "--log-level";
	c[n++] = "warn";
	if (r->log_format) {
		c[n++] = "--log-format";
		c[n++] = (char *)r->log_format;
	}
	c[n] = NULL;
	r->ctl.argv = c;
	r->ctl.env = environ;
	r->ctl.id = -1;
	r->ctl.err_fd = -1;
	r->ctl.max_restarts = r->max_restarts;
	r->ctl.backoff_ms = LOCAL_BACKOFF_MS;
	if (mr__local_start(&r->ctl, &eb)) {
		fprintf(stderr, "meshrun local: unable to start '%s': %s\n", r->ctl_bin, eb.msg);
		return 1;
	}
	port = read_port(r->portfile, 30000);
	if (port < 0) {
		fprintf(stderr, "meshrun local: controller did not start (no '%s')\n", r->portfile);
		return 1;
	}
	snprintf(r->port_s, sizeof(r->port_s), "%d", port); /* restarts bind it again */
	snprintf(r->url, sizeof(r->url), "http://127.0.0.1:%d", port);
	{
		struct mr_httpc_opts ho = {.base_url = r->url, .timeout_ms = 1000, .max_retries = 0};

		r->hc_on = mr_httpc_init(&r->hc, &ho, &eb) == 0;
	}
	r->js.name = r->job;
	r->js.hc = r->hc_on ? &r->hc : NULL;
	return 0;
}

/* The terminal view and its log file; 0 or 1. */
static int open_view(struct local_run *r)
{
	struct mr_errbuf eb = {0};

	if (!r->logfile[0]) { /* /tmp/meshrun-local-job-123.log */
		size_t n = (size_t)snprintf(r->logfile, sizeof(r->logfile), "/tmp/meshrun-%s.log",
					    r->job);

		for (size_t i = strlen("/tmp/"); i < n && i < sizeof(r->logfile); i++)
			if (r->logfile[i] == '/')
				r->logfile[i] = '-';
	}
	if (mr_pview_open(&r->view, r->logfile, &eb)) {
		fprintf(stderr, "meshrun local: %s\n", eb.msg);
		return 1;
	}
	fprintf(stderr, "meshrun local: every agent's log lines go to %s\n", r->logfile);
	r->msg_fd = r->view.wfd;
	return 0;
}

static int start_agents(struct local_run *r)
{
	struct mr_errbuf eb = {0};

	r->agent = calloc((size_t)r->nodes, sizeof(*r->agent));
	if (!r->agent) {
		fprintf(stderr, "meshrun local: out of memory\n");
		return 1;
	}
	for (int i = 0; i < r->nodes; i++) {
		struct local_proc *a = &r->agent[i];
		int err = mr_workenv_init(&r->envs[i], environ);

		r->nenv++;
		if (!err)
			err = mr_workenv_set(&r->envs[i], "MESHRUN_NODE_ID", "local-%d", i);
		if (!err)
			err = mr_workenv_set(&r->envs[i], "MESHRUN_POD_INDEX", "%d", i);
		if (!err) /* why it ended, for report() */
			err = mr_workenv_set(&r->envs[i], "MESHRUN_TERMINATION_LOG", "%s/node-%d.end",
					     r->tmp, i);
		if (err) {
			fprintf(stderr, "meshrun local: %s\n", mr_strerror(err));
			return 1;
		}
		a->argv = r->av;
		a->env = r->envs[i].v;
		a->id = i;
		a->err_fd = r->view.wfd;
		a->max_restarts = r->max_restarts;
		a->backoff_ms = LOCAL_BACKOFF_MS;
		a->code = -1;
		if (mr__local_start(a, &eb)) {
			fprintf(stderr, "meshrun local: unable to start '%s': %s\n", r->agent_bin,
				eb.msg);
			return 1;
		}
	}
	return 0;
}

/* SIGTERM to every running agent; none of them is restarted after. */
static void stop_agents(struct local_run *r)
{
	for (int i = 0; i < r->nodes; i++) {
		struct local_proc *a = &r->agent[i];

		if (a->restart_at_ms) {
			a->restart_at_ms = 0;
			a->final = 1;
		}
		if (!a->final && a->code < 0)
			mr_exec_signal(&a->ex, SIGTERM);
	}
}

/* Watches, restarts and stops the processes until every agent is done. */
static void supervise(struct local_run *r)
{
	long long last_poll = 0, failed_at = -1;

	for (;;) {
		long long now = mr__local_now_ms();
		int left = 0, over;

		if (local_stop && !r->stop_sig) {
			r->stop_sig = local_stop;
			dprintf(r->msg_fd, "meshrun local: signal %d: stopping the agents\n",
				r->stop_sig);
			stop_agents(r);
		}
		if (now - last_poll >= 1000) {
			mr__local_poll_job(&r->js, 1000, r->msg_fd);
			last_poll = now;
		}
		if (mr__local_reaped(&r->ctl))
			mr__local_after_exit(&r->ctl, 0, r->stop_sig != 0, r->msg_fd);
		mr__local_restart_due(&r->ctl, r->msg_fd);
		over = mr__local_job_over(&r->js);
		for (int i = 0; i < r->nodes; i++) {
			struct local_proc *a = &r->agent[i];

			if (mr__local_reaped(a)) {
				if (a->code != 0) { /* the controller's latest word decides */
					mr__local_poll_job(&r->js, 1000, r->msg_fd);
					over = mr__local_job_over(&r->js);
				}
				mr__local_after_exit(a, over, r->stop_sig || r->winding_down,
						     r->msg_fd);
				/* the root cause wins: a permanent failure (2) */
				if (a->final && a->code != 0 && (!r->first_rc || a->code == 2))
					r->first_rc = a->code;
			}
			if (a->restart_at_ms && over) {
				a->restart_at_ms = 0;
				a->final = 1;
			}
			mr__local_restart_due(a, r->msg_fd);
			left += !a->final;
		}
		if (!left)
			return;
		/* the job cannot succeed any more: the others normally stop on
		 * the controller's word; stragglers get SIGTERM */
		if (failed_at < 0 && (over || r->first_rc))
			failed_at = now;
		if (failed_at >= 0 && !r->winding_down && now - failed_at >= LOCAL_STOP_AFTER_MS) {
			dprintf(r->msg_fd, "meshrun local: %d node(s) still running %d ms after the "
					   "failure; stopping them\n",
				left, LOCAL_STOP_AFTER_MS);
			r->winding_down = 1;
			stop_agents(r);
		}
		mr_pview_pump(&r->view);
		usleep(100 * 1000);
	}
}

/* What agent i wrote as the reason it ended (MESHRUN_TERMINATION_LOG,
 * agent/main.c) into buf, one line: 1, or 0 when it wrote none. */
static int end_reason(const struct local_run *r, int i, char *buf, size_t cap)
{
	char path[PATH_MAX];
	FILE *f;
	int got;

	snprintf(path, sizeof(path), "%s/node-%d.end", r->tmp, i);
	if (!(f = fopen(path, "r")))
		return 0;
	got = fgets(buf, (int)cap, f) != NULL;
	fclose(f);
	if (got)
		buf[strcspn(buf, "\n")] = 0;
	return got && buf[0];
}

/* The job's status as the controller recorded it (a controller that died
 * at the end is brought back to read it); returns the exit code. */
static int report(struct local_run *r)
{
	long long end = mr__local_now_ms() + LOCAL_FINAL_POLL_MS;
	int err, rc;

	while ((err = mr__local_poll_job(&r->js, 1000, -1)) && mr__local_now_ms() < end) {
		if (mr__local_reaped(&r->ctl))
			mr__local_after_exit(&r->ctl, 0, 0, STDERR_FILENO);
		mr__local_restart_due(&r->ctl, STDERR_FILENO);
		if (r->ctl.final)
			break;
		usleep(100 * 1000);
	}
	if (!err && !strcmp(r->js.state, "succeeded")) {
		fprintf(stderr, "meshrun local: job %s succeeded\n", r->job);
		return 0;
	}
	rc = r->stop_sig ? 128 + r->stop_sig : r->first_rc ? r->first_rc : 1;
	if (err)
		fprintf(stderr, "meshrun local: job %s: unable to read its status from the "
				"controller (%s);",
			r->job, mr_strerror(err));
	else if (r->stop_sig)
		fprintf(stderr, "meshrun local: job %s stopped by signal %d (controller: %s);",
			r->job, r->stop_sig, r->js.state);
	else if (!strcmp(r->js.state, "failed"))
		fprintf(stderr, "meshrun local: job %s failed: %s;", r->job, r->js.reason);
	else
		fprintf(stderr, "meshrun local: job %s did not finish (controller: %s);", r->job,
			r->js.state);
	for (int i = 0; i < r->nodes; i++) {
		char how[48], why[1024];

		fprintf(stderr, " node %d %s (restarts %d)", i,
			mr__local_end_text(&r->agent[i], how, sizeof(how)), r->agent[i].restarts);
		/* the agent's own reason - its worker's words - unless the
		 * controller's already says it */
		if (end_reason(r, i, why, sizeof(why)) && (err || !strstr(r->js.reason, why)))
			fprintf(stderr, ": %s", why);
		fprintf(stderr, ";");
	}
	fprintf(stderr, "\n");
	return rc;
}

static void release(struct local_run *r)
{
	for (int i = 0; r->agent && i < r->nodes; i++)
		mr_exec_stop(&r->agent[i].ex, 5000);
	mr_pview_close(&r->view);
	mr_exec_stop(&r->ctl.ex, 2000);
	if (r->hc_on)
		mr_httpc_release(&r->hc);
	for (int i = 0; i < r->nenv; i++)
		mr_workenv_release(&r->envs[i]);
	free(r->agent);
	if (r->tmp[0])
		nftw(r->tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int mr_cli_local(int argc, char **argv)
{
	struct local_run *r = calloc(1, sizeof(*r));
	char dir[PATH_MAX];
	struct sigaction sa;
	int rc;

	if (!r) {
		fprintf(stderr, "meshrun local: out of memory\n");
		return 1;
	}
	r->view.rfd = r->view.wfd = -1;
	r->msg_fd = STDERR_FILENO;
	rc = parse_args(r, argc, argv);
	if (!rc)
		rc = agent_argv(r);
	if (rc) {
		free(r);
		return rc < 0 ? 0 : rc;
	}
	self_dir(dir, sizeof(dir));
	snprintf(r->ctl_bin, sizeof(r->ctl_bin), "%s/meshrun-controller", dir);
	snprintf(r->agent_bin, sizeof(r->agent_bin), "%s/meshrun-agent", dir);
	snprintf(r->tmp, sizeof(r->tmp), "/tmp/meshrun-local-XXXXXX");
	if (!mkdtemp(r->tmp)) {
		fprintf(stderr, "meshrun local: unable to create a temporary directory: %s\n",
			strerror(errno));
		free(r);
		return 1;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	rc = start_controller(r);
	if (!rc) {
		fprintf(stderr, "meshrun local: controller on %s, %d node(s), job %s\n", r->url,
			r->nodes, r->job);
		const char *fmt = r->log_format ? r->log_format : getenv("MESHRUN_LOG_FORMAT");

		if (isatty(STDERR_FILENO) && !(fmt && !strcmp(fmt, "json")))
			rc = open_view(r);
	}
	if (!rc)
		rc = start_agents(r);
	if (!rc) {
		supervise(r);
		mr_pview_close(&r->view);
		r->msg_fd = STDERR_FILENO;
		rc = report(r);
	}
	release(r);
	free(r);
	return rc;
}
