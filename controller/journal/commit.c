/*
 * commit.c - group commit of the journal (see journal.h): the batch, the
 * synchronous commit, the writer thread of the pipelined commit, and
 * compaction while running.
 *
 * A commit is a job: the batch (swapped out of the loop's hands) and, when
 * a compaction is due, a snapshot of the live state encoded on the loop
 * thread at hand-off. The writer (or the loop, for a synchronous commit)
 * runs the job: a compaction replaces the file with the snapshot and drops
 * the batch, whose effects the snapshot holds; if the snapshot cannot be
 * written before the rename, the batch is appended to the old file
 * instead. Only one job exists at a time, so a compaction never races an
 * append, and the replies of the batch leave after the job either way.
 *
 * Non-goals: opening (open.c), record bytes (record.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "journal_int.h"
#include "mr_file.h"
#include "mr_log.h"

struct ctl_jbuf *mr__jr_batch(struct ctl_journal *jr)
{
	return &jr->batch;
}

/* A compaction owed after an error waits for the next batch (no retry
 * loop while the disk fails; its replies were answered 503). */
int mr__jr_pending(const struct ctl_journal *jr)
{
	return jr && (jr->batch.len || jr->batch.failed);
}

int mr__jr_inflight(const struct ctl_journal *jr)
{
	return jr && jr->inflight;
}

uint64_t mr__jr_seq(const struct ctl_journal *jr)
{
	return jr ? jr->seq : 0;
}

uint64_t mr__jr_inflight_seq(const struct ctl_journal *jr)
{
	return jr && jr->inflight ? jr->wseq : 0;
}

uint64_t mr__jr_durable(const struct ctl_journal *jr)
{
	return jr ? jr->durable : UINT64_MAX;
}

uint64_t mr__jr_size(const struct ctl_journal *jr)
{
	return jr ? jr->size : 0;
}

uint64_t mr__jr_compactions(const struct ctl_journal *jr)
{
	return jr ? jr->compactions : 0;
}

/* 1 if the file, after `size` bytes, has outgrown the last snapshot. */
static int compaction_due(const struct ctl_journal *jr, uint64_t size)
{
	return jr->compact_factor > 0 && size > jr->compact_min &&
	       size / (uint64_t)jr->compact_factor > jr->snap_size;
}

/* On the loop thread: moves the batch into the job and, if a compaction is
 * due (or forced, or needed after a lost batch), encodes the snapshot.
 * MR_ENOMEM if the batch is lost and no snapshot could replace it. */
static int prepare(struct ctl_journal *jr, int force)
{
	struct ctl_jbuf spare = jr->wbatch;
	int must = jr->batch.failed || jr->need_compact;

	jr->wbatch = jr->batch;
	jr->wseq = jr->seq++;
	jr->batch = spare;
	jr->batch.len = jr->batch.rec_start = 0;
	jr->batch.failed = 0;
	jr->wcompact = must || force || compaction_due(jr, jr->size + jr->wbatch.len);
	jr->wmust = must;
	jr->wreplaced = 0;
	jr->wsnap.len = 0;
	if (jr->wcompact && jr->ops.snapshot(jr->ops.state, &jr->wsnap)) {
		mr__jbuf_release(&jr->wsnap);
		jr->wcompact = 0;
		mr_log_error("journal_compaction_failed", "path=%s err=%s", mr_log_q(jr->path),
			     mr_err_name(MR_ENOMEM));
		if (jr->wmust) { /* the file has a hole that only a snapshot fills */
			jr->need_compact = 1;
			jr->wbatch.len = 0;
			jr->wbatch.failed = 0;
			return MR_ENOMEM;
		}
	}
	jr->need_compact = 0;
	return 0;
}

/* Appends the job's batch and syncs it; on error the file is cut back to
 * its last good size, so no partial record stays in its middle. */
static int append(struct ctl_journal *jr)
{
	int err = mr_file_write_all(jr->fd, jr->wbatch.p, jr->wbatch.len) ? MR_EIO : 0;

	if (!err && jr->do_fsync && fdatasync(jr->fd))
		err = MR_EIO;
	if (!err && jr->dir_dirty && jr->do_fsync) { /* a rename not yet durable */
		if (mr_file_sync_dir(jr->dir, NULL))
			err = MR_EIO;
		else
			jr->dir_dirty = 0;
	}
	if (err) {
		mr_errf(&jr->wmsg, err, "unable to append to '%s': %s", jr->path, strerror(errno));
		if (ftruncate(jr->fd, (off_t)jr->size))
			mr_errf(&jr->wmsg, err, "unable to truncate '%s'", jr->path);
	}
	return err;
}

