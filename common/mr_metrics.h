/*
 * mr_metrics.h - Prometheus metrics registry and text exposition (0.0.4).
 *
 * A registry holds metric families (counter, gauge, histogram) in
 * registration order; a family has 0..MR_METRICS_MAX_LABELS label names,
 * fixed at creation ("route,status"), and one child per distinct tuple of
 * label values, in creation order. Hot paths look a child up once, keep the
 * pointer and update it with a lock-free atomic operation:
 *
 *   struct mr_metric_family *req = mr_metrics_counter(reg,
 *       "meshrun_http_requests_total", "HTTP requests handled.",
 *       "route,status");
 *   struct mr_counter *ok = mr_metric_counter_child(req, "join", "200");
 *   mr_counter_inc(ok);
 *
 * Thread-safety: every function may be called from any thread. Updates are
 * C11 atomics (doubles as their uint64 bit pattern, CAS loop); child
 * creation and rendering take the family's mutex. Collect hooks run right
 * before rendering, serialised by the registry, and may set gauges or create
 * children but must not render.
 *
 * Ownership: the registry owns its families and children; their pointers
 * stay valid until mr_metrics_free(). Label names, values and help texts are
 * copied. A NULL family or child makes every accessor and update a no-op
 * (returns NULL / 0), so a failed registration never crashes a hot path.
 *
 * Bounds: a label value is at most MR_METRICS_MAX_VALUE bytes and a family
 * at most MR_METRICS_MAX_CHILDREN children; past either, the child lookup
 * returns NULL (and its updates are dropped).
 *
 * Naming is the caller's job (Prometheus conventions: base units, counters
 * end in _total, `_seconds`, `_bytes`); the registry only checks syntax:
 * names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]*
 * and do not start with "__"; histograms may not use the label "le".
 *
 * Non-goals: summaries, timestamps, exemplars, OpenMetrics, removing
 * children, push gateways.
 */
#ifndef MR_METRICS_H
#define MR_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "mr_err.h"

#define MR_METRICS_MAX_LABELS 16
#define MR_METRICS_MAX_BUCKETS 64
#define MR_METRICS_MAX_VALUE 1024
#define MR_METRICS_MAX_CHILDREN 100000
#define MR_METRICS_MAX_HOOKS 32
/* Content-Type of mr_metrics_render() output. */
#define MR_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

enum mr_metric_type {
	MR_METRIC_COUNTER,
	MR_METRIC_GAUGE,
	MR_METRIC_HISTOGRAM,
};

struct mr_metrics;       /* registry */
struct mr_metric_family; /* one metric name */
struct mr_counter;       /* one child of a counter family */
struct mr_gauge;
struct mr_histogram;

/* Latency buckets in seconds, 0.5 ms .. 10 s (for request histograms). */
extern const double mr_metrics_latency_buckets[];
extern const size_t mr_metrics_latency_nbuckets;

/* ---- registry -------------------------------------------------------- */

/* NULL on OOM. Free with mr_metrics_free(); NULL is a no-op. */
struct mr_metrics *mr_metrics_new(void);
void mr_metrics_free(struct mr_metrics *reg);

/*
 * Registers a family. labels: comma-separated label names ("route,status"),
 * NULL or "" for none. buckets: strictly increasing finite upper bounds
 * for histograms (+Inf is implicit), ignored otherwise; NULL/0 means
 * mr_metrics_latency_buckets. A family without labels gets its only child
 * at once, so it renders 0 before the first update.
 * Errors: MR_EINVAL (bad name, label, bucket; message names it),
 * MR_EEXISTS (name taken), MR_ELIMIT, MR_ENOMEM. *out is owned by reg.
 */
int mr_metrics_add(struct mr_metrics *reg, enum mr_metric_type type, const char *name,
		   const char *help, const char *labels, const double *buckets, size_t nbuckets,
		   struct mr_metric_family **out, struct mr_errbuf *eb);

/* Shorthands for mr_metrics_add(); NULL on any error (the error is logged
 * with mr_log_error). */
