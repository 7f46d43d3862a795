/*
 * gpt_cuda.c - the gpt worker's CUDA device path (see gpt_cuda.h).
 */
#include <stdlib.h>

#include "gpt_cuda.h"
#include "model/mr_weights.h"

#ifdef MR_HAVE_CUDA
#include "cuda/mr_cuda_gpt.h"

struct mr_gpt_cuda {
	struct mr_cuda *cu;
	struct mr_cuda_gpt *g;
};

int mr_gpt_cuda_check(const struct mr_gpt_config *cfg, int B, int T, struct mr_errbuf *eb)
{
	return mr_cuda_gpt_check(cfg, B, T, eb);
}

int mr_gpt_cuda_create(struct mr_gpt_cuda **out, int device, const struct mr_gpt_config *cfg,
		       int B, int T, const struct mr_adamw_config *ocfg, uint64_t seed,
		       struct mr_errbuf *eb)
{
	struct mr_gpt_cuda *d = calloc(1, sizeof(*d));
	int rc;

	*out = NULL;
	if (!d)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the cuda trainer");
	if ((rc = mr_cuda_create(&d->cu, device, eb)) < 0 ||
	    (rc = mr_cuda_gpt_create(&d->g, d->cu, cfg, B, T, ocfg, eb)) < 0 ||
	    (rc = mr_cuda_gpt_init_params(d->g, seed, eb)) < 0) {
		mr_gpt_cuda_free(d);
		return rc;
	}
	*out = d;
	return 0;
}

void mr_gpt_cuda_free(struct mr_gpt_cuda *d)
{
	if (!d)
		return;
	mr_cuda_gpt_free(d->g);
	mr_cuda_free(d->cu);
	free(d);
}

int mr_gpt_cuda_step(struct mr_gpt_cuda *d, const int *inputs, const int *targets, int accum,
		     struct mr_step_result *r, struct mr_errbuf *eb)
{
	return mr_cuda_gpt_step(d->g, inputs, targets, accum, r, eb);
}

int mr_gpt_cuda_eval(struct mr_gpt_cuda *d, const int *inputs, const int *targets,
		     float *loss, struct mr_errbuf *eb)
{
	return mr_cuda_gpt_forward(d->g, inputs, targets, loss, eb);
}

int mr_gpt_cuda_save(struct mr_gpt_cuda *d, const char *path, struct mr_errbuf *eb)
{
	const struct mr_gpt *t = mr_cuda_gpt_table(d->g);
	float *host = malloc(sizeof(float) * t->nparams);
	int rc;

	if (!host)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the downloaded weights");
	rc = mr_cuda_gpt_download_params(d->g, host, t->nparams, eb);
	if (rc == 0)
		rc = mr_weights_write_buf(&t->cfg, t->ntensors, host, t->nparams, path, eb);
	free(host);
	return rc;
}

void mr_gpt_cuda_mem(const struct mr_gpt_cuda *d, size_t *bytes)
{
	const struct mr_mem *m = mr_cuda_gpt_mem(d->g);
	int k;

	for (k = 0; k < MR_MEM_KINDS; k++)
		bytes[k] = m->bytes[k];
}

size_t mr_gpt_cuda_flops_per_token(const struct mr_gpt_cuda *d)
{
	return mr_cuda_gpt_flops_per_token(d->g);
}

#else /* built without CUDA */

static int no_cuda(struct mr_errbuf *eb)
{
	return mr_errf_field(eb, MR_ENOTSUP, "device",
			     "'device' is \"cuda\" but this build has no CUDA backend "
			     "(no nvcc under CUDA_HOME at build time)");
}

int mr_gpt_cuda_check(const struct mr_gpt_config *cfg, int B, int T, struct mr_errbuf *eb)
{
	(void)cfg;
	(void)B;
	(void)T;
	return no_cuda(eb);
}

int mr_gpt_cuda_create(struct mr_gpt_cuda **out, int device, const struct mr_gpt_config *cfg,
		       int B, int T, const struct mr_adamw_config *ocfg, uint64_t seed,
		       struct mr_errbuf *eb)
{
	(void)device;
	(void)ocfg;
	(void)seed;
	*out = NULL;
	return mr_gpt_cuda_check(cfg, B, T, eb);
}

void mr_gpt_cuda_free(struct mr_gpt_cuda *d)
{
	(void)d;
}

int mr_gpt_cuda_step(struct mr_gpt_cuda *d, const int *inputs, const int *targets, int accum,
		     struct mr_step_result *r, struct mr_errbuf *eb)
{
	(void)d;
	(void)inputs;
	(void)targets;
	(void)accum;
	(void)r;
	return no_cuda(eb);
}

int mr_gpt_cuda_eval(struct mr_gpt_cuda *d, const int *inputs, const int *targets,
		     float *loss, struct mr_errbuf *eb)
{
	(void)d;
	(void)inputs;
	(void)targets;
	(void)loss;
	return no_cuda(eb);
}

int mr_gpt_cuda_save(struct mr_gpt_cuda *d, const char *path, struct mr_errbuf *eb)
{
	(void)d;
	(void)path;
	return no_cuda(eb);
}

void mr_gpt_cuda_mem(const struct mr_gpt_cuda *d, size_t *bytes)
{
	(void)d;
	(void)bytes;
}

size_t mr_gpt_cuda_flops_per_token(const struct mr_gpt_cuda *d)
{
	(void)d;
	return 0;
}

#endif
