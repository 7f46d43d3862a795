/*
 * exec.c - exec-mode worker processes and their prefixed output; see
 * exec.h.
 *
 * Non-goals: restart policy, environment contents.
 */
#include "exec.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PREFIX_MAX 32

int mr_exec_code(int wstatus)
{
	if (WIFEXITED(wstatus))
		return WEXITSTATUS(wstatus);
	if (WIFSIGNALED(wstatus))
		return 128 + WTERMSIG(wstatus);
	return 255;
}

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void write_all(int fd, const char *p, size_t len)
{
	while (len > 0) {
		ssize_t w = write(fd, p, len);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		p += w;
		len -= (size_t)w;
	}
}

/* Writes "[rank N] " + line + "\n" in one write. */
static void emit(struct mr_exec *ex, struct mr_exec_child *c, int s, const char *line,
		 size_t len)
{
	char out[PREFIX_MAX + MR_EXEC_LINE_MAX + 2];
	int p = c->rank >= 0 ? snprintf(out, PREFIX_MAX, "[%s %d] ", ex->label, c->rank)
			     : snprintf(out, PREFIX_MAX, "[%s] ", ex->label);

	if (p < 0 || p >= PREFIX_MAX)
		p = 0;
	if (len > MR_EXEC_LINE_MAX)
		len = MR_EXEC_LINE_MAX;
	memcpy(out + p, line, len);
	out[p + len] = '\n';
	write_all(s == 0 ? ex->out_fd : ex->err_fd, out, (size_t)p + len + 1);
}

/* Consumes what is buffered for stream s: every complete line, and the
 * rest too when flush is set (EOF). */
static void take_lines(struct mr_exec *ex, struct mr_exec_child *c, int s, int flush)
{
	char *b = c->buf[s];
	size_t start = 0;

	for (size_t i = 0; i < c->len[s]; i++) {
		if (b[i] == '\n') {
			emit(ex, c, s, b + start, i - start);
			start = i + 1;
		}
	}
	if (start < c->len[s] && (flush || c->len[s] - start >= MR_EXEC_LINE_MAX)) {
		emit(ex, c, s, b + start, c->len[s] - start);
		start = c->len[s];
	}
	memmove(b, b + start, c->len[s] - start);
	c->len[s] -= start;
}

/* Reads once from stream s; returns 0 on data, 1 on EOF, -1 if nothing. */
static int pump_read(struct mr_exec *ex, struct mr_exec_child *c, int s)
{
	ssize_t r = read(c->fds[s], c->buf[s] + c->len[s], MR_EXEC_LINE_MAX - c->len[s]);

	if (r < 0 && (errno == EAGAIN || errno == EINTR))
		return -1;
	if (r <= 0) {
		take_lines(ex, c, s, 1);
		close(c->fds[s]);
		c->fds[s] = -1;
		return 1;
	}
	c->len[s] += (size_t)r;
	take_lines(ex, c, s, 0);
	return 0;
}

