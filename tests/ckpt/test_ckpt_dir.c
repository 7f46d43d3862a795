/*
 * test_ckpt_dir.c - a checkpoint directory under faults and hostile
 * contents, in real `meshrun local` jobs (tests/support/ckjob.h): a
 * rank's failed write, a second job on the same directory, junk named
 * like a step, a FIFO where a shard should be, and manifests too large
 * to read (runtime/ckpt/mr_ckpt.h, docs/CHECKPOINTS.md).
 *
 * A failed write is injected with the workload's debug_ckpt_fail_* keys
 * (rank 1's part of one step fails as on a full disk, with or without the
 * marker that tells rank 0 at once). Every job that must not wait for a
 * lost part runs with a 600 s communication timeout and is given 120 s:
 * a rank that waited for the part would outlast the test.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckjob.h"
#include "mr_crc32c.h"
#include "proc.h"

#define PATIENT "\"comm_timeout_ms\": 600000"

static const struct mr_ckjob dp2 = { 1, 2, "", NULL };

/* `meshrun <args>` in the scratch directory under `timeout 60`; its exit
 * code (124: it blocked), output in <tag>.out. */
static int meshrun(const char *tag, const char *args)
{
	char cmd[2048], *bin = realpath(mr_proc_build_dir(), NULL);
	int st;

	snprintf(cmd, sizeof(cmd), "cd '%s' && timeout 60 '%s/meshrun' %s >'%s.out' 2>&1",
		 mr_ckjob_dir(), bin ? bin : "build", args, tag);
	free(bin);
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- a rank's part that cannot be written ---- */

/* dp2, 8 steps, a checkpoint every 2 (all kept), rank 1's part of step 4
 * failing: the job ends on time, step 4 is nowhere, the others are
 * published, training is what it is without the failure, and rank 0
 * names rank 1 (with its reason when the marker could be written). */
static void part_fails(int marked)
{
	char keys[512];
	int rc;

	cr_assert_eq(mr_ckjob_run(&dp2, "clean", 8, "\"ckpt_dir\": \"ck0\", \"ckpt_every\": 2"), 0,
		     "%s", mr_ckjob_tail("clean"));
	snprintf(keys, sizeof(keys),
		 PATIENT ", \"ckpt_dir\": \"ck\", \"ckpt_every\": 2, \"ckpt_keep\": 8, "
		 "\"debug_ckpt_fail_rank\": 1, \"debug_ckpt_fail_step\": 4, "
		 "\"debug_ckpt_fail_unmarked\": %s", marked ? "false" : "true");
	rc = mr_ckjob_wait(mr_ckjob_start(&dp2, "hurt", 8, keys), 120 * 1000);
	cr_assert_eq(rc, 0, "the job must end by itself, and succeed (rc %d):\n%s", rc,
		     mr_ckjob_tail("hurt"));
	cr_expect(mr_ckjob_count("hurt", "rank=1 event=checkpoint_failed step=4", "injected"),
		  "rank 1 does not say why its part failed:\n%s", mr_ckjob_tail("hurt"));
	cr_expect(mr_ckjob_count("hurt", "rank=0 event=checkpoint_failed step=4",
				 "rank 1 could not write its part"),
		  "rank 0 does not name rank 1:\n%s", mr_ckjob_tail("hurt"));
	cr_expect_eq(mr_ckjob_count("hurt", "rank=0 event=checkpoint_failed", "injected"), marked,
		     "rank 0 has rank 1's reason exactly when the marker was written:\n%s",
		     mr_ckjob_tail("hurt"));
	cr_expect(!mr_ckjob_exists("ck/step-00000004"), "the failed step was published");
	cr_expect(mr_ckjob_exists("ck/step-00000002") && mr_ckjob_exists("ck/step-00000006") &&
		  mr_ckjob_exists("ck/step-00000008"), "a good step is missing");
	mr_ckjob_sh("test -z \"$(ls -A ck | grep tmp-step)\"%s", "");
	cr_expect(mr_ckjob_same("clean.loss", "hurt.loss"), "a failed checkpoint changed training");
	cr_expect_eq(meshrun("inspect", "ckpt inspect ck"), 0, "%s", mr_ckjob_tail("inspect"));
}

Test(ckpt_dir, a_failed_part_with_its_marker_fails_that_step_at_once_and_training_goes_on,
     .timeout = 300)
{
	part_fails(1);
}

Test(ckpt_dir, a_failed_part_without_a_marker_fails_that_step_at_the_next_save, .timeout = 300)
{
	part_fails(0);
}

/* The last step's checkpoint failing on rank 1 fails the job at once
 * (it cannot succeed without its last checkpoint), and step 6 stays the
 * newest. */
Test(ckpt_dir, a_failed_last_checkpoint_fails_the_job_everywhere, .timeout = 300)
{
	struct mr_ckjob j = { 1, 2, "--max-restarts 0", NULL };
	int rc = mr_ckjob_wait(mr_ckjob_start(&j, "last", 8,
					      PATIENT ", \"ckpt_dir\": \"ck\", \"ckpt_every\": 2, "
						      "\"debug_ckpt_fail_rank\": 1, "
						      "\"debug_ckpt_fail_step\": 8, "
						      "\"debug_ckpt_fail_unmarked\": true"),
			       120 * 1000);

	cr_assert(rc > 0, "the job must fail by itself (rc %d):\n%s", rc, mr_ckjob_tail("last"));
	/* whichever rank's worker ends first fails the job (the agent then
	 * stops the other): rank 1 with its own reason; rank 0 did not
	 * publish */
	cr_expect(mr_ckjob_count("last", "worker_failed", "checkpoint of step 8 failed"),
		  "no worker failed on the last checkpoint:\n%s", mr_ckjob_tail("last"));
	cr_expect(mr_ckjob_count("last", "rank=0 event=checkpoint_failed step=8", NULL),
		  "rank 0 does not report the step:\n%s", mr_ckjob_tail("last"));
	cr_expect(mr_ckjob_exists("ck/step-00000006") && !mr_ckjob_exists("ck/step-00000008"),
		  "step 6 must stay the newest");
}

/* Lines in <scratch>/<name>. */
static int lines_of(const char *name)
{
	char path[PATH_MAX], buf[4096];
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "%s/%s", mr_ckjob_dir(), name);
	if (!(f = fopen(path, "r")))
		return 0;
	while (fgets(buf, sizeof(buf), f))
		n++;
	fclose(f);
	return n;
}

