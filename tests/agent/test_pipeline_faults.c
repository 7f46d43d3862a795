/*
 * test_pipeline_faults.c - a pipeline stage that hangs or dies makes the
 * other stage fail promptly with an error naming it, never a hang: real
 * `meshrun local` jobs of two nodes (one stage each), one stage stopped
 * with the documented debug_stall_* keys at the start of a step, so the
 * other is surely waiting on it in a pipeline transfer.
 *
 *   - the stalled stage stays alive: the waiting stage times out after
 *     comm_timeout_ms, naming the stage it waited for;
 *   - the stalled stage's agent is killed (kill -9): the waiting stage
 *     sees the peer gone, naming it, well before the timeout.
 */
#include "harness.h"

#define CONFIG(timeout)                                                                     \
	"{\"steps\": 200, \"n_layer\": 4, \"d_model\": 32, \"n_head\": 2, \"seq_len\": 16, " \
	"\"batch_size\": 2, \"grad_accum\": 4, \"threads\": 1, \"peak_flops\": 1e9, "       \
	"\"pp_schedule\": \"1f1b\", \"comm_timeout_ms\": " timeout ", "                     \
	"\"debug_stall_rank\": 1, \"debug_stall_step\": 3}"

/* Starts a pp2 job on two nodes whose rank 1 (stage 1, node local-1) stops
 * at step 3; returns once it has. */
static pid_t start_stalled(const char *config, char *log, size_t cap, const char *name)
{
	char *args[] = {"--nodes", "2", "--nproc-per-node", "1", "--pp", "2",
			"--max-restarts", "0", "--heartbeat-timeout", "120s",
			"--workload-config", (char *)config, NULL};
	pid_t local = h_local(args, NULL, log, cap, name);

	if (h_wait_log(log, "event=debug_stall rank=1 step=3", 1, 120000)) {
		h_dump(log);
		h_kill(local);
		cr_assert_fail("rank 1 never stalled");
	}
	return local;
}

/* The waiting stage's failure: rank 0's worker_failed line names stage 1. */
static void expect_named(const char *log, const char *why)
{
	char *out = h_read(log), *line = strstr(out, "rank=0 event=worker_failed");

	cr_assert_not_null(line, "rank 0 did not fail:\n%s", out);
	*strchrnul(line, '\n') = 0;
	cr_expect(strstr(line, "pipeline stage 0 failed") && strstr(line, "stage 1"),
		  "the failure does not name the stage: %s", line);
	cr_expect(strstr(line, why), "expected '%s': %s", why, line);
	free(out);
}

// cppcheck-suppress unknownMacro
Test(pipeline_faults, a_hung_stage_times_its_neighbour_out_naming_it, .timeout = 240)
{
	char log[300];
	pid_t local = start_stalled(CONFIG("3000"), log, sizeof(log), "pp-hang.log");

	/* rank 0 gives up after its 3 s timeout; nothing else ends the job */
	if (h_wait_log(log, "rank=0 event=worker_failed", 1, 60000)) {
		h_dump(log);
		h_kill(local);
		cr_assert_fail("rank 0 hung on its stalled neighbour");
	}
	expect_named(log, "timed out");
	h_kill(local);
}

Test(pipeline_faults, a_killed_stage_fails_its_neighbour_naming_it, .timeout = 240)
{
	char log[300];
	/* a timeout far beyond the test's: only the dead peer can end the wait */
	pid_t local = start_stalled(CONFIG("600000"), log, sizeof(log), "pp-kill.log");
	pid_t victim = h_child(local, "meshrun-agent", 1);

	cr_assert_gt(victim, 0);
	kill(victim, SIGKILL);
	if (h_wait_log(log, "rank=0 event=worker_failed", 1, 60000)) {
		h_dump(log);
		h_kill(local);
		cr_assert_fail("rank 0 hung on its dead neighbour");
	}
	expect_named(log, "peer failed");
	cr_expect_neq(h_wait(local, 60000), 0, "the job cannot succeed without stage 1");
	h_kill(local);
}
