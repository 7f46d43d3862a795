/*
 * local_pods.c - the processes of `meshrun local` (the controller and one
 * agent per node), each started, watched and restarted alone, as
 * Kubernetes would restart the pods of a job; and what the controller
 * says about the job. Policy: local_int.h.
 *
 * Non-goals: options and the final report (local.c).
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "local_int.h"

long long mr__local_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *label_of(const struct local_proc *p, char *buf, size_t cap)
{
	if (p->id < 0)
		snprintf(buf, cap, "controller");
	else
		snprintf(buf, cap, "node %d", p->id);
	return buf;
}

int mr__local_start(struct local_proc *p, struct mr_errbuf *eb)
{
	int id = p->id;
	int err;

	mr_exec_stop(&p->ex, 0); /* reaps and joins what the last run left */
	err = mr_exec_start(&p->ex, p->argv, 1, &p->env, &id, id < 0 ? "controller" : "node",
			    -1, p->err_fd, eb);
	if (err)
		return err;
	p->pid = (int)p->ex.child[0].pid;
	p->code = -1;
	p->sig = 0;
	p->restart_at_ms = 0;
	return 0;
}

int mr__local_reaped(struct local_proc *p)
{
	struct mr_exec_status st;

	if (p->code >= 0 || !p->ex.n || !p->ex.child[0].pid)
		return 0;
	mr_exec_poll(&p->ex, &st);
	if (st.running)
		return 0;
	p->code = p->ex.child[0].code;
	p->sig = p->ex.child[0].signal;
	return 1;
}

const char *mr__local_end_text(const struct local_proc *p, char *buf, size_t cap)
{
	if (p->sig)
		snprintf(buf, cap, "killed by signal %d", p->sig);
	else
		snprintf(buf, cap, "exited %d", p->code);
	return buf;
}

void mr__local_after_exit(struct local_proc *p, int over, int stopping, int fd)
{
	char who[32], how[48];
	const char *why = NULL;

	label_of(p, who, sizeof(who));
	mr__local_end_text(p, how, sizeof(how));
	if (p->code == 0 && p->id >= 0)
		why = "done";
	else if (p->code == 2 && !p->sig)
		why = p->id < 0 ? "it refuses its data dir; not restarted"
				: "permanent failure; not restarted";
	else if (stopping)
		why = "stopping";
	else if (over)
		why = "the job is over";
	else if (p->restarts >= p->max_restarts)
		why = "restart limit reached (--max-restarts)";
	if (why) {
		p->final = 1;
		dprintf(fd, "meshrun local: %s (pid %d) %s: %s\n", who, p->pid, how, why);
		return;
	}
	p->restart_at_ms = mr__local_now_ms() + p->backoff_ms;
	dprintf(fd, "meshrun local: %s (pid %d) %s: restart %d/%d in %ld ms\n", who, p->pid, how,
		p->restarts + 1, p->max_restarts, p->backoff_ms);
	p->backoff_ms = p->backoff_ms * 2 > LOCAL_BACKOFF_MAX_MS ? LOCAL_BACKOFF_MAX_MS
								 : p->backoff_ms * 2;
}

void mr__local_restart_due(struct local_proc *p, int fd)
{
	struct mr_errbuf eb = {0};
	char who[32];

	if (!p->restart_at_ms || mr__local_now_ms() < p->restart_at_ms)
		return;
	p->restarts++;
	if (mr__local_start(p, &eb)) {
		dprintf(fd, "meshrun local: unable to restart %s: %s\n",
			label_of(p, who, sizeof(who)), eb.msg);
		p->restart_at_ms = 0;
		p->final = 1;
		return;
	}
	dprintf(fd, "meshrun local: %s restarted (pid %d, restart %d/%d)\n",
		label_of(p, who, sizeof(who)), p->pid, p->restarts, p->max_restarts);
}

int mr__local_poll_job(struct local_job *j, long timeout_ms, int fd)
{
	char path[512];
	struct mr_errbuf eb = {0};
	json_t *reply = NULL;
	const char *st, *why;
	long status = 0;
	long long g;
	int err;

	if (!j->hc)
		return MR_ECONN;
	snprintf(path, sizeof(path), "/v1/jobs/%s", j->name);
	err = mr_httpc_json(j->hc, "GET", path, NULL, timeout_ms, &status, &reply, &eb);
	if (!err && (status != 200 || !reply))
		err = status == 404 ? MR_ENOTFOUND : MR_ECONN;
	if (err) {
		json_decref(reply);
		return err;
	}
	g = json_integer_value(json_object_get(reply, "generation"));
	st = json_string_value(json_object_get(reply, "state"));
	why = json_string_value(json_object_get(reply, "reason"));
	if (fd >= 0 && (g != j->generation || (st && strcmp(st, j->state))))
		dprintf(fd, "meshrun local: job %s generation %lld %s\n", j->name, g, st ? st : "?");
	j->generation = g;
	snprintf(j->state, sizeof(j->state), "%s", st ? st : "");
	snprintf(j->reason, sizeof(j->reason), "%s", why ? why : "");
	json_decref(reply);
	return 0;
}

int mr__local_job_over(const struct local_job *j)
{
	return !strcmp(j->state, "failed") || !strcmp(j->state, "succeeded");
}
