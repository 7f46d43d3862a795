/*
 * test_rank_process.c - GPU ranks in worker processes of their own
 * (agent/rankproc.h), on the emulated device (build/emul/meshrun-agent,
 * tests/gpu/cuda_emul.c): two ranks on two emulated GPUs, dp 2.
 *
 * A sticky CUDA error (an illegal address) poisons the context for the
 * life of its process; the emulation reproduces it (MR_CUDA_EMUL_STICKY).
 * In a worker process the agent's restart gets a fresh context and the job
 * resumes from its checkpoint with the uninterrupted run's losses; in a
 * rank thread of the agent every restart fails the same way. A worker
 * process that is killed is restarted like a failed rank; one that does
 * not end after its abort (stopped here with SIGSTOP) is killed.
 */
#include "harness.h"

#include "proc.h"

/* Sync count of GPU 1 at which the sticky error strikes: about step 10 of
 * 20 (one sync per step), after the checkpoint of step 8. */
#define STICKY_SYNC 10

/* The job's workload config: loss log and checkpoints named by tag. */
static void config(char *buf, size_t cap, const char *tag, const char *extra)
{
	char loss[300], ck[300], name[64];

	snprintf(name, sizeof(name), "%s.loss", tag);
	h_path(loss, sizeof(loss), name);
	snprintf(name, sizeof(name), "%s-ckpt", tag);
	h_path(ck, sizeof(ck), name);
	snprintf(buf, cap,
		 "{\"steps\": 20, \"d_model\": 64, \"n_layer\": 2, \"n_head\": 2, \"seq_len\": 32, "
		 "\"batch_size\": 4, \"threads\": 1, \"seed\": 5, \"device\": \"cuda\", "
		 "\"precision\": \"fp32\", \"ckpt_every\": 4, \"comm_timeout_ms\": 60000, "
		 "\"loss_log\": \"%s\", \"ckpt_dir\": \"%s\"%s%s}",
		 loss, ck, extra ? ", " : "", extra ? extra : "");
}

/* Runs the job on one emulated agent (two GPUs) to its exit; returns the
 * agent's pid for h_expect_exit. env: extra variables, NULL-terminated. */
static pid_t run(struct h_ctl *c, const char *tag, const char *cfg, char *const *flags,
		 char **env, char *log, size_t cap)
{
	static char bin[1024];
	char job[64], name[64];
	char *extra[16] = { "--nproc-per-node", "2", "--max-restarts", "2",
			    "--workload-config", (char *)cfg };
	int n = 6;

	for (int i = 0; flags && flags[i] && n < 15; i++)
		extra[n++] = flags[i];
	extra[n] = NULL;
	snprintf(bin, sizeof(bin), "%s/emul/meshrun-agent", h_build());
	h_agent_bin = bin;
	snprintf(job, sizeof(job), "t/%s", tag);
	snprintf(name, sizeof(name), "%s.log", tag);
	h_path(log, cap, name);
	return h_agent(c, job, 0, extra, NULL, env, log);
}

static int same_files(const char *a, const char *b)
{
	char pa[300], pb[300], *x, *y;
	int same;

	h_path(pa, sizeof(pa), a);
	h_path(pb, sizeof(pb), b);
	x = h_read(pa);
	y = h_read(pb);
	same = x[0] && !strcmp(x, y);
	free(x);
	free(y);
	return same;
}

/* The reference: the same job in rank threads, uninterrupted. */
static void reference(struct h_ctl *c, const char *tag)
{
	char cfg[1024], log[300];
	char *threads[] = { "--rank-process", "thread", NULL };
	char *env[] = { "MR_CUDA_EMUL_DEVICES=2", NULL };

	config(cfg, sizeof(cfg), tag, NULL);
	h_expect_exit(run(c, tag, cfg, threads, env, log, sizeof(log)), 0, 120000, log, c);
}

