/*
 * safetensors.c - the safetensors reader and writer (see mr_safetensors.h).
 *
 * The reader loads only the header (at most MR_ST_MAX_HEADER bytes, never
 * more than the file holds), checks every entry against the format's
 * rules before any data is touched, and reads tensors with pread at their
 * checked offsets. The writer streams: header first (its offsets computed
 * from the shapes), then each tensor's values in order, into a temporary
 * file that commit publishes.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "mr_safetensors.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads and writes little-endian data as host floats"
#endif

static const struct {
	const char *name;
	size_t size;
} dtypes[MR_ST__COUNT] = {
	[MR_ST_BOOL] = { "BOOL", 1 },	  [MR_ST_U8] = { "U8", 1 },
	[MR_ST_I8] = { "I8", 1 },	  [MR_ST_F8_E5M2] = { "F8_E5M2", 1 },
	[MR_ST_F8_E4M3] = { "F8_E4M3", 1 }, [MR_ST_I16] = { "I16", 2 },
	[MR_ST_U16] = { "U16", 2 },	  [MR_ST_F16] = { "F16", 2 },
	[MR_ST_BF16] = { "BF16", 2 },	  [MR_ST_I32] = { "I32", 4 },
	[MR_ST_U32] = { "U32", 4 },	  [MR_ST_F32] = { "F32", 4 },
	[MR_ST_F64] = { "F64", 8 },	  [MR_ST_I64] = { "I64", 8 },
	[MR_ST_U64] = { "U64", 8 },
};

const char *mr_st_dtype_name(int dtype)
{
	return dtype >= 0 && dtype < MR_ST__COUNT ? dtypes[dtype].name : "?";
}

size_t mr_st_dtype_size(int dtype)
{
	return dtype >= 0 && dtype < MR_ST__COUNT ? dtypes[dtype].size : 0;
}

static int dtype_of(const char *s)
{
	for (int i = 0; i < MR_ST__COUNT; i++)
		if (!strcmp(s, dtypes[i].name))
			return i;
	return -1;
}

static int read_at(int fd, void *buf, size_t n, uint64_t at)
{
	size_t done = 0;

	while (done < n) {
		ssize_t got = pread(fd, (char *)buf + done, n - done, (off_t)(at + done));
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return -1;
		done += (size_t)got;
	}
	return 0;
}

/* ---- reading ---- */

void mr_st_close(struct mr_st_file *f)
{
	if (!f)
		return;
	if (f->fd >= 0)
		close(f->fd);
	for (int i = 0; f->meta && i < 2 * f->nmeta; i++)
		free(f->meta[i]);
	free(f->meta);
	free(f->t);
	f->fd = -1;
	f->t = NULL;
	f->meta = NULL;
	f->ntensors = f->nmeta = 0;
}

/* The "__metadata__" object: strings to strings. */
static int parse_meta(struct mr_st_file *f, json_t *m, struct mr_errbuf *eb)
{
	const char *k;
	json_t *v;
	int i = 0;

	if (!json_is_object(m))
		return mr_errf(eb, MR_ECORRUPT, "'%s': '__metadata__' is not an object", f->path);
	f->nmeta = (int)json_object_size(m);
	if (!(f->meta = calloc((size_t)(2 * f->nmeta + 1), sizeof(char *))))
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", f->path);
	json_object_foreach(m, k, v)
	{
		if (!json_is_string(v))
			return mr_errf(eb, MR_ECORRUPT,
				       "'%s': metadata '%s' is not a string (safetensors "
				       "metadata maps strings to strings)", f->path, k);
		if (!(f->meta[2 * i] = strdup(k)) || !(f->meta[2 * i + 1] = strdup(json_string_value(v))))
			return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", f->path);
		i++;
	}
	return 0;
}

