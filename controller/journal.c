/*
 * journal.c - the journal file of the controller (see journal.h): read and
 * replay at open, compaction, and the group-commit write + fdatasync.
 *
 * Non-goals: record formats (jrecord.c).
 */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mr_log.h"

/* ---- files -------------------------------------------------------------------------- */

static int write_all(int fd, const unsigned char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return MR_EIO;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int read_file(const char *path, unsigned char **out, size_t *len, struct mr_errbuf *eb)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	unsigned char *buf = NULL;
	size_t n = 0, cap = 0;
	int err = 0;

	*out = NULL;
	*len = 0;
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		return mr_errf(eb, MR_EIO, "unable to open '%s': %s", path, strerror(errno));
	}
	for (;;) {
		ssize_t r;

		if (n == cap) {
			unsigned char *nb;

			cap = cap ? cap * 2 : 1 << 16;
			nb = realloc(buf, cap);
			if (!nb) {
				err = mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", path);
				goto out;
			}
			buf = nb;
		}
		r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			err = mr_errf(eb, MR_EIO, "unable to read '%s': %s", path, strerror(errno));
			goto out;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	*out = buf;
	*len = n;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return err;
}

static int sync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int err = 0;

	if (fd < 0)
		return MR_EIO;
	if (fsync(fd))
		err = MR_EIO;
	close(fd);
	return err;
}

int mr__jr_open(struct ctl *ctl, const char *dir, int do_fsync, struct ctl_journal_info *info,
		struct mr_errbuf *eb)
{
	struct ctl_journal *jr = calloc(1, sizeof(*jr));
	unsigned char *data = NULL, *snap = NULL;
	char tmp[PATH_MAX + 8];
	size_t len = 0, good = 0, slen = 0;
	int fd = -1, err = 0;

	memset(info, 0, sizeof(*info));
	if (!jr)
		return mr_errf(eb, MR_ENOMEM, "out of memory");
	jr->fd = -1;
	jr->do_fsync = do_fsync;
	pthread_mutex_init(&jr->mu, NULL);
	pthread_cond_init(&jr->cv, NULL);
	if (snprintf(jr->dir, sizeof(jr->dir), "%s", dir) >= (int)sizeof(jr->dir) ||
	    snprintf(jr->path, sizeof(jr->path), "%s/journal", dir) >= (int)sizeof(jr->path)) {
		err = mr_errf_field(eb, MR_EINVAL, "data_dir", "data dir '%.200s' is too long", dir);
		goto out;
	}
	snprintf(tmp, sizeof(tmp), "%s.tmp", jr->path);
	if (mkdir(dir, 0700) && errno != EEXIST) {
		err = mr_errf_field(eb, MR_EIO, "data_dir", "unable to create '%s': %s", dir,
				    strerror(errno));
		goto out;
	}
	err = read_file(jr->path, &data, &len, eb);
	if (err)
		goto out;
	info->records = mr__jr_replay_buf(ctl, data, len, &good);
	info->bytes = good;
	info->dropped = len - good;
	if (info->dropped)
		mr_log_warn("journal_tail_dropped", "path=%s bytes=%llu good=%llu",
			    mr_log_q(jr->path), (unsigned long long)info->dropped,
			    (unsigned long long)good);
	/* compaction: snapshot -> tmp -> fsync -> rename -> fsync dir */
	err = mr__jr_snapshot(ctl, &snap, &slen);
	if (err) {
		mr_errf(eb, err, "out of memory compacting the journal");
		goto out;
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || write_all(fd, snap, slen) || (do_fsync && fsync(fd))) {
		err = mr_errf(eb, MR_EIO, "unable to write '%s': %s", tmp, strerror(errno));
		goto out;
	}
	close(fd);
	fd = -1;
	if (rename(tmp, jr->path) || (do_fsync && sync_dir(dir))) {
		err = mr_errf(eb, MR_EIO, "unable to replace '%s': %s", jr->path, strerror(errno));
		goto out;
	}
	jr->fd = open(jr->path, O_WRONLY | O_APPEND | O_CLOEXEC);
	if (jr->fd < 0) {
		err = mr_errf(eb, MR_EIO, "unable to open '%s': %s", jr->path, strerror(errno));
		goto out;
	}
	jr->size = slen;
	ctl->jr = jr;
	jr = NULL;
out:
	if (fd >= 0)
		close(fd);
	free(data);
	free(snap);
	free(jr);
	return err;
}

int mr__jr_pending(const struct ctl *ctl)
{
	return ctl->jr && (ctl->jr->len || ctl->jr->failed);
}

