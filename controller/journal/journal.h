/*
 * journal.h - the controller's journal: files, framing, CRC-32, replay,
 * compaction and group commit. A layer below the state it rebuilds: it
 * knows no jobs, members or keys.
 *
 * The state (controller/core/records.c) hands the journal, at open, a table of
 * record types (one decode+apply function per type) and a snapshot
 * function. Replay calls the table; compaction calls the snapshot. The
 * state encodes its records into the batch being collected
 * (mr__jr_batch) with the field encoder below, and decodes them with the
 * bounded decoder. Nothing here includes the core (core/ctl.h).
 *
 * Files in the data dir:
 *   lock               flock(LOCK_EX | LOCK_NB), taken before the journal is
 *                      read and held for the journal's life; holds the
 *                      holder's "pid host". A second controller on the dir
 *                      fails with MR_ECONFLICT naming the dir and the holder
 *   journal            framed records, appended in batches
 *   journal.tmp        a snapshot being written (compaction)
 *   journal.corrupt.<unix-time>[.<n>]
 *                      a corrupt journal kept by recover (never overwritten)
 *
 * A frame is a u32 little-endian payload length, a u32 CRC-32 (IEEE) of the
 * payload, and the payload: a type byte, then fields (LEB128 varints,
 * length-prefixed strings and bytes). Types are append-only.
 *
 * Replay, torn tails and corruption. A frame at offset `off` is *intact*
 * when its 8-byte header is in the file, its length is 1..MR_JR_MAX_RECORD
 * and its payload lies within the file, its CRC matches and its type is in
 * the table. Replay applies frames in order and stops at the first bad one;
 * the bytes before it are the valid prefix. The bad frame is a *torn tail*
 * (what kill -9 or a crash in the middle of a write leaves: a prefix of a
 * record, or a last record only partly on disk) when all of these hold:
 *   - it is not intact only for want of bytes or a matching CRC (header
 *     incomplete, length 0, above the maximum or past the end of the file,
 *     CRC mismatch);
 *   - no byte other than zero follows the extent its header declares (a
 *     complete frame with a bad CRC and data after it is corruption; zeros
 *     are what a crash leaves in blocks it did not write);
 *   - no intact frame starts at any later offset.
 * A torn tail is dropped with a warning. Anything else is *corruption*: a
 * frame with a good CRC that has an unknown type or does not decode, a bad
 * frame with non-zero bytes after its extent, or a bad frame with an intact
 * frame after it (a flipped length field). Corruption stops the open with
 * MR_ECORRUPT and a message naming the file, the offset of the bad frame
 * and the number of records before it; the file is left untouched. With
 * opts.recover the original is first copied beside it
 * (journal.corrupt.<unix-time>, O_EXCL: an existing file is never
 * overwritten), the copy and the dir are synced, and only then is the
 * journal compacted to the valid prefix.
 *
 * Compaction writes a snapshot of the state to journal.tmp, syncs it,
 * renames it over the journal and syncs the directory; the journal then
 * appends to the new file. It runs at open (after replay) and while
 * running: when a batch is handed to the writer thread and the journal
 * would exceed both compact_factor x (size of the last snapshot) and
 * compact_min bytes, the writer replaces the file with a fresh snapshot of
 * the live state instead of appending the batch (the snapshot already holds
 * the batch's effects, so its records are dropped, never appended after
 * it). If the snapshot cannot be written (before the rename), the batch is
 * appended to the old file as usual. A batch lost to an error (a failed
 * write or sync, or no memory to record it) makes the next commit a
 * compaction, so the file never keeps a hole that later records depend on;
 * until one succeeds, every commit fails (its replies are 503).
 *
 * Group commit: mutations are encoded into the batch; a commit writes it
 * with one write() and one fdatasync(). The server pipelines commits on a
 * writer thread (mr__jr_commit_start) and keeps serving while the disk
 * syncs; tests and shutdown use the synchronous mr__jr_commit().
 *
 * Threads: everything runs on the loop thread except the writer, which owns
 * the file and the handed-off batch while one is in flight.
 *
 * Non-goals: replication, encryption, journals of another format.
 */