/* One tensor entry into t; the message names the tensor and the field. */
static int parse_tensor(const struct mr_st_file *f, const char *name, json_t *e,
			struct mr_st_tensor *t, uint64_t data_n, struct mr_errbuf *eb)
{
	json_t *dt = json_object_get(e, "dtype"), *sh = json_object_get(e, "shape");
	json_t *off = json_object_get(e, "data_offsets");
	uint64_t bytes;
	size_t k;

#define TBAD(...) mr_errf(eb, MR_ECORRUPT, "'%s': tensor '%s': " __VA_ARGS__)
	if (strlen(name) > MR_ST_MAX_NAME)
		return mr_errf(eb, MR_ELIMIT, "'%s': a tensor name of %zu bytes (at most %d)",
			       f->path, strlen(name), MR_ST_MAX_NAME);
	if (!name[0])
		return mr_errf(eb, MR_ECORRUPT, "'%s': a tensor with an empty name", f->path);
	snprintf(t->name, sizeof(t->name), "%s", name);
	if (!json_is_object(e))
		return TBAD("not an object with dtype, shape and data_offsets", f->path, name);
	if (!json_is_string(dt))
		return TBAD("'dtype' is missing or not a string", f->path, name);
	if ((t->dtype = dtype_of(json_string_value(dt))) < 0)
		return TBAD("unknown dtype '%.32s'", f->path, name, json_string_value(dt));
	if (!json_is_array(sh) || json_array_size(sh) > MR_ST_MAX_DIMS)
		return TBAD("'shape' is missing, not an array or has more than %d dims", f->path,
			    name, MR_ST_MAX_DIMS);
	t->ndim = (int)json_array_size(sh);
	t->count = 1;
	for (k = 0; k < json_array_size(sh); k++) {
		json_t *d = json_array_get(sh, k);
		if (!json_is_integer(d) || json_integer_value(d) < 0)
			return TBAD("'shape'[%zu] is not a non-negative integer", f->path, name, k);
		t->shape[k] = json_integer_value(d);
		if (__builtin_mul_overflow(t->count, (uint64_t)t->shape[k], &t->count))
			return TBAD("'shape' has too many elements", f->path, name);
	}
	if (!json_is_array(off) || json_array_size(off) != 2 ||
	    !json_is_integer(json_array_get(off, 0)) || !json_is_integer(json_array_get(off, 1)))
		return TBAD("'data_offsets' is not a pair of integers", f->path, name);
	if (json_integer_value(json_array_get(off, 0)) < 0 ||
	    json_integer_value(json_array_get(off, 1)) < json_integer_value(json_array_get(off, 0)))
		return TBAD("'data_offsets' [%lld, %lld] is not 0 <= begin <= end", f->path, name,
			    (long long)json_integer_value(json_array_get(off, 0)),
			    (long long)json_integer_value(json_array_get(off, 1)));
	t->begin = (uint64_t)json_integer_value(json_array_get(off, 0));
	t->end = (uint64_t)json_integer_value(json_array_get(off, 1));
	if (t->end > data_n)
		return TBAD("'data_offsets' end %llu is past the data (%llu bytes after the "
			    "header; truncated file?)", f->path, name, (unsigned long long)t->end,
			    (unsigned long long)data_n);
	if (__builtin_mul_overflow(t->count, (uint64_t)dtypes[t->dtype].size, &bytes) ||
	    bytes != t->end - t->begin)
		return TBAD("'data_offsets' span %llu bytes, its %s shape needs %llu", f->path, name,
			    (unsigned long long)(t->end - t->begin), dtypes[t->dtype].name,
			    (unsigned long long)t->count * dtypes[t->dtype].size);
#undef TBAD
	return 0;
}

