/*
 * fuzz_controller.c - libFuzzer harness for the controller core.
 *
 * The first input byte picks a target, the rest is its input:
 *   0: journal replay of arbitrary framed bytes (length/CRC/decoder, the
 *      torn-tail vs corruption rule, every apply function), then snapshot ->
 *      replay of the snapshot, which must be clean and reproduce the same
 *      jobs, members and KV sizes; and the input with an intact record
 *      appended, which must never make a bad record a droppable torn tail;
 *   1: a job spec as JSON through mr__ctl_parse_spec (validation of every
 *      field a client sends);
 *   2: an operation program: each 4-byte step drives join / wait /
 *      heartbeat / leave / fail / KV put / get (parked) / add / delete / list
 *      / time passing on a small set of nodes and keys, with parked
 *      requests answered through a fake wake; invariants are checked after
 *      every step.
 * Nothing here opens sockets or files; the journal is replayed from memory.
 *
 * Build (scripts/fuzz.sh): clang -fsanitize=fuzzer,address with
 * libmrcontroller + libmrcommon objects; defines LLVMFuzzerTestOneInput only.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctl.h"
#include "diag/diag.h"
#include "journal/journal.h"
#include "mr_log.h"

static int wakes;

static void on_wake(struct ctl *ctl, void *req, struct ctl_res *res)
{
	(void)ctl;
	(void)req;
	if (res->status < 200 || res->status > 599)
		abort();
	wakes++;
}

static void setup(struct ctl *ctl)
{
	struct ctl_limits lim = { .max_value = 4096, .max_keys = 64, .max_members = 64,
				  .max_jobs = 8 };

	lim.defaults.last_call_ms = 5;
	lim.defaults.heartbeat_timeout_ms = 100;
	lim.defaults.max_restarts = 3;
	mr__ctl_init(ctl, &lim);
	ctl->wake = on_wake;
}

static void check(struct ctl *ctl)
{
	size_t cur = 0;
	void *v;

	while (mr_dict_next(&ctl->jobs, &cur, NULL, &v)) {
		struct ctl_job *job = v;
		size_t n = 0, total = 0;

		for (struct ctl_member *m = job->lru_head; m; m = m->lru_next)
			n++;
		for (int s = 0; s < CTL_M_NSTATES; s++)
			total += job->count[s];
		if (n != mr_dict_len(&job->members) || total != n)
			abort();
		if (job->diag) { /* progress bookkeeping matches the members' reports */
			uint32_t ranks = 0, flagged = 0;

			for (struct ctl_member *m = job->lru_head; m; m = m->lru_next) {
				if (m->prog && m->state != CTL_M_RUNNING)
					abort();
				for (uint16_t i = 0; m->prog && i < m->prog->nr; i++)
					flagged += m->prog->r[i].flagged;
				ranks += m->prog ? m->prog->nr : 0;
			}
			if (ranks != job->diag->ranks || job->diag->hist_n > ranks ||
			    flagged != job->diag->nstragglers ||
			    job->diag->nlisted > job->diag->nstragglers)
				abort();
		}
	}
}

/* A heartbeat with a progress report made of fuzz bytes (mostly valid:
 * the member's rank, a dp or tp group, small numbers), then sometimes the
 * diagnosis; every answer is 200 or a 4xx naming a field. */
