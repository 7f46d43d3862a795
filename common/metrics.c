/*
 * metrics.c - Prometheus registry and text format 0.0.4; see mr_metrics.h.
 *
 * Values are C11 atomics: doubles are kept as their IEEE-754 bit pattern in
 * an _Atomic uint64_t and updated with a compare-and-swap loop. A histogram
 * child keeps one non-cumulative count per bucket (plus +Inf); rendering
 * sums them into cumulative buckets and prints _count as the same total,
 * so the +Inf bucket always equals _count even while observations race.
 *
 * Locks: reg->mu guards the family list and hooks, reg->render_mu
 * serialises renders (and so the hooks), fam->mu guards a family's child
 * list. Lock order is reg->render_mu, reg->mu, fam->mu.
 *
 * This file is the registry (names, families, children); metrics_values.c
 * updates values, metrics_text.c renders the text exposition.
 *
 * Non-goals: removing children, summaries, timestamps.
 */
#include "metrics_int.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mr_log.h"

const double mr_metrics_latency_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
					     0.1,    0.25,  0.5,    1,     2.5,  5,     10};
const size_t mr_metrics_latency_nbuckets =
	sizeof(mr_metrics_latency_buckets) / sizeof(mr_metrics_latency_buckets[0]);

/* ---- names ------------------------------------------------------------ */

static int name_char(char c, int first, int colon)
{
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')
		return 1;
	if (colon && c == ':')
		return 1;
	return !first && c >= '0' && c <= '9';
}

int mr_metrics_valid_name(const char *name)
{
	if (!name || !*name)
		return 0;
	for (const char *p = name; *p; p++)
		if (!name_char(*p, p == name, 1))
			return 0;
	return 1;
}

int mr_metrics_valid_label(const char *name)
{
	if (!name || !*name || strncmp(name, "__", 2) == 0)
		return 0;
	for (const char *p = name; *p; p++)
		if (!name_char(*p, p == name, 0))
			return 0;
	return 1;
}

int mr_metrics_format_double(double v, char *buf, size_t size)
{
	if (isnan(v))
		return snprintf(buf, size, "NaN");
	if (isinf(v))
		return snprintf(buf, size, v > 0 ? "+Inf" : "-Inf");
	if (v == floor(v) && fabs(v) < 1e15)
		return snprintf(buf, size, "%.0f", v + 0.0); /* + 0.0 turns -0 into 0 */
	for (int prec = 15; prec < 17; prec++) {
		char tmp[40];
		snprintf(tmp, sizeof(tmp), "%.*g", prec, v);
		if (strtod(tmp, NULL) == v)
			return snprintf(buf, size, "%s", tmp);
	}
	return snprintf(buf, size, "%.17g", v);
}

/* ---- registry --------------------------------------------------------- */

struct mr_metrics *mr_metrics_new(void)
{
	struct mr_metrics *reg = calloc(1, sizeof(*reg));

	if (!reg)
		return NULL;
	pthread_mutex_init(&reg->mu, NULL);
	pthread_mutex_init(&reg->render_mu, NULL);
	return reg;
}

static void child_free(struct child *ch)
{
	free(ch->value_buf);
	free(ch->hist.counts);
	free(ch);
}

static void family_free(struct mr_metric_family *fam)
{
	struct child *ch, *next;

	if (!fam)
		return;
	for (ch = fam->head; ch; ch = next) {
		next = ch->next;
		child_free(ch);
	}
	for (size_t i = 0; i < fam->nlabels; i++)
		free(fam->labels[i]);
	free(fam->bounds);
	free(fam->name);
	free(fam->help);
	pthread_mutex_destroy(&fam->mu);
	free(fam);
}

void mr_metrics_free(struct mr_metrics *reg)
{
	struct mr_metric_family *fam, *next;

	if (!reg)
		return;
	for (fam = reg->head; fam; fam = next) {
		next = fam->next;
		family_free(fam);
	}
	pthread_mutex_destroy(&reg->mu);
	pthread_mutex_destroy(&reg->render_mu);
	free(reg);
}

