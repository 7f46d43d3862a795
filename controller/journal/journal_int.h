/*
 * journal_int.h - internals shared by the journal's files: open.c
 * (open: lock, replay, recover, compaction at open), commit.c (group
 * commit, the writer thread, compaction while running) and file.c (file
 * operations).
 *
 * Non-goals: anything the state or the server needs (journal.h).
 */
#ifndef MR_CTL_JOURNAL_INT_H
#define MR_CTL_JOURNAL_INT_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "journal.h"

struct ctl_journal {
	/* set at open */
	char dir[PATH_MAX];
	char path[PATH_MAX];     /* dir/journal */
	char tmp[PATH_MAX + 8];  /* dir/journal.tmp */
	int do_fsync;
	int lock_fd;
	int compact_factor;
	uint64_t compact_min;
	struct ctl_jr_ops ops;
	/* the file: owned by the writer while a batch is in flight */
	int fd;         /* O_APPEND */
	int dir_dirty;  /* a rename whose directory sync failed: sync it next */
	/* loop thread */
	struct ctl_jbuf batch;  /* records being collected */
	uint64_t size;          /* bytes in the file */
	uint64_t snap_size;     /* bytes of the last snapshot written */
	uint64_t compactions;
	int need_compact;       /* a batch was lost: the next commit compacts */
	int inflight;
	uint64_t seq;           /* number of the batch being collected (from 1) */
	uint64_t durable;       /* the last batch known to be on disk */
	/* the job handed to the writer (its fields are the writer's while
	 * inflight; job/stop/werr under mu) */
	struct ctl_jbuf wbatch; /* the batch: appended, or the fallback */
	struct ctl_jbuf wsnap;  /* a snapshot to replace the file with, if len */
	uint64_t wseq;          /* the batch's number */
	int wcompact;           /* the job is a compaction */
	int wmust;              /* ... that may not fall back to appending */
	int werr;
	int wreplaced;          /* the compaction replaced the file */
	struct mr_errbuf wmsg;  /* why it failed (logged on the loop thread) */
	void (*done)(void *arg); /* called on the writer thread */
	void *done_arg;
	pthread_t writer;
	int writer_started, job, stop;
	atomic_int wdone;       /* the writer finished the job in flight (read
				 * without mu by the loop: mr__jr_writer_done) */
	pthread_mutex_t mu;
	pthread_cond_t cv;
};

/* ---- file.c ---- */
/* Takes the lock of dir (dir/lock, mr_file_lock) naming this process
 * as "pid N on 'host'"; *fd keeps it. MR_ECONFLICT if another
 * process holds it (the message names dir and the holder). */
int mr__jr_lock(const char *dir, int *fd, struct mr_errbuf *eb);
/* Reads the whole file; a missing file is empty. *out is malloc'd. */
int mr__jr_read_file(const char *path, unsigned char **out, size_t *len, struct mr_errbuf *eb);
/* Writes len bytes of buf to tmp (created or truncated), syncs it, renames
 * it over path and syncs dir (syncs only if do_fsync). On success *fd is
 * the new file, open for appends. *renamed is set once the rename is done:
 * then *fd is valid even if the directory sync failed (MR_EIO). */
int mr__jr_replace(const char *tmp, const char *path, const char *dir, const void *buf,
		   size_t len, int do_fsync, int *fd, int *renamed, struct mr_errbuf *eb);
/* Copies buf (the bytes of path) to path.corrupt.<unix-time>, or
 * .<unix-time>.<n> when that exists (O_EXCL: nothing is overwritten), and
 * syncs it and dir whatever do_fsync says. The name goes to out. */
int mr__jr_preserve(const char *path, const char *dir, const void *buf, size_t len,
		    char *out, size_t cap, struct mr_errbuf *eb);

#endif
