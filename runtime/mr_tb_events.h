/*
 * mr_tb_events.h - a TensorBoard event file writer: scalars per step into
 * events.out.tfevents.<unix seconds>.<hostname>.<pid>.meshrun in a
 * directory, so `tensorboard --logdir <dir>` plots a run while it trains.
 *
 * The file is TensorFlow's record format (each record: uint64 length, its
 * masked CRC-32C, the data, the data's masked CRC-32C; little endian) of
 * serialized Event protobufs, encoded by hand: the first carries
 * file_version "brain.Event:2", each later one a step's Summary of
 * simple_value scalars (or a SessionLog START where a run starts). Every open makes a new file (a resumed job adds
 * one; TensorBoard merges the files of a directory).
 *
 * Non-goals: reading event files, histograms, images, text; any other
 * protobuf. One writer is used by one thread.
 *
 * The caller owns the struct mr_tb (mr_tb_open fills it, mr_tb_close
 * releases what it holds; closing a closed or never-opened zeroed one is a
 * no-op).
 */
#ifndef MR_TB_EVENTS_H
#define MR_TB_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "mr_err.h"

#define MR_TB_MAX_TAG 128      /* bytes of a tag, without its NUL */
#define MR_TB_MAX_PENDING 4096 /* bytes of one step's scalars before a flush */

struct mr_tb {
	int open;              /* fd is the event file */
	int fd;
	char path[4352];       /* the event file */
	int64_t step;          /* the pending scalars' step */
	size_t n;              /* bytes of pending Summary.Value fields */
	uint8_t pending[MR_TB_MAX_PENDING];
};

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of buf, continued
 * from crc (0 to start): crc32c(0, "123456789", 9) = 0xE3069283. */
uint32_t mr_tb_crc32c(uint32_t crc, const void *buf, size_t n);

/* Creates dir (mkdir -p) and in it a new event file, whose first record
 * (file_version) it writes. Errors name the path and the reason; field is
 * the config key they are reported under ("tensorboard_dir"), may be NULL. */
int mr_tb_open(struct mr_tb *tb, const char *dir, const char *field, struct mr_errbuf *eb);

/* Adds the scalar tag = value at step to the pending Summary; a pending
 * one of another step (or a full one) is written first. A tag longer than
 * MR_TB_MAX_TAG is refused (MR_EINVAL). */
int mr_tb_scalar(struct mr_tb *tb, int64_t step, const char *tag, float value,
		 struct mr_errbuf *eb);

/* Writes the pending scalars as one Event (nothing when none are pending),
 * so a reader sees them. */
int mr_tb_flush(struct mr_tb *tb, struct mr_errbuf *eb);

/* Writes an Event at step holding SessionLog START (after pending
 * scalars): TensorBoard then drops what earlier files of the directory
 * hold for steps >= step - the steps a resumed or restarted run trains
 * again. */
int mr_tb_session_start(struct mr_tb *tb, int64_t step, struct mr_errbuf *eb);

/* Flushes, then closes the file (a failed flush is dropped: errors are
 * for mr_tb_flush). */
void mr_tb_close(struct mr_tb *tb);

#endif
