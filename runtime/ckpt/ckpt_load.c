/*
 * ckpt_load.c - resuming from a checkpoint (see mr_ckpt.h): the newest
 * step every rank can load, each rank's owned and replicated slices read
 * from the records that cover them - directly when the tensor's tp and ep
 * layout is unchanged, through the whole tensor when it is not - then the
 * data-parallel state restored.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_int.h"
#include "comm/mr_comm.h"
#include "mr_log.h"

/* Badness of one rank's attempt, agreed on with a MAX over the world. */
enum { LOAD_OK = 0, LOAD_BAD = 1, LOAD_REFUSED = 2 };

/* The records of manifest tensor ti and kind (group_recs' grouping). */
int mr__ckpt_recs_of(int ti, int kind, const int **out, const int *index, const int *start)
{
	*out = index + start[ti * MR_CKPT_KINDS + kind];
	return start[ti * MR_CKPT_KINDS + kind + 1] - start[ti * MR_CKPT_KINDS + kind];
}

/* Record numbers grouped by (tensor, kind): index[start[g]..start[g+1]). */
int mr__ckpt_group_recs(const struct mr_ckpt_manifest *mf, int **index, int **start)
{
	int ng = mf->ntensors * MR_CKPT_KINDS, i, *fill;

	*index = malloc((size_t)(mf->nrecs ? mf->nrecs : 1) * sizeof(int));
	*start = calloc((size_t)ng + 1, sizeof(int));
	fill = calloc((size_t)ng + 1, sizeof(int));
	if (!*index || !*start || !fill) {
		free(fill);
		return MR_ENOMEM;
	}
	for (i = 0; i < mf->nrecs; i++)
		(*start)[mf->recs[i].tensor * MR_CKPT_KINDS + mf->recs[i].kind + 1]++;
	for (i = 0; i < ng; i++)
		(*start)[i + 1] += (*start)[i];
	for (i = 0; i < mf->nrecs; i++) {
		int g = mf->recs[i].tensor * MR_CKPT_KINDS + mf->recs[i].kind;
		(*index)[(*start)[g] + fill[g]++] = i;
	}
	free(fill);
	return 0;
}

/* A struct mr_gpt_tensor laid out as the slices of tp x ep cut t. */
static void layout_of(const struct mr_ckpt_tensor *t, int tp, int ep, struct mr_gpt_tensor *o)
{
	memset(o, 0, sizeof(*o));
	snprintf(o->name, sizeof(o->name), "%s", t->name);
	o->ndim = t->ndim;
	for (int k = 0; k < MR_AXIS__COUNT; k++)
		o->split[k] = -1;
	for (int k = 0; k < t->ndim; k++) {
		o->full[k] = o->shape[k] = t->full[k];
		if (k == t->tp_dim && tp > 1)
			o->shape[k] = (t->full[k] + tp - 1) / tp;
		if (k == 0 && t->expert && ep > 1)
			o->shape[k] /= ep;
	}
	o->split[MR_AXIS_TP] = tp > 1 ? t->tp_dim : -1;
	o->split[MR_AXIS_EP] = t->expert && ep > 1 ? 0 : -1;
	o->tp_dim = t->tp_dim;
	o->expert = t->expert;
	o->split_parts = t->parts;
	o->n = mr__ckpt_slice_n(t, tp, ep);
}

/* Records rs (nr) of one tensor and kind into the whole tensor: each
 * (tp rank, ep rank) slice assembled, then placed. */
int mr__ckpt_assemble(const struct mr_ckpt_manifest *mf, const int *rs, int nr, int *fds,
		    float *full, struct mr_errbuf *eb)
{
	const struct mr_ckpt_rec *r0 = &mf->recs[rs[0]];
	const struct mr_ckpt_tensor *t = &mf->tensors[r0->tensor];
	struct mr_gpt_tensor lay;
	float *local;
	int ti, ei, i, rc = 0;

	layout_of(t, r0->tp, r0->ep, &lay);
	if (!(local = calloc(lay.n ? lay.n : 1, sizeof(float))))
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", t->name);
	for (i = 0; i < nr && rc == 0; i++)
		if (mf->recs[rs[i]].tp != r0->tp || mf->recs[rs[i]].ep != r0->ep)
			rc = mr_errf(eb, MR_ECORRUPT, "'%s': tensor '%s' is saved in two layouts",
				     mf->dir, t->name);
	for (ti = 0; ti < r0->tp && rc == 0; ti++)
		for (ei = 0; ei < r0->ep && rc == 0; ei++) {
			int tr = r0->tp > 1 ? ti : -1, er = r0->ep > 1 ? ei : -1;
			memset(local, 0, lay.n * sizeof(float));
			for (i = 0; i < nr && rc == 0; i++) {
				const struct mr_ckpt_rec *r = &mf->recs[rs[i]];
				if (r->tp_rank == tr && r->ep_rank == er)
					rc = mr__ckpt_read_rec(mf, r, fds, local + r->at, eb);
			}
			if (rc == 0)
				mr_gpt_tensor_slice(&lay, r0->tp, ti, ei, full, local, 1);
		}
	free(local);
	return rc;
}