Test(rank_process, sticky_cuda_error_is_survived_by_a_fresh_worker_process, .timeout = 300)
{
	struct h_ctl c = { 0 };
	char cfg[1024], log[300], mark[300], sticky[400];
	char *env[] = { "MR_CUDA_EMUL_DEVICES=2", sticky, NULL };

	h_ctl_start(&c, 0);
	reference(&c, "ref");
	h_path(mark, sizeof(mark), "sticky.fired");
	snprintf(sticky, sizeof(sticky), "MR_CUDA_EMUL_STICKY=1:%d:%s", STICKY_SYNC, mark);
	config(cfg, sizeof(cfg), "proc", NULL);
	/* device cuda: worker processes by default */
	h_expect_exit(run(&c, "proc", cfg, NULL, env, log, sizeof(log)), 0, 120000, log, &c);
	cr_expect_eq(access(mark, F_OK), 0, "the sticky error never struck");
	cr_expect_geq(h_count(log, "illegal memory access"), 1);
	cr_expect_eq(h_count(log, "event=restarting"), 1, "one restart, not more");
	cr_expect_eq(h_count(log, "event=worker_process_started"), 4, "2 ranks, twice");
	cr_expect_geq(h_count(log, "event=checkpoint_resumed"), 1, "no resume");
	cr_expect(same_files("proc.loss", "ref.loss"),
		  "the losses differ from the uninterrupted run's (in rank threads)");
	h_kill(c.pid);
}

Test(rank_process, sticky_cuda_error_in_a_rank_thread_spends_every_restart, .timeout = 300)
{
	struct h_ctl c = { 0 };
	char cfg[1024], log[300], mark[300], sticky[400];
	char *env[] = { "MR_CUDA_EMUL_DEVICES=2", sticky, NULL };
	char *threads[] = { "--rank-process", "thread", NULL };

	h_ctl_start(&c, 0);
	h_path(mark, sizeof(mark), "sticky-thread.fired");
	snprintf(sticky, sizeof(sticky), "MR_CUDA_EMUL_STICKY=1:%d:%s", STICKY_SYNC, mark);
	config(cfg, sizeof(cfg), "thread", NULL);
	h_expect_exit(run(&c, "thread", cfg, threads, env, log, sizeof(log)), 1, 120000, log,
		      &c);
	cr_expect_eq(access(mark, F_OK), 0, "the sticky error never struck");
	cr_expect_geq(h_count(log, "event=restarting"), 2, "max_restarts 2, all spent");
	cr_expect_geq(h_count(log, "restarts exhausted"), 1);
	cr_expect_geq(h_count(log, "illegal memory access"), 3, "each restart poisoned");
	cr_expect_eq(h_count(log, "event=worker_process_started"), 0);
	h_kill(c.pid);
}

Test(rank_process, killed_worker_process_is_restarted_and_the_job_resumes, .timeout = 300)
{
	struct h_ctl c = { 0 };
	char cfg[1024], log[300];
	char *env[] = { "MR_CUDA_EMUL_DEVICES=2", NULL };
	pid_t agent;

	h_ctl_start(&c, 0);
	reference(&c, "kref");
	/* paced, so the kill lands mid-training */
	config(cfg, sizeof(cfg), "kill", "\"debug_slow_rank\": 0, \"debug_slow_ms\": 100");
	agent = run(&c, "kill", cfg, NULL, env, log, sizeof(log));
	cr_assert_eq(h_wait_log(log, "event=checkpoint_saved", 2, 60000), 0);
	kill(h_child(agent, "meshrun-agent", 1), SIGKILL);
	h_expect_exit(agent, 0, 120000, log, &c);
	cr_expect_eq(h_count(log, "event=worker_process_died"), 1);
	cr_expect_geq(h_count(log, "killed by signal 9"), 1, "the death is named");
	cr_expect_eq(h_count(log, "event=restarting"), 1);
	cr_expect(same_files("kill.loss", "kref.loss"),
		  "the losses differ from the uninterrupted run's");
	h_kill(c.pid);
}

Test(rank_process, worker_process_that_ignores_its_abort_is_killed, .timeout = 300)
{
	struct h_ctl c = { 0 };
	char cfg[1024], log[300];
	char *env[] = { "MR_CUDA_EMUL_DEVICES=2", NULL };
	char *grace[] = { "--grace-period", "1s", NULL };
	pid_t agent, worker;

	h_ctl_start(&c, 0);
	config(cfg, sizeof(cfg), "stop", "\"debug_slow_rank\": 0, \"debug_slow_ms\": 100");
	agent = run(&c, "stop", cfg, grace, env, log, sizeof(log));
	cr_assert_eq(h_wait_log(log, "event=gpt_worker_ready", 2, 60000), 0);
	worker = h_child(agent, "meshrun-agent", 1);
	kill(worker, SIGSTOP); /* reads no abort, never exits by itself */
	kill(agent, SIGTERM);
	h_expect_exit(agent, 128 + SIGTERM, 60000, log, &c);
	cr_expect_eq(h_count(log, "event=worker_process_killed"), 1);
	cr_expect_neq(kill(worker, 0), 0, "the stopped worker outlived the agent");
	h_kill(c.pid);
}
