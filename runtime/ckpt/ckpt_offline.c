/*
 * ckpt_offline.c - checkpoints outside a job (see mr_ckpt.h): whole
 * tensors read back, every record verified, and a one-rank checkpoint of
 * a model's parameters written (what `meshrun ckpt` uses).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "mr_crc32c.h"

int mr_ckpt_read_model(const struct mr_ckpt_manifest *mf, const struct mr_gpt *m, float *dst,
		       struct mr_errbuf *eb)
{
	int i, rc = 0;

	if (mf->ntensors != m->ntensors)
		return mr_errf(eb, MR_ECORRUPT, "'%s' holds %d tensors, its model has %d", mf->dir,
			       mf->ntensors, m->ntensors);
	for (i = 0; rc == 0 && i < m->ntensors; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i];
		int mi = mr_ckpt_manifest_find(mf, t->name), same;

		same = mi >= 0 && mf->tensors[mi].ndim == t->ndim;
		for (int k = 0; same && k < t->ndim; k++)
			same = mf->tensors[mi].full[k] == t->full[k];
		if (!same)
			rc = mr_errf(eb, MR_ECORRUPT, "'%s': tensor '%s' is %s", mf->dir, t->name,
				     mi < 0 ? "missing" : "not shaped as its model says");
		else
			rc = mr_ckpt_read_full(mf, mi, MR_CKPT_PARAM, dst + t->off, eb);
	}
	return rc;
}

int mr_ckpt_read_full(const struct mr_ckpt_manifest *mf, int i, int kind, float *full,
		      struct mr_errbuf *eb)
{
	int *index = NULL, *start = NULL, *fds, nr, k, rc;
	const int *rs;

	if (i < 0 || i >= mf->ntensors || kind < 0 || kind >= MR_CKPT_KINDS)
		return mr_errf(eb, MR_EINVAL, "no tensor %d of kind %d", i, kind);
	if (!(fds = malloc((size_t)mf->nshards * sizeof(int))) ||
	    mr__ckpt_group_recs(mf, &index, &start) < 0) {
		free(fds);
		free(index);
		free(start);
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", mf->dir);
	}
	for (k = 0; k < mf->nshards; k++)
		fds[k] = -1;
	memset(full, 0, mr__ckpt_full_n(&mf->tensors[i]) * sizeof(float));
	nr = mr__ckpt_recs_of(i, kind, &rs, index, start);
	rc = nr == 0 ? mr_errf(eb, MR_ENOTFOUND, "'%s' holds no %s of '%s'", mf->dir,
			       kind == MR_CKPT_PARAM ? "parameters" : "optimizer state",
			       mf->tensors[i].name)
		     : mr__ckpt_assemble(mf, rs, nr, fds, full, eb);
	mr__ckpt_close_fds(fds, mf->nshards);
	free(fds);
	free(index);
	free(start);
	return rc;
}

int mr_ckpt_verify(const struct mr_ckpt_manifest *mf, uint64_t *bytes, struct mr_errbuf *eb)
{
	int *fds = malloc((size_t)mf->nshards * sizeof(int)), i, rc = 0;
	uint64_t most = 0, done = 0;
	float *buf;

	for (i = 0; i < mf->nrecs; i++)
		if (mf->recs[i].n > most)
			most = mf->recs[i].n;
	buf = malloc((size_t)(most ? most : 1) * sizeof(float));
	if (!fds || !buf) {
		free(fds);
		free(buf);
		return mr_errf(eb, MR_ENOMEM, "out of memory verifying '%s'", mf->dir);
	}
	/* every shard's size and header, records or not */
	for (i = 0; i < mf->nshards; i++)
		if ((fds[i] = rc == 0 ? mr__ckpt_open_shard(mf, i, eb) : -1) < 0) {
			rc = rc ? rc : fds[i];
			fds[i] = -1;
		}
	for (i = 0; i < mf->nrecs && rc == 0; i++) {
		rc = mr__ckpt_read_rec(mf, &mf->recs[i], fds, buf, eb);
		done += mf->recs[i].n * sizeof(float);
	}
	mr__ckpt_close_fds(fds, mf->nshards);
	free(fds);
	free(buf);
	if (bytes)
		*bytes = rc == 0 ? done : 0;
	return rc;
}

/* The checkpoint directory's lock (a job's, mr_ckpt_create): an import
 * writes nowhere a job or another import is writing. */
