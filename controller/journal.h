/*
 * journal.h - the controller's append-only journal (durability).
 *
 * File <data-dir>/journal holds framed records: u32 little-endian payload
 * length, u32 CRC-32 (IEEE) of the payload, payload. A payload is a type
 * byte and fields (unsigned LEB128 varints, length-prefixed strings and
 * bytes). Records describe the result of each mutation (job put/delete,
 * member put/delete, round close, generation bump, KV put/delete); replay
 * applies them through the same apply functions as the live paths.
 *
 * Mutations are appended to an in-memory batch; mr__jr_commit() writes the
 * batch with one write() and one fdatasync() (group commit): the server
 * calls it once per loop iteration, before any reply leaves.
 *
 * On open: replay (a torn or corrupt tail is detected by length/CRC/decode
 * and dropped), then compaction: a snapshot of the state is written to
 * journal.tmp, fsync'd, renamed over the journal, and the directory is
 * fsync'd.
 *
 * Non-goals: compaction while running, replication, encryption.
 */
#ifndef MR_CTL_JOURNAL_H
#define MR_CTL_JOURNAL_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "ctl.h"

/* Internals shared by journal.c (files) and jrecord.c (records). */
struct ctl_journal {
	int fd;
	int do_fsync;
	int failed; /* an append ran out of memory: the batch is incomplete */
	char path[PATH_MAX];
	char dir[PATH_MAX];
	unsigned char *buf;
	size_t len, cap;
	size_t rec_start; /* offset of the record being encoded */
	uint64_t size;
};

struct ctl_journal_info {
	uint64_t records;     /* replayed */
	uint64_t bytes;       /* good bytes replayed */
	uint64_t dropped;     /* bytes of torn/corrupt tail dropped */
};

/* Replays dir/journal into ctl, compacts it and opens it for appends;
 * sets ctl->jr. dir is created if missing (one level). */
int mr__jr_open(struct ctl *ctl, const char *dir, int do_fsync, struct ctl_journal_info *info,
		struct mr_errbuf *eb);
/* Writes and syncs the batch. 0 if nothing was pending. */
int mr__jr_commit(struct ctl *ctl);
/* 1 if records wait in the batch. */
int mr__jr_pending(const struct ctl *ctl);
/* Size of the journal file in bytes. */
uint64_t mr__jr_size(const struct ctl *ctl);
/* Closes the file (no commit) and frees ctl->jr. */
void mr__jr_free(struct ctl *ctl);

/* Replays framed records from buf into ctl (ctl->replaying is set during
 * the call). Stops at the first bad record; *good gets the length of the
 * valid prefix. Returns the number of records applied. */
uint64_t mr__jr_replay_buf(struct ctl *ctl, const unsigned char *buf, size_t len, size_t *good);
/* Encodes a snapshot of ctl as framed records into a malloc'd buffer. */
int mr__jr_snapshot(struct ctl *ctl, unsigned char **out, size_t *len);

uint32_t mr__crc32(const void *buf, size_t len);

#endif