/* SIGTERM while rank 0's publisher still waits for a part that will
 * never come (no marker, the next save not yet reached): the stop's own
 * checkpoint is taken and the job ends within the grace period. */
Test(ckpt_dir, sigterm_ends_a_job_whose_checkpoint_lost_a_part, .timeout = 300)
{
	pid_t pid = mr_ckjob_start(&dp2, "term", 100000,
				   PATIENT ", \"ckpt_dir\": \"ck\", \"ckpt_every\": 20, "
					   "\"debug_ckpt_fail_rank\": 1, \"debug_ckpt_fail_step\": 20, "
					   "\"debug_ckpt_fail_unmarked\": true, "
					   "\"debug_slow_rank\": 1, \"debug_slow_ms\": 20");
	long long end = mr_test_now_ms() + 120 * 1000;
	int rc;

	while (lines_of("term.loss") < 25 && mr_test_now_ms() < end)
		usleep(10 * 1000);
	cr_assert_geq(lines_of("term.loss"), 25, "no step 25:\n%s", mr_ckjob_tail("term"));
	kill(pid, SIGTERM);
	rc = mr_ckjob_wait(pid, 60 * 1000);
	cr_assert_neq(rc, -1, "SIGTERM did not end the job in 60 s:\n%s", mr_ckjob_tail("term"));
	cr_expect(mr_ckjob_count("term", "event=preempted", NULL), "%s", mr_ckjob_tail("term"));
	cr_expect(!mr_ckjob_exists("ck/step-00000020"), "the failed step was published");
	cr_expect_eq(meshrun("inspect", "ckpt inspect ck"), 0, "%s", mr_ckjob_tail("inspect"));
}

