/*
 * mr_file.h - the few file operations several rooms need: whole writes,
 * a directory's fsync, a file opened for reading only when it is a
 * regular file (and a small one read whole), and an exclusive lock that names its holder.
 *
 * The lock is flock(2) on a small file holding one line of text about
 * its holder (what a second process quotes when it is refused). flock is
 * released by the kernel when the holder's process dies, so a lock is
 * never stale; it works on local filesystems and on NFSv4 (as a lease).
 *
 * Non-goals: buffered I/O, path manipulation, locks that wait.
 */
#ifndef MR_FILE_H
#define MR_FILE_H

#include <stddef.h>

#include "mr_err.h"

/* write(2) of all n bytes (EINTR and short writes retried); 0, or -1
 * with errno set. */
int mr_file_write_all(int fd, const void *buf, size_t n);

/* fsync of directory dir (what makes a rename in it durable); 0 or
 * MR_EIO naming the directory. eb may be NULL. */
int mr_file_sync_dir(const char *dir, struct mr_errbuf *eb);

/* Opens path read-only without blocking on it and only when it is a
 * regular file (a FIFO, device or directory placed where a file should
 * be is refused, not waited on); the descriptor (close-on-exec, blocking
 * again) or MR_ENOTFOUND (absent), MR_ECORRUPT (not a regular file),
 * MR_EIO, with eb naming what the file should be (`what`, e.g. "shard";
 * may be NULL) and the path. *size (may be NULL): its length. */
int mr_file_open_regular(const char *path, const char *what, size_t *size,
			 struct mr_errbuf *eb);

/* Reads the regular file path whole (as mr_file_open_regular opens it)
 * into *buf (malloc'd, NUL-terminated; *len its length, may be NULL):
 * 0, or mr_file_open_regular's codes, MR_ELIMIT when it is over cap
 * bytes, MR_EIO, MR_ENOMEM, with eb naming what and path. For the small
 * files a daemon reads at start: certificates, keys, tokens. */
int mr_file_read_small(const char *path, const char *what, size_t cap, char **buf, size_t *len,
		       struct mr_errbuf *eb);

/* Takes the exclusive lock on path (created if missing) without
 * waiting and writes holder (one line, e.g. "pid 12 on 'ctl-0'") into
 * it. 0 with *fd the descriptor to keep (closing it releases the lock);
 * MR_ECONFLICT when another process holds it, with its holder text in
 * who (cap bytes; "unknown" when it wrote none); MR_ENOTSUP when the
 * filesystem has no locks; MR_EIO. Messages in eb name the path. */
int mr_file_lock(const char *path, const char *holder, int *fd, char *who, size_t cap,
		 struct mr_errbuf *eb);

#endif