static int by_offset(const void *a, const void *b)
{
	const struct mr_st_tensor *x = *(const struct mr_st_tensor *const *)a;
	const struct mr_st_tensor *y = *(const struct mr_st_tensor *const *)b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

/* The tensors' byte ranges tile [0, data_n) exactly. */
static int check_layout(const struct mr_st_file *f, uint64_t data_n, struct mr_errbuf *eb)
{
	const struct mr_st_tensor **o = malloc((size_t)(f->ntensors ? f->ntensors : 1) * sizeof(*o));
	const struct mr_st_tensor *prev = NULL;
	uint64_t at = 0;
	int i, rc = 0;

	if (!o)
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", f->path);
	for (i = 0; i < f->ntensors; i++)
		o[i] = &f->t[i];
	qsort(o, (size_t)f->ntensors, sizeof(*o), by_offset);
	for (i = 0; i < f->ntensors && rc == 0; i++) {
		if (o[i]->begin < at)
			rc = mr_errf(eb, MR_ECORRUPT,
				     "'%s': tensors '%s' and '%s' overlap (bytes [%llu, %llu) and "
				     "[%llu, %llu))", f->path, prev->name, o[i]->name,
				     (unsigned long long)prev->begin, (unsigned long long)prev->end,
				     (unsigned long long)o[i]->begin, (unsigned long long)o[i]->end);
		else if (o[i]->begin > at)
			rc = mr_errf(eb, MR_ECORRUPT,
				     "'%s': tensor '%s': a gap of %llu bytes before its data at %llu "
				     "(the data must be tiled without holes)", f->path, o[i]->name,
				     (unsigned long long)(o[i]->begin - at),
				     (unsigned long long)o[i]->begin);
		if (o[i]->end > at) {
			at = o[i]->end;
			prev = o[i];
		} else if (!prev) {
			prev = o[i];
		}
	}
	if (rc == 0 && at != data_n)
		rc = mr_errf(eb, MR_ECORRUPT,
			     "'%s': %llu bytes after the last tensor's data (the header accounts "
			     "for %llu of %llu)", f->path, (unsigned long long)(data_n - at),
			     (unsigned long long)at, (unsigned long long)data_n);
	free(o);
	return rc;
}

static int parse_header(struct mr_st_file *f, const char *text, size_t n, struct mr_errbuf *eb)
{
	uint64_t data_n = f->size - f->data_at;
	json_error_t je;
	json_t *doc, *v;
	const char *k;
	int rc = 0, i = 0;

	if (n == 0 || text[0] != '{')
		return mr_errf(eb, MR_ECORRUPT, "'%s': the header does not start with '{'", f->path);
	doc = json_loadb(text, n, JSON_REJECT_DUPLICATES, &je);
	if (!doc)
		return mr_errf(eb, MR_ECORRUPT, "'%s': the header is not valid JSON: %s (at byte %d)",
			       f->path, je.text, je.position);
	if (!json_is_object(doc)) {
		json_decref(doc);
		return mr_errf(eb, MR_ECORRUPT, "'%s': the header is not a JSON object", f->path);
	}
	f->ntensors = (int)json_object_size(doc) - (json_object_get(doc, "__metadata__") != NULL);
	if (json_object_size(doc) > MR_ST_MAX_TENSORS)
		rc = mr_errf(eb, MR_ELIMIT, "'%s': more than %d tensors", f->path, MR_ST_MAX_TENSORS);
	else if (!(f->t = calloc((size_t)(f->ntensors ? f->ntensors : 1), sizeof(*f->t))))
		rc = mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", f->path);
	json_object_foreach(doc, k, v)
	{
		if (rc < 0)
			break;
		if (!strcmp(k, "__metadata__"))
			rc = parse_meta(f, v, eb);
		else
			rc = parse_tensor(f, k, v, &f->t[i++], data_n, eb);
	}
	json_decref(doc);
	return rc < 0 ? rc : check_layout(f, data_n, eb);
}

int mr_st_open(struct mr_st_file *f, const char *path, struct mr_errbuf *eb)
{
	unsigned char len8[8];
	uint64_t n = 0;
	size_t size;
	char *text = NULL;
	int rc = 0;

	memset(f, 0, sizeof(*f));
	snprintf(f->path, sizeof(f->path), "%s", path);
	if ((f->fd = mr_file_open_regular(path, NULL, &size, eb)) < 0)
		return f->fd;
	if ((f->size = (uint64_t)size) < 8)
		rc = mr_errf(eb, MR_ECORRUPT,
			     "'%s': %llu bytes, shorter than the 8-byte header length (truncated?)",
			     path, (unsigned long long)f->size);
	else if (read_at(f->fd, len8, 8, 0) < 0)
		rc = mr_errf(eb, MR_EIO, "unable to read '%s': %s", path, strerror(errno));
	if (rc == 0) {
		for (int b = 7; b >= 0; b--)
			n = (n << 8) | len8[b];
		if (n > MR_ST_MAX_HEADER)
			rc = mr_errf(eb, MR_ELIMIT, "'%s': a header length of %llu bytes (at most %u)",
				     path, (unsigned long long)n, MR_ST_MAX_HEADER);
		else if (n < 2 || n > f->size - 8)
			rc = mr_errf(eb, MR_ECORRUPT,
				     "'%s': a header length of %llu bytes in a file of %llu "
				     "(truncated, or not safetensors)", path, (unsigned long long)n,
				     (unsigned long long)f->size);
	}
	f->data_at = 8 + n;
	if (rc == 0 && !(text = malloc((size_t)n)))
		rc = mr_errf(eb, MR_ENOMEM, "out of memory reading the header of '%s'", path);
	if (rc == 0 && read_at(f->fd, text, (size_t)n, 8) < 0)
		rc = mr_errf(eb, MR_EIO, "unable to read '%s': %s", path, strerror(errno));
	if (rc == 0)
		rc = parse_header(f, text, (size_t)n, eb);
	free(text);
	if (rc < 0)
		mr_st_close(f);
	return rc;
}

int mr_st_find(const struct mr_st_file *f, const char *name)
{
	for (int i = 0; i < f->ntensors; i++)
		if (!strcmp(f->t[i].name, name))
			return i;
	return -1;
}

const char *mr_st_meta(const struct mr_st_file *f, const char *key)
{
	for (int i = 0; i < f->nmeta; i++)
		if (!strcmp(f->meta[2 * i], key))
			return f->meta[2 * i + 1];
	return NULL;
}

int mr_st_read_raw(const struct mr_st_file *f, int i, void *out, struct mr_errbuf *eb)
{
	const struct mr_st_tensor *t = &f->t[i];

	if (read_at(f->fd, out, (size_t)(t->end - t->begin), f->data_at + t->begin) < 0)
		return mr_errf(eb, MR_EIO, "'%s': unable to read tensor '%s' (file changed?)",
			       f->path, t->name);
	return 0;
}

static float half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
	float out;

	if (e == 0 && m == 0) {
		bits = sign;
	} else if (e == 0) { /* subnormal: normalise */
		e = 127 - 15 + 1;
		while (!(m & 0x400)) {
			m <<= 1;
			e--;
		}
		bits = sign | (e << 23) | ((m & 0x3ff) << 13);
	} else if (e == 31) {
		bits = sign | 0x7f800000u | (m << 13);
	} else {
		bits = sign | ((e + 127 - 15) << 23) | (m << 13);
	}
	memcpy(&out, &bits, sizeof(out));
	return out;
}

