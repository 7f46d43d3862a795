/*
 * device.c - opening a device by name and precision (see mr_device.h).
 * The cuda backend is reached through the CUDA side's table
 * (plugin/cuda_entry.h): where this build has none, or the machine no GPU,
 * "cuda" fails naming "device".
 */
#include <string.h>

#include "device/dev_int.h"
#include "plugin/cuda_entry.h"

int mr_dev_check_precision(const char *name, const char *precision, struct mr_errbuf *eb)
{
	int cuda = name && !strcmp(name, "cuda");

	if (!precision || !strcmp(precision, "fp32") || (cuda && !strcmp(precision, "bf16")))
		return 0;
	return mr_errf_field(eb, MR_EINVAL, "precision",
			     "'precision' \"%s\" is not available on device %s (%s)", precision,
			     cuda ? "cuda" : "cpu", cuda ? "bf16, fp32" : "fp32 only");
}

static int open_cuda(struct mr_dev *d, int index, const char *precision, struct mr_errbuf *eb)
{
	struct mr_errbuf why = { { 0 }, { 0 } };
	const struct mr__cuda_entry *e;
	enum mr_dtype act = precision && !strcmp(precision, "fp32") ? MR_DT_F32 : MR_DT_BF16;
	int rc;

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
	if ((!name || !strcmp(name, "cpu") || !strcmp(name, "cuda")) &&
	    mr_dev_check_precision(name, precision, eb) < 0)
		return MR_EINVAL;
	if (!name || !strcmp(name, "cpu")) {
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

const char *mr_dev_kind_name(int kind)
{
	static const char *const names[MR_DEV_KINDS + 1] = {
		[MR_DEV_ATTENTION] = "attention", [MR_DEV_GEMM] = "gemm",
		[MR_DEV_OPTIMIZER] = "optimizer", [MR_DEV_COPY] = "copy",
		[MR_DEV_OTHER] = "other",         [MR_DEV_KINDS] = "idle",
	};

	return kind >= 0 && kind <= MR_DEV_KINDS ? names[kind] : "?";
}
