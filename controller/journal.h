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
 * Mutations are appended to an in-memory batch. Group commit writes a whole
 * batch with one write() and one fdatasync(). The server pipelines it: it
 * hands the batch to a writer thread (mr__jr_commit_start) and goes on
 * serving while the disk syncs, collecting the next batch; replies that
 * depend on a batch leave only once that batch is durable. Tests and
 * shutdown use the synchronous mr__jr_commit().
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
#include <pthread.h>
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
	/* the batch being written by the writer thread (owned by it while
	 * inflight is set; inflight itself belongs to the loop thread) */
	unsigned char *wbuf;
	size_t wlen, wcap;
	int werr;
	int inflight;
	void (*done)(void *arg); /* called on the writer thread */
	void *done_arg;
	pthread_t writer;
	int writer_started, job, stop;
	pthread_mutex_t mu;
	pthread_cond_t cv;
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
/* Writes and syncs the batch now, on the calling thread. 0 if nothing was
 * pending. Not while a pipelined commit is in flight. */
int mr__jr_commit(struct ctl *ctl);
/*
 * Pipelined commit: hands the batch to the writer thread, which writes and
 * syncs it and then calls done(arg) on its own thread (the server posts
 * back to its loop). Returns 1 if a batch was handed off, 0 if there was
 * nothing to write or a batch is still in flight, or a negative code if the
 * batch was lost (out of memory while recording it; it is dropped).
 */
int mr__jr_commit_start(struct ctl *ctl, void (*done)(void *arg), void *arg);
/* After done() ran: ends the in-flight batch and returns its result. */
int mr__jr_commit_finish(struct ctl *ctl);
/* 1 while a handed-off batch is not yet finished. */
int mr__jr_inflight(const struct ctl *ctl);
/* Stops the writer thread after it wrote the batch handed to it, if any
 * (its done() is still called). Later commits are synchronous only. */
void mr__jr_free_writer(struct ctl *ctl);
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
