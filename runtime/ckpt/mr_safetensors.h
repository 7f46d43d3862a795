/*
 * mr_safetensors.h - the safetensors file format (Hugging Face): a reader
 * that trusts nothing in the file and a streaming, atomic writer.
 *
 * A file is (https://github.com/huggingface/safetensors, little-endian):
 *
 *   8 bytes     N, the header's length (u64)
 *   N bytes     a JSON object: per tensor
 *                 "name": {"dtype": "F32", "shape": [d0, ...],
 *                          "data_offsets": [begin, end]}
 *               and optionally "__metadata__": {"key": "value", ...}
 *               (strings only); padded with spaces
 *   the rest    the data: each tensor's bytes at [begin, end) counted from
 *               the first byte after the header, row-major, little-endian
 *
 * The reader (mr_st_open) checks what the reference implementation does
 * and says which tensor or field is wrong: N within the file and at most
 * MR_ST_MAX_HEADER, the header a JSON object starting with '{' (no
 * duplicate keys), every dtype known, every shape a list of at most
 * MR_ST_MAX_DIMS non-negative integers, every data_offsets a pair
 * begin <= end whose length is the shape's element count times the
 * dtype's size, and the tensors' byte ranges tiling the data exactly: no
 * overlap, no gap, nothing after the last one. __metadata__ must map
 * strings to strings. Nothing is read past the file; a hostile file is an
 * error (MR_ECORRUPT, or MR_ELIMIT past a bound), never a crash.
 *
 * The writer (mr_st_writer_*) takes the tensors' names and shapes first
 * (the header is written then, tensors laid out in the given order, one
 * after another) and each tensor's float32 values in that order; commit
 * makes the file appear whole under its name (temporary file, fsync,
 * rename or link, fsync of the directory). It writes F32 only.
 *
 * Ownership: the caller owns struct mr_st_file / mr_st_writer; the file
 * is closed by mr_st_close, the writer's temporary file removed by
 * mr_st_writer_abort (commit or abort exactly once after a successful
 * open). Non-goals: mmap, other dtypes on write, big-endian hosts.
 */
#ifndef MR_SAFETENSORS_H
#define MR_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "mr_err.h"

#define MR_ST_MAX_HEADER 100000000u /* bytes of JSON header (the reference's bound) */
#define MR_ST_MAX_DIMS 8
#define MR_ST_MAX_NAME 255          /* bytes of a tensor name */
#define MR_ST_MAX_TENSORS (1 << 20)

enum mr_st_dtype {
	MR_ST_BOOL, MR_ST_U8, MR_ST_I8, MR_ST_F8_E5M2, MR_ST_F8_E4M3, MR_ST_I16, MR_ST_U16,
	MR_ST_F16, MR_ST_BF16, MR_ST_I32, MR_ST_U32, MR_ST_F32, MR_ST_F64, MR_ST_I64,
	MR_ST_U64, MR_ST__COUNT
};

/* "F32" ... for a dtype; its size in bytes. */
const char *mr_st_dtype_name(int dtype);
size_t mr_st_dtype_size(int dtype);

struct mr_st_tensor {
	char name[MR_ST_MAX_NAME + 1];
	int dtype;                     /* enum mr_st_dtype */
	int ndim;
	int64_t shape[MR_ST_MAX_DIMS];
	uint64_t count;                /* elements (product of shape) */
	uint64_t begin, end;           /* bytes, from the start of the data */
};

struct mr_st_file {
	char path[4096];
	int fd;
	uint64_t size;                 /* of the file */
	uint64_t data_at;              /* 8 + N: where the data starts */
	int ntensors;
	struct mr_st_tensor *t;        /* in header order */
	int nmeta;
	char **meta;                   /* key, value, key, value, ... (2 * nmeta) */
};

/* Opens and checks path (see the header); 0, or MR_ENOTFOUND / MR_EIO /
 * MR_ECORRUPT / MR_ELIMIT / MR_ENOMEM with eb naming the file, the
 * tensor or field, and the reason. On failure f holds nothing. */
int mr_st_open(struct mr_st_file *f, const char *path, struct mr_errbuf *eb);
/* NULL-safe; f may be reopened afterwards. */
void mr_st_close(struct mr_st_file *f);
/* Index of tensor name, or -1. */
int mr_st_find(const struct mr_st_file *f, const char *name);
/* The metadata value of key, or NULL. */
const char *mr_st_meta(const struct mr_st_file *f, const char *key);
/* Tensor i's values as float32 into out (t[i].count floats): F32 as is,
 * F16, BF16 and F64 converted; another dtype is MR_ENOTSUP naming it. */
int mr_st_read_f32(const struct mr_st_file *f, int i, float *out, struct mr_errbuf *eb);
/* Tensor i's raw bytes (end - begin) into out. */
int mr_st_read_raw(const struct mr_st_file *f, int i, void *out, struct mr_errbuf *eb);

/* One tensor the writer will write (F32). */
struct mr_st_spec {
	const char *name;
	int ndim;
	int64_t shape[MR_ST_MAX_DIMS];
};

struct mr_st_writer {
	char path[4096], tmp[4200];
	int fd;
	int overwrite;
	int n, next;                   /* tensors; the next to put */
	uint64_t *bytes;               /* (n) each one's bytes */
};

/* Starts path: checks the specs (names unique, non-empty, at most
 * MR_ST_MAX_NAME bytes; shapes non-negative), writes the header with the
 * metadata meta (key, value, ..., NULL; may be NULL) into a temporary file
 * beside path. An existing path is MR_EEXISTS unless overwrite. */
int mr_st_writer_open(struct mr_st_writer *w, const char *path, const struct mr_st_spec *specs,
		      int n, const char *const *meta, int overwrite, struct mr_errbuf *eb);
/* The next tensor's values (count must be its element count). */
int mr_st_writer_put(struct mr_st_writer *w, const float *data, uint64_t count,
		     struct mr_errbuf *eb);
/* Every tensor put: fsync, then the file appears as path (without
 * overwrite, never replacing a file that appeared meanwhile). Frees w. */
int mr_st_writer_commit(struct mr_st_writer *w, struct mr_errbuf *eb);
/* Removes the temporary file and frees w. */
void mr_st_writer_abort(struct mr_st_writer *w);

#endif
