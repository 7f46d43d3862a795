/*
 * weights.c - read and write the weights file (format in mr_weights.h).
 * Every error names the file.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mr_weights.h"

static int32_t fbits(float f)
{
	int32_t i;

	memcpy(&i, &f, sizeof(i));
	return i;
}

static float bitsf(int32_t i)
{
	float f;

	memcpy(&f, &i, sizeof(f));
	return f;
}

void mr_weights_pack_config(int32_t *h, const struct mr_gpt_config *c)
{
	h[2] = c->vocab;
	h[3] = c->max_seq;
	h[4] = c->n_layer;
	h[5] = c->d_model;
	h[6] = c->n_head;
	h[7] = c->moe_every;
	h[8] = c->n_experts;
	h[9] = c->top_k;
	h[10] = fbits(c->capacity_factor);
	h[11] = fbits(c->aux_coef);
}

/* Slots 16..25 of a weights file: the family's keys, zero for gpt2 (files
 * from before the families read as gpt2). */
static void pack_family(int32_t *h, const struct mr_gpt_config *c)
{
	h[16] = c->arch;
	h[17] = c->n_kv_head;
	h[18] = c->ffn_hidden;
	h[19] = fbits(c->norm_eps);
	h[20] = fbits(c->rope_theta);
	h[21] = fbits(c->rope_scaling.factor);
	h[22] = fbits(c->rope_scaling.low_freq_factor);
	h[23] = fbits(c->rope_scaling.high_freq_factor);
	h[24] = c->rope_scaling.original_max_pos;
	h[25] = c->tie_embeddings;
}

void mr_weights_unpack_config(const int32_t *h, struct mr_gpt_config *c)
{
	memset(c, 0, sizeof(*c));
	c->vocab = h[2];
	c->max_seq = h[3];
	c->n_layer = h[4];
	c->d_model = h[5];
	c->n_head = h[6];
	c->moe_every = h[7];
	c->n_experts = h[8];
	c->top_k = h[9];
	c->capacity_factor = bitsf(h[10]);
	c->aux_coef = bitsf(h[11]);
}

static void unpack_family(const int32_t *h, struct mr_gpt_config *c)
{
	c->arch = h[16];
	c->n_kv_head = h[17];
	c->ffn_hidden = h[18];
	c->norm_eps = bitsf(h[19]);
	c->rope_theta = bitsf(h[20]);
	c->rope_scaling.factor = bitsf(h[21]);
	c->rope_scaling.low_freq_factor = bitsf(h[22]);
	c->rope_scaling.high_freq_factor = bitsf(h[23]);
	c->rope_scaling.original_max_pos = h[24];
	c->tie_embeddings = h[25];
}

int mr_weights_write(const struct mr_gpt *m, const char *path, struct mr_errbuf *eb)
{
	float *h = malloc(sizeof(float) * m->nparams);
	int rc;

	if (!h)
		return mr_errf(eb, MR_ENOMEM, "unable to write '%s': out of memory", path);
	rc = m->dev->ops->download(m->dev, h, m->params, sizeof(float) * m->nparams);
	if (rc < 0)
		rc = mr_errf(eb, rc, "unable to write '%s': the device's parameters did not "
			     "download", path);
	else
		rc = mr_weights_write_buf(&m->cfg, m->ntensors, h, m->nparams, path, eb);
	free(h);
	return rc;
}

int mr_weights_write_buf(const struct mr_gpt_config *cfg, int ntensors, const float *params,
			 size_t nparams, const char *path, struct mr_errbuf *eb)
{
	int32_t hdr[MR_WEIGHTS_HEADER_INTS];
	FILE *f;
	int rc = 0;

	memset(hdr, 0, sizeof(hdr));
	hdr[0] = MR_WEIGHTS_MAGIC;
	hdr[1] = MR_WEIGHTS_VERSION;
	mr_weights_pack_config(hdr, cfg);
	pack_family(hdr, cfg);
	hdr[12] = ntensors;
	hdr[13] = (int32_t)(uint32_t)(nparams & 0xffffffffu);
	hdr[14] = (int32_t)(uint32_t)((uint64_t)nparams >> 32);
	f = fopen(path, "wb");
	if (!f)
		return mr_errf(eb, MR_EIO, "unable to create '%s': %s", path, strerror(errno));
	if (fwrite(hdr, sizeof(hdr), 1, f) != 1 ||
	    fwrite(params, sizeof(float), nparams, f) != nparams)
		rc = mr_errf(eb, MR_EIO, "unable to write '%s': %s", path, strerror(errno));
	if (fclose(f) != 0 && rc == 0)
		rc = mr_errf(eb, MR_EIO, "unable to write '%s': %s", path, strerror(errno));
	return rc;
}

