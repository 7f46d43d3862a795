/*
 * ckpt_save.c - writing checkpoints (see mr_ckpt.h): the snapshot of a
 * rank's owned slices, the writer thread, and rank 0 publishing the step
 * directory once every rank's index is there.
 */
#include <dirent.h>
#include <sched.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "comm/mr_comm.h"
#include "mr_crc32c.h"
#include "mr_log.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void tmp_dir(const struct mr_ckpt *c, long step, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s/.tmp-step-%08ld.%016llx", c->dir, step,
		 (unsigned long long)c->nonce);
}

/* Rank 0 at start: temporary and replaced directories of earlier attempts
 * (a writer killed mid-save) go. */
static void remove_leftovers(const char *dir)
{
	char **names = NULL, path[4400];
	int n = 0, cap = 0;
	DIR *d = opendir(dir);
	struct dirent *e;

	while (d && (e = readdir(d))) {
		if (strncmp(e->d_name, ".tmp-step-", 10) && strncmp(e->d_name, ".replaced-step-", 15))
			continue;
		if (n == cap) {
			char **g = realloc(names, (size_t)(cap = cap ? 2 * cap : 8) * sizeof(*g));
			if (!g)
				break;
			names = g;
		}
		if (!(names[n] = strdup(e->d_name)))
			break;
		n++;
	}
	if (d)
		closedir(d);
	for (int i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		mr_log_info("ckpt_leftover_removed", "dir=%s", mr_log_q(path));
		mr__ckpt_remove_dir(path);
		free(names[i]);
	}
	free(names);
}

/* The owned slices, their place in the file, and the snapshot buffer. */
static int plan_pieces(struct mr_ckpt *c, struct mr_errbuf *eb)
{
	int n = mr_dp_nslices(c->job.dp_state), i;
	uint64_t off = CKPT_HEADER;

	c->pc = calloc((size_t)(n ? n : 1), sizeof(*c->pc));
	if (!c->pc)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the checkpoint plan");
	for (i = 0; i < n; i++) {
		struct mr_dp_slice s;
		mr_dp_slice(c->job.dp_state, i, &s);
		if (!s.owner)
			continue;
		c->pc[c->npc].tensor = s.tensor;
		c->pc[c->npc].at = s.at;
		c->pc[c->npc].n = s.n;
		c->pc[c->npc].offset = off;
		off += (uint64_t)MR_CKPT_KINDS * s.n * sizeof(float);
		c->npc++;
	}
	c->image_bytes = (size_t)((off + CKPT_ALIGN - 1) / CKPT_ALIGN * CKPT_ALIGN);
	if (posix_memalign((void **)&c->image, CKPT_ALIGN, c->image_bytes) != 0) {
		c->image = NULL;
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the checkpoint snapshot (%zu MiB)",
			       c->image_bytes >> 20);
	}
	/* touched now, not in the first save's step */
	memset(c->image, 0, c->image_bytes);
	return 0;
}

int mr_ckpt_create(struct mr_ckpt **out, const struct mr_ckpt_opts *o,
		   const struct mr_ckpt_job *job, struct mr_errbuf *eb)
{
	struct mr_ckpt *c = calloc(1, sizeof(*c));
	int64_t nonce = 0;
	int rc;

	*out = NULL;
	if (!c)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the checkpoint state");
	c->o = *o;
	c->job = *job;
	snprintf(c->dir, sizeof(c->dir), "%s", o->dir);
	c->o.dir = c->dir;
	if (c->o.keep < 1)
		c->o.keep = 1;
	pthread_mutex_init(&c->lock, NULL);
	atomic_init(&c->cancel, 0);
	if ((rc = mr__ckpt_make_dirs(c->dir, eb)) < 0 || (rc = plan_pieces(c, eb)) < 0) {
		mr_ckpt_free(c);
		return rc;
	}
	/* rank 0 clears earlier attempts' leftovers, then names this one's
	 * temporary directories for everyone */
	if (job->rank == 0) {
		remove_leftovers(c->dir);
		nonce = (int64_t)(((uint64_t)time(NULL) << 20) ^ ((uint64_t)getpid() << 40) ^
				  (uint64_t)(now_s() * 1e9));
	}
	if (job->world_comm &&
	    (rc = mr_comm_broadcast(job->world_comm, &nonce, 1, MR_COMM_I64, 0)) < 0) {
		mr_ckpt_free(c);
		return mr_errf(eb, rc, "unable to agree on the checkpoint attempt: %s",
			       mr_strerror(rc));
	}
	c->nonce = (uint64_t)nonce;
	*out = c;
	return 0;
}

int mr_ckpt_due(const struct mr_ckpt *c, long step)
{
	return c && c->o.every > 0 && step > 0 && step % c->o.every == 0;
}

/* Rank 0: waits for every rank's index in tmp, then the manifest. */
static json_t *collect(struct mr_ckpt *c, const char *tmp, long step, long opt_steps,
		       struct mr_errbuf *eb)
{
	int n = c->job.world, r;
	json_t **idx = calloc((size_t)n, sizeof(*idx)), *doc = NULL;
	double until = now_s() + (double)c->o.timeout_ms / 1000.0;
	char path[4400];