#ifndef MR_CTL_JOURNAL_H
#define MR_CTL_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#include "mr_err.h"

/* Longest payload replay accepts (a KV value is at most 1 GiB). */
#define MR_JR_MAX_RECORD 0x7fffffffu

/* ---- records: the encoder and the bounded decoder (record.c) ---- */

/* A buffer of framed records. A failed allocation sets failed; later puts
 * are then no-ops and the buffer is incomplete. */
struct ctl_jbuf {
	unsigned char *p;
	size_t len, cap;
	size_t rec_start; /* offset of the record being encoded */
	int failed;
};

/* Starts a record of type; mr__jbuf_end() writes its length and CRC. */
void mr__jbuf_begin(struct ctl_jbuf *b, unsigned type);
void mr__jbuf_end(struct ctl_jbuf *b);
void mr__jbuf_uv(struct ctl_jbuf *b, uint64_t v);
/* NULL is encoded as length 0, "x" as length 2. */
void mr__jbuf_str(struct ctl_jbuf *b, const char *s);
void mr__jbuf_bytes(struct ctl_jbuf *b, const void *p, size_t n);
/* Frees the bytes; the buffer is empty and usable again. */
void mr__jbuf_release(struct ctl_jbuf *b);

/* Reads the fields of one payload (after the type byte). Any read past the
 * end or out of range sets bad and returns a neutral value. */
struct ctl_jdec {
	const unsigned char *p;
	size_t len, off;
	int bad;
};

uint64_t mr__jdec_uv(struct ctl_jdec *d);
/* A varint within [lo, hi] (lo >= 0). */
int32_t mr__jdec_i32(struct ctl_jdec *d, int64_t lo, int64_t hi);
/* Copies a string into buf (cap bytes with the NUL); returns buf, or NULL
 * for an encoded NULL. Embedded NULs and strings of cap bytes or more are
 * bad. */
const char *mr__jdec_str(struct ctl_jdec *d, char *buf, size_t cap);
/* Points into the payload; *n gets the length. */
const void *mr__jdec_bytes(struct ctl_jdec *d, size_t *n);
/* 1 if bytes are left (an optional trailing field is present). */
int mr__jdec_more(const struct ctl_jdec *d);
/* 1 if every byte was read and nothing was bad. */
int mr__jdec_done(const struct ctl_jdec *d);

uint32_t mr__crc32(const void *buf, size_t len);

/* ---- what the state provides ---- */

struct ctl_jr_type {
	const char *name; /* for messages: "kv_put" */
	/* Decodes one payload (d is past the type byte) and applies it to
	 * state: 0, MR_ECORRUPT if it does not decode or does not fit the
	 * state, or another error (MR_ENOMEM) that stops replay. */
	int (*apply)(void *state, struct ctl_jdec *d);
};

struct ctl_jr_ops {
	const struct ctl_jr_type *types; /* indexed by type byte; apply NULL = unknown */
	size_t ntypes;
	/* Encodes the whole state as records into out: 0 or MR_ENOMEM. */
	int (*snapshot)(void *state, struct ctl_jbuf *out);
	void *state;
};

/* ---- replay of bytes (record.c) ---- */

enum ctl_jr_verdict { CTL_JR_CLEAN, CTL_JR_TORN, CTL_JR_CORRUPT };

struct ctl_jr_scan {
	size_t good;      /* bytes of the valid prefix (offset of the bad frame) */
	uint64_t records; /* records in the valid prefix, all applied */
	int verdict;      /* enum ctl_jr_verdict */
	int err;          /* an apply error other than MR_ECORRUPT stopped replay */
	char why[192];    /* what is wrong at `good` ("crc mismatch") */
};

/* Replays framed records from buf through ops and classifies what follows
 * the valid prefix by the rule above. */
void mr__jr_replay_buf(const struct ctl_jr_ops *ops, const unsigned char *buf, size_t len,
		       struct ctl_jr_scan *scan);

/* ---- the journal file (open.c, commit.c) ---- */

struct ctl_journal;