static int lock_dir(const char *ckpt_dir, int *fd, struct mr_errbuf *eb)
{
	char path[4200], who[600], holder[64];
	int rc;

	snprintf(path, sizeof(path), "%s/lock", ckpt_dir);
	snprintf(holder, sizeof(holder), "meshrun ckpt import (pid %ld)", (long)getpid());
	rc = mr_file_lock(path, holder, fd, who, sizeof(who), eb);
	if (rc == MR_ECONFLICT)
		return mr_errf(eb, rc, "'%s' is in use by %s: one writer per checkpoint directory",
			       ckpt_dir, who);
	return rc == MR_ENOTSUP ? 0 : rc; /* no locks there: as a job, unlocked */
}

int mr_ckpt_write_params(const char *ckpt_dir, const struct mr_gpt_config *cfg, long step,
			 const float *params, struct mr_errbuf *eb)
{
	struct mr_adamw_config opt = { 0 };
	struct mr_ckpt_job job = { 0 };
	struct ckpt_piece *pc = NULL;
	char tmp[4200], path[4400], final[4200], head[CKPT_HEADER];
	uint64_t off = CKPT_HEADER;
	uint32_t ver = MR_CKPT_VERSION;
	json_t *idx = NULL, *doc = NULL;
	char *text = NULL;
	struct mr_gpt m;
	size_t tn = 0;
	int i, rc, lock_fd = -1;

	if ((rc = mr_gpt_create(&m, cfg, 1, 1, NULL, eb)) < 0)
		return rc;
	job.world = job.tp = job.cp = job.dp = job.pp = job.ep = 1;
	job.batch_size = job.seq_len = job.grad_accum = 1;
	job.opt = &opt;
	job.m = &m;
	mr__ckpt_step_dir(final, sizeof(final), ckpt_dir, step);
	snprintf(tmp, sizeof(tmp), "%s/.tmp-step-%08ld.import-%d", ckpt_dir, step, (int)getpid());
	if ((rc = mr__ckpt_make_dirs(ckpt_dir, eb)) == 0)
		rc = lock_dir(ckpt_dir, &lock_fd, eb);
	if (rc < 0)
		;
	else if (access(final, F_OK) == 0)
		rc = mr_errf(eb, MR_EEXISTS, "'%s' exists: nothing is overwritten", final);
	else if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
		rc = mr_errf(eb, MR_EIO, "unable to create '%s': %s", tmp, strerror(errno));
	else if (!(pc = calloc((size_t)m.ntensors, sizeof(*pc))))
		rc = mr_errf(eb, MR_ENOMEM, "out of memory");
	for (i = 0; rc == 0 && i < m.ntensors; i++) {
		pc[i].tensor = i;
		pc[i].n = m.tensors[i].n;
		pc[i].offset = off;
		pc[i].crc[0] = mr_crc32c(0, params + m.tensors[i].off, m.tensors[i].n * sizeof(float));
		off += m.tensors[i].n * sizeof(float);
	}
	memset(head, 0, sizeof(head));
	memcpy(head, CKPT_MAGIC, 8);
	memcpy(head + 8, &ver, 4);
	memcpy(head + 16, &(int64_t){ step }, 8);
	snprintf(path, sizeof(path), "%s/rank-00000.bin", tmp);
	if (rc == 0)
		rc = mr__ckpt_write_file(path, head, sizeof(head), params,
					 m.nparams * sizeof(float), eb);
	if (rc == 0 && (!(idx = mr__ckpt_index_json(&job, pc, m.ntensors, 1, off)) ||
			!(doc = mr__ckpt_manifest_json(&job, step, 0, &idx, 1, eb)) ||
			!(text = mr__ckpt_manifest_text(doc, &tn))))
		rc = mr_errf(eb, MR_ENOMEM, "unable to build the manifest");
	if (rc == 0) {
		/* the rank's index, as a job writes it beside its shard */
		char *itext = json_dumps(idx, JSON_COMPACT);
		snprintf(path, sizeof(path), "%s/rank-00000.json", tmp);
		rc = itext ? mr__ckpt_write_file(path, NULL, 0, itext, strlen(itext), eb)
			   : mr_errf(eb, MR_ENOMEM, "out of memory");
		free(itext);
	}
	snprintf(path, sizeof(path), "%s/manifest.json", tmp);
	if (rc == 0)
		rc = mr__ckpt_write_file(path, NULL, 0, text, tn, eb);
	if (rc == 0 && rename(tmp, final) != 0)
		rc = mr_errf(eb, MR_EIO, "unable to publish '%s': %s", final, strerror(errno));
	if (rc == 0)
		rc = mr_file_sync_dir(ckpt_dir, eb);
	else
		mr__ckpt_remove_dir(tmp);
	if (lock_fd >= 0)
		close(lock_fd);
	free(text);
	json_decref(doc);
	json_decref(idx);
	free(pc);
	mr_gpt_release(&m);
	return rc;
}