/* Elements [at, at+n) of the model's tensor ti (its current slice) of kind
 * into dst, from manifest tensor mi. 1: the checkpoint has no such kind. */
static int fill(struct mr_ckpt *c, const struct mr_ckpt_manifest *mf, int mi, int ti, int kind,
		uint64_t at, uint64_t n, float *dst, int *fds, const int *index, const int *start,
		struct mr_errbuf *eb)
{
	const struct mr_gpt *m = c->job.m;
	const struct mr_gpt_tensor *t = &m->tensors[ti];
	const struct mr_tp *mtp = &m->par.tp;
	const struct mr_ep *mep = &m->par.ep;
	/* the slice this rank holds: replicated key/value heads share one */
	int tp = mr_gpt_tensor_tp_slices(t, mtp->size);
	int ep = t->split[MR_AXIS_EP] >= 0 ? mep->size : 1;
	int tr = mr_gpt_tensor_tp_slice(t, mtp->size, mtp->rank), er = ep > 1 ? mep->rank : -1;
	int i, nr, rc = 0;
	const int *rs;
	uint64_t got = 0;
	float *full, *local;

	nr = mr__ckpt_recs_of(mi, kind, &rs, index, start);
	if (nr == 0)
		return 1;
	if (mf->recs[rs[0]].tp == tp && mf->recs[rs[0]].ep == ep) {
		/* the same layout: the records of this rank's slice that overlap */
		for (i = 0; i < nr && rc == 0; i++) {
			const struct mr_ckpt_rec *r = &mf->recs[rs[i]];
			uint64_t lo = r->at > at ? r->at : at;
			uint64_t hi = r->at + r->n < at + n ? r->at + r->n : at + n;
			float *buf;
			if (r->tp_rank != tr || r->ep_rank != er || lo >= hi)
				continue;
			if (!(buf = malloc(r->n * sizeof(float))))
				return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", t->name);
			rc = mr__ckpt_read_rec(mf, r, fds, buf, eb);
			if (rc == 0)
				memcpy(dst + (lo - at), buf + (lo - r->at), (hi - lo) * sizeof(float));
			free(buf);
			got += hi - lo;
		}
		if (rc == 0 && got != n)
			rc = mr_errf(eb, MR_ECORRUPT,
				     "'%s': tensor '%s' is missing %llu of this rank's elements",
				     mf->dir, t->name, (unsigned long long)(n - got));
		return rc;
	}
	/* another mesh's layout: through the whole tensor */
	full = calloc(mr_gpt_tensor_full_n(t), sizeof(float));
	local = calloc(t->n, sizeof(float));
	if (!full || !local)
		rc = mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", t->name);
	if (rc == 0)
		rc = mr__ckpt_assemble(mf, rs, nr, fds, full, eb);
	if (rc == 0) {
		mr_gpt_tensor_slice(t, mtp->size, mtp->rank, mep->rank, full, local, 0);
		memcpy(dst, local + at, n * sizeof(float));
	}
	free(full);
	free(local);
	return rc;
}

/* Loads the checkpoint in dir into this rank's slices; LOAD_* with eb. */
static int load_one(struct mr_ckpt *c, const char *dir, struct mr_ckpt_manifest *mf,
		    struct mr_errbuf *eb)
{
	struct mr_gpt *m = c->job.m;
	int *index = NULL, *start = NULL, *fds = NULL, i, k, rc;
	const char *field;
	float *buf = NULL;
	size_t most = 0;

	if (mr_ckpt_manifest_read(mf, dir, eb) < 0)
		return LOAD_BAD;
	if ((field = mr_ckpt_model_diff(&mf->model, &m->cfg))) {
		mr_errf_field(eb, MR_EINVAL, field,
			      "checkpoint '%s' is of another model: '%s' differs (n_layer %d d_model "
			      "%d vocab_size %d there)", dir, field, mf->model.n_layer,
			      mf->model.d_model, mf->model.vocab);
		return LOAD_REFUSED;
	}
	rc = mr__ckpt_group_recs(mf, &index, &start);
	fds = malloc((size_t)mf->nshards * sizeof(int));
	for (i = 0; fds && i < mf->nshards; i++)
		fds[i] = -1;
	for (i = 0; i < mr_dp_nslices(c->job.dp_state); i++) {
		struct mr_dp_slice s;
		mr_dp_slice(c->job.dp_state, i, &s);
		if (s.n > most)
			most = s.n;
	}
	if (rc < 0 || !fds || !(buf = malloc((most ? most : 1) * sizeof(float)))) {
		mr_errf(eb, MR_ENOMEM, "out of memory loading '%s'", dir);
		rc = MR_ENOMEM;
	}
	for (i = 0; rc == 0 && i < mr_dp_nslices(c->job.dp_state); i++) {
		struct mr_dp_slice s;
		int mi;
		mr_dp_slice(c->job.dp_state, i, &s);
		if ((mi = mr_ckpt_manifest_find(mf, m->tensors[s.tensor].name)) < 0) {
			rc = mr_errf(eb, MR_ECORRUPT, "'%s' has no tensor '%s'", dir,
				     m->tensors[s.tensor].name);
			break;
		}
		for (k = 0; k < MR_CKPT_KINDS && rc == 0; k++) {
			int f = fill(c, mf, mi, s.tensor, k, s.at, s.n, buf, fds, index, start, eb);
			if (f == 1 && k == MR_CKPT_PARAM)
				f = mr_errf(eb, MR_ECORRUPT, "'%s' has no parameters of '%s'", dir,
					    m->tensors[s.tensor].name);
			if (f == 1) /* no optimizer state (an imported model): zeros */
				memset(buf, 0, s.n * sizeof(float));
			/* to wherever it lives: the device, or the host (offload) */
			rc = f < 0 ? f : mr_dp_slice_write(c->job.dp_state, i, k, buf);
		}
	}
	mr__ckpt_close_fds(fds, mf->nshards);
	free(fds);
	free(buf);
	free(index);
	free(start);
	return rc < 0 ? LOAD_BAD : LOAD_OK;
}

