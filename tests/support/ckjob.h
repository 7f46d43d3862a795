/*
 * ckjob.h - small `meshrun local` training jobs in a test's scratch
 * directory, for the checkpoint tests (tests/parity/test_ckpt.c,
 * tests/ckpt/test_ckpt_dir.c).
 *
 * Every job trains the same tiny GPT (4 layers, d_model 32, 4 heads,
 * vocab 64, seq_len 16, batch 2, lr 0.003, seed 7, one thread per rank,
 * the default comm_timeout_ms)
 * with its loss log in <tag>.loss, its final weights in <tag>.bin and
 * its output in <tag>.out, all in the scratch directory, which is also
 * the job's working directory (so "ckpt_dir": "ck" is <scratch>/ck).
 *
 * Non-goals: other models (write the command yourself), jobs on more
 * than one machine.
 */
#ifndef MR_TEST_CKJOB_H
#define MR_TEST_CKJOB_H

#include <sys/types.h>

struct mr_ckjob {
	int nodes, nproc;
	const char *flags; /* mesh flags, e.g. "--tp 2 --pp 2" */
	const char *keys;  /* more workload keys, e.g. "\"zero\": 1"; NULL: none */
};

/* The test's scratch directory (made on first use, removed at exit). */
const char *mr_ckjob_dir(void);
/* Starts job j for `steps` steps in the background, with extra keys
 * (e.g. the checkpoint's: "\"ckpt_dir\": \"ck\", \"ckpt_every\": 1");
 * `meshrun local` itself is the returned process (signals reach it). */
pid_t mr_ckjob_start(const struct mr_ckjob *j, const char *tag, int steps, const char *extra);
/* Its exit code when it ends within timeout_ms; otherwise -1 (then it is
 * killed, with its process group). */
int mr_ckjob_wait(pid_t pid, int timeout_ms);
/* Start and wait (300 s). */
int mr_ckjob_run(const struct mr_ckjob *j, const char *tag, int steps, const char *extra);
/* The end of <tag>.out (for failure messages; a static buffer). */
const char *mr_ckjob_tail(const char *tag);
/* Lines of <tag>.out holding both a and b (b may be NULL). */
int mr_ckjob_count(const char *tag, const char *a, const char *b);
/* Whether <name> exists in the scratch directory. */
int mr_ckjob_exists(const char *name);
/* Whether files a and b of the scratch directory are equal. */
int mr_ckjob_same(const char *a, const char *b);
/* Runs the shell command fmt (with arg for its %s) in the scratch
 * directory; the test fails when it does. */
void mr_ckjob_sh(const char *fmt, const char *arg);

#endif
