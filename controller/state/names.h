/*
 * names.h - the names of job and member states (enum ctl_job_state, enum
 * ctl_member_state) as replies, logs and the diagnosis show them:
 * "forming", "running", ..., "waiting", "standby", ...
 *
 * Non-goals: state transitions (core/).
 */
#ifndef MR_CTL_NAMES_H
#define MR_CTL_NAMES_H

/* "unknown" for a number out of range. */
const char *mr__ctl_member_state_name(int st);
const char *mr__ctl_job_state_name(int st);

#endif
