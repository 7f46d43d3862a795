/*
 * ckpt_save.c - writing checkpoints (see mr_ckpt.h): the directory's lock,
 * the snapshot of a rank's owned slices, the writer thread, the ranks
 * agreeing whether every part was written, and rank 0 publishing the step
 * directory once every rank's index is there.
 *
 * A failed part fails the whole checkpoint, everywhere, and nothing
 * waits for it: the failing rank leaves a marker (rank-N.failed) rank 0's
 * publisher sees at once, and at the next save (or the final wait) the
 * ranks agree, in one all-reduce, whether every part was written - the
 * marker may be impossible on a full disk. The previous step stays the
 * newest; training goes on, and the job's last checkpoint (or a
 * preemption's) failing fails the job.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
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

/* an earlier run of the same job may hold the lock this long (well within
 * the communication timeout the other ranks wait for rank 0 with) */
#define LOCK_WAIT_S 20

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

/* Rank 0 at start, holding the directory's lock: temporary and replaced
 * directories of earlier attempts (a writer killed mid-save) go - the
 * lock proves their writers are gone. */
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

/* Rank 0: <dir>/lock, naming this job. Another job's lock is refused at
 * once (MR_EINVAL on 'ckpt_dir': the same on every run); an earlier
 * incarnation of this job (same run id: a replaced pod still stopping)
 * is waited for, up to LOCK_WAIT_S (then MR_ECONFLICT: a restart may find
 * it gone). A filesystem without locks is used unlocked, with a warning,
 * and its leftovers are kept (nothing proves them stale). */
static int take_lock(struct mr_ckpt *c, struct mr_errbuf *eb)
{
	char path[4200], holder[700], who[700], mine[300], host[256] = "";
	double until = now_s() + LOCK_WAIT_S;
	struct mr_errbuf le = { "", "" };
	int rc;

	snprintf(path, sizeof(path), "%s/lock", c->dir);
	gethostname(host, sizeof(host) - 1);
	snprintf(mine, sizeof(mine), "run '%.200s'", c->job.run_id ? c->job.run_id : "-");
	snprintf(holder, sizeof(holder), "job '%.200s' (%s), rank 0 pid %ld on '%.100s'",
		 c->job.job_name ? c->job.job_name : "-", mine, (long)getpid(),
		 host[0] ? host : "-");
	while ((rc = mr_file_lock(path, holder, &c->lock_fd, who, sizeof(who), &le)) ==
		       MR_ECONFLICT &&
	       c->job.run_id && strstr(who, mine) && now_s() < until &&
	       !atomic_load(&c->cancel))
		usleep(100 * 1000);
	if (rc == MR_ENOTSUP) {
		mr_log_warn("ckpt_lock_unsupported", "dir=%s msg=%s", mr_log_q(c->dir),
			    mr_log_q(le.msg));
		return 0;
	}
	if (rc == MR_ECONFLICT && !(c->job.run_id && strstr(who, mine)))
		return mr_errf_field(eb, MR_EINVAL, "ckpt_dir",
				     "'ckpt_dir' '%s' is in use by %s: one job per checkpoint "
				     "directory (its lock '%s')", c->dir, who, path);
	if (rc == MR_ECONFLICT)
		return mr_errf_field(eb, MR_ECONFLICT, "ckpt_dir",
				     "'ckpt_dir' '%s' is still held by an earlier run of this job "
				     "(%s) after %d s", c->dir, who, LOCK_WAIT_S);
	if (rc < 0)
		return mr_errf_field(eb, rc, "ckpt_dir", "%s", le.msg);
	remove_leftovers(c->dir);
	return 0;
}

