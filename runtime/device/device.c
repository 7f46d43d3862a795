/*
 * device.c - opening a device by name and precision (see mr_device.h).
 * The cuda backend is reached through the CUDA side's table
 * (device/cuda_entry.h): where this build has none, or the machine no GPU,
 * "cuda" fails naming "device".
 */
#include <string.h>

#include "device/cuda_entry.h"
#include "device/dev_int.h"

static int open_cuda(struct mr_dev *d, int index, const char *precision, struct mr_errbuf *eb)
{
	struct mr_errbuf why = { { 0 }, { 0 } };
	const struct mr__cuda_entry *e;
	enum mr_dtype act = MR_DT_BF16;
	int rc;

	if (precision && !strcmp(precision, "fp32"))
		act = MR_DT_F32;
	else if (precision && strcmp(precision, "bf16"))
		return mr_errf_field(eb, MR_EINVAL, "precision",
				     "'precision' \"%s\" is not available on device cuda (bf16, "
				     "fp32)",
				     precision);
	if (!(e = mr__cuda_entry(&why)) || e->device_count(&why) < 1)
		return mr_errf_field(eb, MR_ENOTSUP, "device",
				     "'device' \"cuda\" is not available: %s", why.msg);
	rc = e->dev_open(d, index, act, &why);
	if (rc < 0)
		return mr_errf_field(eb, rc, "device",
				     "'device' \"cuda\" is not available as GPU %d: %s", index,
				     why.msg);
	return 0;
}

int mr_dev_open(struct mr_dev *d, const char *name, int index, const char *precision,
		struct mr_pool *pool, struct mr_errbuf *eb)
{
	memset(d, 0, sizeof(*d));
	if (!name || !strcmp(name, "cpu")) {
		if (precision && strcmp(precision, "fp32"))
			return mr_errf_field(eb, MR_EINVAL, "precision",
					     "'precision' \"%s\" is not available on device cpu "
					     "(fp32 only)",
					     precision);
		if (mr__dev_cpu_open(d, pool) < 0)
			return mr_errf(eb, MR_ENOMEM, "unable to open device cpu");
		return 0;
	}
	if (!strcmp(name, "cuda"))
		return open_cuda(d, index, precision, eb);
	return mr_errf_field(eb, MR_EINVAL, "device", "'device' \"%s\" is not a device (cpu, cuda)",
			     name);
}

void mr_dev_close(struct mr_dev *d)
{
	if (d->ops && d->ops->close)
		d->ops->close(d);
	memset(d, 0, sizeof(*d));
}
