/*
 * metrics_int.h - the registry's structures, shared by metrics.c (families,
 * children, values) and metrics_text.c (rendering); see mr_metrics.h.
 */
#ifndef MR_METRICS_INT_H
#define MR_METRICS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "mr_metrics.h"

struct mr_counter {
	_Atomic uint64_t bits;
};

struct mr_gauge {
	_Atomic uint64_t bits;
};

struct mr_histogram {
	const double *bounds; /* the family's, nb of them */
	size_t nb;
	_Atomic uint64_t sum;     /* double bits */
	_Atomic uint64_t *counts; /* nb + 1, last is +Inf */
};

struct child {
	struct child *next;
	char *values[MR_METRICS_MAX_LABELS]; /* point into one allocation */
	char *value_buf;
	struct mr_counter counter;
	struct mr_gauge gauge;
	struct mr_histogram hist;
};

struct mr_metric_family {
	struct mr_metric_family *next;
	enum mr_metric_type type;
	char *name;
	char *help;
	size_t nlabels;
	char *labels[MR_METRICS_MAX_LABELS];
	double *bounds;
	size_t nb;
	pthread_mutex_t mu;
	struct child *head, *tail;
	size_t nchildren;
};

struct hook {
	mr_metrics_collect_fn fn;
	void *user;
};

struct mr_metrics {
	pthread_mutex_t mu;
	pthread_mutex_t render_mu;
	struct mr_metric_family *head, *tail;
	struct hook hooks[MR_METRICS_MAX_HOOKS];
	size_t nhooks;
};

/* The double stored as IEEE-754 bits in *p. */
double mr__metrics_get_double(const _Atomic uint64_t *p);

#endif