int mr_ckpt_create(struct mr_ckpt **out, const struct mr_ckpt_opts *o,
		   const struct mr_ckpt_job *job, struct mr_errbuf *eb)
{
	struct mr_ckpt *c = calloc(1, sizeof(*c));
	int64_t agreed[2] = { 0, 0 }; /* rank 0's result, the attempt's nonce */
	int rc;

	*out = NULL;
	if (!c)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the checkpoint state");
	c->o = *o;
	c->job = *job;
	c->lock_fd = -1;
	snprintf(c->dir, sizeof(c->dir), "%s", o->dir);
	c->o.dir = c->dir;
	if (c->o.keep < 1)
		c->o.keep = 1;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->part_cond, NULL);
	atomic_init(&c->cancel, 0);
	atomic_init(&c->abandon, 0);
	if ((rc = mr__ckpt_make_dirs(c->dir, eb)) < 0 || (rc = plan_pieces(c, eb)) < 0) {
		mr_ckpt_free(c);
		return rc;
	}
	/* rank 0 takes the directory (clearing earlier attempts' leftovers)
	 * and names this attempt's temporary directories for everyone; its
	 * refusal is everyone's */
	if (job->rank == 0) {
		agreed[0] = take_lock(c, eb);
		agreed[1] = (int64_t)(((uint64_t)time(NULL) << 20) ^ ((uint64_t)getpid() << 40) ^
				      (uint64_t)(now_s() * 1e9));
	}
	if (job->world_comm &&
	    (rc = mr_comm_broadcast(job->world_comm, agreed, 2, MR_COMM_I64, 0)) < 0) {
		mr_ckpt_free(c);
		return mr_errf(eb, rc, "unable to agree on the checkpoint attempt: %s",
			       mr_strerror(rc));
	}
	if (agreed[0] < 0) {
		mr_ckpt_free(c);
		if (job->rank == 0)
			return (int)agreed[0];
		return mr_errf_field(eb, (int)agreed[0], "ckpt_dir",
				     "rank 0 could not take 'ckpt_dir' '%s' (%s; its log says why)",
				     o->dir, mr_strerror((int)agreed[0]));
	}
	c->nonce = (uint64_t)agreed[1];
	*out = c;
	return 0;
}

int mr_ckpt_due(const struct mr_ckpt *c, long step)
{
	return c && c->o.every > 0 && step > 0 && step % c->o.every == 0;
}

/* A rank's marker of its failed part (best effort: on a full disk even
 * this may fail; the ranks' agreement at the next save covers that). */
static void mark_failed(const char *tmp, int rank, const char *why)
{
	char path[4400];
	int fd;

	snprintf(path, sizeof(path), "%s/rank-%05d.failed", tmp, rank);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0644);
	if (fd >= 0) {
		if (mr_file_write_all(fd, why, strlen(why)) != 0)
			errno = 0; /* the marker's existence is what counts */
		close(fd);
	}
}

/* Rank 0: whether rank r gave up on its part (its marker, or the ranks'
 * agreement); the reason into eb. */
static int part_failed(struct mr_ckpt *c, const char *tmp, int r, long step,
		       struct mr_errbuf *eb)
{
	char path[4400], why[400] = "";
	int fd, a = atomic_load(&c->abandon);
	ssize_t n;

	snprintf(path, sizeof(path), "%s/rank-%05d.failed", tmp, r);
	if ((fd = mr_file_open_regular(path, NULL, NULL, NULL)) >= 0) {
		n = read(fd, why, sizeof(why) - 1);
		why[n > 0 ? n : 0] = '\0';
		close(fd);
		mr_errf(eb, MR_EIO, "step %ld not published: rank %d could not write its part: %s",
			step, r, why[0] ? why : "(no reason given)");
		return 1;
	}
	if (a) {
		mr_errf(eb, MR_EIO, "step %ld not published: rank %d could not write its part",
			step, a - 1);
		return 1;
	}
	return 0;
}

