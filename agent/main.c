/*
 * main.c - meshrun-agent: config, health server, signal thread, then the
 * supervisor's lifecycle. Exit codes: 0 the job (this node's part)
 * succeeded as recorded by the controller, 1 the job failed (or the
 * controller stayed unreachable past controller_timeout), 2 bad
 * configuration or a permanent failure of this node, 128+N stopped by
 * signal N before the job succeeded (docs/RELIABILITY.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "http.h"
#include "mr_log.h"
#include "rankproc.h"
#include "supervisor.h"
#include "supervisor_int.h"

/* SIGTERM/SIGINT go through a pipe to a normal thread: any thread may
 * take the signal (OpenBLAS starts its pool before main, so masks are not
 * enough), and only async-signal-safe write(2) runs in the handler. */
static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
	unsigned char b = (unsigned char)sig;
	int saved = errno;

	if (write(sig_pipe[1], &b, 1) < 0) {
		/* nothing to do: the pipe is full of earlier requests */
	}
	errno = saved;
}

static void *signal_main(void *arg)
{
	struct mr_supervisor *sv = arg;
	unsigned char b;

	for (;;) {
		ssize_t r = read(sig_pipe[0], &b, 1);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0 || b == 0) /* 0: shutdown of this thread */
			return NULL;
		mr_supervisor_stop(sv, b);
	}
}

/*
 * Why this agent ended, for whoever started it: the file named by
 * MESHRUN_TERMINATION_LOG gets the reason (empty on success) - a pod's
 * terminationMessagePath (/dev/termination-log) shows it in `kubectl
 * describe pod`, and `meshrun local` puts it on its last line.
 */
static void termination_message(int code, const char *reason)
{
	const char *path = getenv("MESHRUN_TERMINATION_LOG");
	FILE *f;

	if (!path || !*path || !(f = fopen(path, "w")))
		return;
	if (code != 0 && reason && *reason)
		fprintf(f, "%.4000s\n", reason);
	fclose(f);
}

int main(int argc, char **argv)
{
	struct mr_agent_config cfg;
	struct mr_supervisor sv;
	struct mr_httpd *srv = NULL;
	struct mr_errbuf eb = {0};
	pthread_t sigthr;
	long long t_start = mr__sv_now_ms();
	int rc, err, sig_on = 0;

	if (argc == 2 && !strcmp(argv[1], MR_RANK_WORKER_ARG))
		return mr_rank_worker_main(); /* a rank of an agent (rankproc.h) */
	signal(SIGPIPE, SIG_IGN);
	err = mr_agent_config_load(&cfg, "meshrun-agent", argc, argv, &eb);
	if (err == MR_CONFIG_HELP)
		return 0;
	if (err) {
		fprintf(stderr, "meshrun-agent: %s\n", eb.msg[0] ? eb.msg : mr_strerror(err));
		termination_message(MR_AGENT_EXIT_USAGE, eb.msg[0] ? eb.msg : mr_strerror(err));
		mr_agent_config_release(&cfg);
		return MR_AGENT_EXIT_USAGE;
	}
	mr_log_init("agent", (enum mr_log_level)cfg.log_level);
	mr_log_set_format((enum mr_log_format)cfg.log_format);
	mr_log_set_job(cfg.job);
	err = mr_supervisor_init(&sv, &cfg, &eb);
	if (err) {
		fprintf(stderr, "meshrun-agent: %s\n", eb.msg[0] ? eb.msg : mr_strerror(err));
		mr_supervisor_release(&sv);
		mr_agent_config_release(&cfg);
		return MR_AGENT_EXIT_FAILED;
	}
	if (cfg.health_port >= 0) {
		err = mr_agent_http_start(&srv, &sv, cfg.health_addr, cfg.health_port, &eb);
		if (err) {
			fprintf(stderr, "meshrun-agent: health server on %s:%d: %s\n",
				cfg.health_addr, cfg.health_port,
				eb.msg[0] ? eb.msg : mr_strerror(err));
			mr_supervisor_release(&sv);
			mr_agent_config_release(&cfg);
			return MR_AGENT_EXIT_USAGE;
		}
		mr_rdzv_set_agent_port(sv.rdzv, mr_httpd_port(srv));
		mr_log_info("health_listening", "addr=%s port=%d", cfg.health_addr,
			    mr_httpd_port(srv));
	}
	mr_log_info("start", "node_id=%s host=%s pod_index=%d nnodes=%s nproc=%d controller=%s",
		    mr_log_q(cfg.node_id), mr_log_q(cfg.host), cfg.pod_index, cfg.nnodes,
		    cfg.nproc_per_node, mr_log_q(cfg.controller));
	if (pipe2(sig_pipe, O_CLOEXEC) == 0 &&
	    pthread_create(&sigthr, NULL, signal_main, &sv) == 0) {
		struct sigaction sa;

		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = on_signal;
		sa.sa_flags = SA_RESTART;
		sigaction(SIGTERM, &sa, NULL);
		sigaction(SIGINT, &sa, NULL);
		sig_on = 1;
	}
	rc = mr_supervisor_run(&sv);
	mr_supervisor_log_summary(&sv, (double)(mr__sv_now_ms() - t_start) / 1e3);
	mr_log_info("exit", "code=%d state=%s reason=%s", rc,
		    mr_agent_state_name(atomic_load(&sv.state)), mr_log_q(sv.reason));
	termination_message(rc, sv.reason);
	if (sig_on) {
		unsigned char zero = 0;

		signal(SIGTERM, SIG_DFL);
		signal(SIGINT, SIG_DFL);
		if (write(sig_pipe[1], &zero, 1) == 1)
			pthread_join(sigthr, NULL);
	}
	mr_httpd_stop(srv);
	mr_supervisor_release(&sv);
	mr_agent_config_release(&cfg);
	return rc;
}
