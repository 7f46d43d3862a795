/*
 * device.c - opening a device by name (see mr_device.h).
 */
#include <string.h>

#include "device/mr_device.h"

int mr__dev_cpu_open(struct mr_dev *d, struct mr_pool *pool);

int mr_dev_open(struct mr_dev *d, const char *name, int index, const char *precision,
		struct mr_pool *pool, struct mr_errbuf *eb)
{
	(void)index;
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
	return mr_errf_field(eb, strcmp(name, "cuda") ? MR_EINVAL : MR_ENOTSUP, "device",
			     "'device' \"%s\" is not a backend of the device layer (cpu)", name);
}

void mr_dev_close(struct mr_dev *d)
{
	if (d->ops && d->ops->close)
		d->ops->close(d);
	memset(d, 0, sizeof(*d));
}