/* Splits "a, b" into fam->labels, validating each. */
static int parse_labels(struct mr_metric_family *fam, const char *labels, struct mr_errbuf *eb)
{
	const char *p = labels;

	if (!labels)
		return 0;
	while (*p) {
		const char *start, *end;
		size_t len;

		while (*p == ' ')
			p++;
		start = p;
		while (*p && *p != ',')
			p++;
		end = p;
		while (end > start && end[-1] == ' ')
			end--;
		len = (size_t)(end - start);
		if (fam->nlabels == MR_METRICS_MAX_LABELS)
			return mr_errf_field(eb, MR_ELIMIT, "labels",
					     "metric '%s' has more than %d labels", fam->name,
					     MR_METRICS_MAX_LABELS);
		fam->labels[fam->nlabels] = strndup(start, len);
		if (!fam->labels[fam->nlabels])
			return MR_ENOMEM;
		fam->nlabels++;
		if (!mr_metrics_valid_label(fam->labels[fam->nlabels - 1]))
			return mr_errf_field(eb, MR_EINVAL, "labels",
					     "metric '%s': label name '%s' is not valid", fam->name,
					     fam->labels[fam->nlabels - 1]);
		if (fam->type == MR_METRIC_HISTOGRAM &&
		    strcmp(fam->labels[fam->nlabels - 1], "le") == 0)
			return mr_errf_field(eb, MR_EINVAL, "labels",
					     "histogram '%s' may not use label 'le'", fam->name);
		for (size_t i = 0; i + 1 < fam->nlabels; i++)
			if (strcmp(fam->labels[i], fam->labels[fam->nlabels - 1]) == 0)
				return mr_errf_field(eb, MR_EINVAL, "labels",
						     "metric '%s': label '%s' is repeated",
						     fam->name, fam->labels[i]);
		if (*p == ',') {
			p++;
			if (!*p)
				return mr_errf_field(eb, MR_EINVAL, "labels",
						     "metric '%s': label name '' is not valid",
						     fam->name);
		}
	}
	return 0;
}

static int set_buckets(struct mr_metric_family *fam, const double *b, size_t n,
		       struct mr_errbuf *eb)
{
	if (!b || n == 0) {
		b = mr_metrics_latency_buckets;
		n = mr_metrics_latency_nbuckets;
	}
	if (n > MR_METRICS_MAX_BUCKETS)
		return mr_errf_field(eb, MR_ELIMIT, "buckets", "histogram '%s' has more than %d buckets",
				     fam->name, MR_METRICS_MAX_BUCKETS);
	for (size_t i = 0; i < n; i++) {
		if (!isfinite(b[i]))
			return mr_errf_field(eb, MR_EINVAL, "buckets",
					     "histogram '%s': bucket %zu is not finite", fam->name, i);
		if (i > 0 && !(b[i] > b[i - 1]))
			return mr_errf_field(eb, MR_EINVAL, "buckets",
					     "histogram '%s': buckets are not strictly increasing at %zu",
					     fam->name, i);
	}
	fam->bounds = malloc(n * sizeof(double));
	if (!fam->bounds)
		return MR_ENOMEM;
	memcpy(fam->bounds, b, n * sizeof(double));
	fam->nb = n;
	return 0;
}

static struct child *child_get(struct mr_metric_family *fam, enum mr_metric_type type,
			       const char *const *values);

int mr_metrics_add(struct mr_metrics *reg, enum mr_metric_type type, const char *name,
		   const char *help, const char *labels, const double *buckets, size_t nbuckets,
		   struct mr_metric_family **out, struct mr_errbuf *eb)
{
	struct mr_metric_family *fam = NULL;
	int rc;

