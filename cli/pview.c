/* pview.c - the agents' lines for a person at a terminal; see pview.h. */
#include "pview.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

/* info events a person wants to see as they are */
static const char *const shown_events[] = { "restarting", "checkpoint_resumed",
					    "already_finished", "preempted", "no_validation" };

int mr_pview_open(struct mr_pview *v, const char *log_path, struct mr_errbuf *eb)
{
	int fds[2];
	struct winsize ws;

	memset(v, 0, sizeof(*v));
	v->rfd = v->wfd = -1;
	v->status_node = -1;
	if (log_path && !(v->log = fopen(log_path, "a")))
		return mr_errf(eb, MR_ESYS, "unable to open the log file '%s': %s", log_path,
			       strerror(errno));
	if (pipe(fds)) {
		if (v->log)
			fclose(v->log);
		v->log = NULL;
		return mr_errf(eb, MR_ESYS, "pipe: %s", strerror(errno));
	}
	v->rfd = fds[0];
	v->wfd = fds[1];
	fcntl(v->rfd, F_SETFL, fcntl(v->rfd, F_GETFL) | O_NONBLOCK);
	fcntl(v->rfd, F_SETFD, FD_CLOEXEC);
	fcntl(v->wfd, F_SETFD, FD_CLOEXEC);
	v->width = ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20 ? ws.ws_col : 100;
	return 0;
}

static void clear_status(struct mr_pview *v)
{
	if (v->shown)
		fputs("\r\033[K", stderr);
	v->shown = 0;
}

static void draw_status(struct mr_pview *v)
{
	size_t n = strlen(v->status);

	if (!n)
		return;
	if (n > (size_t)v->width - 1)
		n = (size_t)v->width - 1;
	fprintf(stderr, "\r\033[K%.*s", (int)n, v->status);
	v->shown = 1;
}

/* The value of `key` in a logfmt line (bare, or quoted with \" and \\
 * unescaped) into out; 0, or -1 when the line has no such key. */
static int field(const char *line, const char *key, char *out, size_t cap)
{
	size_t kl = strlen(key), n = 0;
	const char *p = line;

	for (;;) {
		p = strstr(p, key);
		if (!p)
			return -1;
		if ((p == line || p[-1] == ' ') && p[kl] == '=')
			break;
		p += kl;
	}
	p += kl + 1;
	if (*p == '"') {
		for (p++; *p && *p != '"'; p++) {
			if (*p == '\\' && p[1])
				p++;
			if (n + 1 < cap)
				out[n++] = *p;
		}
	} else {
		for (; *p && *p != ' '; p++)
			if (n + 1 < cap)
				out[n++] = *p;
	}
	out[n] = '\0';
	return 0;
}