static void progress_beat(struct ctl *ctl, const char *node, int64_t gen, uint8_t a, uint8_t b,
			  uint8_t c, struct ctl_res *res)
{
	struct ctl_job *job = mr__ctl_job(ctl, "f/j");
	struct ctl_member *m = job ? mr_dict_get(&job->members, node) : NULL;
	int rank = m && m->node_rank >= 0 && !(c & 0x40) ? m->node_rank : a % 4;
	char text[512];
	json_t *p;

	snprintf(text, sizeof(text),
		 "[{\"rank\":%d,\"step\":%d,\"micro\":%d,\"busy_ms\":%d,"
		 "\"g\":[[%d,0,%d,%d,%d,%d,%d]%s]}]",
		 rank, b % 5, (int)(c % 3) - 1, 1 + (a & 0x3f) * (b & 3), (c & 0x80) ? 1 : 3,
		 2 + c % 2, b % 7, 1 + a % 9, (int)(a % 3) - 1, b % 7 - (c & 1),
		 (c & 0x20) ? ",[0,0,3,2,7,1,1]" : "");
	p = json_loads(text, 0, NULL);
	if (!p)
		abort();
	if (mr__ctl_progress_check(p, 1024, res) == 0)
		mr__ctl_heartbeat(ctl, "f/j", node, gen, p, res);
	else if (res->status != 400 || !res->field)
		abort();
	json_decref(p);
	if (job && (c & 0x10)) {
		json_t *d = mr__ctl_diagnose(ctl, job, NULL, 0);

		if (!d || !json_is_string(json_object_get(d, "message")))
			abort();
		json_decref(d);
	}
}

/* One intact R_JOB frame (a snapshot of a state with one job). */
static struct ctl_jbuf one_job;

static void make_one_job(void)
{
	struct ctl c;
	struct ctl_spec sp = { .min_nodes = 1, .max_nodes = 2, .nproc_per_node = 1, .tp = 1,
			       .pp = 1, .cp = 1, .ep = 1, .dp = 0, .last_call_ms = 5,
			       .heartbeat_timeout_ms = 100, .max_restarts = 3 };

	setup(&c);
	if (!mr__ctl_apply_job(&c, "z/z", &sp, 1, CTL_JOB_FORMING, 0, 0, 0, 0) ||
	    mr__ctl_snapshot(&c, &one_job) || one_job.len < 9)
		abort();
	mr__ctl_release(&c);
}

static void fuzz_replay(const uint8_t *d, size_t n)
{
	struct ctl a, b;
	struct ctl_jbuf snap = { 0 };
	struct ctl_jr_scan s, s2;

	setup(&a);
	mr__ctl_replay(&a, d, n, &s);
	check(&a);
	if (s.good > n || (s.good == n) != (s.verdict == CTL_JR_CLEAN && !s.err))
		abort();
	if (mr__ctl_snapshot(&a, &snap) == 0) {
		setup(&b);
		mr__ctl_replay(&b, snap.p, snap.len, &s2);
		if (s2.verdict != CTL_JR_CLEAN || s2.err || s2.good != snap.len ||
		    mr_dict_len(&a.jobs) != mr_dict_len(&b.jobs) || a.kv_bytes != b.kv_bytes)
			abort();
		check(&b);
		mr__ctl_release(&b);
	}
	mr__jbuf_release(&snap);
	mr__ctl_release(&a);
	/* an intact record after a bad one is never dropped as a torn tail */
	if (s.verdict != CTL_JR_CLEAN && !s.err) {
		unsigned char *buf = malloc(n + one_job.len);

		if (!buf)
			return;
		memcpy(buf, d, n);
		memcpy(buf + n, one_job.p, one_job.len);
		setup(&b);
		mr__ctl_replay(&b, buf, n + one_job.len, &s2);
		if (s2.good == s.good && s2.verdict == CTL_JR_TORN)
			abort();
		mr__ctl_release(&b);
		free(buf);
	}
}

static void fuzz_spec(const uint8_t *d, size_t n)
{
	struct ctl_limits lim = { .max_value = 4096, .max_keys = 64, .max_members = 200000,
				  .max_jobs = 8 };
	json_t *o = json_loadb((const char *)d, n, 0, NULL);
	struct ctl_spec spec;
	struct ctl_res res;
	const char *name;

	if (!o)
		return;
	memset(&res, 0, sizeof(res));
	if (mr__ctl_parse_spec(o, &lim, &spec, &name, &res) == 0) {
		int ok = 0;

		for (int32_t k = spec.min_nodes; k <= spec.max_nodes && !ok; k++)
			ok = mr__ctl_mesh_fits(&spec, k, NULL);
		if (!ok || spec.max_nodes < spec.min_nodes || strchr(name, '/') == NULL)
			abort();
	} else if (res.status != 400) {
		abort();
	}
	mr__res_release(&res);
	json_decref(o);
}

