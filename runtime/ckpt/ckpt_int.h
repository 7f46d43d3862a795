/*
 * ckpt_int.h - internals shared by the checkpoint files: ckpt_io.c (files
 * written durably, records read and verified, directories listed and
 * removed), manifest.c (the JSON of a rank's index and of the manifest),
 * ckpt_save.c (snapshot, writer thread, publishing) and ckpt_load.c
 * (resume, resharding, the offline readers).
 */
#ifndef MR_CKPT_INT_H
#define MR_CKPT_INT_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#include "mr_ckpt.h"
#include "mr_file.h"

#define CKPT_HEADER 64             /* bytes before a shard's first record */
#define CKPT_MAGIC "MRCKPT01"      /* a shard's first 8 bytes */
#define CKPT_MAX_STEPS 64          /* published steps a resume considers */
#define CKPT_MAX_BYTES ((uint64_t)1 << 44) /* a shard or record larger is refused */
#define CKPT_MAX_MANIFEST ((uint64_t)1 << 28) /* a manifest larger is refused (~6 M records) */
#define CKPT_MAX_REST (1 << 23)    /* ... and its members besides "shards" larger */
#define CKPT_ALIGN 4096            /* a shard image's alignment and length unit */

struct mr_ckpt {
	struct mr_ckpt_opts o;
	char dir[4096];
	struct mr_ckpt_job job;
	uint64_t nonce;            /* this attempt's: names its temporary directories */
	int lock_fd;               /* rank 0: <dir>/lock held (-1: none) */
	struct ckpt_piece *pc;     /* (npc) the owned slices, file order */
	int npc;
	unsigned char *image;      /* the shard file: header, their param|m|v records
				    * at their offsets, zeros to a CKPT_ALIGN multiple */
	size_t image_bytes;
	pthread_t thread;
	int threaded;              /* thread runs the write in flight (to be joined) */
	int running;               /* a write in flight (thread or not yet joined) */
	long wstep;                /* its step */
	long wopt;                 /* the optimizer steps it holds */
	int part_done;             /* its rank's part written or failed (lock, part_cond) */
	int part_rc;               /* that part's result */
	int wrc;                   /* the whole write's result */
	struct mr_errbuf web;
	double t0;                 /* its start */
	double wsecs;              /* rank 0, async: when its writer published it
				    * (seconds from t0; logged there), 0 = not */
	atomic_int cancel;         /* the job stops: rank 0 stops waiting for the others */
	atomic_int abandon;        /* rank 0: rank abandon - 1 failed its part: stop waiting */
	pthread_mutex_t lock;      /* st, part_done */
	pthread_cond_t part_cond;
	struct mr_ckpt_stats st;
};

/* Writes n bytes to path durably: a temporary name, fsync, rename, fsync
 * of the directory. head (hn bytes, may be NULL) first, then body. */
int mr__ckpt_write_file(const char *path, const void *head, size_t hn, const void *body,
			size_t n, struct mr_errbuf *eb);
/* The same for a whole file in buf, CKPT_ALIGN-aligned in address and
 * length: written past the page cache (O_DIRECT) where the filesystem
 * allows, so a background write costs training no copy. */
int mr__ckpt_write_image(const char *path, const void *buf, size_t n, struct mr_errbuf *eb);
/* mkdir -p; errors name the field "ckpt_dir". */
int mr__ckpt_make_dirs(const char *dir, struct mr_errbuf *eb);
/* Removes a directory tree (checkpoint directories hold plain files). */
int mr__ckpt_remove_dir(const char *dir);
/* The step numbers of <dir>/step-N, newest first, at most cap. */
int mr__ckpt_steps(const char *dir, long *steps, int cap, struct mr_errbuf *eb);
/* "<dir>/step-%08ld" into buf. */
void mr__ckpt_step_dir(char *buf, size_t cap, const char *dir, long step);

/* Opens shard s of mf, checking its size and header (magic, version, its
 * rank, the manifest's step); the descriptor or an MR_E* code. */
int mr__ckpt_open_shard(const struct mr_ckpt_manifest *mf, int s, struct mr_errbuf *eb);
/* Reads record r of mf into out (r->n floats), verifying the shard's
 * header and the record's CRC; fds caches one open descriptor per shard
 * (-1 = not yet open; mr__ckpt_close_fds). */
int mr__ckpt_read_rec(const struct mr_ckpt_manifest *mf, const struct mr_ckpt_rec *r,
		      int *fds, float *out, struct mr_errbuf *eb);
void mr__ckpt_close_fds(int *fds, int n);

/* ---- reading (ckpt_load.c) ---- */

/* Record numbers of mf grouped by (tensor, kind): *index (nrecs) and
 * *start (ntensors * MR_CKPT_KINDS + 1), malloc'd; 0 or MR_ENOMEM. */
int mr__ckpt_group_recs(const struct mr_ckpt_manifest *mf, int **index, int **start);
/* The records of manifest tensor ti and kind: *out into index, count. */
int mr__ckpt_recs_of(int ti, int kind, const int **out, const int *index, const int *start);
/* Records rs (nr > 0, one tensor and kind) into the whole tensor full. */
int mr__ckpt_assemble(const struct mr_ckpt_manifest *mf, const int *rs, int nr, int *fds,
		      float *full, struct mr_errbuf *eb);

/* One owned slice of the snapshot: where it goes in the rank's file. */
struct ckpt_piece {
	int tensor;          /* index into the rank's model table */
	uint64_t at, n;      /* elements of the slice */
	uint64_t offset;     /* byte offset of its param record; m, v follow */
	uint32_t crc[MR_CKPT_KINDS];
};

/* ---- JSON (manifest.c) ---- */

/* Elements of the whole tensor; of the slice tp rank r of tp and ep rank
 * e of ep hold (the model table's layout: a tp-split dim rounded up, the
 * experts divided). */
uint64_t mr__ckpt_full_n(const struct mr_ckpt_tensor *t);
uint64_t mr__ckpt_slice_n(const struct mr_ckpt_tensor *t, int tp, int ep);


/* A rank's index: its tensors' descriptions and its records. New ref. */
json_t *mr__ckpt_index_json(const struct mr_ckpt_job *job, const struct ckpt_piece *p, int np,
			    int kinds, uint64_t bytes);
/* The manifest from every rank's index (indexes[r] for rank r). New ref,
 * or NULL with eb set (an index naming a tensor twice differently...). */
json_t *mr__ckpt_manifest_json(const struct mr_ckpt_job *job, long step, long opt_steps,
			       json_t *const *indexes, int n, struct mr_errbuf *eb);
/* The model config as the manifest writes it. New ref. */
json_t *mr__ckpt_model_json(const struct mr_gpt_config *c);
/* "config_crc32c": the CRC-32C of model dumped compactly, keys sorted. */
uint32_t mr__ckpt_model_crc(const json_t *model);
/* The manifest's text, sealed: doc dumped compactly with a last member
 * "manifest_crc32c", the CRC-32C of every byte before its comma (so
 * readers tell a damaged manifest from another model). malloc'd, *n its
 * length; NULL when out of memory. */
char *mr__ckpt_manifest_text(const json_t *doc, size_t *n);

#endif
