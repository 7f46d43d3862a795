/*
 * mr_peak.h - the peak FLOP/s that MFU divides by when the workload
 * config gives no peak_flops: on a GPU its datasheet's dense peak by the
 * driver's name, on the CPU one thread's sustained sgemm FLOP/s.
 *
 * The CPU's is measured once per machine, not per rank: every rank of a
 * machine must report MFU against the same peak, and a rank that times
 * sgemm while other ranks train measures its neighbours, not the CPU (two
 * ranks of one `make run` job once reported 0.02 and 0.07 for the same
 * step). The
 * first process to ask measures while holding an exclusive flock on a
 * cache file in /dev/shm (shared by the processes of a pod, or of
 * `meshrun local`); the others wait on the lock and read its result. An
 * entry is trusted for MR_PEAK_TTL_S seconds and only on the boot that
 * wrote it. Where the file cannot be used, each process measures once.
 *
 * A GPU's is a table of known parts (peak.c); an unknown GPU has none.
 *
 * Non-goals: measuring a GPU's peak, frequency scaling.
 */
#ifndef MR_PEAK_H
#define MR_PEAK_H

#include "core/mr_dtype.h"

#define MR_PEAK_CACHE "/dev/shm/meshrun-sgemm-peak"
#define MR_PEAK_TTL_S 600

/* One thread's sustained sgemm FLOP/s on this machine (0 if it could not
 * be measured). Thread-safe; the first call may take ~0.1 s. */
double mr_cpu_sgemm_peak(void);

/* The datasheet's dense peak FLOP/s of a GPU named `model` at precision
 * act (runtime/device/peak.c), or 0 for a GPU the table does not know. */
double mr_dev_peak_flops(const char *model, enum mr_dtype act);

#endif
