/*
 * harness.h - helpers for the agent's integration tests: start the real
 * meshrun-controller / meshrun-agent / meshrun from $MESHRUN_BUILD on
 * loopback, with output captured to files, wait for log lines and exits.
 *
 * Header-only (static functions) so each test binary stays one file;
 * tests/support/ belongs to the controller's tests.
 * Non-goals: generic process management (agent/exec.c does that).
 */
#ifndef MR_TEST_AGENT_HARNESS_H
#define MR_TEST_AGENT_HARNESS_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mr_port.h"

#define H_MAX_ARGS 64

static inline long long h_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline const char *h_build(void)
{
	const char *b = getenv("MESHRUN_BUILD");

	return b && b[0] ? b : "build";
}

static char h__dir[64];

static inline int h__rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

static inline void h__cleanup(void)
{
	if (h__dir[0] && !getenv("MESHRUN_TEST_KEEP"))
		nftw(h__dir, h__rm, 16, FTW_DEPTH | FTW_PHYS);
}

/* A scratch directory for this test process, removed at exit unless
 * MESHRUN_TEST_KEEP is set. */
static inline const char *h_tmpdir(void)
{
	if (!h__dir[0]) {
		snprintf(h__dir, sizeof(h__dir), "/tmp/mr-agent-test-XXXXXX");
		cr_assert_not_null(mkdtemp(h__dir));
		atexit(h__cleanup);
	}
	return h__dir;
}

/*
 * Starts argv (NULL-terminated; argv[0] relative to the build dir when it
 * has no '/') in its own process group with stdout+stderr appended to log.
 * env: extra "K=V" entries (NULL-terminated, may be NULL).
 */
static inline pid_t h_spawn(char *const *argv, char *const *env, const char *log)
{
	char bin[1024];
	pid_t parent = getpid();
	pid_t pid;

	if (strchr(argv[0], '/'))
		snprintf(bin, sizeof(bin), "%s", argv[0]);
	else
		snprintf(bin, sizeof(bin), "%s/%s", h_build(), argv[0]);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(99);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		for (int i = 0; env && env[i]; i++)
			putenv(env[i]);
		execv(bin, argv);
		_exit(127);
	}
	setpgid(pid, pid);
	return pid;
}

/* Waits for pid; returns its exit code (128+sig), or -1 on timeout. */
static inline int h_wait(pid_t pid, int timeout_ms)
{
	long long end = h_now_ms() + timeout_ms;
	int ws;

	for (;;) {
		pid_t r = waitpid(pid, &ws, WNOHANG);

		if (r == pid)
			return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
		if (r < 0)
			return -2;
		if (h_now_ms() >= end)
			return -1;
		usleep(10 * 1000);
	}
}

/* Kills the process group of pid and reaps pid. */
static inline void h_kill(pid_t pid)
{
	if (pid <= 0)
		return;
	kill(-pid, SIGKILL);
	h_wait(pid, 5000);
}