	if (!idx) {
		mr_errf(eb, MR_ENOMEM, "out of memory publishing step %ld", step);
		return NULL;
	}
	for (r = 0; r < n; r++) {
		json_error_t je;
		snprintf(path, sizeof(path), "%s/rank-%05d.json", tmp, r);
		while (access(path, F_OK) != 0) {
			if (atomic_load(&c->cancel)) {
				mr_errf(eb, MR_EABORTED, "step %ld not published: the workers stopped "
					"before rank %d wrote its part", step, r);
				goto out;
			}
			if (now_s() > until) {
				mr_errf(eb, MR_ETIMEDOUT,
					"rank %d did not write its part of step %ld within %ld ms", r,
					step, c->o.timeout_ms);
				goto out;
			}
			usleep(5000);
		}
		if (!(idx[r] = json_load_file(path, 0, &je))) {
			mr_errf(eb, MR_ECORRUPT, "'%s': %s", path, je.text);
			goto out;
		}
	}
	doc = mr__ckpt_manifest_json(&c->job, step, opt_steps, idx, n, eb);
out:
	for (r = 0; r < n; r++)
		json_decref(idx[r]);
	free(idx);
	return doc;
}

/* Rank 0: the manifest written, the directory published as step-N (an
 * older step-N - an unloadable one a resume passed over - moved aside
 * first), old steps beyond `keep` removed. */
static int publish(struct mr_ckpt *c, const char *tmp, long step, long opt_steps,
		   struct mr_errbuf *eb)
{
	char path[4400], final[4400], aside[4400];
	long steps[CKPT_MAX_STEPS];
	json_t *doc = collect(c, tmp, step, opt_steps, eb);
	char *text;
	int rc, k, i, moved = 0;

	if (!doc)
		return MR_EIO;
	text = json_dumps(doc, JSON_COMPACT);
	json_decref(doc);
	if (!text)
		return mr_errf(eb, MR_ENOMEM, "unable to write the manifest of step %ld", step);
	snprintf(path, sizeof(path), "%s/manifest.json", tmp);
	rc = mr__ckpt_write_file(path, NULL, 0, text, strlen(text), eb);
	free(text);
	if (rc < 0 || (rc = mr__ckpt_sync_dir(tmp, eb)) < 0)
		return rc;
	mr__ckpt_step_dir(final, sizeof(final), c->dir, step);
	snprintf(aside, sizeof(aside), "%s/.replaced-step-%08ld.%016llx", c->dir, step,
		 (unsigned long long)c->nonce);
	if (access(final, F_OK) == 0) {
		if (rename(final, aside) != 0)
			return mr_errf(eb, MR_EIO, "unable to move '%s' aside: %s", final,
				       strerror(errno));
		moved = 1;
	}
	if (rename(tmp, final) != 0)
		return mr_errf(eb, MR_EIO, "unable to publish '%s': %s", final, strerror(errno));
	if ((rc = mr__ckpt_sync_dir(c->dir, eb)) < 0)
		return rc;
	if (moved)
		mr__ckpt_remove_dir(aside);
	k = mr__ckpt_steps(c->dir, steps, CKPT_MAX_STEPS, NULL);
	for (i = c->o.keep; i < k; i++) {
		mr__ckpt_step_dir(path, sizeof(path), c->dir, steps[i]);
		mr__ckpt_remove_dir(path);
	}
	return 0;
}

/* The write of c->wstep's snapshot: the rank's shard and index, then
 * (rank 0) publishing. */
static int write_step(struct mr_ckpt *c, struct mr_errbuf *eb)
{
	char tmp[4200], path[4400], *head = (char *)c->image;
	long step = c->wstep;
	uint64_t bytes = c->image_bytes;
	uint32_t ver = MR_CKPT_VERSION, rank = (uint32_t)c->job.rank;
	json_t *idx;
	char *text;
	int i, k, rc;

	tmp_dir(c, step, tmp, sizeof(tmp));
	if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
		return mr_errf(eb, MR_EIO, "unable to create '%s': %s", tmp, strerror(errno));
	for (i = 0; i < c->npc; i++)
		for (k = 0; k < MR_CKPT_KINDS; k++)
			c->pc[i].crc[k] = mr_crc32c(
				0, (float *)(void *)(c->image + c->pc[i].offset) + (size_t)k * c->pc[i].n,
				c->pc[i].n * sizeof(float));
	memset(head, 0, CKPT_HEADER);
	memcpy(head, CKPT_MAGIC, 8);
	memcpy(head + 8, &ver, 4);
	memcpy(head + 12, &rank, 4);
	memcpy(head + 16, &(int64_t){ step }, 8);
	snprintf(path, sizeof(path), "%s/rank-%05d.bin", tmp, c->job.rank);
	if ((rc = mr__ckpt_write_image(path, c->image, c->image_bytes, eb)) < 0)
		return rc;
	idx = mr__ckpt_index_json(&c->job, c->pc, c->npc, MR_CKPT_KINDS, bytes);
	text = idx ? json_dumps(idx, JSON_COMPACT) : NULL;
	json_decref(idx);
	if (!text)
		return mr_errf(eb, MR_ENOMEM, "unable to write the index of step %ld", step);
	snprintf(path, sizeof(path), "%s/rank-%05d.json", tmp, c->job.rank);
	rc = mr__ckpt_write_file(path, NULL, 0, text, strlen(text), eb);
	free(text);
	pthread_mutex_lock(&c->lock);
	c->st.last_bytes = bytes;
	pthread_mutex_unlock(&c->lock);
	if (rc == 0 && c->job.rank == 0)
		rc = publish(c, tmp, step, c->wopt, eb);
	return rc;
}