struct mr_metric_family *mr_metrics_counter(struct mr_metrics *reg, const char *name,
					    const char *help, const char *labels);
struct mr_metric_family *mr_metrics_gauge(struct mr_metrics *reg, const char *name,
					  const char *help, const char *labels);
struct mr_metric_family *mr_metrics_histogram(struct mr_metrics *reg, const char *name,
					      const char *help, const char *labels,
					      const double *buckets, size_t nbuckets);

/* The family registered under name, or NULL. */
struct mr_metric_family *mr_metrics_find(struct mr_metrics *reg, const char *name);

/*
 * fn(reg, user) runs right before every render, in registration order, so
 * owners can copy their state into gauges. At most MR_METRICS_MAX_HOOKS.
 */
typedef void (*mr_metrics_collect_fn)(struct mr_metrics *reg, void *user);
int mr_metrics_on_collect(struct mr_metrics *reg, mr_metrics_collect_fn fn, void *user);

/*
 * Runs the collect hooks, then renders every family with at least one child
 * in text format 0.0.4. *out is malloc'd and NUL-terminated (free() it);
 * *len excludes the NUL and may be NULL. MR_ENOMEM on failure.
 */
int mr_metrics_render(struct mr_metrics *reg, char **out, size_t *len);

/* ---- families and children ------------------------------------------- */

enum mr_metric_type mr_metric_type(const struct mr_metric_family *fam);
const char *mr_metric_name(const struct mr_metric_family *fam);
size_t mr_metric_label_count(const struct mr_metric_family *fam);

/*
 * Child for the given label values, created on first use. The variadic
 * forms read exactly mr_metric_label_count(fam) `const char *` arguments
 * (none for an unlabeled family); the v forms take an array of that many.
 * NULL if fam is NULL or of another type, a value is NULL or too long, the
 * family is full, or memory runs out. Lookup is a linear scan under the
 * family mutex: keep the pointer on hot paths.
 */
struct mr_counter *mr_metric_counter_child(struct mr_metric_family *fam, ...);
struct mr_gauge *mr_metric_gauge_child(struct mr_metric_family *fam, ...);
struct mr_histogram *mr_metric_histogram_child(struct mr_metric_family *fam, ...);
struct mr_counter *mr_metric_counter_childv(struct mr_metric_family *fam,
					    const char *const *values);
struct mr_gauge *mr_metric_gauge_childv(struct mr_metric_family *fam, const char *const *values);
struct mr_histogram *mr_metric_histogram_childv(struct mr_metric_family *fam,
						const char *const *values);

/* ---- updates: lock-free, any thread; NULL child is a no-op ------------ */

void mr_counter_inc(struct mr_counter *c);
/* v < 0 or NaN is ignored (counters only go up). */
void mr_counter_add(struct mr_counter *c, double v);
double mr_counter_value(const struct mr_counter *c);

void mr_gauge_set(struct mr_gauge *g, double v);
void mr_gauge_add(struct mr_gauge *g, double v);
void mr_gauge_inc(struct mr_gauge *g);
void mr_gauge_dec(struct mr_gauge *g);
double mr_gauge_value(const struct mr_gauge *g);

/* NaN observations are ignored. */
void mr_histogram_observe(struct mr_histogram *h, double v);
uint64_t mr_histogram_count(const struct mr_histogram *h);
double mr_histogram_sum(const struct mr_histogram *h);

/* ---- helpers (exposed for tests and other text producers) ------------ */

/* Formats v the way Prometheus parses it: "+Inf", "-Inf", "NaN", integers
 * without exponent or fraction below 1e15, otherwise the shortest %g form
 * that reads back exactly. Returns the length; buf of >= 32 bytes. */
int mr_metrics_format_double(double v, char *buf, size_t size);
/* 1 if name matches [a-zA-Z_:][a-zA-Z0-9_:]*, else 0. */
int mr_metrics_valid_name(const char *name);
/* 1 if a valid label name (and not reserved "__..."), else 0. */
int mr_metrics_valid_label(const char *name);

#endif
