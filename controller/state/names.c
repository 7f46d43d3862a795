/*
 * names.c - the names of job and member states (see names.h).
 *
 * Non-goals: anything else.
 */
#include "names.h"
#include "state.h"

const char *mr__ctl_member_state_name(int st)
{
	static const char *const names[] = { "waiting", "running", "standby", "stale", "done" };

	return st >= 0 && st < CTL_M_NSTATES ? names[st] : "unknown";
}

const char *mr__ctl_job_state_name(int st)
{
	static const char *const names[] = { "forming", "running", "failed", "succeeded" };

	return st >= 0 && st <= CTL_JOB_SUCCEEDED ? names[st] : "unknown";
}