static void *writer(void *arg)
{
	struct mr_ckpt *c = arg;
	struct sched_param sp = { 0 };

	/* a background write takes only CPU time training leaves idle: on a
	 * CPU rank the compute threads keep every core busy, and a writer at
	 * normal priority would stall a whole parallel region each time it
	 * preempts one of them (the next save waits for this one, so it
	 * cannot starve) */
	if (c->o.async)
		pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
	c->wrc = write_step(c, &c->web);
	return NULL;
}

/* The previous write's end: joined, logged, counted. */
static int finish_write(struct mr_ckpt *c, struct mr_errbuf *eb)
{
	double secs;
	int rc;

	if (!c->running)
		return 0;
	if (c->o.async)
		pthread_join(c->thread, NULL);
	c->running = 0;
	rc = c->wrc;
	secs = now_s() - c->t0;
	if (rc < 0) {
		mr_log_error("checkpoint_failed", "step=%ld err=%s msg=%s", c->wstep, mr_err_name(rc),
			     mr_log_q(c->web.msg));
		return mr_errf(eb, rc, "checkpoint of step %ld failed: %s", c->wstep, c->web.msg);
	}
	pthread_mutex_lock(&c->lock);
	c->st.last_step = c->wstep;
	c->st.last_seconds = secs;
	c->st.saves++;
	pthread_mutex_unlock(&c->lock);
	if (c->job.rank == 0)
		mr_log_info("checkpoint_saved", "step=%ld seconds=%.3f bytes=%llu dir=%s", c->wstep,
			    secs, (unsigned long long)c->st.last_bytes, mr_log_q(c->dir));
	return 0;
}

int mr_ckpt_wait(struct mr_ckpt *c, struct mr_errbuf *eb)
{
	return c ? finish_write(c, eb) : 0;
}

int mr_ckpt_save(struct mr_ckpt *c, long step, struct mr_errbuf *eb)
{
	struct mr_dev *dev = c->job.m->dev;
	double t0 = now_s();
	int i, k, j = 0, n = mr_dp_nslices(c->job.dp_state), rc;

	rc = finish_write(c, eb);
	/* the snapshot: every owned slice's param, m and v to host memory */
	for (i = 0; i < n; i++) {
		struct mr_dp_slice s;
		mr_dp_slice(c->job.dp_state, i, &s);
		if (!s.owner)
			continue;
		for (k = 0; k < MR_CKPT_KINDS; k++) {
			const float *src = k == 0 ? s.param : k == 1 ? s.m : s.v;
			float *dst = (float *)(void *)(c->image + c->pc[j].offset) + (size_t)k * s.n;
			int drc = dev->ops->download(dev, dst, src, s.n * sizeof(float));
			if (drc < 0)
				return mr_errf(eb, drc, "unable to snapshot '%s' for step %ld",
					       c->job.m->tensors[s.tensor].name, step);
		}
		j++;
	}
	c->wstep = step;
	c->wopt = mr_dp_steps(c->job.dp_state);
	c->wrc = 0;
	mr_errbuf_clear(&c->web);
	c->t0 = t0;
	c->running = 1;
	if (c->o.async && pthread_create(&c->thread, NULL, writer, c) != 0)
		c->o.async = 0; /* write here instead */
	if (!c->o.async) {
		writer(c);
		rc = finish_write(c, eb) < 0 ? MR_EIO : rc;
	}
	pthread_mutex_lock(&c->lock);
	c->st.stall_seconds = now_s() - t0;
	pthread_mutex_unlock(&c->lock);
	return rc;
}

void mr_ckpt_stats(struct mr_ckpt *c, struct mr_ckpt_stats *st)
{
	pthread_mutex_lock(&c->lock);
	*st = c->st;
	pthread_mutex_unlock(&c->lock);
}

void mr_ckpt_free(struct mr_ckpt *c)
{
	if (!c)
		return;
	atomic_store(&c->cancel, 1);
	finish_write(c, NULL);
	free(c->pc);
	free(c->image);
	pthread_mutex_destroy(&c->lock);
	free(c);
}