/* "45s", "3m05s", "2h07m". */
static void duration(char *out, size_t cap, double s)
{
	long t = s > 0 ? (long)(s + 0.5) : 0;

	if (t < 60)
		snprintf(out, cap, "%lds", t);
	else if (t < 3600)
		snprintf(out, cap, "%ldm%02lds", t / 60, t % 60);
	else
		snprintf(out, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
}

/* 1234567 -> "1,234,567" */
static void grouped(char *out, size_t cap, const char *digits)
{
	size_t len = strspn(digits, "0123456789"), n = 0;

	for (size_t i = 0; i < len && n + 2 < cap; i++) {
		if (i && (len - i) % 3 == 0)
			out[n++] = ',';
		out[n++] = digits[i];
	}
	out[n] = '\0';
}

static void print(struct mr_pview *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void print(struct mr_pview *v, const char *fmt, ...)
{
	va_list ap;

	clear_status(v);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
}

/* rank 0's gpt_worker_ready */
static void show_model(struct mr_pview *v, const char *l)
{
	char arch[16] = "", p[32] = "", pg[48], lay[16] = "", d[16] = "", h[16] = "", kv[16] = "",
	     moe[16] = "", b[16] = "", t[16] = "", acc[16] = "", dev[16] = "", prec[16] = "",
	     mesh[6][16] = { "", "", "", "", "", "" };
	static const char *const axes[6] = { "tp", "cp", "pp", "dp", "ep", "zero" };

	field(l, "arch", arch, sizeof(arch));
	field(l, "model_params", p, sizeof(p));
	field(l, "layers", lay, sizeof(lay));
	field(l, "d_model", d, sizeof(d));
	field(l, "heads", h, sizeof(h));
	field(l, "kv_heads", kv, sizeof(kv));
	field(l, "moe_every", moe, sizeof(moe));
	field(l, "batch", b, sizeof(b));
	field(l, "seq", t, sizeof(t));
	field(l, "accum", acc, sizeof(acc));
	field(l, "device", dev, sizeof(dev));
	field(l, "precision", prec, sizeof(prec));
	for (int i = 0; i < 6; i++)
		field(l, axes[i], mesh[i], sizeof(mesh[i]));
	grouped(pg, sizeof(pg), p);
	print(v, "model: %s, %s parameters (%s layers, d_model %s, %s heads%s%s%s%s%s%s)\n",
	      arch, pg, lay, d, h, strcmp(kv, h) ? ", " : "", strcmp(kv, h) ? kv : "",
	      strcmp(kv, h) ? " kv heads" : "", strcmp(moe, "0") ? ", experts every " : "",
	      strcmp(moe, "0") ? moe : "", strcmp(moe, "0") ? " blocks" : "");
	print(v, "mesh: tp %s, cp %s, pp %s, dp %s, ep %s, zero %s; batch %s x %s tokens x %s "
		 "micro-batches per rank; %s %s\n",
	      mesh[0], mesh[1], mesh[2], mesh[3], mesh[4], mesh[5], b, t, acc, dev, prec);
}

static void show_step(struct mr_pview *v, const char *l)
{
	char step[32] = "", loss[32] = "", val[32] = "", gn[32] = "", lr[32] = "", tps[32] = "",
	     tg[48], mfu[32] = "", mem[32] = "", eta[32] = "", et[32] = "";
	int width;

	field(l, "step", step, sizeof(step));
	field(l, "loss", loss, sizeof(loss));
	field(l, "grad_norm", gn, sizeof(gn));
	field(l, "lr", lr, sizeof(lr));
	field(l, "tokens_per_s", tps, sizeof(tps));
	field(l, "mfu", mfu, sizeof(mfu));
	field(l, "mem_mib", mem, sizeof(mem));
	field(l, "eta_s", eta, sizeof(eta));
	if (field(l, "val_loss", val + 6, sizeof(val) - 6) == 0)
		memcpy(val, "  val ", 6);
	grouped(tg, sizeof(tg), tps);
	duration(et, sizeof(et), atof(eta));
	/* "step  7/30" lines up with "step 30/30" */
	width = strchr(step, '/') ? 2 * (int)strlen(strchr(step, '/') + 1) + 1 : 0;
	print(v, "step %*s  loss %s%s  grad_norm %s  lr %s  %s tok/s  mfu %.1f%%  mem %s MiB  "
		 "eta %s\n",
	      width, step, loss, val, gn, lr, tg, 100.0 * atof(mfu), mem, et);
	snprintf(v->status, sizeof(v->status), "step %s, eta %s", step, et);
	v->status_node = 0;
}

static void show_summary(struct mr_pview *v, const char *l)
{
	char state[32] = "", steps[48] = "", secs[32] = "", rs[16] = "", loss[32] = "",
	     val[32] = "", best[32] = "", bstep[32] = "", tps[32] = "", tg[48], ck[32] = "",
	     dir[1024] = "", reason[1024] = "", took[32];

	field(l, "state", state, sizeof(state));
	field(l, "seconds", secs, sizeof(secs));
	field(l, "restarts", rs, sizeof(rs));
	field(l, "tokens_per_s", tps, sizeof(tps));
	field(l, "checkpoints", ck, sizeof(ck));
	field(l, "ckpt_dir", dir, sizeof(dir));
	field(l, "reason", reason, sizeof(reason));
	duration(took, sizeof(took), atof(secs));
	v->status[0] = '\0'; /* the run is over */
	v->status_node = -1;
	if (field(l, "steps", steps + 1, sizeof(steps) - 1) == 0)
		steps[0] = ' ';
	print(v, "done: %s,%s%s in %s, %s restart%s\n", state, steps, steps[0] ? " steps" : "",
	      took, rs, strcmp(rs, "1") ? "s" : "");
	if (!field(l, "loss", loss, sizeof(loss))) {
		grouped(tg, sizeof(tg), tps);
		field(l, "val_loss", val, sizeof(val));
		field(l, "best_val_loss", best, sizeof(best));
		field(l, "best_val_step", bstep, sizeof(bstep));
		print(v, "  loss %s%s%s%s%s%s%s  %s tokens/s\n", loss, val[0] ? "  val_loss " : "",
		      val, best[0] ? "  best val_loss " : "", best, best[0] ? " at step " : "",
		      bstep, tg);
	}
	if (strcmp(ck, "0") && ck[0])
		print(v, "  %s checkpoint%s in %s\n", ck, strcmp(ck, "1") ? "s" : "", dir);
	if (strcmp(state, "succeeded") && reason[0])
		print(v, "  reason: %s\n", reason);
}

/* "[node 3] ... event=progress rank=6 step=37/100 ... eta_s=4" */
static void take_progress(struct mr_pview *v, int node, const char *l)
{
	char step[32] = "", eta[32] = "", stalled[32] = "", d[32];

	field(l, "step", step, sizeof(step));
	if (!field(l, "stalled_s", stalled, sizeof(stalled))) {
		duration(d, sizeof(d), atof(stalled));
		snprintf(v->status, sizeof(v->status), "step %s on node %d: no step for %s", step,
			 node, d);
		v->status_node = node;
		return;
	}
	if (v->status_node >= 0 && v->status_node != node && strstr(v->status, "no step"))
		return; /* a stall elsewhere stays on screen until that node moves */
	if (node != 0 && v->status_node >= 0 && v->status_node != node)
		return;
	field(l, "eta_s", eta, sizeof(eta));
	duration(d, sizeof(d), atof(eta));
	snprintf(v->status, sizeof(v->status), "step %s, eta %s", step, d);
	v->status_node = node;
}

static void handle_line(struct mr_pview *v, const char *line)
{
	char event[64] = "", lvl[16] = "", rank[16] = "";
	int node;

	if (v->log)
		fprintf(v->log, "%s\n", line);
	if (sscanf(line, "[node %d]", &node) != 1) {
		print(v, "%s\n", line); /* meshrun local's own, or a worker's output */
		return;
	}
	field(line, "event", event, sizeof(event));
	field(line, "lvl", lvl, sizeof(lvl));
	field(line, "rank", rank, sizeof(rank));
	if (!strcmp(event, "progress")) {
		take_progress(v, node, line);
		return;
	}
	if (!strcmp(event, "step")) {
		show_step(v, line);
		return;
	}
	if (!strcmp(event, "job_summary")) {
		show_summary(v, line);
		return;
	}
	if (!strcmp(event, "gpt_worker_ready") && !strcmp(rank, "0")) {
		show_model(v, line);
		return;
	}
	if (!event[0] || !strcmp(lvl, "warn") || !strcmp(lvl, "error")) {
		print(v, "%s\n", line);
		return;
	}
	for (size_t i = 0; i < sizeof(shown_events) / sizeof(shown_events[0]); i++)
		if (!strcmp(event, shown_events[i]))
			print(v, "%s\n", line);
}

void mr_pview_pump(struct mr_pview *v)
{
	int got = 0;

	if (v->rfd < 0)
		return;
	for (;;) {
		ssize_t r = read(v->rfd, v->buf + v->len, sizeof(v->buf) - 1 - v->len);
		char *start, *nl;

		if (r <= 0)
			break;
		got = 1;
		v->len += (size_t)r;
		v->buf[v->len] = '\0';
		start = v->buf;
		while ((nl = strchr(start, '\n'))) {
			*nl = '\0';
			handle_line(v, start);
			start = nl + 1;
		}
		v->len -= (size_t)(start - v->buf);
		memmove(v->buf, start, v->len);
		if (v->len == sizeof(v->buf) - 1) { /* a line longer than the buffer */
			v->buf[v->len] = '\0';
			handle_line(v, v->buf);
			v->len = 0;
		}
	}
	if (got) {
		draw_status(v);
		if (v->log)
			fflush(v->log);
	}
}

void mr_pview_close(struct mr_pview *v)
{
	if (v->wfd >= 0)
		close(v->wfd);
	v->wfd = -1;
	mr_pview_pump(v);
	if (v->len) {
		v->buf[v->len] = '\0';
		handle_line(v, v->buf);
		v->len = 0;
	}
	clear_status(v);
	v->status[0] = '\0';
	if (v->log)
		fclose(v->log);
	v->log = NULL;
	if (v->rfd >= 0)
		close(v->rfd);
	v->rfd = -1;
}
