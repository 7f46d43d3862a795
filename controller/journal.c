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

int mr__jr_commit(struct ctl *ctl)
{
	struct ctl_journal *jr = ctl->jr;
	int err = 0;

	if (!jr || (!jr->len && !jr->failed))
		return 0;
	if (jr->failed) {
		err = MR_ENOMEM;
	} else {
		err = write_all(jr->fd, jr->buf, jr->len);
		if (!err && jr->do_fsync && fdatasync(jr->fd))
			err = MR_EIO;
	}
	if (err)
		mr_log_error("journal_write_failed", "path=%s err=%s", mr_log_q(jr->path),
			     mr_err_name(err));
	else
		jr->size += jr->len;
	jr->len = 0;
	jr->failed = 0;
	if (jr->cap > (1u << 20)) { /* give back a burst's buffer */
		free(jr->buf);
		jr->buf = NULL;
		jr->cap = 0;
	}
	return err;
}

void mr__jr_free(struct ctl *ctl)
{
	struct ctl_journal *jr = ctl->jr;

	if (!jr)
		return;
	if (jr->fd >= 0)
		close(jr->fd);
	free(jr->buf);
	free(jr);
	ctl->jr = NULL;
}
