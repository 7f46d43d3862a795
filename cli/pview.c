/* pview.c - fold progress lines into one redrawn status line; see pview.h. */
#include "pview.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "mr_err.h"

int mr_pview_open(struct mr_pview *v)
{
	int fds[2];
	struct winsize ws;

	memset(v, 0, sizeof(*v));
	v->rfd = v->wfd = -1;
	if (pipe(fds))
		return MR_ESYS;
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
	char line[1024];
	size_t n = 0;

	for (int i = 0; i < MR_PVIEW_NODES; i++) {
		if (!v->node[i][0])
			continue;
		n += (size_t)snprintf(line + n, sizeof(line) - n, "%snode %d: %s", n ? " | " : "",
				      i, v->node[i]);
		if (n >= sizeof(line))
			n = sizeof(line) - 1;
	}
	if (!n)
		return;
	if (n > (size_t)v->width - 1)
		n = (size_t)v->width - 1;
	fprintf(stderr, "\r\033[K%.*s", (int)n, line);
	v->shown = 1;
}

/* "[node 3] ... event=progress rank=6 step=..." -> node 3 shows "step=...". */
static int fold_progress(struct mr_pview *v, const char *line)
{
	const char *step;
	int node;

	if (!strstr(line, " event=progress ") || sscanf(line, "[node %d]", &node) != 1 ||
	    node < 0 || node >= MR_PVIEW_NODES || !(step = strstr(line, " step=")))
		return 0;
	snprintf(v->node[node], MR_PVIEW_FIELD, "%s", step + 1);
	return 1;
}

static void handle_line(struct mr_pview *v, const char *line)
{
	if (fold_progress(v, line))
		return;
	clear_status(v);
	fprintf(stderr, "%s\n", line);
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
	if (got)
		draw_status(v);
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
	clear_status(v); /* the agents' worker_done lines carry the summary */
	memset(v->node, 0, sizeof(v->node));
	if (v->rfd >= 0)
		close(v->rfd);
	v->rfd = -1;
}