/* ---- one job per directory ---- */

Test(ckpt_dir, a_second_job_on_the_directory_is_refused_naming_the_first, .timeout = 300)
{
	static const char *keys = "\"ckpt_dir\": \"ck\", \"ckpt_every\": 10, "
				  "\"debug_slow_rank\": 0, \"debug_slow_ms\": 20";
	long long end = mr_test_now_ms() + 120 * 1000;
	pid_t first = mr_ckjob_start(&dp2, "first", 300, keys);
	int rc;

	while (!mr_ckjob_exists("ck/step-00000010") && mr_test_now_ms() < end)
		usleep(50 * 1000);
	cr_assert(mr_ckjob_exists("ck/step-00000010"), "%s", mr_ckjob_tail("first"));
	rc = mr_ckjob_run(&dp2, "second", 300, keys);
	cr_expect_eq(rc, 2, "the second job must fail as misconfigured (exit %d):\n%s", rc,
		     mr_ckjob_tail("second"));
	cr_expect(mr_ckjob_count("second", "is in use by job 'local/job-", "ckpt_dir"),
		  "the refusal does not name the first job:\n%s", mr_ckjob_tail("second"));
	rc = mr_ckjob_wait(first, 200 * 1000);
	cr_expect_eq(rc, 0, "the first job was disturbed:\n%s", mr_ckjob_tail("first"));
	cr_expect(mr_ckjob_exists("ck/step-00000300"), "the first job's last step is missing");
	cr_expect_eq(mr_ckjob_count("first", "checkpoint_failed", NULL), 0, "%s",
		     mr_ckjob_tail("first"));
	cr_expect_eq(meshrun("inspect", "ckpt inspect ck"), 0, "%s", mr_ckjob_tail("inspect"));
}

/* ---- junk named like a step ---- */

/* After a job's first steps, a directory step-99999999 with a manifest
 * of {} and an empty file named like a step the job will publish: the
 * resume skips the junk, neither takes a ckpt_keep slot, neither is moved
 * or removed, and each is reported (the file where it is in the way). */
Test(ckpt_dir, junk_named_like_steps_never_costs_a_good_step)
{
	static const char *keys = "\"ckpt_dir\": \"ck\", \"ckpt_every\": 2, \"ckpt_keep\": 2";

	cr_assert_eq(mr_ckjob_run(&dp2, "first", 4, keys), 0, "%s", mr_ckjob_tail("first"));
	mr_ckjob_sh("mkdir ck/step-99999999 && echo '{}' >ck/step-99999999/manifest.json && "
		    ": >ck/step-00000006%s", "");
	cr_assert_eq(mr_ckjob_run(&dp2, "run", 10, keys), 0, "%s", mr_ckjob_tail("run"));
	cr_expect(mr_ckjob_count("run", "checkpoint_skipped", "step-99999999"), "%s",
		  mr_ckjob_tail("run"));
	cr_expect(mr_ckjob_count("run", "checkpoint_resumed", "step=4"), "%s",
		  mr_ckjob_tail("run"));
	cr_expect(mr_ckjob_exists("ck/step-00000008") && mr_ckjob_exists("ck/step-00000010"),
		  "the two newest good steps must be kept:\n%s", mr_ckjob_tail("run"));
	cr_expect(mr_ckjob_exists("ck/step-99999999/manifest.json"), "the junk was removed");
	mr_ckjob_sh("test -f ck/step-00000006 && ! test -s ck/step-00000006 && "
		    "test -z \"$(ls -A ck | grep replaced)\"%s", "");
	cr_expect(mr_ckjob_count("run", "checkpoint_junk", "step-99999999"),
		  "the junk is not reported:\n%s", mr_ckjob_tail("run"));
	cr_expect(mr_ckjob_count("run", "checkpoint_failed step=6", "is in the way"),
		  "the file in the way is not reported:\n%s", mr_ckjob_tail("run"));
}

/* ---- what is not a file ---- */