int mr_st_read_f32(const struct mr_st_file *f, int i, float *out, struct mr_errbuf *eb)
{
	const struct mr_st_tensor *t = &f->t[i];
	size_t n = (size_t)t->count, k;
	void *raw;
	int rc;

	if (t->dtype == MR_ST_F32)
		return mr_st_read_raw(f, i, out, eb);
	if (t->dtype != MR_ST_F16 && t->dtype != MR_ST_BF16 && t->dtype != MR_ST_F64)
		return mr_errf(eb, MR_ENOTSUP, "'%s': tensor '%s' is %s, not a float type", f->path,
			       t->name, dtypes[t->dtype].name);
	if (!(raw = malloc(n ? t->end - t->begin : 1)))
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", t->name);
	rc = mr_st_read_raw(f, i, raw, eb);
	for (k = 0; rc == 0 && k < n; k++) {
		if (t->dtype == MR_ST_F64) {
			double d;
			memcpy(&d, (char *)raw + 8 * k, 8);
			out[k] = (float)d;
		} else {
			uint16_t h;
			uint32_t bits;
			memcpy(&h, (char *)raw + 2 * k, 2);
			if (t->dtype == MR_ST_F16) {
				out[k] = half_to_float(h);
			} else {
				bits = (uint32_t)h << 16;
				memcpy(&out[k], &bits, sizeof(float));
			}
		}
	}
	free(raw);
	return rc;
}

/* ---- writing ---- */