static void fuzz_ops(const uint8_t *d, size_t n)
{
	static const char *const nodes[] = { "a", "b", "c", "d", "e" };
	static const char *const keys[] = { "k", "peer/0", "peer/1", "ctr" };
	struct ctl ctl;
	struct ctl_spec spec = { .min_nodes = 2, .max_nodes = 3, .nproc_per_node = 1,
				 .tp = 1, .pp = 1, .cp = 1, .ep = 1, .dp = 0,
				 .last_call_ms = 5, .heartbeat_timeout_ms = 50,
				 .max_restarts = 2, .hang_timeout_ms = 20,
				 .straggler_pct = 150 };
	uintptr_t next_req = 1;

	setup(&ctl);
	for (size_t i = 0; i + 4 <= n; i += 4) {
		uint8_t op = d[i] % 13, a = d[i + 1], b = d[i + 2], c = d[i + 3];
		const char *node = nodes[a % 5];
		const char *key = keys[b % 4];
		struct ctl_job *job = mr__ctl_job(&ctl, "f/j");
		int64_t gen = (c & 1) && job ? (int64_t)job->generation : (int64_t)(c % 4) - 1;
		struct ctl_res res;

		memset(&res, 0, sizeof(res));
		ctl.now_ms = mr__ctl_now_ms() + ctl.skew_ms;
		switch (op) {
		case 0: {
			struct ctl_join j = { .node_id = node, .pod_index = (c & 2) ? a % 7 : -1,
					      .spec = &spec, .ports = "{\"comm\":1}" };

			mr__ctl_join(&ctl, "f/j", &j, &res);
			break;
		}
		case 1:
			mr__ctl_wait(&ctl, "f/j", node, gen, c % 3 ? c * 2 : 0,
				     (void *)next_req++, &res);
			break;
		case 2:
			mr__ctl_heartbeat(&ctl, "f/j", node, gen, NULL, &res);
			break;
		case 3:
		case 4:
			mr__ctl_leave(&ctl, "f/j", node, gen, op == 4, &res);
			break;
		case 5:
			if (job) {
				struct ctl_put p = { .val = "xyz", .len = c % 4,
						     .if_match = (c & 8) ? c % 5 : -1,
						     .if_none_match = (c & 16) != 0 };

				mr__ctl_kv_put(&ctl, job, key, &p, &res);
			}
			break;
		case 6:
			if (job)
				mr__ctl_kv_get(&ctl, job, key, c % 2 ? c : 0, (void *)next_req++, &res);
			break;
		case 7:
			if (job)
				mr__ctl_kv_add(&ctl, job, key, (int8_t)c, &res);
			break;
		case 8:
			if (job)
				mr__ctl_kv_delete(&ctl, job, key, &res);
			break;
		case 9:
			if (job)
				mr__ctl_kv_list(&ctl, job, c & 1 ? "peer/" : "", c % 3, 1 + c % 4,
						&res);
			break;
		case 10:
			ctl.skew_ms += c;
			ctl.last_scan_ms = 0;
			mr__ctl_tick(&ctl);
			break;
		case 11:
			if (c == 0xff)
				mr__ctl_job_delete(&ctl, "f/j", &res);
			break;
		case 12:
			progress_beat(&ctl, node, gen, a, b, c, &res);
			break;
		}
		if (!res.suspended && res.status && (res.status < 200 || res.status > 599))
			abort();
		mr__res_release(&res);
		check(&ctl);
	}
	mr__ctl_release(&ctl);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int inited;

	if (!inited) {
		mr_log_init("fuzz", MR_LOG_OFF);
		make_one_job();
		inited = 1;
	}
	if (size < 1)
		return 0;
	switch (data[0] % 3) {
	case 0:
		fuzz_replay(data + 1, size - 1);
		break;
	case 1:
		fuzz_spec(data + 1, size - 1);
		break;
	default:
		fuzz_ops(data + 1, size - 1);
		break;
	}
	return 0;
}
