/*
 * local.c - `meshrun local`: a whole job on this machine. Starts
 * meshrun-controller (from the directory of the meshrun binary) on an
 * ephemeral loopback port with a temporary data dir, then N meshrun-agent
 * processes joined to it, merges their output with "[node i] " /
 * "[controller] " prefixes, prints a line whenever the job's generation or
 * state changes, and exits with the
 * job's status: 0 when every agent succeeded, else the code of the agent
 * that failed first (2 for a bad config).
 * When one agent fails, the controller fails the job and the other agents
 * stop on their own within a round trip; as a safety net (an agent that
 * cannot reach the controller), they get SIGTERM LOCAL_STOP_AFTER_MS after
 * the first failure, as a Kubernetes failure policy would stop the pods.
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
 * Non-goals: remote nodes, containers, keeping the controller's data.
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
#include "exec.h"
#include "mr_cli.h"
#include "mr_httpc.h"
#include "pview.h"
#include "workenv.h"

extern char **environ;

#define LOCAL_MAX_NODES 64
#define LOCAL_MAX_ARGS 512
#define LOCAL_STOP_AFTER_MS 10000 /* safety net, see the header */

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
		"usage: meshrun local [--nodes N] [agent options] [-- CMD ARGS...]\n\n"
		"Runs a whole job on this machine: an embedded controller on loopback and N\n"
		"agents (default 1). Every other option is a meshrun-agent option (see\n"
		"`meshrun-agent --help`), e.g. --nproc-per-node, --tp, --max-restarts.\n"
		"Without a command the agents train the in-process GPT runtime\n"
		"(--workload-config '{\"steps\": 20}'); --demo runs a shell command\n"
		"printing each rank's placement instead.\n");
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

/* Prints a line to fd when the job's generation or state changes. */
static void progress(struct mr_httpc *c, const char *job, long long *gen, char *state,
		     size_t cap, int fd)
{
	char path[512];
	struct mr_errbuf eb = {0};
	json_t *reply = NULL;
	long status = 0;
	const char *st;
	long long g;

	snprintf(path, sizeof(path), "/v1/jobs/%s", job);
	if (mr_httpc_json(c, "GET", path, NULL, 1000, &status, &reply, &eb) || status != 200 ||
	    !reply) {
		json_decref(reply);
		return;
	}
	g = json_integer_value(json_object_get(reply, "generation"));
	st = json_string_value(json_object_get(reply, "state"));
	if (g != *gen || (st && strcmp(st, state))) {
		dprintf(fd, "meshrun local: job %s generation %lld %s\n", job, g, st ? st : "?");
		*gen = g;
		snprintf(state, cap, "%s", st ? st : "");
	}
	json_decref(reply);
}