static void *pump_main(void *arg)
{
	struct mr_exec *ex = arg;
	struct pollfd pf[2 * MR_EXEC_MAX_LOCAL + 1];
	struct mr_exec_child *who[2 * MR_EXEC_MAX_LOCAL];
	int which[2 * MR_EXEC_MAX_LOCAL];
	int draining = 0;

	for (;;) {
		nfds_t n = 0;

		for (int i = 0; i < ex->n; i++) {
			for (int s = 0; s < 2; s++) {
				if (ex->child[i].fds[s] < 0)
					continue;
				pf[n].fd = ex->child[i].fds[s];
				pf[n].events = POLLIN;
				who[n] = &ex->child[i];
				which[n] = s;
				n++;
			}
		}
		if (n == 0)
			break;
		if (draining) {
			/* the group is stopped: take what is there, never wait
			 * for EOF (an escaped grandchild may hold a pipe) */
			int more = 0;

			for (nfds_t k = 0; k < n; k++)
				if (pump_read(ex, who[k], which[k]) == 0)
					more = 1;
			if (more)
				continue;
			for (nfds_t k = 0; k < n; k++) {
				take_lines(ex, who[k], which[k], 1);
				close(who[k]->fds[which[k]]);
				who[k]->fds[which[k]] = -1;
			}
			break;
		}
		pf[n].fd = ex->wake[0];
		pf[n].events = POLLIN;
		if (poll(pf, n + 1, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (pf[n].revents) {
			draining = 1;
			continue;
		}
		for (nfds_t k = 0; k < n; k++)
			if (pf[k].revents)
				pump_read(ex, who[k], which[k]);
	}
	return NULL;
}

/* PATH lookup done before fork (the child only calls execve). */
static void resolve(const char *name, char *out, size_t size)
{
	const char *path = getenv("PATH");

	snprintf(out, size, "%s", name);
	if (strchr(name, '/') || !path)
		return;
	while (*path) {
		const char *end = strchr(path, ':');
		size_t dl = end ? (size_t)(end - path) : strlen(path);
		char cand[PATH_MAX];
		int w = snprintf(cand, sizeof(cand), "%.*s/%s", (int)dl, dl ? path : ".", name);

		if (dl == 0)
			w = snprintf(cand, sizeof(cand), "./%s", name);
		if (w > 0 && (size_t)w < sizeof(cand) && access(cand, X_OK) == 0) {
			snprintf(out, size, "%s", cand);
			return;
		}
		if (!end)
			break;
		path = end + 1;
	}
}

static void child_fail(const char *msg, int code)
{
	write_all(2, msg, strlen(msg));
	_exit(code);
}

pid_t mr_exec_fork(void)
{
	struct sigaction dfl;
	sigset_t all, old;
	pid_t pid;
	int saved;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pid = fork();
	if (pid == 0) {
		memset(&dfl, 0, sizeof(dfl));
		dfl.sa_handler = SIG_DFL;
		for (int sig = 1; sig < NSIG; sig++)
			sigaction(sig, &dfl, NULL); /* KILL, STOP, libc's own: refused */
		sigemptyset(&all);
		sigprocmask(SIG_SETMASK, &all, NULL);
		return 0;
	}
	saved = errno;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	errno = saved;
	return pid;
}

/* Runs in the child between fork and execve: async-signal-safe calls only. */
static void child_exec(const char *path, char *const *argv, char *const *envp, int out,
		       int err, pid_t parent)
{
	setpgid(0, 0);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(128 + SIGKILL);
	if (dup2(out, 1) < 0 || dup2(err, 2) < 0)
		_exit(126);
	execve(path, argv, envp);
	if (errno == ENOENT)
		child_fail("meshrun-agent: cannot execute worker: command not found\n", 127);
	child_fail("meshrun-agent: cannot execute worker: permission denied or bad format\n", 126);
}

int mr_exec_start(struct mr_exec *ex, char *const *argv, int n, char **const *envs,
		  const int *ranks, const char *label, int out_fd, int err_fd, struct mr_errbuf *eb)
{
	char path[PATH_MAX];
	pid_t self = getpid();
	int err = 0;

	memset(ex, 0, sizeof(*ex));
	ex->wake[0] = ex->wake[1] = -1;
	snprintf(ex->label, sizeof(ex->label), "%s", label ? label : "rank");
	ex->out_fd = out_fd >= 0 ? out_fd : 1;
	ex->err_fd = err_fd >= 0 ? err_fd : 2;
	if (n < 1 || n > MR_EXEC_MAX_LOCAL || !argv || !argv[0])
		return mr_errf(eb, MR_EINVAL, "worker count %d or command is invalid", n);
	resolve(argv[0], path, sizeof(path));
	if (pipe2(ex->wake, O_CLOEXEC) < 0)
		return mr_errf(eb, MR_ESYS, "unable to create pipe: %s", strerror(errno));
	ex->started = 1;
	for (int i = 0; i < n; i++) {
		struct mr_exec_child *c = &ex->child[i];
		int po[2], pe[2];
		pid_t pid;

		c->fds[0] = c->fds[1] = -1;
		c->rank = ranks[i];
		c->buf[0] = malloc(MR_EXEC_LINE_MAX);
		c->buf[1] = malloc(MR_EXEC_LINE_MAX);
		ex->n = i + 1;
		if (!c->buf[0] || !c->buf[1]) {
			err = mr_errf(eb, MR_ENOMEM, "out of memory for worker %d", i);
			goto out;
		}
		if (pipe2(po, O_CLOEXEC) < 0) {
			err = mr_errf(eb, MR_ESYS, "unable to create pipe: %s", strerror(errno));
			goto out;
		}
		if (pipe2(pe, O_CLOEXEC) < 0) {
			close(po[0]);
			close(po[1]);
			err = mr_errf(eb, MR_ESYS, "unable to create pipe: %s", strerror(errno));
			goto out;
		}
		pid = mr_exec_fork();
		if (pid == 0)
			child_exec(path, argv, envs[i], po[1], pe[1], self);
		close(po[1]);
		close(pe[1]);
		c->fds[0] = po[0];
		c->fds[1] = pe[0];
		fcntl(po[0], F_SETFL, O_NONBLOCK);
		fcntl(pe[0], F_SETFL, O_NONBLOCK);
		if (pid < 0) {
			err = mr_errf(eb, MR_ESYS, "unable to fork worker %d: %s", i,
				      strerror(errno));
			goto out;
		}
		setpgid(pid, pid); /* both sides, so no signal races the child */
		c->pid = pid;
		c->running = 1;
	}
	if (pthread_create(&ex->pump, NULL, pump_main, ex) != 0) {
		err = mr_errf(eb, MR_ESYS, "unable to start the output thread");
		goto out;
	}
	ex->pump_on = 1;
out:
	if (err)
		mr_exec_stop(ex, 0);
	return err;
}

static void reap(struct mr_exec *ex, int block)
{
	for (int i = 0; i < ex->n; i++) {
		struct mr_exec_child *c = &ex->child[i];
		int ws;
		pid_t r;

		if (!c->running)
			continue;
		do
			r = waitpid(c->pid, &ws, block ? 0 : WNOHANG);
		while (r < 0 && errno == EINTR);
		if (r == c->pid || (r < 0 && errno == ECHILD)) {
			c->running = 0;
			c->code = r == c->pid ? mr_exec_code(ws) : 255;
			c->signal = r == c->pid && WIFSIGNALED(ws) ? WTERMSIG(ws) : 0;
		}
	}
}

void mr_exec_poll(struct mr_exec *ex, struct mr_exec_status *st)
{
	memset(st, 0, sizeof(*st));
	st->first_failed_rank = -1;
	reap(ex, 0);
	for (int i = 0; i < ex->n; i++) {
		struct mr_exec_child *c = &ex->child[i];

		if (!c->pid)
			continue;
		if (c->running) {
			st->running++;
			continue;
		}
		st->exited++;
		if (c->code != 0) {
			st->failed++;
			if (st->first_failed_rank < 0) {
				st->first_failed_rank = c->rank;
				st->first_failed_code = c->code;
			}
		}
	}
}

void mr_exec_signal(struct mr_exec *ex, int sig)
{
	ex->signalled = 1;
	for (int i = 0; i < ex->n; i++)
		if (ex->child[i].pid && ex->child[i].running)
			kill(-ex->child[i].pid, sig);
}

int mr_exec_wait(struct mr_exec *ex, int timeout_ms)
{
	long long end = now_ms() + timeout_ms;
	struct mr_exec_status st;

	for (;;) {
		mr_exec_poll(ex, &st);
		if (st.running == 0)
			return 0;
		if (timeout_ms >= 0 && now_ms() >= end)
			return MR_ETIMEDOUT;
		usleep(5000);
	}
}

void mr_exec_stop(struct mr_exec *ex, int grace_ms)
{
	struct mr_exec_status st;

	if (!ex->started)
		return;
	mr_exec_poll(ex, &st);
	if (st.running) {
		/* once: a worker whose trap is already running on the forwarded
		 * signal must not get a second one (torchrun: signal, wait, kill) */
		if (!ex->signalled)
			mr_exec_signal(ex, SIGTERM);
		if (mr_exec_wait(ex, grace_ms) != 0)
			mr_exec_signal(ex, SIGKILL);
		reap(ex, 1);
	}
	/* stragglers forked by a worker stay in its process group */
	for (int i = 0; i < ex->n; i++)
		if (ex->child[i].pid > 0)
			kill(-ex->child[i].pid, SIGKILL);
	if (ex->pump_on) {
		char b = 1;

		write_all(ex->wake[1], &b, 1);
		pthread_join(ex->pump, NULL);
		ex->pump_on = 0;
	}
	for (int i = 0; i < ex->n; i++) {
		struct mr_exec_child *c = &ex->child[i];

		for (int s = 0; s < 2; s++) {
			if (c->fds[s] >= 0)
				close(c->fds[s]);
			c->fds[s] = -1;
			free(c->buf[s]);
			c->buf[s] = NULL;
		}
	}
	for (int s = 0; s < 2; s++) {
		if (ex->wake[s] >= 0)
			close(ex->wake[s]);
		ex->wake[s] = -1;
	}
	ex->started = 0;
}
