/*
 * test_exec.c - exec-mode worker processes (agent/exec.c) and their
 * environment (agent/workenv.c): real children, real signals, real pipes.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exec.h"
#include "workenv.h"

extern char **environ;

/* Reads everything from fd (non-blocking after the writers are gone). */
static void slurp(int fd, char *buf, size_t cap)
{
	size_t len = 0;
	ssize_t r;

	while (len + 1 < cap && (r = read(fd, buf + len, cap - 1 - len)) > 0)
		len += (size_t)r;
	buf[len] = '\0';
}

/* Processes of group pgid that are not zombies (pid 1 here may reap late). */
static int live_in_group(pid_t pgid)
{
	int live = 0;
	DIR *d = opendir("/proc");
	struct dirent *de;

	cr_assert_not_null(d);
	while ((de = readdir(d))) {
		int pid = atoi(de->d_name);
		char path[300], buf[512], *rp;
		int fd, pg;
		char state;
		ssize_t r;

		snprintf(path, sizeof(path), "/proc/%d/stat", pid);
		fd = open(path, O_RDONLY);
		if (pid <= 1 || fd < 0) {
			if (fd >= 0)
				close(fd);
			continue;
		}
		r = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (r <= 0)
			continue;
		buf[r] = '\0';
		rp = strrchr(buf, ')');
		if (rp && sscanf(rp + 2, "%c %*d %d", &state, &pg) == 2 && pg == pgid &&
		    state != 'Z')
			live++;
	}
	closedir(d);
	return live;
}

static void start_sh(struct mr_exec *ex, const char *script, int n, int out, int err)
{
	char *argv[] = {"sh", "-c", (char *)script, NULL};
	struct mr_workenv envs[4];
	char **ev[4];
	int ranks[4];
	struct mr_errbuf eb = {0};

	for (int i = 0; i < n; i++) {
		cr_assert_eq(mr_workenv_init(&envs[i], environ), 0);
		cr_assert_eq(mr_workenv_set(&envs[i], "RANK", "%d", 10 + i), 0);
		ev[i] = envs[i].v;
		ranks[i] = 10 + i;
	}
	cr_assert_eq(mr_exec_start(ex, argv, n, ev, ranks, NULL, out, err, &eb), 0, "%s", eb.msg);
	for (int i = 0; i < n; i++)
		mr_workenv_release(&envs[i]);
}

Test(exec, prefixes_lines_and_collects_codes)
{
	struct mr_exec ex;
	struct mr_exec_status st;
	int po[2], pe[2];
	char out[4096], err[4096];

	cr_assert_eq(pipe(po), 0);
	cr_assert_eq(pipe(pe), 0);
	start_sh(&ex, "echo hello $RANK; printf 'partial'; echo oops >&2; exit $((RANK - 10))",
		 2, po[1], pe[1]);
	cr_assert_eq(mr_exec_wait(&ex, 5000), 0);
	mr_exec_poll(&ex, &st);
	cr_assert_eq(st.running, 0);
	cr_assert_eq(st.exited, 2);
	cr_assert_eq(st.failed, 1);
	cr_assert_eq(st.first_failed_rank, 11);
	cr_assert_eq(st.first_failed_code, 1);
	mr_exec_stop(&ex, 100);
	close(po[1]);
	close(pe[1]);
	slurp(po[0], out, sizeof(out));
	slurp(pe[0], err, sizeof(err));
	cr_assert(strstr(out, "[rank 10] hello 10\n"), "out: %s", out);
	cr_assert(strstr(out, "[rank 11] hello 11\n"), "out: %s", out);
	cr_assert(strstr(out, "[rank 10] partial\n"), "out: %s", out);
	cr_assert(strstr(err, "[rank 11] oops\n"), "err: %s", err);
	cr_assert_null(strstr(err, "hello"));
	close(po[0]);
	close(pe[0]);
}

Test(exec, stop_escalates_to_sigkill_after_grace)
{
	struct mr_exec ex;
	struct mr_exec_status st;
	int devnull = open("/dev/null", O_WRONLY);

	/* ignores SIGTERM; so does its background grandchild */
	start_sh(&ex, "trap '' TERM; sleep 30 & sleep 30", 2, devnull, devnull);
	usleep(100 * 1000);
	mr_exec_poll(&ex, &st);
	cr_assert_eq(st.running, 2);
	mr_exec_stop(&ex, 200);
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(ex.child[i].running, 0);
		cr_assert_eq(ex.child[i].code, 128 + SIGKILL);
		/* the whole process group is gone (the kernel delivers SIGKILL
		 * to the grandchild asynchronously: allow it a moment) */
		int live = live_in_group(ex.child[i].pid);
		for (int t = 0; t < 100 && live; t++) {
			usleep(10 * 1000);
			live = live_in_group(ex.child[i].pid);
		}
		cr_assert_eq(live, 0);
	}
	close(devnull);
}

Test(exec, sigterm_ends_cooperative_workers_with_143)
{
	struct mr_exec ex;
	int devnull = open("/dev/null", O_WRONLY);

	start_sh(&ex, "exec sleep 30", 1, devnull, devnull);
	usleep(50 * 1000);
	mr_exec_stop(&ex, 5000);
	cr_assert_eq(ex.child[0].code, 128 + SIGTERM);
	close(devnull);
}