int mr_cli_local(int argc, char **argv)
{
	char *pass[LOCAL_MAX_ARGS], *cmd[LOCAL_MAX_ARGS], *av[2 * LOCAL_MAX_ARGS];
	int npass = 0, ncmd = 0, nodes = 1, rc = 1, port;
	char dir[PATH_MAX], tmp[] = "/tmp/meshrun-local-XXXXXX", path[PATH_MAX + 64];
	char ctl_bin[PATH_MAX + 32], agent_bin[PATH_MAX + 32], url[64], job[256], nodes_s[16];
	char portfile[sizeof(tmp) + 16], datadir[sizeof(tmp) + 16];
	struct mr_exec ctl = {0}, agents = {0};
	struct mr_workenv envs[LOCAL_MAX_NODES];
	char **ev[LOCAL_MAX_NODES];
	int ids[LOCAL_MAX_NODES], nenv = 0;
	struct mr_agent_config check;
	struct mr_errbuf eb = {0};
	struct mr_httpc hc = {0};
	struct sigaction sa;
	long long gen = -1;
	char state[32] = "";
	int hc_on = 0, tmp_made = 0, demo = 0, first_rc = 0, err;
	struct mr_pview view = {.rfd = -1, .wfd = -1};
	int msg_fd = STDERR_FILENO; /* the view's pipe on a terminal */

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--")) {
			for (i++; i < argc && ncmd < LOCAL_MAX_ARGS - 1; i++)
				cmd[ncmd++] = argv[i];
			break;
		}
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		}
		if (!strcmp(argv[i], "--demo")) {
			demo = 1;
			continue;
		}
		if (!strcmp(argv[i], "--nodes") || !strncmp(argv[i], "--nodes=", 8)) {
			const char *v = argv[i][7] == '=' ? argv[i] + 8 : (i + 1 < argc ? argv[++i] : "");
			char *end;

			errno = 0;
			nodes = (int)strtol(v, &end, 10);
			if (errno || end == v || *end || nodes < 1 || nodes > LOCAL_MAX_NODES) {
				fprintf(stderr, "meshrun local: --nodes: '%s' is not in [1, %d]\n", v,
					LOCAL_MAX_NODES);
				return 2;
			}
			continue;
		}
		if (npass >= LOCAL_MAX_ARGS - 64) {
			fprintf(stderr, "meshrun local: too many arguments\n");
			return 2;
		}
		pass[npass++] = argv[i];
	}
	if (ncmd == 0 && demo) {
		cmd[ncmd++] = "sh";
		cmd[ncmd++] = "-c";
		cmd[ncmd++] = (char *)demo_script;
	}
	cmd[ncmd] = NULL;
	snprintf(job, sizeof(job), "local/job-%d", (int)getpid());
	snprintf(nodes_s, sizeof(nodes_s), "%d", nodes);

	/* the agent command line, checked with the agent's own table */
	{
		int n = 0;

		av[n++] = agent_bin;
		av[n++] = "--controller";
		av[n++] = url;
		if (!has_flag(pass, npass, "--job")) {
			av[n++] = "--job";
			av[n++] = job;
		}
		av[n++] = "--nnodes";
		av[n++] = nodes_s;
		if (!has_flag(pass, npass, "--host")) {
			av[n++] = "--host";
			av[n++] = "127.0.0.1";
		}
		if (!has_flag(pass, npass, "--health-port")) {
			av[n++] = "--health-port";
			av[n++] = "0";
		}
		if (!has_flag(pass, npass, "--health-addr")) {
			av[n++] = "--health-addr";
			av[n++] = "127.0.0.1";
		}
		for (int i = 0; i < npass; i++)
			av[n++] = pass[i];
		if (ncmd > 0)
			av[n++] = "--";
		for (int i = 0; i < ncmd; i++)
			av[n++] = cmd[i];
		av[n] = NULL;
		snprintf(url, sizeof(url), "http://127.0.0.1:1");
		err = mr_agent_config_load(&check, "meshrun local", n, av, &eb);
		if (!err)
			snprintf(job, sizeof(job), "%s", check.job);
		mr_agent_config_release(&check);
		if (err) {
			fprintf(stderr, "meshrun local: %s\n", eb.msg[0] ? eb.msg : mr_strerror(err));
			return 2;
		}
	}
	self_dir(dir, sizeof(dir));
	snprintf(ctl_bin, sizeof(ctl_bin), "%s/meshrun-controller", dir);
	snprintf(agent_bin, sizeof(agent_bin), "%s/meshrun-agent", dir);
	if (!mkdtemp(tmp)) {
		fprintf(stderr, "meshrun local: unable to create a temporary directory: %s\n",
			strerror(errno));
		return 1;
	}
	tmp_made = 1;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	snprintf(portfile, sizeof(portfile), "%s/port", tmp);
	snprintf(datadir, sizeof(datadir), "%s/data", tmp);
	{
		char *cav[] = {ctl_bin, "--listen", "127.0.0.1", "--port", "0", "--port-file",
			       portfile, "--data-dir", datadir, "--no-fsync", "--log-level",
			       "warn", NULL};
		int cid = -1;

		err = mr_exec_start(&ctl, cav, 1, &environ, &cid, "controller", -1, -1, &eb);
		if (err) {
			fprintf(stderr, "meshrun local: unable to start '%s': %s\n", ctl_bin,
				eb.msg);
			goto out;
		}
	}
	port = read_port(portfile, 5000);
	if (port < 0) {
		fprintf(stderr, "meshrun local: controller did not start (no '%s')\n", portfile);
		goto out;
	}
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
	{
		struct mr_httpc_opts ho = {.base_url = url, .timeout_ms = 1000, .max_retries = 0};

		hc_on = mr_httpc_init(&hc, &ho, &eb) == 0;
	}
	for (int i = 0; i < nodes; i++) {
		err = mr_workenv_init(&envs[i], environ);
		nenv++;
		if (!err)
			err = mr_workenv_set(&envs[i], "MESHRUN_NODE_ID", "local-%d", i);
		if (!err)
			err = mr_workenv_set(&envs[i], "MESHRUN_POD_INDEX", "%d", i);
		if (err) {
			fprintf(stderr, "meshrun local: %s\n", mr_strerror(err));
			goto out;
		}
		ev[i] = envs[i].v;
		ids[i] = i;
	}
	fprintf(stderr, "meshrun local: controller on %s, %d node(s), job %s\n", url, nodes, job);
	if (isatty(STDERR_FILENO) && mr_pview_open(&view) == 0)
		msg_fd = view.wfd;
	err = mr_exec_start(&agents, av, nodes, ev, ids, "node", -1, view.wfd, &eb);
	if (err) {
		fprintf(stderr, "meshrun local: unable to start '%s': %s\n", agent_bin, eb.msg);
		goto out;
	}
	for (int tick = 0, stopped_rest = 0, failed_tick = -1;; tick++) {
		struct mr_exec_status st;

		if (local_stop) {
			mr_exec_signal(&agents, SIGTERM);
			local_stop = 0;
		}
		mr_exec_poll(&agents, &st);
		if (st.running == 0)
			break;
		/* a failed agent fails the job through the controller and the
		 * others stop by themselves; only stragglers get SIGTERM */
		if (st.failed && failed_tick < 0) {
			dprintf(msg_fd, "meshrun local: node %d failed (exit %d)\n",
				st.first_failed_rank, st.first_failed_code);
			failed_tick = tick;
			first_rc = st.first_failed_code;
		}
		if (failed_tick >= 0 && !stopped_rest &&
		    (tick - failed_tick) * 100 >= LOCAL_STOP_AFTER_MS) {
			dprintf(msg_fd, "meshrun local: %d node(s) still running %d ms after the "
					"failure; stopping them\n",
				st.running, LOCAL_STOP_AFTER_MS);
			mr_exec_signal(&agents, SIGTERM);
			stopped_rest = 1;
		}
		if (hc_on && tick % 10 == 0)
			progress(&hc, job, &gen, state, sizeof(state), msg_fd);
		mr_pview_pump(&view);
		usleep(100 * 1000);
	}
	mr_pview_close(&view);
	rc = first_rc;
	for (int i = 0; i < nodes && rc == 0; i++)
		rc = agents.child[i].code;
	fprintf(stderr, "meshrun local: job %s %s", job, rc ? "failed:" : "succeeded\n");
	if (rc) {
		for (int i = 0; i < nodes; i++)
			fprintf(stderr, " node %d exit %d;", i, agents.child[i].code);
		fprintf(stderr, "\n");
	}
out:
	mr_exec_stop(&agents, 5000);
	mr_pview_close(&view);
	mr_exec_stop(&ctl, 2000);
	if (hc_on)
		mr_httpc_release(&hc);
	for (int i = 0; i < nenv; i++)
		mr_workenv_release(&envs[i]);
	if (tmp_made) {
		snprintf(path, sizeof(path), "%s", tmp);
		nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	}
	return rc;
}