/* Runs the job on the calling thread (the writer, or the loop). */
static int run_job(struct ctl_journal *jr)
{
	int err, fd = -1, renamed = 0;

	mr_errbuf_clear(&jr->wmsg);
	if (!jr->wcompact)
		return jr->wbatch.len ? append(jr) : 0;
	err = mr__jr_replace(jr->tmp, jr->path, jr->dir, jr->wsnap.p, jr->wsnap.len,
			     jr->do_fsync, &fd, &renamed, &jr->wmsg);
	if (renamed) { /* the snapshot is the journal now; appends go on there */
		close(jr->fd);
		jr->fd = fd;
		jr->wreplaced = 1;
		jr->dir_dirty = err != 0;
		return err;
	}
	if (jr->wmust)
		return err;
	return jr->wbatch.len ? append(jr) : 0; /* the old file is intact: fall back */
}

/* On the loop thread, after the job: accounting, logs, buffers. */
static int finish(struct ctl_journal *jr, int err)
{
	uint64_t before = jr->size + jr->wbatch.len;

	if (jr->wreplaced) {
		jr->size = jr->snap_size = jr->wsnap.len;
		jr->compactions++;
		mr_log_info("journal_compacted", "path=%s bytes_before=%llu bytes=%llu",
			    mr_log_q(jr->path), (unsigned long long)before,
			    (unsigned long long)jr->size);
	} else if (jr->wcompact) {
		mr_log_error("journal_compaction_failed", "path=%s batch=%s err=%s",
			     mr_log_q(jr->path), err ? "lost" : "appended", mr_log_q(jr->wmsg.msg));
	}
	if (err) {
		mr_log_error("journal_write_failed", "path=%s err=%s", mr_log_q(jr->path),
			     mr_log_q(jr->wmsg.msg[0] ? jr->wmsg.msg : mr_strerror(err)));
		if (!jr->wreplaced) /* the batch is not in the file: a snapshot must be */
			jr->need_compact = 1;
	} else if (!jr->wreplaced) {
		jr->size += jr->wbatch.len;
	}
	if (!err)
		jr->durable = jr->wseq;
	jr->wbatch.len = 0;
	if (jr->wbatch.cap > (1u << 20)) /* give back a burst's buffer */
		mr__jbuf_release(&jr->wbatch);
	mr__jbuf_release(&jr->wsnap);
	return err;
}

static int commit_now(struct ctl_journal *jr, int force)
{
	int err;

	if (!jr || jr->inflight || (!force && !mr__jr_pending(jr)))
		return 0;
	err = prepare(jr, force);
	if (err)
		return err;
	return finish(jr, run_job(jr));
}

int mr__jr_commit(struct ctl_journal *jr)
{
	return commit_now(jr, 0);
}

int mr__jr_compact(struct ctl_journal *jr)
{
	return commit_now(jr, 1);
}

static void *writer_main(void *arg)
{
	struct ctl_journal *jr = arg;
	int err;

	pthread_mutex_lock(&jr->mu);
	for (;;) {
		while (!jr->job && !jr->stop)
			pthread_cond_wait(&jr->cv, &jr->mu);
		if (!jr->job)
			break;
		pthread_mutex_unlock(&jr->mu);
		err = run_job(jr);
		pthread_mutex_lock(&jr->mu);
		jr->werr = err;
		jr->job = 0; /* before done(): the loop may hand off the next at once */
		atomic_store(&jr->wdone, 1);
		pthread_mutex_unlock(&jr->mu);
		jr->done(jr->done_arg);
		pthread_mutex_lock(&jr->mu);
	}
	pthread_mutex_unlock(&jr->mu);
	return NULL;
}

int mr__jr_commit_start(struct ctl_journal *jr, void (*done)(void *arg), void *arg)
{
	int err;

	if (!jr || jr->inflight || !mr__jr_pending(jr))
		return 0;
	err = prepare(jr, 0);
	if (err)
		return err;
	if (!jr->writer_started) {
		if (pthread_create(&jr->writer, NULL, writer_main, jr))
			return finish(jr, run_job(jr)); /* 0: written, nothing in flight */
		jr->writer_started = 1;
	}
	jr->done = done;
	jr->done_arg = arg;
	jr->inflight = 1;
	atomic_store(&jr->wdone, 0);
	pthread_mutex_lock(&jr->mu);
	jr->job = 1;
	pthread_cond_signal(&jr->cv);
	pthread_mutex_unlock(&jr->mu);
	return 1;
}

int mr__jr_writer_done(const struct ctl_journal *jr)
{
	return jr && jr->inflight && atomic_load(&((struct ctl_journal *)jr)->wdone);
}

int mr__jr_commit_finish(struct ctl_journal *jr)
{
	int err;

	if (!jr || !jr->inflight)
		return 0;
	pthread_mutex_lock(&jr->mu); /* werr and the job's fields were set before it */
	err = jr->werr;
	pthread_mutex_unlock(&jr->mu);
	jr->inflight = 0;
	return finish(jr, err);
}

void mr__jr_free_writer(struct ctl_journal *jr)
{
	if (!jr || !jr->writer_started)
		return;
	pthread_mutex_lock(&jr->mu);
	jr->stop = 1;
	pthread_cond_signal(&jr->cv);
	pthread_mutex_unlock(&jr->mu);
	pthread_join(jr->writer, NULL); /* a batch handed off is written first */
	jr->writer_started = 0;
}
