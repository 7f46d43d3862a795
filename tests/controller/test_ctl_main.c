/*
 * test_ctl_main.c - meshrun-controller as a process (controller/main.c,
 * issue 26): the stop line names the signal that stopped it, and the
 * connection limit fits the file descriptor limit (soft raised to hard;
 * the default lowered to what fits; an explicit value that cannot fit
 * refused with exit 2 naming its source, the value and the limit).
 *
 * The fd limits are set with setrlimit() in the test process (Criterion
 * runs each test in a process of its own) and inherited by the controller.
 * Each controller gets a data dir of its own (ctl_test.h).
 */
#include <criterion/criterion.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl_test.h"

/* A controller at log level info (the lines these tests read). */
static void spawn(struct ctlp *c, const char *const *extra)
{
	c->log_level = "info";
	ctlp_spawn(c, 0, extra);
}

static void start(struct ctlp *c, const char *const *extra)
{
	c->log_level = "info";
	ctlp_start(c, 0, extra);
}

/* Reaps the controller (it must exit by itself within 20 s); its exit
 * code; the log's end in tail. Its data dir goes. */
static int reap(struct ctlp *c, char *tail, size_t cap)
{
	cr_assert_eq(mr_proc_reap(&c->proc, 20000), 0, "controller did not exit");
	mr_test_tail(c->log, tail, cap);
	mr_test_rmdir(c->dir);
	return WIFEXITED(c->proc.status) ? WEXITSTATUS(c->proc.status) : -1;
}

static void set_nofile(rlim_t soft, rlim_t hard)
{
	struct rlimit rl = {.rlim_cur = soft, .rlim_max = hard};

	cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0, "setrlimit %lu:%lu",
		     (unsigned long)soft, (unsigned long)hard);
}

static int get_status(int port, const char *path)
{
	char req[256], buf[4096];

	snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		 path);
	return mr_test_raw_request(port, req, buf, sizeof(buf));
}

/* ---- the stop line ---------------------------------------------------------- */

Test(ctl_main, stopping_logs_the_signal_that_stopped_it)
{
	static const struct {
		int sig;
		const char *line;
	} cases[] = {
		{SIGTERM, "event=stopping signal=15 name=SIGTERM"},
		{SIGINT, "event=stopping signal=2 name=SIGINT"},
	};
	char tail[8192];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct ctlp c = {0};

		start(&c, NULL);
		cr_assert_eq(mr_proc_kill(&c.proc, cases[i].sig), 0);
		cr_assert_eq(reap(&c, tail, sizeof(tail)), 0, "%s", tail);
		cr_assert(strstr(tail, cases[i].line), "no '%s' in: %s", cases[i].line, tail);
	}
}

/* ---- the connection limit and the fd limit ---------------------------------- */

/* With 256 descriptors and no --max-connections, the default becomes
 * 256 - 16 reserve - 64 own = 176, logged; and it really fits: with
 * every slot and all but one reserve slot held, a probe still answers and
 * an ordinary request gets 503, not a refused connection. */
Test(ctl_main, default_max_connections_fits_the_fd_limit)
{
	enum { HOLD = 176 + 15 };
	static int fds[HOLD];
	struct ctlp c = {0};
	char tail[8192];

	set_nofile(256, 256);
	start(&c, NULL);
	mr_test_tail(c.log, tail, sizeof(tail));
	cr_assert(strstr(tail, "event=max_connections value=176 source=fd_limit fd_limit=256"),
		  "%s", tail);
	for (int i = 0; i < HOLD; i++) {
		fds[i] = mr_test_connect(c.port);
		cr_assert(fds[i] >= 0, "connection %d refused", i);
	}
	usleep(300000); /* the controller's loop takes them all */
	cr_assert_eq(get_status(c.port, "/healthz"), 200);
	cr_assert_eq(get_status(c.port, "/v1/jobs"), 503);
	for (int i = 0; i < HOLD; i++)
		close(fds[i]);
	mr_proc_kill(&c.proc, SIGTERM);
	cr_assert_eq(reap(&c, tail, sizeof(tail)), 0, "%s", tail);
	cr_assert(!strstr(tail, "EMFILE") && !strstr(tail, "errno=24"), "%s", tail);
}

/* The soft limit is raised to the hard one before the default is fitted. */
Test(ctl_main, the_soft_fd_limit_is_raised_to_the_hard_one)
{
	struct rlimit rl;
	struct ctlp c = {0};
	char tail[8192], want[128];

	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_max < 1024)
		cr_skip_test("hard fd limit %lu is below 1024", (unsigned long)rl.rlim_max);
	set_nofile(256, 1024);
	start(&c, NULL);
	mr_test_tail(c.log, tail, sizeof(tail));
	snprintf(want, sizeof(want), "event=max_connections value=%d source=fd_limit "
		 "fd_limit=1024 fd_hard=1024", 1024 - 16 - 64);
	cr_assert(strstr(tail, want), "no '%s' in: %s", want, tail);
	mr_proc_kill(&c.proc, SIGTERM);
	cr_assert_eq(reap(&c, tail, sizeof(tail)), 0, "%s", tail);
}

/* An explicit value that cannot fit is refused at start, naming where it
 * came from, the value and the limit; one that fits is kept. */
Test(ctl_main, an_explicit_max_connections_that_cannot_fit_is_refused)
{
	const char *const flag[] = {"--max-connections", "1000", NULL};
	const char *const fits[] = {"--max-connections", "100", NULL};
	struct ctlp c = {0};
	char tail[8192];

	set_nofile(256, 256);
	spawn(&c, flag);
	cr_assert_eq(reap(&c, tail, sizeof(tail)), 2, "%s", tail);
	cr_assert(strstr(tail, "--max-connections: 1000 connections do not fit the file "
			       "descriptor limit 256"), "%s", tail);
	cr_assert(strstr(tail, "set at most 176"), "%s", tail);
	cr_assert(access(c.port_file, F_OK) != 0, "it listened before refusing");

	memset(&c, 0, sizeof(c));
	setenv("MESHRUN_MAX_CONNECTIONS", "500", 1); /* the controller inherits it */
	spawn(&c, NULL);
	unsetenv("MESHRUN_MAX_CONNECTIONS");
	cr_assert_eq(reap(&c, tail, sizeof(tail)), 2, "%s", tail);
	cr_assert(strstr(tail, "MESHRUN_MAX_CONNECTIONS: 500 connections do not fit the file "
			       "descriptor limit 256"), "%s", tail);

	memset(&c, 0, sizeof(c));
	start(&c, fits);
	mr_test_tail(c.log, tail, sizeof(tail));
	cr_assert(strstr(tail, "event=max_connections value=100 source=flag fd_limit=256"), "%s",
		  tail);
	mr_proc_kill(&c.proc, SIGTERM);
	cr_assert_eq(reap(&c, tail, sizeof(tail)), 0, "%s", tail);
}