	if (!reg || (unsigned)type > MR_METRIC_HISTOGRAM)
		return mr_errf(eb, MR_EINVAL, "metric registry or type is not valid");
	if (!mr_metrics_valid_name(name))
		return mr_errf_field(eb, MR_EINVAL, "name", "metric name '%s' is not valid",
				     name ? name : "");
	fam = calloc(1, sizeof(*fam));
	if (!fam)
		return mr_errf(eb, MR_ENOMEM, "out of memory registering '%s'", name);
	pthread_mutex_init(&fam->mu, NULL);
	fam->type = type;
	fam->name = strdup(name);
	fam->help = strdup(help ? help : "");
	if (!fam->name || !fam->help) {
		rc = mr_errf(eb, MR_ENOMEM, "out of memory registering '%s'", name);
		goto out;
	}
	if ((rc = parse_labels(fam, labels, eb)) < 0)
		goto out;
	if (type == MR_METRIC_HISTOGRAM && (rc = set_buckets(fam, buckets, nbuckets, eb)) < 0)
		goto out;
	if (fam->nlabels == 0 && !child_get(fam, type, NULL)) {
		rc = mr_errf(eb, MR_ENOMEM, "out of memory registering '%s'", name);
		goto out;
	}
	pthread_mutex_lock(&reg->mu);
	for (struct mr_metric_family *f = reg->head; f; f = f->next)
		if (strcmp(f->name, name) == 0) {
			pthread_mutex_unlock(&reg->mu);
			rc = mr_errf_field(eb, MR_EEXISTS, "name", "metric '%s' is already registered",
					   name);
			goto out;
		}
	if (reg->tail)
		reg->tail->next = fam;
	else
		reg->head = fam;
	reg->tail = fam;
	pthread_mutex_unlock(&reg->mu);
	if (out)
		*out = fam;
	return 0;
out:
	if (rc == MR_ENOMEM)
		mr_errf(eb, MR_ENOMEM, "out of memory registering '%s'", name);
	family_free(fam);
	return rc;
}

static struct mr_metric_family *add_or_log(struct mr_metrics *reg, enum mr_metric_type type,
					   const char *name, const char *help,
					   const char *labels, const double *b, size_t n)
{
	struct mr_metric_family *fam = NULL;
	struct mr_errbuf eb = {{0}, {0}};
	int rc = mr_metrics_add(reg, type, name, help, labels, b, n, &fam, &eb);

	if (rc < 0) {
		mr_log_error("metric_register_failed", "name=%s err=%s msg=%s", mr_log_q(name),
			     mr_err_name(rc), mr_log_q(eb.msg));
		return NULL;
	}
	return fam;
}

struct mr_metric_family *mr_metrics_counter(struct mr_metrics *reg, const char *name,
					    const char *help, const char *labels)
{
	return add_or_log(reg, MR_METRIC_COUNTER, name, help, labels, NULL, 0);
}

struct mr_metric_family *mr_metrics_gauge(struct mr_metrics *reg, const char *name,
					  const char *help, const char *labels)
{
	return add_or_log(reg, MR_METRIC_GAUGE, name, help, labels, NULL, 0);
}

struct mr_metric_family *mr_metrics_histogram(struct mr_metrics *reg, const char *name,
					      const char *help, const char *labels,
					      const double *buckets, size_t nbuckets)
{
	return add_or_log(reg, MR_METRIC_HISTOGRAM, name, help, labels, buckets, nbuckets);
}

struct mr_metric_family *mr_metrics_find(struct mr_metrics *reg, const char *name)
{
	struct mr_metric_family *f;

	if (!reg || !name)
		return NULL;
	pthread_mutex_lock(&reg->mu);
	for (f = reg->head; f; f = f->next)
		if (strcmp(f->name, name) == 0)
			break;
	pthread_mutex_unlock(&reg->mu);
	return f;
}

int mr_metrics_on_collect(struct mr_metrics *reg, mr_metrics_collect_fn fn, void *user)
{
	int rc = 0;

	if (!reg || !fn)
		return MR_EINVAL;
	pthread_mutex_lock(&reg->mu);
	if (reg->nhooks == MR_METRICS_MAX_HOOKS)
		rc = MR_ELIMIT;
	else
		reg->hooks[reg->nhooks++] = (struct hook){fn, user};
	pthread_mutex_unlock(&reg->mu);
	return rc;
}

/* ---- children ----------------------------------------------------------- */

enum mr_metric_type mr_metric_type(const struct mr_metric_family *fam)
{
	return fam ? fam->type : MR_METRIC_COUNTER;
}

const char *mr_metric_name(const struct mr_metric_family *fam)
{
	return fam ? fam->name : "";
}

size_t mr_metric_label_count(const struct mr_metric_family *fam)
{
	return fam ? fam->nlabels : 0;
}