/* The published steps rank 0 sees, the same on every rank. */
static int agree_steps(struct mr_ckpt *c, long *steps, struct mr_errbuf *eb)
{
	int64_t buf[CKPT_MAX_STEPS + 1];
	int n = 0, i, rc;

	memset(buf, 0, sizeof(buf));
	if (c->job.rank == 0) {
		long s[CKPT_MAX_STEPS];
		/* an unreadable directory is an error everywhere, never "no
		 * checkpoint": training from scratch would write over it */
		n = mr__ckpt_steps(c->dir, s, CKPT_MAX_STEPS, eb);
		buf[0] = n;
		for (i = 0; i < n; i++)
			buf[i + 1] = s[i];
	}
	if (c->job.world_comm &&
	    (rc = mr_comm_broadcast(c->job.world_comm, buf, CKPT_MAX_STEPS + 1, MR_COMM_I64, 0)) < 0)
		return mr_errf(eb, rc, "unable to agree on the checkpoints: %s", mr_strerror(rc));
	if (buf[0] < 0)
		return mr_errf(eb, MR_EIO, "rank 0 cannot list the checkpoints in '%s'", c->dir);
	n = (int)buf[0];
	for (i = 0; i < n; i++)
		steps[i] = (long)buf[i + 1];
	return n;
}

static int agree(struct mr_ckpt *c, int mine, int *all)
{
	int32_t v = mine;
	int rc = 0;

	if (c->job.world_comm)
		rc = mr_comm_allreduce(c->job.world_comm, &v, &v, 1, MR_COMM_I32, MR_COMM_MAX);
	*all = v;
	return rc;
}

int mr_ckpt_resume(struct mr_ckpt *c, long *step, struct mr_errbuf *eb)
{
	long steps[CKPT_MAX_STEPS];
	struct mr_errbuf first = { "", "" };
	int n = agree_steps(c, steps, eb), i, rc;

	*step = 0;
	if (n < 0)
		return n;
	for (i = 0; i < n; i++) {
		struct mr_ckpt_manifest mf;
		struct mr_errbuf le = { "", "" };
		char dir[4200];
		int mine, all;
		mr__ckpt_step_dir(dir, sizeof(dir), c->dir, steps[i]);
		mine = load_one(c, dir, &mf, &le);
		if ((rc = agree(c, mine, &all)) < 0) {
			mr_ckpt_manifest_release(&mf);
			return mr_errf(eb, rc, "unable to agree on checkpoint '%s': %s", dir,
				       mr_strerror(rc));
		}
		if (all == LOAD_OK) {
			long t = mf.opt_steps;
			*step = mf.step;
			mr_ckpt_manifest_release(&mf);
			if ((rc = mr_dp_restore(c->job.dp_state, t)) < 0)
				return mr_errf(eb, rc, "unable to restore step %ld: %s", *step,
					       mr_strerror(rc));
			pthread_mutex_lock(&c->lock);
			c->st.resumed_step = c->st.last_step = *step;
			pthread_mutex_unlock(&c->lock);
			if (c->job.rank == 0)
				mr_log_info("checkpoint_resumed", "step=%ld dir=%s", *step,
					    mr_log_q(dir));
			return 0;
		}
		mr_ckpt_manifest_release(&mf);
		if (mine == LOAD_OK)
			snprintf(le.msg, sizeof(le.msg), "another rank could not load step %ld",
				 steps[i]);
		if (!first.msg[0])
			first = le;
		if (all == LOAD_REFUSED)
			return mine == LOAD_REFUSED
				       ? mr_errf_field(eb, MR_EINVAL, le.field, "%s", le.msg)
				       : mr_errf(eb, MR_EINVAL, "%s", le.msg);
		mr_log_warn("checkpoint_skipped", "dir=%s why=%s", mr_log_q(dir), mr_log_q(le.msg));
	}
	if (n > 0)
		return mr_errf(eb, MR_ECORRUPT, "no loadable checkpoint in '%s' (%d tried): %s",
			       c->dir, n, first.msg);
	return 0;
}