Test(exec, missing_command_is_127)
{
	struct mr_exec ex;
	struct mr_exec_status st;
	char *argv[] = {"meshrun-no-such-command", NULL};
	char *env[] = {NULL};
	char **ev[] = {env};
	int rank = 0;
	int devnull = open("/dev/null", O_WRONLY);
	struct mr_errbuf eb = {0};

	cr_assert_eq(mr_exec_start(&ex, argv, 1, ev, &rank, "node", devnull, devnull, &eb), 0);
	cr_assert_eq(mr_exec_wait(&ex, 5000), 0);
	mr_exec_poll(&ex, &st);
	cr_assert_eq(st.first_failed_code, 127);
	mr_exec_stop(&ex, 0);
	close(devnull);
}

Test(workenv, torchrun_contract)
{
	struct mr_workenv e;
	char *base[] = {"PATH=/bin", "RANK=99", "OMP_NUM_THREADS=4", NULL};
	struct mr_worker_env w = {.job = "ns/a", .run_id = "ns/a", .generation = 3,
				  .restart_count = 2, .rank = 5, .world_size = 8,
				  .local_rank = 1, .local_world_size = 2, .node_rank = 2,
				  .num_nodes = 4, .tp = 2, .pp = 1, .cp = 1, .ep = 1, .dp = 4};
	struct mr_workenv_extra x = {.role = "trainer", .max_restarts = 3,
				     .master_addr = "127.0.0.1", .master_port = 29500};

	cr_assert_eq(mr_workenv_init(&e, base), 0);
	cr_assert_eq(mr_workenv_torchrun(&e, &w, &x), 0);
	cr_assert_str_eq(mr_workenv_get(&e, "PATH"), "/bin");
	cr_assert_str_eq(mr_workenv_get(&e, "RANK"), "5");
	cr_assert_str_eq(mr_workenv_get(&e, "LOCAL_RANK"), "1");
	cr_assert_str_eq(mr_workenv_get(&e, "WORLD_SIZE"), "8");
	cr_assert_str_eq(mr_workenv_get(&e, "LOCAL_WORLD_SIZE"), "2");
	cr_assert_str_eq(mr_workenv_get(&e, "GROUP_RANK"), "2");
	cr_assert_str_eq(mr_workenv_get(&e, "GROUP_WORLD_SIZE"), "4");
	cr_assert_str_eq(mr_workenv_get(&e, "ROLE_NAME"), "trainer");
	cr_assert_str_eq(mr_workenv_get(&e, "MASTER_PORT"), "29500");
	cr_assert_str_eq(mr_workenv_get(&e, "TORCHELASTIC_RESTART_COUNT"), "2");
	cr_assert_str_eq(mr_workenv_get(&e, "TORCHELASTIC_MAX_RESTARTS"), "3");
	cr_assert_str_eq(mr_workenv_get(&e, "TORCHELASTIC_RUN_ID"), "ns/a");
	/* a user's own OMP_NUM_THREADS wins, as with torchrun */
	cr_assert_str_eq(mr_workenv_get(&e, "OMP_NUM_THREADS"), "4");
	cr_assert_str_eq(mr_workenv_get(&e, "MESHRUN_DP"), "4");
	/* rank 5 = tp 1 + 2 * dp 2 */
	cr_assert_str_eq(mr_workenv_get(&e, "MESHRUN_TP_RANK"), "1");
	cr_assert_str_eq(mr_workenv_get(&e, "MESHRUN_DP_RANK"), "2");
	cr_assert_str_eq(mr_workenv_get(&e, "MESHRUN_PP_RANK"), "0");
	mr_workenv_unset(&e, "OMP_NUM_THREADS");
	cr_assert_null(mr_workenv_get(&e, "OMP_NUM_THREADS"));
	cr_assert_eq(mr_workenv_torchrun(&e, &w, &x), 0);
	cr_assert_str_eq(mr_workenv_get(&e, "OMP_NUM_THREADS"), "1");
	cr_assert_null(e.v[e.n]);
	mr_workenv_release(&e);
}

static int fork_test_pipe[2] = {-1, -1};

static void fork_test_handler(int sig)
{
	unsigned char b = (unsigned char)sig;

	if (write(fork_test_pipe[1], &b, 1) < 0) {
		/* the test reads the pipe: nothing else to do */
	}
}

/* The agent's SIGTERM handler writes to a pipe its signal thread reads. A
 * stop signal that reached a new worker before the worker reset its
 * handlers ran that handler in the worker: the agent read the byte as its
 * own SIGTERM and the worker lived on (the rare lifecycle failure in CI,
 * 2026-11-28). A signal sent the moment fork returns must kill the child
 * and write nothing, whether it lands before or after the reset. */
Test(exec, signal_right_after_fork_kills_the_child_not_the_agent)
{
	struct sigaction sa, old;
	unsigned char b;

	cr_assert_eq(pipe2(fork_test_pipe, O_NONBLOCK | O_CLOEXEC), 0);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = fork_test_handler;
	cr_assert_eq(sigaction(SIGTERM, &sa, &old), 0);
	for (int i = 0; i < 200; i++) {
		pid_t pid = mr_exec_fork();
		int ws = 0;

		cr_assert_geq(pid, 0);
		if (pid == 0) {
			usleep(20 * 1000);
			_exit(0);
		}
		kill(pid, SIGTERM);
		cr_assert_eq(waitpid(pid, &ws, 0), pid);
		cr_assert(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGTERM,
			  "iteration %d: the child survived SIGTERM (status 0x%x)", i, ws);
	}
	cr_expect_lt(read(fork_test_pipe[0], &b, 1), 0, "a child ran the parent's handler");
	sigaction(SIGTERM, &old, NULL);
	close(fork_test_pipe[0]);
	close(fork_test_pipe[1]);
}