static struct child *child_new(const struct mr_metric_family *fam, const char *const *values)
{
	struct child *ch = calloc(1, sizeof(*ch));
	size_t total = 0, off = 0;

	if (!ch)
		return NULL;
	for (size_t i = 0; i < fam->nlabels; i++)
		total += strlen(values[i]) + 1;
	if (total) {
		ch->value_buf = malloc(total);
		if (!ch->value_buf)
			goto fail;
		for (size_t i = 0; i < fam->nlabels; i++) {
			size_t len = strlen(values[i]) + 1;
			memcpy(ch->value_buf + off, values[i], len);
			ch->values[i] = ch->value_buf + off;
			off += len;
		}
	}
	if (fam->type == MR_METRIC_HISTOGRAM) {
		ch->hist.bounds = fam->bounds;
		ch->hist.nb = fam->nb;
		ch->hist.counts = calloc(fam->nb + 1, sizeof(*ch->hist.counts));
		if (!ch->hist.counts)
			goto fail;
	}
	return ch;
fail:
	child_free(ch);
	return NULL;
}

static struct child *child_get(struct mr_metric_family *fam, enum mr_metric_type type,
			       const char *const *values)
{
	struct child *ch;

	if (!fam || fam->type != type || (fam->nlabels && !values))
		return NULL;
	for (size_t i = 0; i < fam->nlabels; i++)
		if (!values[i] || strlen(values[i]) > MR_METRICS_MAX_VALUE)
			return NULL;
	pthread_mutex_lock(&fam->mu);
	for (ch = fam->head; ch; ch = ch->next) {
		size_t i = 0;
		while (i < fam->nlabels && strcmp(ch->values[i], values[i]) == 0)
			i++;
		if (i == fam->nlabels)
			goto out;
	}
	if (fam->nchildren >= MR_METRICS_MAX_CHILDREN)
		goto out; /* ch is NULL */
	ch = child_new(fam, values);
	if (!ch)
		goto out;
	if (fam->tail)
		fam->tail->next = ch;
	else
		fam->head = ch;
	fam->tail = ch;
	fam->nchildren++;
out:
	pthread_mutex_unlock(&fam->mu);
	return ch;
}

static struct child *child_va(struct mr_metric_family *fam, enum mr_metric_type type,
			      va_list ap)
{
	const char *values[MR_METRICS_MAX_LABELS];

	if (!fam)
		return NULL;
	for (size_t i = 0; i < fam->nlabels; i++)
		values[i] = va_arg(ap, const char *);
	return child_get(fam, type, values);
}

struct mr_counter *mr_metric_counter_child(struct mr_metric_family *fam, ...)
{
	struct child *ch;
	va_list ap;

	va_start(ap, fam);
	ch = child_va(fam, MR_METRIC_COUNTER, ap);
	va_end(ap);
	return ch ? &ch->counter : NULL;
}

struct mr_gauge *mr_metric_gauge_child(struct mr_metric_family *fam, ...)
{
	struct child *ch;
	va_list ap;

	va_start(ap, fam);
	ch = child_va(fam, MR_METRIC_GAUGE, ap);
	va_end(ap);
	return ch ? &ch->gauge : NULL;
}

struct mr_histogram *mr_metric_histogram_child(struct mr_metric_family *fam, ...)
{
	struct child *ch;
	va_list ap;

	va_start(ap, fam);
	ch = child_va(fam, MR_METRIC_HISTOGRAM, ap);
	va_end(ap);
	return ch ? &ch->hist : NULL;
}

struct mr_counter *mr_metric_counter_childv(struct mr_metric_family *fam,
					    const char *const *values)
{
	struct child *ch = child_get(fam, MR_METRIC_COUNTER, values);

	return ch ? &ch->counter : NULL;
}

struct mr_gauge *mr_metric_gauge_childv(struct mr_metric_family *fam, const char *const *values)
{
	struct child *ch = child_get(fam, MR_METRIC_GAUGE, values);

	return ch ? &ch->gauge : NULL;
}

struct mr_histogram *mr_metric_histogram_childv(struct mr_metric_family *fam,
						const char *const *values)
{
	struct child *ch = child_get(fam, MR_METRIC_HISTOGRAM, values);

	return ch ? &ch->hist : NULL;
}
