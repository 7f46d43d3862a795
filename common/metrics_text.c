/*
 * metrics_text.c - rendering a registry in the Prometheus text format 0.0.4
 * (see mr_metrics.h): the collect hooks, then every family's HELP, TYPE and
 * samples; histograms as cumulative buckets with _sum and _count (the
 * +Inf bucket equals _count even while observations race).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics_int.h"

/* ---- rendering -------------------------------------------------------- */

struct sbuf {
	char *p;
	size_t len, cap;
	int oom;
};

static void sb_put(struct sbuf *sb, const char *s, size_t n)
{
	if (sb->oom)
		return;
	if (sb->len + n + 1 > sb->cap) {
		size_t cap = sb->cap ? sb->cap : 4096;
		char *np;
		while (cap < sb->len + n + 1)
			cap *= 2;
		np = realloc(sb->p, cap);
		if (!np) {
			sb->oom = 1;
			return;
		}
		sb->p = np;
		sb->cap = cap;
	}
	memcpy(sb->p + sb->len, s, n);
	sb->len += n;
	sb->p[sb->len] = '\0';
}

static void sb_str(struct sbuf *sb, const char *s)
{
	sb_put(sb, s, strlen(s));
}

static void sb_double(struct sbuf *sb, double v)
{
	char buf[48];

	mr_metrics_format_double(v, buf, sizeof(buf));
	sb_str(sb, buf);
}

/* Escapes backslash and newline, and the double quote when quote is set. */
static void sb_escaped(struct sbuf *sb, const char *s, int quote)
{
	for (const char *p = s; *p; p++) {
		if (*p == '\\')
			sb_put(sb, "\\\\", 2);
		else if (*p == '\n')
			sb_put(sb, "\\n", 2);
		else if (quote && *p == '"')
			sb_put(sb, "\\\"", 2);
		else
			sb_put(sb, p, 1);
	}
}

/* name{labels[,le="x"]} value\n; le may be NULL. */
static void sb_sample(struct sbuf *sb, const struct mr_metric_family *fam,
		      const struct child *ch, const char *suffix, const char *le, double v)
{
	sb_str(sb, fam->name);
	sb_str(sb, suffix);
	if (fam->nlabels || le) {
		sb_put(sb, "{", 1);
		for (size_t i = 0; i < fam->nlabels; i++) {
			if (i)
				sb_put(sb, ",", 1);
			sb_str(sb, fam->labels[i]);
			sb_put(sb, "=\"", 2);
			sb_escaped(sb, ch->values[i], 1);
			sb_put(sb, "\"", 1);
		}
		if (le) {
			if (fam->nlabels)
				sb_put(sb, ",", 1);
			sb_str(sb, "le=\"");
			sb_str(sb, le);
			sb_put(sb, "\"", 1);
		}
		sb_put(sb, "}", 1);
	}
	sb_put(sb, " ", 1);
	sb_double(sb, v);
	sb_put(sb, "\n", 1);
}

static void render_histogram(struct sbuf *sb, const struct mr_metric_family *fam,
			     const struct child *ch)
{
	uint64_t cum = 0;
	char le[48];

	for (size_t i = 0; i <= fam->nb; i++) {
		cum += atomic_load_explicit(&ch->hist.counts[i], memory_order_relaxed);
		if (i < fam->nb)
			mr_metrics_format_double(fam->bounds[i], le, sizeof(le));
		else
			snprintf(le, sizeof(le), "+Inf");
		sb_sample(sb, fam, ch, "_bucket", le, (double)cum);
	}
	sb_sample(sb, fam, ch, "_sum", NULL, mr__metrics_get_double(&ch->hist.sum));
	sb_sample(sb, fam, ch, "_count", NULL, (double)cum);
}

static void render_family(struct sbuf *sb, struct mr_metric_family *fam)
{
	static const char *const type_names[] = {"counter", "gauge", "histogram"};

	pthread_mutex_lock(&fam->mu);
	if (!fam->head)
		goto out;
	if (fam->help[0]) {
		sb_str(sb, "# HELP ");
		sb_str(sb, fam->name);
		sb_put(sb, " ", 1);
		sb_escaped(sb, fam->help, 0);
		sb_put(sb, "\n", 1);
	}
	sb_str(sb, "# TYPE ");
	sb_str(sb, fam->name);
	sb_put(sb, " ", 1);
	sb_str(sb, type_names[fam->type]);
	sb_put(sb, "\n", 1);
	for (const struct child *ch = fam->head; ch; ch = ch->next) {
		if (fam->type == MR_METRIC_COUNTER)
			sb_sample(sb, fam, ch, "", NULL, mr__metrics_get_double(&ch->counter.bits));
		else if (fam->type == MR_METRIC_GAUGE)
			sb_sample(sb, fam, ch, "", NULL, mr__metrics_get_double(&ch->gauge.bits));
		else
			render_histogram(sb, fam, ch);
	}
out:
	pthread_mutex_unlock(&fam->mu);
}

int mr_metrics_render(struct mr_metrics *reg, char **out, size_t *len)
{
	struct sbuf sb = {NULL, 0, 0, 0};
	struct hook hooks[MR_METRICS_MAX_HOOKS];
	size_t nhooks;

	*out = NULL;
	if (len)
		*len = 0;
	if (!reg)
		return MR_EINVAL;
	pthread_mutex_lock(&reg->render_mu);
	pthread_mutex_lock(&reg->mu);
	nhooks = reg->nhooks;
	memcpy(hooks, reg->hooks, nhooks * sizeof(hooks[0]));
	pthread_mutex_unlock(&reg->mu);
	for (size_t i = 0; i < nhooks; i++)
		hooks[i].fn(reg, hooks[i].user);
	sb_put(&sb, "", 0); /* an empty registry still renders "" */
	pthread_mutex_lock(&reg->mu);
	for (struct mr_metric_family *fam = reg->head; fam; fam = fam->next)
		render_family(&sb, fam);
	pthread_mutex_unlock(&reg->mu);
	pthread_mutex_unlock(&reg->render_mu);
	if (sb.oom) {
		free(sb.p);
		return MR_ENOMEM;
	}
	*out = sb.p;
	if (len)
		*len = sb.len;
	return 0;
}