struct ctl_journal_opts {
	const char *dir;      /* data dir; created if missing (one level) */
	int fsync;            /* 0: no fsync/fdatasync at all (benchmarks) */
	int recover;          /* keep the valid prefix of a corrupt journal */
	int compact_factor;   /* compact while running past factor x snapshot; 0 = never */
	uint64_t compact_min; /* ... and past this many bytes */
};

struct ctl_journal_info {
	uint64_t records;  /* replayed */
	uint64_t bytes;    /* bytes of the valid prefix */
	uint64_t dropped;  /* bytes after it: torn tail, or dropped by recover */
	int verdict;       /* enum ctl_jr_verdict of the file as found */
	char kept[4096];   /* recover: where the original was preserved, else "" */
};

/* Locks the data dir, replays the journal through ops (see the rule
 * above), compacts it and opens it for appends. Errors: MR_ECONFLICT (the
 * dir is locked by another process), MR_ECORRUPT (corrupt and not
 * opts->recover), MR_EIO, MR_EINVAL, MR_ENOMEM; eb says which. */
int mr__jr_open(struct ctl_journal **out, const struct ctl_journal_opts *opts,
		const struct ctl_jr_ops *ops, struct ctl_journal_info *info,
		struct mr_errbuf *eb);
/* The batch the state encodes its records into. */
struct ctl_jbuf *mr__jr_batch(struct ctl_journal *jr);
/* 1 if records (or a batch lost while recording) wait to be committed. */
int mr__jr_pending(const struct ctl_journal *jr);
/* Writes and syncs the batch now, on the calling thread (a compaction
 * instead if one is due after an error). 0 if nothing was pending. Not
 * while a pipelined commit is in flight. */
int mr__jr_commit(struct ctl_journal *jr);
/* Replaces the file with a snapshot of the state now, on the calling
 * thread; the batch's records are dropped (the snapshot holds them). If
 * the snapshot cannot be written the batch is appended as by
 * mr__jr_commit (unless a compaction is owed: then MR_EIO). Not while a
 * pipelined commit is in flight. */
int mr__jr_compact(struct ctl_journal *jr);
/*
 * Pipelined commit: hands the batch (or a compaction, when due) to the
 * writer thread, which writes and syncs it and then calls done(arg) on its
 * own thread (the server posts back to its loop). Returns 1 if a batch was
 * handed off, 0 if there was nothing to write or a batch is still in
 * flight, or a negative code if the batch was lost (out of memory while
 * recording it and no compaction possible).
 */
int mr__jr_commit_start(struct ctl_journal *jr, void (*done)(void *arg), void *arg);
/* After done() ran: ends the in-flight batch and returns its result. */
int mr__jr_commit_finish(struct ctl_journal *jr);
/* 1 if a batch is in flight and the writer is through with it (done()
 * may not have run yet): mr__jr_commit_finish() may end it now. Loop
 * thread; a load of an atomic, cheap enough for every request. */
int mr__jr_writer_done(const struct ctl_journal *jr);
/* 1 while a handed-off batch is not yet finished. */
int mr__jr_inflight(const struct ctl_journal *jr);
/*
 * Batches are numbered from 1 in the order they are collected:
 * mr__jr_seq() is the number of the batch records go into now,
 * mr__jr_inflight_seq() that of the batch in flight (0 if none), and
 * mr__jr_durable() the last one on disk (a failed batch is not; the
 * compaction after it, which holds its effects, is). Everything replayed
 * at open is durable. Without a journal every number is durable.
 */
uint64_t mr__jr_seq(const struct ctl_journal *jr);
uint64_t mr__jr_inflight_seq(const struct ctl_journal *jr);
uint64_t mr__jr_durable(const struct ctl_journal *jr);
/* Stops the writer thread after it wrote the batch handed to it, if any
 * (its done() is still called). Later commits are synchronous only. */
void mr__jr_free_writer(struct ctl_journal *jr);
/* Size of the journal file in bytes. */
uint64_t mr__jr_size(const struct ctl_journal *jr);
/* Compactions done since open (the one at open not counted). */
uint64_t mr__jr_compactions(const struct ctl_journal *jr);
/* Stops the writer, closes the file (no commit), releases the lock and
 * frees jr. NULL is a no-op. */
void mr__jr_free(struct ctl_journal *jr);

#endif
