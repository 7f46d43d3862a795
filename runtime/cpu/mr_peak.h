/*
 * mr_peak.h - the CPU's sustained sgemm FLOP/s, the denominator of the
 * CPU runtime's MFU when the workload config gives no peak_flops.
 *
 * Measured once per machine, not per rank: every rank of a machine must
 * report MFU against the same peak, and a rank that times sgemm while
 * other ranks train measures its neighbours, not the CPU (two ranks of
 * one `make run` job once reported 0.02 and 0.07 for the same step). The
 * first process to ask measures while holding an exclusive flock on a
 * cache file in /dev/shm (shared by the processes of a pod, or of
 * `meshrun local`); the others wait on the lock and read its result. An
 * entry is trusted for MR_PEAK_TTL_S seconds and only on the boot that
 * wrote it. Where the file cannot be used, each process measures once.
 *
 * Non-goals: GPU peaks (a table by device name), frequency scaling.
 */
#ifndef MR_PEAK_H
#define MR_PEAK_H

#define MR_PEAK_CACHE "/dev/shm/meshrun-sgemm-peak"
#define MR_PEAK_TTL_S 600

/* One thread's sustained sgemm FLOP/s on this machine (0 if it could not
 * be measured). Thread-safe; the first call may take ~0.1 s. */
double mr_cpu_sgemm_peak(void);

#endif