static void writer_free(struct mr_st_writer *w)
{
	if (w->fd >= 0)
		close(w->fd);
	w->fd = -1;
	free(w->bytes);
	w->bytes = NULL;
}

void mr_st_writer_abort(struct mr_st_writer *w)
{
	if (!w)
		return;
	writer_free(w);
	if (w->tmp[0])
		unlink(w->tmp);
	w->tmp[0] = 0;
}

/* The header's JSON, padded with spaces to a multiple of 8; malloc'd. */
static char *header_text(struct mr_st_writer *w, const struct mr_st_spec *specs, int n,
			 const char *const *meta, size_t *len, struct mr_errbuf *eb)
{
	json_t *doc = json_object(), *md = NULL;
	uint64_t at = 0;
	char *text = NULL, *pad;
	size_t tl, pl;
	int i, k, rc = 0;

	if (!doc)
		return NULL;
	if (meta && meta[0]) {
		md = json_object();
		for (i = 0; md && meta[i] && meta[i + 1]; i += 2)
			json_object_set_new(md, meta[i], json_string(meta[i + 1]));
		json_object_set_new(doc, "__metadata__", md);
	}
	for (i = 0; i < n && rc == 0; i++) {
		const struct mr_st_spec *s = &specs[i];
		json_t *shape = json_array(), *e;
		uint64_t count = 1;
		if (!s->name || !s->name[0] || strlen(s->name) > MR_ST_MAX_NAME ||
		    !strcmp(s->name, "__metadata__") || json_object_get(doc, s->name) ||
		    s->ndim < 0 || s->ndim > MR_ST_MAX_DIMS)
			rc = mr_errf(eb, MR_EINVAL, "tensor %d ('%s'): an empty, long, reserved or "
				     "repeated name, or more than %d dims", i, s->name ? s->name : "",
				     MR_ST_MAX_DIMS);
		for (k = 0; rc == 0 && k < s->ndim; k++) {
			if (s->shape[k] < 0 ||
			    __builtin_mul_overflow(count, (uint64_t)s->shape[k], &count))
				rc = mr_errf(eb, MR_EINVAL, "tensor '%s': a bad shape", s->name);
			json_array_append_new(shape, json_integer(s->shape[k]));
		}
		w->bytes[i] = count * sizeof(float);
		e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape, "data_offsets",
			      (json_int_t)at, (json_int_t)(at + w->bytes[i]));
		if (!e || json_object_set_new(doc, s->name, e) < 0)
			rc = rc < 0 ? rc : mr_errf(eb, MR_ENOMEM, "out of memory");
		at += w->bytes[i];
	}
	if (rc == 0)
		text = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(doc);
	if (!text)
		return NULL;
	tl = strlen(text);
	pl = (tl + 7) / 8 * 8;
	if (!(pad = realloc(text, pl + 1))) {
		free(text);
		return NULL;
	}
	memset(pad + tl, ' ', pl - tl);
	pad[pl] = 0;
	*len = pl;
	return pad;
}

int mr_st_writer_open(struct mr_st_writer *w, const char *path, const struct mr_st_spec *specs,
		      int n, const char *const *meta, int overwrite, struct mr_errbuf *eb)
{
	struct mr_errbuf he = { "", "" };
	unsigned char len8[8];
	size_t len = 0;
	char *text;
	int rc = 0;

	memset(w, 0, sizeof(*w));
	w->fd = -1;
	w->n = n;
	w->overwrite = overwrite;
	if (strlen(path) >= sizeof(w->path) - 32)
		return mr_errf(eb, MR_EINVAL, "'%s': path too long", path);
	snprintf(w->path, sizeof(w->path), "%s", path);
	if (!overwrite && access(path, F_OK) == 0)
		return mr_errf(eb, MR_EEXISTS, "'%s' exists", path);
	if (!(w->bytes = calloc((size_t)(n > 0 ? n : 1), sizeof(*w->bytes))))
		return mr_errf(eb, MR_ENOMEM, "out of memory");
	if (!(text = header_text(w, specs, n, meta, &len, &he))) {
		writer_free(w);
		return he.msg[0] ? mr_errf(eb, MR_EINVAL, "%s", he.msg)
				 : mr_errf(eb, MR_ENOMEM, "out of memory building the header");
	}
	for (int b = 0; b < 8; b++)
		len8[b] = (unsigned char)((uint64_t)len >> (8 * b));
	snprintf(w->tmp, sizeof(w->tmp), "%s.tmp-%ld", path, (long)getpid());
	w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (w->fd < 0)
		rc = mr_errf(eb, MR_EIO, "unable to create '%s': %s", w->tmp, strerror(errno));
	else if (mr_file_write_all(w->fd, len8, 8) < 0 || mr_file_write_all(w->fd, text, len) < 0)
		rc = mr_errf(eb, MR_EIO, "unable to write '%s': %s", w->tmp, strerror(errno));
	free(text);
	if (rc < 0) {
		if (w->fd < 0)
			w->tmp[0] = 0;
		mr_st_writer_abort(w);
	}
	return rc;
}