static int read_header(FILE *f, const char *path, int32_t *hdr, struct mr_errbuf *eb)
{
	if (fread(hdr, sizeof(int32_t), MR_WEIGHTS_HEADER_INTS, f) != MR_WEIGHTS_HEADER_INTS)
		return mr_errf(eb, MR_ECORRUPT, "'%s': truncated header (need %d bytes)", path,
			       (int)(MR_WEIGHTS_HEADER_INTS * sizeof(int32_t)));
	if (hdr[0] != MR_WEIGHTS_MAGIC)
		return mr_errf(eb, MR_ECORRUPT, "'%s': bad magic %d (want %d)", path, hdr[0],
			       MR_WEIGHTS_MAGIC);
	if (hdr[1] != MR_WEIGHTS_VERSION)
		return mr_errf(eb, MR_ECORRUPT, "'%s': unsupported version %d (want %d)", path,
			       hdr[1], MR_WEIGHTS_VERSION);
	return 0;
}

int mr_weights_read_config(const char *path, struct mr_gpt_config *c, struct mr_errbuf *eb)
{
	int32_t hdr[MR_WEIGHTS_HEADER_INTS];
	FILE *f = fopen(path, "rb");
	int rc;

	if (!f)
		return mr_errf(eb, MR_EIO, "unable to open '%s': %s", path, strerror(errno));
	rc = read_header(f, path, hdr, eb);
	fclose(f);
	if (rc < 0)
		return rc;
	mr_weights_unpack_config(hdr, c);
	unpack_family(hdr, c);
	rc = mr_gpt_config_check(c, eb);
	if (rc < 0)
		return mr_errf(eb, rc, "'%s': bad config", path);
	return 0;
}

int mr_weights_load(struct mr_gpt *m, const char *path, struct mr_errbuf *eb)
{
	int32_t hdr[MR_WEIGHTS_HEADER_INTS];
	struct mr_gpt_config c;
	uint64_t n;
	FILE *f = fopen(path, "rb");
	float *h = NULL;
	int rc;
	long extra;

	if (!f)
		return mr_errf(eb, MR_EIO, "unable to open '%s': %s", path, strerror(errno));
	rc = read_header(f, path, hdr, eb);
	if (rc < 0)
		goto out;
	mr_weights_unpack_config(hdr, &c);
	unpack_family(hdr, &c);
	n = (uint64_t)(uint32_t)hdr[13] | ((uint64_t)(uint32_t)hdr[14] << 32);
	if (memcmp(&c, &m->cfg, sizeof(c)) != 0 || hdr[12] != m->ntensors ||
	    n != (uint64_t)m->nparams) {
		rc = mr_errf(eb, MR_EINVAL, "'%s': model config differs from the file's", path);
		goto out;
	}
	if (!(h = malloc(sizeof(float) * m->nparams))) {
		rc = mr_errf(eb, MR_ENOMEM, "'%s': out of memory for %zu parameters", path,
			     m->nparams);
		goto out;
	}
	if (fread(h, sizeof(float), m->nparams, f) != m->nparams) {
		rc = mr_errf(eb, MR_ECORRUPT, "'%s': truncated (want %zu parameters)", path,
			     m->nparams);
		goto out;
	}
	extra = ftell(f);
	if (fseek(f, 0, SEEK_END) == 0 && ftell(f) != extra) {
		rc = mr_errf(eb, MR_ECORRUPT, "'%s': trailing bytes after the parameters", path);
		goto out;
	}
	/* the file is whole: now the model's (device) parameters change */
	rc = m->dev->ops->upload(m->dev, m->params, h, sizeof(float) * m->nparams);
	if (rc == 0)
		rc = mr_gpt_refresh_compute(m);
	if (rc < 0)
		rc = mr_errf(eb, rc, "'%s': unable to load the parameters onto the device", path);
out:
	free(h);
	fclose(f);
	return rc;
}