/* A FIFO where a shard, and one where a manifest should be, and a
 * manifest that is not there: inspect and export refuse them at once,
 * naming them, and a resume falls back past them. */
Test(ckpt_dir, a_fifo_for_a_shard_or_manifest_is_refused_not_waited_on, .timeout = 300)
{
	static const char *keys = "\"ckpt_dir\": \"ck\", \"ckpt_every\": 2, \"ckpt_keep\": 8";

	cr_assert_eq(mr_ckjob_run(&dp2, "run", 8, keys), 0, "%s", mr_ckjob_tail("run"));
	/* dp2 without ZeRO: rank 0 owns (and writes) everything */
	mr_ckjob_sh("rm ck/step-00000008/rank-00000.bin && mkfifo ck/step-00000008/rank-00000.bin "
		    "&& rm ck/step-00000006/manifest.json && "
		    "mkfifo ck/step-00000006/manifest.json%s", "");
	cr_expect_eq(meshrun("inspect", "ckpt inspect ck"), 1, "%s", mr_ckjob_tail("inspect"));
	cr_expect(mr_ckjob_count("inspect", "rank-00000.bin' is not a regular file (a FIFO)", NULL),
		  "%s", mr_ckjob_tail("inspect"));
	cr_expect(mr_ckjob_count("inspect", "manifest.json' is not a regular file (a FIFO)", NULL),
		  "%s", mr_ckjob_tail("inspect"));
	cr_expect_eq(meshrun("export", "ckpt export ck --safetensors out.safetensors"), 1, "%s",
		     mr_ckjob_tail("export"));
	/* a manifest that is not there: named plainly (not "(line -1)") */
	mr_ckjob_sh("rm ck/step-00000004/manifest.json%s", "");
	cr_expect_eq(meshrun("missing", "ckpt inspect ck"), 1, "%s", mr_ckjob_tail("missing"));
	cr_expect(mr_ckjob_count("missing", "step-00000004/manifest.json': No such file", NULL) &&
			  !mr_ckjob_count("missing", "line -1", NULL),
		  "%s", mr_ckjob_tail("missing"));
	cr_expect(mr_ckjob_count("export", "is not a regular file", NULL), "%s",
		  mr_ckjob_tail("export"));
	cr_assert_eq(mr_ckjob_run(&dp2, "again", 10, keys), 0, "%s", mr_ckjob_tail("again"));
	cr_expect(mr_ckjob_count("again", "checkpoint_resumed", "step=2"), "%s",
		  mr_ckjob_tail("again"));
}

/* ---- manifests too large ---- */

/* Peak resident memory of `meshrun ckpt inspect DIR`, KiB. */
static long inspect_peak_kib(const char *dir)
{
	char path[PATH_MAX], *bin = realpath(mr_proc_build_dir(), NULL);
	struct rusage ru;
	pid_t pid;
	int st;

	snprintf(path, sizeof(path), "%s/meshrun", bin ? bin : "build");
	free(bin);
	pid = fork();
	if (pid == 0) {
		if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr))
			_exit(126);
		execl(path, "meshrun", "ckpt", "inspect", dir, (char *)NULL);
		_exit(127);
	}
	cr_assert(pid > 0 && wait4(pid, &st, 0, &ru) == pid);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "inspect must exit 1 (status %d)", st);
	return ru.ru_maxrss;
}

/* Rewrites <dir>/manifest.json with one shard of n one-element records
 * of tensor 0's parameters (each valid alone; together not a tiling),
 * sealed as meshrun seals it; the file's size. */