/* Whole file as a malloc'd string ("" if absent). */
static inline char *h_read(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf;
	long n;

	if (!f)
		return strdup("");
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = calloc(1, (size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n)
		buf[0] = '\0';
	fclose(f);
	return buf;
}

/* Number of occurrences of needle in file. */
static inline int h_count(const char *path, const char *needle)
{
	char *s = h_read(path), *p = s;
	int n = 0;

	while ((p = strstr(p, needle))) {
		n++;
		p += strlen(needle);
	}
	free(s);
	return n;
}

/* Waits until file holds needle at least times times; 0 or -1. */
static inline int h_wait_log(const char *path, const char *needle, int times, int timeout_ms)
{
	long long end = h_now_ms() + timeout_ms;

	while (h_count(path, needle) < times) {
		if (h_now_ms() >= end)
			return -1;
		usleep(20 * 1000);
	}
	return 0;
}

static inline void h_path(char *buf, size_t size, const char *name)
{
	snprintf(buf, size, "%s/%s", h_tmpdir(), name);
}

struct h_ctl {
	pid_t pid;
	int port;
	char url[64];
	char log[256];
	char data[256];
	char *const *env; /* extra "K=V" for the controller (e.g. MESHRUN_TOKEN), may be NULL */
};

/* Starts a controller (data dir kept across restarts of the same h_ctl;
 * port 0 = ephemeral). hb_timeout: its default heartbeat timeout. */
static inline void h_ctl_start(struct h_ctl *c, int port)
{
	char portfile[300], ports[16];
	FILE *f;

	if (!c->log[0]) {
		h_path(c->log, sizeof(c->log), "controller.log");
		h_path(c->data, sizeof(c->data), "ctl-data");
	}
	snprintf(portfile, sizeof(portfile), "%s.port", c->data);
	unlink(portfile);
	snprintf(ports, sizeof(ports), "%d", port);
	{
		char *argv[] = {"meshrun-controller", "--listen", "127.0.0.1", "--port", ports,
				"--port-file", portfile, "--data-dir", c->data, "--no-fsync",
				NULL};

		c->pid = h_spawn(argv, c->env, c->log);
	}
	c->port = 0;
	for (int i = 0; i < 500 && c->port <= 0; i++) {
		f = fopen(portfile, "r");
		if (f) {
			if (fscanf(f, "%d", &c->port) != 1)
				c->port = 0;
			fclose(f);
		}
		if (c->port <= 0)
			usleep(10 * 1000);
	}
	cr_assert_gt(c->port, 0, "controller did not write its port");
	snprintf(c->url, sizeof(c->url), "http://127.0.0.1:%d", c->port);
}

/* A TCP port for a server started later (mr_port.h: outside the
 * ephemeral range other sockets take theirs from). */
static inline int h_free_port(void)
{
	int port = mr_port_free();

	cr_assert_gt(port, 0, "no free port");
	return port;
}

/*
 * Starts an agent: fixed flags (controller, job, node id, pod index,
 * loopback host, --health-port -1 unless extra has one) + extra
 * (NULL-terminated) + "--" + cmd (NULL-terminated).
 */
/* The agent binary h_agent starts: a name in the build directory or a
 * path (the emulated device's build/emul/meshrun-agent). */
static const char *h_agent_bin = "meshrun-agent";

static inline pid_t h_agent(const struct h_ctl *c, const char *job, int idx, char *const *extra,
			    char *const *cmd, char *const *env, const char *log)
{
	char *argv[H_MAX_ARGS];
	char node[32], pidx[16];
	int n = 0;

	snprintf(node, sizeof(node), "node-%d", idx);
	snprintf(pidx, sizeof(pidx), "%d", idx);
	argv[n++] = (char *)h_agent_bin;
	argv[n++] = "--controller";
	argv[n++] = (char *)c->url;
	argv[n++] = "--job";
	argv[n++] = (char *)job;
	argv[n++] = "--node-id";
	argv[n++] = node;
	argv[n++] = "--pod-index";
	argv[n++] = pidx;
	argv[n++] = "--host";
	argv[n++] = "127.0.0.1";
	{
		int has_health = 0;

		for (int i = 0; extra && extra[i]; i++)
			has_health |= !strncmp(extra[i], "--health-port", 13);
		if (!has_health) {
			argv[n++] = "--health-port";
			argv[n++] = "-1";
		}
	}
	for (int i = 0; extra && extra[i] && n < H_MAX_ARGS - 20; i++)
		argv[n++] = extra[i];
	argv[n++] = "--";
	for (int i = 0; cmd && cmd[i] && n < H_MAX_ARGS - 1; i++)
		argv[n++] = cmd[i];
	argv[n] = NULL;
	return h_spawn(argv, env, log);
}

/* Starts `meshrun local args` in the background (env may be NULL); its
 * output goes to the log file `name`, whose path is written to log. */
static inline pid_t h_local(char *const *args, char *const *env, char *log, size_t cap,
			    const char *name)
{
	char *argv[H_MAX_ARGS];
	int n = 0;

	h_path(log, cap, name);
	argv[n++] = "meshrun";
	argv[n++] = "local";
	for (int i = 0; args[i] && n < H_MAX_ARGS - 1; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	return h_spawn(argv, env, log);
}

/* Dumps a log to stderr (for failing tests). */
static inline void h_dump(const char *path)
{
	char *s = h_read(path);

	fprintf(stderr, "---- %s ----\n%s\n", path, s);
	free(s);
}

/* The logs <dir>/<name>-a.log and -b.log, for two agents. */
static inline void h_logs(char *a, char *b, size_t size, const char *name)
{
	char n[64];

	snprintf(n, sizeof(n), "%s-a.log", name);
	h_path(a, size, n);
	snprintf(n, sizeof(n), "%s-b.log", name);
	h_path(b, size, n);
}

/* Waits up to ms for pid to exit with want; otherwise dumps log (and the
 * controller's, when c is given), kills it and fails the test. Returns
 * the milliseconds it took. */
static inline long long h_expect_exit(pid_t pid, int want, int ms, const char *log,
				      const struct h_ctl *c)
{
	long long t0 = h_now_ms();
	int code = h_wait(pid, ms);

	if (code != want) {
		h_dump(log);
		if (c)
			h_dump(c->log);
		h_kill(pid);
	}
	cr_assert_eq(code, want, "exit %d, want %d (within %d ms)", code, want, ms);
	return h_now_ms() - t0;
}


/* `meshrun status JOB` against c into a malloc'd string. */
static inline char *h_status(const struct h_ctl *c, const char *job, const char *logname)
{
	char log[300];
	char *argv[] = {"meshrun", "status", "--controller", (char *)c->url, (char *)job, NULL};
	pid_t p;

	h_path(log, sizeof(log), logname);
	unlink(log);
	p = h_spawn(argv, NULL, log);
	cr_assert_eq(h_wait(p, 10000), 0, "meshrun status failed");
	return h_read(log);
}

/* The pids of parent's children whose command line contains name (up to
 * max, in /proc order); returns how many. */
static inline int h_children(pid_t parent, const char *name, pid_t *out, int max)
{
	char path[64], buf[4096];
	DIR *d = opendir("/proc");
	struct dirent *e;
	int n = 0;

	cr_assert_not_null(d);
	while (n < max && (e = readdir(d))) {
		long pid = strtol(e->d_name, NULL, 10), ppid = 0;
		FILE *f;
		size_t len;

		if (pid <= 0)
			continue;
		snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
		if (!(f = fopen(path, "r")))
			continue;
		/* pid (comm) state ppid: comm may hold spaces, so from the last ')' */
		len = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[len] = '\0';
		if (!strrchr(buf, ')') || sscanf(strrchr(buf, ')') + 2, "%*c %ld", &ppid) != 1 ||
		    ppid != parent)
			continue;
		snprintf(path, sizeof(path), "/proc/%ld/cmdline", pid);
		if (!(f = fopen(path, "r")))
			continue;
		len = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[len] = '\0'; /* argv[0] is enough */
		if (strstr(buf, name))
			out[n++] = (pid_t)pid;
	}
	closedir(d);
	return n;
}


/* The pid of parent's child (the which-th, in /proc order) whose command
 * line contains name, waiting up to 10 s for it to appear. */
static inline pid_t h_child(pid_t parent, const char *name, int which)
{
	pid_t kids[16] = {0};
	int n = 0;

	for (int tries = 0; tries < 500 && n <= which; tries++) {
		n = h_children(parent, name, kids, 16);
		if (n <= which)
			usleep(20 * 1000);
	}
	cr_assert_gt(n, which, "no child '%s' of %d", name, (int)parent);
	return kids[which];
}

#endif