uint64_t mr__jr_size(const struct ctl *ctl)
{
	return ctl->jr ? ctl->jr->size : 0;
}

/* After a batch was written: account for it and give back a burst's buffer. */
static void batch_written(struct ctl_journal *jr, int err, size_t len, unsigned char **buf,
			  size_t *cap)
{
	if (err)
		mr_log_error("journal_write_failed", "path=%s err=%s", mr_log_q(jr->path),
			     mr_err_name(err));
	else
		jr->size += len;
	if (*cap > (1u << 20)) {
		free(*buf);
		*buf = NULL;
		*cap = 0;
	}
}

static int write_batch(struct ctl_journal *jr, const unsigned char *buf, size_t len)
{
	int err = write_all(jr->fd, buf, len);

	if (!err && jr->do_fsync && fdatasync(jr->fd))
		err = MR_EIO;
	return err;
}

int mr__jr_commit(struct ctl *ctl)
{
	struct ctl_journal *jr = ctl->jr;
	int err;

	if (!jr || (!jr->len && !jr->failed))
		return 0;
	err = jr->failed ? MR_ENOMEM : write_batch(jr, jr->buf, jr->len);
	batch_written(jr, err, jr->len, &jr->buf, &jr->cap);
	jr->len = 0;
	jr->failed = 0;
	return err;
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
		err = write_batch(jr, jr->wbuf, jr->wlen);
		pthread_mutex_lock(&jr->mu);
		jr->werr = err;
		jr->job = 0; /* before done(): the loop may hand off the next at once */
		pthread_mutex_unlock(&jr->mu);
		jr->done(jr->done_arg);
		pthread_mutex_lock(&jr->mu);
	}
	pthread_mutex_unlock(&jr->mu);
	return NULL;
}

int mr__jr_commit_start(struct ctl *ctl, void (*done)(void *arg), void *arg)
{
	struct ctl_journal *jr = ctl->jr;
	unsigned char *b;
	size_t c;

	if (!jr || jr->inflight || (!jr->len && !jr->failed))
		return 0;
	if (jr->failed)
		return mr__jr_commit(ctl); /* drops the incomplete batch, MR_ENOMEM */
	if (!jr->writer_started) {
		if (pthread_create(&jr->writer, NULL, writer_main, jr))
			return mr__jr_commit(ctl) ? MR_EIO : 0;
		jr->writer_started = 1;
	}
	/* swap: the batch goes to the writer, its old buffer collects the next */
	b = jr->wbuf;
	c = jr->wcap;
	jr->wbuf = jr->buf;
	jr->wcap = jr->cap;
	jr->wlen = jr->len;
	jr->buf = b;
	jr->cap = c;
	jr->len = 0;
	jr->done = done;
	jr->done_arg = arg;
	jr->inflight = 1;
	pthread_mutex_lock(&jr->mu);
	jr->job = 1;
	pthread_cond_signal(&jr->cv);
	pthread_mutex_unlock(&jr->mu);
	return 1;
}

int mr__jr_commit_finish(struct ctl *ctl)
{
	struct ctl_journal *jr = ctl->jr;
	int err;

	if (!jr || !jr->inflight)
		return 0;
	pthread_mutex_lock(&jr->mu); /* werr was set under it */
	err = jr->werr;
	pthread_mutex_unlock(&jr->mu);
	batch_written(jr, err, jr->wlen, &jr->wbuf, &jr->wcap);
	jr->wlen = 0;
	jr->inflight = 0;
	return err;
}

int mr__jr_inflight(const struct ctl *ctl)
{
	return ctl->jr && ctl->jr->inflight;
}

void mr__jr_free_writer(struct ctl *ctl)
{
	struct ctl_journal *jr = ctl->jr;

	if (!jr || !jr->writer_started)
		return;
	pthread_mutex_lock(&jr->mu);
	jr->stop = 1;
	pthread_cond_signal(&jr->cv);
	pthread_mutex_unlock(&jr->mu);
	pthread_join(jr->writer, NULL); /* a batch handed off is written first */
	jr->writer_started = 0;
}

void mr__jr_free(struct ctl *ctl)
{
	struct ctl_journal *jr = ctl->jr;

	if (!jr)
		return;
	mr__jr_free_writer(ctl);
	pthread_mutex_destroy(&jr->mu);
	pthread_cond_destroy(&jr->cv);
	if (jr->fd >= 0)
		close(jr->fd);
	free(jr->buf);
	free(jr->wbuf);
	free(jr);
	ctl->jr = NULL;
}