static long write_large_manifest(const char *dir, long n)
{
	char path[PATH_MAX + 32], *head;
	json_t *doc;
	size_t len, cap = 64 + (size_t)n * 48;
	char *text = malloc(cap);
	FILE *f;
	long i;

	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	cr_assert_not_null(doc = json_load_file(path, 0, NULL));
	json_object_del(doc, "manifest_crc32c");
	json_object_del(doc, "shards");
	cr_assert_not_null(head = json_dumps(doc, JSON_COMPACT));
	json_decref(doc);
	cr_assert_not_null(text);
	len = (size_t)snprintf(text, cap, "%.*s,\"shards\":[{\"file\":\"rank-00000.bin\","
			       "\"rank\":0,\"bytes\":%ld,\"records\":[",
			       (int)strlen(head) - 1, head, 64 + 4 * n);
	free(head);
	for (i = 0; i < n; i++)
		len += (size_t)snprintf(text + len, cap - len, "%s[0,0,-1,1,-1,1,%ld,1,%ld,0]",
					i ? "," : "", i % 64, 64 + 4 * i);
	len += (size_t)snprintf(text + len, cap - len, "]}]");
	len += (size_t)snprintf(text + len, cap - len, ",\"manifest_crc32c\":%u}\n",
				mr_crc32c(0, text, len));
	cr_assert_not_null(f = fopen(path, "w"));
	cr_assert_eq(fwrite(text, 1, len, f), len);
	fclose(f);
	free(text);
	return (long)len;
}

/* A sealed 44 MB manifest of a million one-element records is read in
 * memory near its size (a DOM of it took 14x), and one past the bound is
 * refused before it is read. */
Test(ckpt_dir, large_manifests_are_read_in_bounded_memory_or_refused, .timeout = 300)
{
	char dir[PATH_MAX];
	long kib, bytes;

	cr_assert_eq(mr_ckjob_run(&(struct mr_ckjob){ 1, 1, "", NULL }, "run", 2,
				  "\"ckpt_dir\": \"ck\", \"ckpt_every\": 2"),
		     0, "%s", mr_ckjob_tail("run"));
	snprintf(dir, sizeof(dir), "%s/ck/step-00000002", mr_ckjob_dir());
	bytes = write_large_manifest(dir, 1000000);
	kib = inspect_peak_kib(dir);
	cr_log_info("manifest %ld bytes: inspect peak %ld KiB (%.1fx)", bytes, kib,
		    kib * 1024.0 / (double)bytes);
#ifndef MR_SANITIZED /* ASan's shadow and quarantine are not the reader's */
	cr_expect_lt(kib * 1024, 4 * bytes, "inspect took %ld KiB for a %ld-byte manifest", kib,
		     bytes);
#endif
	cr_expect_eq(meshrun("big", "ckpt inspect ck/step-00000002"), 1, "%s",
		     mr_ckjob_tail("big"));
	cr_expect(mr_ckjob_count("big", "do not cover", NULL), "%s", mr_ckjob_tail("big"));
	mr_ckjob_sh("truncate -s 300M %s/manifest.json", dir);
	cr_expect_eq(meshrun("huge", "ckpt inspect ck/step-00000002"), 1, "%s",
		     mr_ckjob_tail("huge"));
	cr_expect(mr_ckjob_count("huge", "more than a manifest may be", NULL), "%s",
		  mr_ckjob_tail("huge"));
}

/* A finished job run again has nothing to train: it says so, shows where
 * it stands (step N/N) with no made-up losses, and succeeds. */
Test(ckpt_dir, a_finished_job_run_again_says_it_is_done, .timeout = 300)
{
	const char *keys = "\"ckpt_dir\": \"done\", \"ckpt_every\": 2";

	cr_assert_eq(mr_ckjob_run(&dp2, "first", 4, keys), 0, "%s", mr_ckjob_tail("first"));
	cr_assert_eq(mr_ckjob_run(&dp2, "again", 4, keys), 0, "%s", mr_ckjob_tail("again"));
	cr_expect_eq(mr_ckjob_count("again", "event=already_finished", "step=4 steps=4"), 1, "%s",
		     mr_ckjob_tail("again"));
	cr_expect_eq(mr_ckjob_count("again", "event=worker_done", "step=4/4"), 2, "%s",
		     mr_ckjob_tail("again"));
	cr_expect_eq(mr_ckjob_count("again", "loss=0.0000", NULL), 0, "%s",
		     mr_ckjob_tail("again"));
	cr_expect_eq(mr_ckjob_count("again", "event=worker_done", "loss="), 0, "%s",
		     mr_ckjob_tail("again"));
}