/* Rank 0: waits for every rank's index in tmp, then the manifest. */
static json_t *collect(struct mr_ckpt *c, const char *tmp, long step, long opt_steps,
		       struct mr_errbuf *eb)
{
	int n = c->job.world, r, fd;
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
			if (part_failed(c, tmp, r, step, eb))
				goto out;
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
		if ((fd = mr_file_open_regular(path, NULL, NULL, eb)) < 0)
			goto out;
		idx[r] = json_loadfd(fd, 0, &je);
		close(fd);
		if (!idx[r]) {
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

/* Rank 0 after publishing: the newest `keep` steps stay, older ones go.
 * Only steps whose manifest reads count: a step directory that does not
 * (someone's junk, a damaged step) is reported and left alone, never the
 * reason a good step is removed. */
static void prune(struct mr_ckpt *c, long published)
{
	long steps[CKPT_MAX_STEPS];
	int k = mr__ckpt_steps(c->dir, steps, CKPT_MAX_STEPS, NULL), valid = 0;
	char path[4400];

	for (int i = 0; i < k; i++) {
		mr__ckpt_step_dir(path, sizeof(path), c->dir, steps[i]);
		if (steps[i] != published) {
			struct mr_errbuf me = { "", "" };
			struct mr_ckpt_manifest mf;
			if (mr_ckpt_manifest_read(&mf, path, &me) < 0) {
				mr_log_warn("checkpoint_junk", "dir=%s why=%s", mr_log_q(path),
					    mr_log_q(me.msg));
				continue;
			}
			mr_ckpt_manifest_release(&mf);
		}
		if (++valid > c->o.keep)
			mr__ckpt_remove_dir(path);
	}
}

/* Rank 0: the manifest written, the directory published as step-N (an
 * older step-N - an unloadable one a resume passed over - moved aside
 * first), old steps beyond `keep` removed. */
static int publish(struct mr_ckpt *c, const char *tmp, long step, long opt_steps,
		   struct mr_errbuf *eb)
{
	char path[4400], final[4400], aside[4400];
	json_t *doc = collect(c, tmp, step, opt_steps, eb);
	struct stat st;
	size_t n = 0;
	char *text;
	int rc, moved = 0;

	if (!doc)
		return MR_EIO;
	text = mr__ckpt_manifest_text(doc, &n);
	json_decref(doc);
	if (!text)
		return mr_errf(eb, MR_ENOMEM, "unable to write the manifest of step %ld", step);
	snprintf(path, sizeof(path), "%s/manifest.json", tmp);
	rc = mr__ckpt_write_file(path, NULL, 0, text, n, eb);
	free(text);
	if (rc < 0 || (rc = mr_file_sync_dir(tmp, eb)) < 0)
		return rc;
	if (c->o.publish_delay_ms > 0) { /* the first publish only */
		long ms = c->o.publish_delay_ms;

		c->o.publish_delay_ms = 0;
		mr_log_info("debug_checkpoint_publish_delay", "step=%ld ms=%ld", step, ms);
		usleep((useconds_t)ms * 1000);
	}
	if (c->o.fence && (rc = c->o.fence(c->o.fence_arg, eb)) < 0) {
		mr_log_warn("checkpoint_fenced", "step=%ld dir=%s why=%s", step, mr_log_q(tmp),
			    mr_log_q(eb->msg));
		mr__ckpt_remove_dir(tmp);
		return rc;
	}
	mr__ckpt_step_dir(final, sizeof(final), c->dir, step);
	snprintf(aside, sizeof(aside), "%s/.replaced-step-%08ld.%016llx", c->dir, step,
		 (unsigned long long)c->nonce);
	if (lstat(final, &st) == 0) {
		/* an older step-N a resume passed over is replaced; anything
		 * else there is not ours to move */
		if (!S_ISDIR(st.st_mode))
			return mr_errf(eb, MR_EEXISTS, "unable to publish step %ld: '%s' is in the "
				       "way and not a step directory (remove it)", step, final);
		if (rename(final, aside) != 0)
			return mr_errf(eb, MR_EIO, "unable to move '%s' aside: %s", final,
				       strerror(errno));
		moved = 1;
	}
	if (rename(tmp, final) != 0)
		return mr_errf(eb, MR_EIO, "unable to publish '%s': %s", final, strerror(errno));
	if ((rc = mr_file_sync_dir(c->dir, eb)) < 0)
		return rc;
	if (moved)
		mr__ckpt_remove_dir(aside);
	prune(c, step);
	return 0;
}

/* This rank's part of c->wstep's snapshot: its shard and index in the
 * attempt's temporary directory. */
static int write_part(struct mr_ckpt *c, const char *tmp, struct mr_errbuf *eb)
{
	char path[4400], *head = (char *)c->image;
	long step = c->wstep;
	uint64_t bytes = c->image_bytes;
	uint32_t ver = MR_CKPT_VERSION, rank = (uint32_t)c->job.rank;
	json_t *idx;
	char *text;
	int i, k, rc;

	if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
		return mr_errf(eb, MR_EIO, "unable to create '%s': %s", tmp, strerror(errno));
	if (c->o.fail_step == step)
		return mr_errf(eb, MR_EIO, "unable to write '%s/rank-%05d.bin.tmp': %s (injected: "
			       "debug_ckpt_fail_step)", tmp, c->job.rank, strerror(ENOSPC));
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
	return rc;
}

/* The write: this rank's part (a failure marked for rank 0), then - in
 * the background - rank 0 publishing; without a thread rank 0 publishes
 * after the ranks agreed (finish_write). */
static void *writer(void *arg)
{
	struct mr_ckpt *c = arg;
	struct sched_param sp = { 0 };
	char tmp[4200];
	int rc;

	/* a background write takes only CPU time training leaves idle: on a
	 * CPU rank the compute threads keep every core busy, and a writer at
	 * normal priority would stall a whole parallel region each time it
	 * preempts one of them (the next save waits for this one, so it
	 * cannot starve) */
	if (c->o.async)
		pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
	tmp_dir(c, c->wstep, tmp, sizeof(tmp));
	rc = write_part(c, tmp, &c->web);
	if (rc < 0 && c->job.rank != 0 && !c->o.fail_unmarked)
		mark_failed(tmp, c->job.rank, c->web.msg);
	pthread_mutex_lock(&c->lock);
	c->part_rc = rc;
	c->part_done = 1;
	pthread_cond_broadcast(&c->part_cond);
	pthread_mutex_unlock(&c->lock);
	if (rc == 0 && c->job.rank == 0 && c->o.async)
		rc = publish(c, tmp, c->wstep, c->wopt, &c->web);
	if (rc == 0 && c->job.rank == 0 && c->o.async) {
		/* saved: say so now, not when the ranks next agree on it (at the
		 * next save or the end) */
		c->wsecs = now_s() - c->t0;
		mr_log_info("checkpoint_saved", "step=%ld seconds=%.3f bytes=%llu dir=%s",
			    c->wstep, c->wsecs, (unsigned long long)c->st.last_bytes,
			    mr_log_q(c->dir));
	}
	c->wrc = rc;
	return NULL;
}

/* Collective: waits for this rank's part, then every rank learns whether
 * all parts were written; the first rank that failed (-1: none). With
 * abort, no collective (the job is stopping): this rank's part only. */
static int agree_parts(struct mr_ckpt *c, int collective)
{
	int32_t v;

	pthread_mutex_lock(&c->lock);
	while (!c->part_done)
		pthread_cond_wait(&c->part_cond, &c->lock);
	v = c->part_rc < 0 ? c->job.world - c->job.rank : 0;
	pthread_mutex_unlock(&c->lock);
	if (collective && c->job.world_comm &&
	    mr_comm_allreduce(c->job.world_comm, &v, &v, 1, MR_COMM_I32, MR_COMM_MAX) < 0)
		v = c->job.world - c->job.rank; /* the job is failing: so is this write */
	return v ? c->job.world - v : -1;
}

/* The write in flight ended: the ranks agree on it (collective), rank 0
 * stops waiting for a part that failed, the thread is joined; logged
 * and counted. Its result: 0, or the failure - this rank's part, or
 * (peer = 1) another rank's. */
static int finish_write(struct mr_ckpt *c, int collective, int *peer, struct mr_errbuf *eb)
{
	char tmp[4200];
	double secs;
	int rc, failed;

	*peer = 0;
	if (!c->running)
		return 0;
	failed = agree_parts(c, collective);
	if (failed >= 0 && c->job.rank == 0)
		atomic_store(&c->abandon, failed + 1);
	tmp_dir(c, c->wstep, tmp, sizeof(tmp));
	if (c->threaded)
		pthread_join(c->thread, NULL);
	else if (c->job.rank == 0 && failed < 0 && c->wrc == 0)
		c->wrc = publish(c, tmp, c->wstep, c->wopt, &c->web);
	c->running = c->threaded = 0;
	atomic_store(&c->abandon, 0);
	rc = c->wrc;
	if (rc == 0 && failed >= 0) {
		rc = MR_EIO;
		*peer = 1;
		mr_errf(&c->web, rc, "step %ld not saved: rank %d could not write its part", c->wstep,
			failed);
	}
	secs = now_s() - c->t0;
	if (rc < 0) {
		if (c->job.rank == 0) /* what the ranks wrote of a failed step goes */
			mr__ckpt_remove_dir(tmp);
		if (!*peer || c->job.rank == 0)
			mr_log_error("checkpoint_failed", "step=%ld err=%s msg=%s", c->wstep,
				     mr_err_name(rc), mr_log_q(c->web.msg));
		pthread_mutex_lock(&c->lock);
		c->st.failures += !*peer || c->job.rank == 0;
		pthread_mutex_unlock(&c->lock);
		return mr_errf(eb, rc, "checkpoint of step %ld failed: %s", c->wstep, c->web.msg);
	}
	pthread_mutex_lock(&c->lock);
	c->st.last_step = c->wstep;
	c->st.last_seconds = c->wsecs > 0 ? c->wsecs : secs;
	c->st.saves++;
	pthread_mutex_unlock(&c->lock);
	if (c->job.rank == 0 && c->wsecs <= 0) /* else its writer said it */
		mr_log_info("checkpoint_saved", "step=%ld seconds=%.3f bytes=%llu dir=%s", c->wstep,
			    secs, (unsigned long long)c->st.last_bytes, mr_log_q(c->dir));
	return 0;
}

int mr_ckpt_wait(struct mr_ckpt *c, struct mr_errbuf *eb)
{
	int peer;

	return c ? finish_write(c, 1, &peer, eb) : 0;
}

int mr_ckpt_wait_published(struct mr_ckpt *c, long step, long timeout_ms, struct mr_errbuf *eb)
{
	char path[4400];
	double end = now_s() + (double)timeout_ms / 1e3;
	struct stat st;

	if (!c || c->job.rank == 0) /* its wait published it */
		return 0;
	mr__ckpt_step_dir(path, sizeof(path), c->dir, step);
	strncat(path, "/manifest.json", sizeof(path) - strlen(path) - 1);
	while (stat(path, &st) != 0) {
		if (atomic_load(&c->cancel))
			return mr_errf(eb, MR_EABORTED, "aborted waiting for step %ld's publish", step);
		if (now_s() >= end)
			return mr_errf(eb, MR_ETIMEDOUT, "step %ld was not published within %ld ms "
					   "(rank 0 logs why)", step, timeout_ms);
		usleep(20 * 1000);
	}
	return 0;
}

int mr_ckpt_save(struct mr_ckpt *c, long step, struct mr_errbuf *eb)
{
	double t0 = now_s();
	int i, k, j = 0, n = mr_dp_nslices(c->job.dp_state), rc, peer;

	/* the previous write's failure is logged there; only the ranks that
	 * failed it (and rank 0, which did not publish) report it here */
	rc = finish_write(c, 1, &peer, eb);
	if (rc < 0 && peer && c->job.rank != 0)
		rc = 0;
	c->wstep = step;
	c->wopt = mr_dp_steps(c->job.dp_state);
	c->wrc = 0;
	c->part_done = 0;
	c->part_rc = 0;
	mr_errbuf_clear(&c->web);
	c->t0 = t0;
	c->wsecs = 0;
	c->running = 1;
	/* the snapshot: every owned slice's param, m and v to host memory */
	for (i = 0; i < n && c->wrc == 0; i++) {
		struct mr_dp_slice s;
		mr_dp_slice(c->job.dp_state, i, &s);
		if (!s.owner)
			continue;
		for (k = 0; k < MR_CKPT_KINDS && c->wrc == 0; k++) {
			/* from wherever it lives: the device, or the host (offload) */
			float *dst = (float *)(void *)(c->image + c->pc[j].offset) + (size_t)k * s.n;
			int drc = mr_dp_slice_read(c->job.dp_state, i, k, dst);
			if (drc < 0)
				c->wrc = mr_errf(&c->web, drc, "unable to snapshot '%s' for step %ld",
						 c->job.m->tensors[s.tensor].name, step);
		}
		j++;
	}
	if (c->wrc < 0) {
		/* a failed part like any other: the ranks agree on it (at the
		 * next save in the background, at once otherwise) */
		c->part_rc = c->wrc;
		c->part_done = 1;
	} else if (c->o.async && pthread_create(&c->thread, NULL, writer, c) == 0) {
		c->threaded = 1;
	} else {
		c->o.async = 0; /* no thread: written here, from now on */
		writer(c);
	}
	if (!c->o.async && finish_write(c, 1, &peer, eb) < 0 && (!peer || c->job.rank == 0))
		rc = MR_EIO;
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

void mr_ckpt_abort(struct mr_ckpt *c)
{
	if (c)
		atomic_store(&c->cancel, 1);
}

void mr_ckpt_free(struct mr_ckpt *c)
{
	int peer;

	if (!c)
		return;
	atomic_store(&c->cancel, 1);
	finish_write(c, 0, &peer, NULL);
	if (c->lock_fd >= 0)
		close(c->lock_fd);
	free(c->pc);
	free(c->image);
	pthread_cond_destroy(&c->part_cond);
	pthread_mutex_destroy(&c->lock);
	free(c);
}
