/*
 * open.c - opening the journal (see journal.h): lock the data dir, read
 * and replay the journal through the state's table, refuse a corrupt one
 * (or, with recover, preserve it and keep its valid prefix), compact, and
 * open the new file for appends; and freeing it.
 *
 * Non-goals: group commit and compaction while running (commit.c), file
 * primitives (file.c), record bytes (record.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "journal_int.h"
#include "mr_log.h"

static int set_paths(struct ctl_journal *jr, const char *dir, struct mr_errbuf *eb)
{
	if (snprintf(jr->dir, sizeof(jr->dir), "%s", dir) >= (int)sizeof(jr->dir) ||
	    snprintf(jr->path, sizeof(jr->path), "%s/journal", dir) >= (int)sizeof(jr->path))
		return mr_errf_field(eb, MR_EINVAL, "data_dir", "data dir '%.200s' is too long",
				     dir);
	snprintf(jr->tmp, sizeof(jr->tmp), "%s.tmp", jr->path);
	return 0;
}

/* The verdict of replay: 0 to go on (clean, torn tail dropped, or
 * recovered), or the error that stops the open. */
static int judge(struct ctl_journal *jr, const struct ctl_jr_scan *s, int recover,
		 const unsigned char *data, size_t len, struct ctl_journal_info *info,
		 struct mr_errbuf *eb)
{
	unsigned long long recs = (unsigned long long)s->records;
	int err;

	if (s->err)
		return mr_errf(eb, s->err, "unable to replay '%s' at offset %zu: %s", jr->path,
			       s->good, s->why);
	if (s->verdict == CTL_JR_TORN) {
		mr_log_warn("journal_tail_dropped",
			    "path=%s offset=%zu records=%llu dropped_bytes=%zu why=%s",
			    mr_log_q(jr->path), s->good, recs, len - s->good, mr_log_q(s->why));
		return 0;
	}
	if (s->verdict != CTL_JR_CORRUPT)
		return 0;
	if (!recover)
		return mr_errf_field(eb, MR_ECORRUPT, "data_dir",
				     "journal '%s' is corrupt at offset %zu (after %llu good "
				     "records): %s; start with --journal-recover to keep the "
				     "first %llu records (the original is then kept as "
				     "'%s.corrupt.<unix-time>')",
				     jr->path, s->good, recs, s->why, recs, jr->path);
	err = mr__jr_preserve(jr->path, jr->dir, data, len, info->kept, sizeof(info->kept), eb);
	if (err)
		return err;
	mr_log_warn("journal_recovered",
		    "path=%s kept=%s offset=%zu records=%llu dropped_bytes=%zu why=%s",
		    mr_log_q(jr->path), mr_log_q(info->kept), s->good, recs, len - s->good,
		    mr_log_q(s->why));
	return 0;
}

int mr__jr_open(struct ctl_journal **out, const struct ctl_journal_opts *o,
		const struct ctl_jr_ops *ops, struct ctl_journal_info *info,
		struct mr_errbuf *eb)
{
	struct ctl_journal *jr = calloc(1, sizeof(*jr));
	struct ctl_jbuf snap = { 0 };
	struct ctl_jr_scan scan;
	unsigned char *data = NULL;
	size_t len = 0;
	int err, renamed;

	*out = NULL;
	memset(info, 0, sizeof(*info));
	if (!jr)
		return mr_errf(eb, MR_ENOMEM, "out of memory");
	jr->fd = jr->lock_fd = -1;
	jr->seq = 1; /* batch 0: what was replayed, durable */
	jr->do_fsync = o->fsync;
	jr->compact_factor = o->compact_factor;
	jr->compact_min = o->compact_min;
	jr->ops = *ops;
	pthread_mutex_init(&jr->mu, NULL);
	pthread_cond_init(&jr->cv, NULL);
	err = set_paths(jr, o->dir, eb);
	if (err)
		goto out;
	if (mkdir(o->dir, 0700) && errno != EEXIST) {
		err = mr_errf_field(eb, MR_EIO, "data_dir", "unable to create '%s': %s", o->dir,
				    strerror(errno));
		goto out;
	}
	/* before anything is read: a second controller must not replay, let
	 * alone compact, a journal that another one is appending to */
	err = mr__jr_lock(o->dir, &jr->lock_fd, eb);
	if (err)
		goto out;
	err = mr__jr_read_file(jr->path, &data, &len, eb);
	if (err)
		goto out;
	mr__jr_replay_buf(ops, data, len, &scan);
	info->records = scan.records;
	info->bytes = scan.good;
	info->dropped = len - scan.good;
	info->verdict = scan.verdict;
	err = judge(jr, &scan, o->recover, data, len, info, eb);
	if (err)
		goto out;
	/* compaction: snapshot -> tmp -> fsync -> rename -> fsync dir */
	if (ops->snapshot(ops->state, &snap)) {
		err = mr_errf(eb, MR_ENOMEM, "out of memory compacting '%s'", jr->path);
		goto out;
	}
	err = mr__jr_replace(jr->tmp, jr->path, jr->dir, snap.p, snap.len, jr->do_fsync, &jr->fd,
			     &renamed, eb);
	if (err)
		goto out;
	jr->size = jr->snap_size = snap.len;
	*out = jr;
	jr = NULL;
out:
	free(data);
	mr__jbuf_release(&snap);
	mr__jr_free(jr);
	return err;
}

void mr__jr_free(struct ctl_journal *jr)
{
	if (!jr)
		return;
	mr__jr_free_writer(jr);
	pthread_mutex_destroy(&jr->mu);
	pthread_cond_destroy(&jr->cv);
	if (jr->fd >= 0)
		close(jr->fd);
	if (jr->lock_fd >= 0)
		close(jr->lock_fd); /* releases the lock */
	mr__jbuf_release(&jr->batch);
	mr__jbuf_release(&jr->wbatch);
	mr__jbuf_release(&jr->wsnap);
	free(jr);
}