int mr_st_writer_put(struct mr_st_writer *w, const float *data, uint64_t count,
		     struct mr_errbuf *eb)
{
	if (w->next >= w->n || count * sizeof(float) != w->bytes[w->next])
		return mr_errf(eb, MR_EINVAL, "'%s': tensor %d: %llu values, not what its shape says",
			       w->path, w->next, (unsigned long long)count);
	if (mr_file_write_all(w->fd, data, (size_t)count * sizeof(float)) < 0)
		return mr_errf(eb, MR_EIO, "unable to write '%s': %s", w->tmp, strerror(errno));
	w->next++;
	return 0;
}

/* The temporary file appears as w->path: renamed over it with overwrite,
 * else linked (which fails rather than replace a file that appeared
 * meanwhile; a filesystem without links gets a checked rename). */
static int publish(struct mr_st_writer *w, struct mr_errbuf *eb)
{
	if (w->overwrite) {
		if (rename(w->tmp, w->path) != 0)
			return mr_errf(eb, MR_EIO, "unable to rename '%s': %s", w->tmp,
				       strerror(errno));
		w->tmp[0] = 0;
		return 0;
	}
	if (link(w->tmp, w->path) == 0)
		return 0; /* the temporary name is removed by the caller */
	if (errno == EEXIST)
		return mr_errf(eb, MR_EEXISTS, "'%s' exists", w->path);
	if (errno != EPERM && errno != ENOTSUP && errno != ENOSYS)
		return mr_errf(eb, MR_EIO, "unable to create '%s': %s", w->path, strerror(errno));
	if (access(w->path, F_OK) == 0)
		return mr_errf(eb, MR_EEXISTS, "'%s' exists", w->path);
	if (rename(w->tmp, w->path) != 0)
		return mr_errf(eb, MR_EIO, "unable to rename '%s': %s", w->tmp, strerror(errno));
	w->tmp[0] = 0;
	return 0;
}

int mr_st_writer_commit(struct mr_st_writer *w, struct mr_errbuf *eb)
{
	char dir[4200], *slash;
	int rc = 0, dfd;

	if (w->next != w->n)
		rc = mr_errf(eb, MR_ESTATE, "'%s': %d of %d tensors written", w->path, w->next, w->n);
	else if (fsync(w->fd) != 0)
		rc = mr_errf(eb, MR_EIO, "unable to sync '%s': %s", w->tmp, strerror(errno));
	if (close(w->fd) != 0 && rc == 0)
		rc = mr_errf(eb, MR_EIO, "unable to write '%s': %s", w->tmp, strerror(errno));
	w->fd = -1;
	if (rc == 0)
		rc = publish(w, eb);
	if (rc == 0) {
		snprintf(dir, sizeof(dir), "%s", w->path);
		slash = strrchr(dir, '/');
		if (slash)
			*slash = 0;
		dfd = open(slash ? (dir[0] ? dir : "/") : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0 || fsync(dfd) != 0)
			rc = mr_errf(eb, MR_EIO, "unable to sync the directory of '%s'", w->path);
		if (dfd >= 0)
			close(dfd);
	}
	mr_st_writer_abort(w); /* a link's or a failure's temporary name goes */
	return rc;
}
