/*
 * ckjob.c - small `meshrun local` jobs for the checkpoint tests (see
 * ckjob.h).
 */
#include "ckjob.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc.h"

const char *mr_ckjob_dir(void)
{
	static char dir[256];

	if (!dir[0]) {
		const char *d = mr_test_scratch("mr-ckpt");
		cr_assert_not_null(d, "no scratch directory");
		snprintf(dir, sizeof(dir), "%s", d);
	}
	return dir;
}

pid_t mr_ckjob_start(const struct mr_ckjob *j, const char *tag, int steps, const char *extra)
{
	char cmd[6000], *bin = realpath(mr_proc_build_dir(), NULL);
	pid_t pid;

	snprintf(cmd, sizeof(cmd),
		 "cd '%s' && exec '%s/meshrun' local --nodes %d --nproc-per-node %d %s "
		 "--workload-config '{\"n_layer\": 4, \"d_model\": 32, \"n_head\": 4, "
		 "\"vocab_size\": 64, \"seq_len\": 16, \"batch_size\": 2, \"steps\": %d, "
		 "\"lr\": 0.003, \"warmup_steps\": 2, \"threads\": 1, \"seed\": 7, "
		 "\"loss_log\": \"%s.loss\", \"save_weights\": "
		 "\"%s.bin\"%s%s%s%s}' >'%s.out' 2>&1",
		 mr_ckjob_dir(), bin ? bin : "build", j->nodes, j->nproc, j->flags ? j->flags : "",
		 steps, tag, tag, j->keys ? ", " : "", j->keys ? j->keys : "", extra ? ", " : "",
		 extra ? extra : "", tag);
	free(bin);
	pid = fork();
	cr_assert_geq(pid, 0, "fork");
	if (pid == 0) {
		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* gone with a test that dies */
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	setpgid(pid, pid);
	return pid;
}

int mr_ckjob_wait(pid_t pid, int timeout_ms)
{
	long long end = mr_test_now_ms() + timeout_ms;
	int st;

	while (waitpid(pid, &st, WNOHANG) == 0) {
		if (mr_test_now_ms() > end) {
			kill(-pid, SIGKILL);
			waitpid(pid, &st, 0);
			return -1;
		}
		usleep(20 * 1000);
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int mr_ckjob_run(const struct mr_ckjob *j, const char *tag, int steps, const char *extra)
{
	return mr_ckjob_wait(mr_ckjob_start(j, tag, steps, extra), 300 * 1000);
}

const char *mr_ckjob_tail(const char *tag)
{
	static char buf[3000];
	char path[512];

	snprintf(path, sizeof(path), "%s/%s.out", mr_ckjob_dir(), tag);
	mr_test_tail(path, buf, sizeof(buf));
	return buf;
}

int mr_ckjob_count(const char *tag, const char *a, const char *b)
{
	char path[512], *line = NULL;
	size_t cap = 0;
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "%s/%s.out", mr_ckjob_dir(), tag);
	if (!(f = fopen(path, "r")))
		return 0;
	while (getline(&line, &cap, f) > 0)
		n += strstr(line, a) && (!b || strstr(line, b));
	free(line);
	fclose(f);
	return n;
}

int mr_ckjob_exists(const char *name)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", mr_ckjob_dir(), name);
	return access(path, F_OK) == 0;
}

int mr_ckjob_same(const char *a, const char *b)
{
	char cmd[1200];

	snprintf(cmd, sizeof(cmd), "cmp -s '%s/%s' '%s/%s'", mr_ckjob_dir(), a, mr_ckjob_dir(), b);
	return system(cmd) == 0;
}

void mr_ckjob_sh(const char *fmt, const char *arg)
{
	char cmd[4096], c2[4600];

	snprintf(cmd, sizeof(cmd), fmt, arg);
	snprintf(c2, sizeof(c2), "cd '%s' && %s", mr_ckjob_dir(), cmd);
	cr_assert_eq(system(c2), 0, "%s", c2);
}
