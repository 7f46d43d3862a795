/*
 * dev_comm.c - a device as the comm layer sees it (see mr_dev_comm.h):
 * the device table's is_device, download, upload, alloc, free, stream and
 * stream-ordered waits behind struct mr_comm_device's callbacks, and the
 * sync before a collective (mr_dev_comm_sync).
 */
#include <string.h>

#include "device/mr_dev_comm.h"

static int is_device(void *ctx, const void *p)
{
	struct mr_dev_comm *c = ctx;

	return c->dev->ops->is_device(c->dev, p);
}

static int download(void *ctx, void *host, const void *dev, size_t bytes)
{
	struct mr_dev_comm *c = ctx;

	return c->dev->ops->download(c->dev, host, dev, bytes);
}

static int upload(void *ctx, void *dev, const void *host, size_t bytes)
{
	struct mr_dev_comm *c = ctx;

	return c->dev->ops->upload(c->dev, dev, host, bytes);
}

static void *alloc(void *ctx, size_t bytes)
{
	struct mr_dev_comm *c = ctx;

	return mr_dev_alloc(c->dev, &c->mem, MR_MEM_WORKSPACE, bytes);
}

static void release(void *ctx, void *p, size_t bytes)
{
	struct mr_dev_comm *c = ctx;

	mr_dev_free(c->dev, &c->mem, MR_MEM_WORKSPACE, p, bytes);
}

static void *stream(void *ctx)
{
	struct mr_dev_comm *c = ctx;

	return c->dev->ops->stream ? c->dev->ops->stream(c->dev) : NULL;
}

static int stream_wait(void *ctx, void *ev, const struct mr_comm_fence *f)
{
	struct mr_dev_comm *c = ctx;

	return c->dev->ops->stream_wait(c->dev, ev, f);
}

static void stream_forget(void *ctx, const void *owner)
{
	struct mr_dev_comm *c = ctx;

	c->dev->ops->stream_forget(c->dev, owner);
}

const struct mr_comm_device *mr_dev_comm_init(struct mr_dev_comm *c, struct mr_dev *d)
{
	int ordered = d->ops->stream_wait != NULL;

	memset(c, 0, sizeof(*c));
	if (!d->ops->is_device)
		return NULL;
	c->dev = d;
	c->cd = (struct mr_comm_device){ c, is_device, download, upload, alloc, release, stream,
					 ordered ? stream_wait : NULL,
					 ordered ? stream_forget : NULL, 0 };
	return &c->cd;
}

int mr_dev_comm_sync(struct mr_dev *d, const struct mr_comm *c)
{
	if (!c || mr_comm_stream_ordered(c))
		return 0;
	return d->ops->sync(d);
}
