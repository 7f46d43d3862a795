/*
 * main.c - meshrun-controller: parse the config table, fit the connection
 * limit to the file descriptors, start the controller, run until
 * SIGINT/SIGTERM, stop.
 *
 * Exit status: 0 after a clean stop; 2 for a usage or config error (a
 * --max-connections that does not fit the fd limit too), a corrupt journal
 * (see --journal-recover) or a data dir locked by another controller; 1
 * for any other start failure (token files, the data dir, the port,
 * memory).
 *
 * Non-goals: anything else (see controller/api/server.c).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mr_controller.h"
#include "mr_log.h"

static volatile sig_atomic_t stop; /* the stop signal's number, 0 = none yet */

static void on_signal(int sig)
{
	stop = sig;
}

int main(int argc, char **argv)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_controller_opts o;
	struct mr_controller *c = NULL;
	struct mr_config cfg;
	struct sigaction sa;
	sigset_t stopsigs, old;
	int rc;

	memset(&o, 0, sizeof(o));
	mr_log_init("controller", MR_LOG_INFO);
	rc = mr_config_init(&cfg, mr_controller_config, mr_controller_config_len, &o, &eb);
	if (!rc) {
		cfg.prog = "meshrun-controller";
		cfg.usage = "[options]";
		cfg.summary = "Rendezvous, per-job KV store, heartbeats and journal for meshrun "
			      "agents (HTTP API: docs/API.md).";
		rc = mr_config_parse(&cfg, argc, argv, &eb);
	}
	if (!rc) {
		mr_log_set_level((enum mr_log_level)o.log_level);
		mr_log_set_format((enum mr_log_format)o.log_format);
		rc = mr_controller_fit_fds(&o, &cfg, &eb);
	}
	mr_config_release(&cfg);
	if (rc == MR_CONFIG_HELP)
		return 0;
	if (rc) {
		fprintf(stderr, "meshrun-controller: %s\n", eb.msg);
		return MR_CONFIG_EXIT_USAGE;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	/* blocked here and in every thread the start creates (they inherit the
	 * mask), so a stop signal reaches this thread, and only inside
	 * sigsuspend: none is lost between the check of stop and the wait */
	sigemptyset(&stopsigs);
	sigaddset(&stopsigs, SIGINT);
	sigaddset(&stopsigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &stopsigs, &old);
	rc = mr_controller_start(&c, &o, &eb);
	if (rc) {
		mr_log_error("start_failed", "err=%s", mr_log_q(eb.msg));
		fprintf(stderr, "meshrun-controller: %s\n", eb.msg);
		/* a TLS file that cannot serve is a configuration error: exit 2 too */
		return rc == MR_ECORRUPT || rc == MR_ECONFLICT || !strncmp(eb.field, "tls_", 4)
			       ? MR_CONTROLLER_EXIT_DATA
			       : 1;
	}
	sigdelset(&old, SIGINT);
	sigdelset(&old, SIGTERM);
	while (!stop)
		sigsuspend(&old);
	mr_log_info("stopping", "signal=%d name=%s", (int)stop,
		    stop == SIGTERM ? "SIGTERM" : stop == SIGINT ? "SIGINT" : "?");
	mr_controller_stop(c);
	return 0;
}
