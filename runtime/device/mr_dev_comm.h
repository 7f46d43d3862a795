/*
 * mr_dev_comm.h - a device as the comm layer sees it (struct
 * mr_comm_device, comm/mr_comm.h): which buffers are device memory and how
 * to copy them and make stand-ins, so a communicator can take device and
 * host buffers alike (the host backend stages device buffers through host
 * memory, nccl host buffers through device memory), its compute stream
 * and its stream-ordered waits; and the sync a collective needs first.
 *
 * Ownership: struct mr_dev_comm borrows the device and owns the ledger of
 * the stand-ins it allocates; it must outlive the communicators given its
 * mr_comm_device.
 */
#ifndef MR_DEV_COMM_H
#define MR_DEV_COMM_H

#include "comm/mr_comm.h"
#include "device/mr_device.h"

struct mr_dev_comm {
	struct mr_comm_device cd;
	struct mr_dev *dev;
	struct mr_mem mem; /* device stand-ins (WORKSPACE) */
};

/* The comm view of d, or NULL when d's memory is host memory (cpu):
 * then communicators need none. */
const struct mr_comm_device *mr_dev_comm_init(struct mr_dev_comm *c, struct mr_dev *d);

/* Before a collective of c on buffers d's queued work writes: waits for
 * d's stream, unless c is stream-ordered (mr_comm_stream_ordered: its
 * backend orders itself after the stream). c NULL: no collective, 0. The
 * one place the parallel layers decide whether to sync. */
int mr_dev_comm_sync(struct mr_dev *d, const struct mr_comm *c);

#endif
