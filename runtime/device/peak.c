/*
 * peak.c - the peak FLOP/s behind MFU (see mr_peak.h): a GPU's by its
 * name, and one CPU thread's sustained sgemm, measured once per machine
 * and cached in /dev/shm.
 *
 * GPUs: the figures are the vendor's datasheet numbers without structured
 * sparsity: bf16 on the tensor cores (with fp32 accumulation), and fp32 on
 * the CUDA cores - the cuda backend's fp32 GEMMs run without TF32
 * (runtime/cuda/device.cu), so TF32 peaks would understate its MFU.
 *
 *   NVIDIA H100 SXM5 datasheet: 989.4 TFLOP/s bf16, 66.9 fp32;
 *   H100 PCIe: 756.5 / 51.2; H200 SXM (same GH100 compute as H100 SXM):
 *   989.4 / 66.9; A100 (SXM and PCIe): 312 / 19.5; L40S: 362.05 / 91.6.
 *
 * Names are matched as substrings of what the driver reports, most
 * specific first ("NVIDIA H100 80GB HBM3" is the SXM part; "NVIDIA H100
 * PCIe" the PCIe one). An unknown GPU has no peak: MFU is then reported
 * as 0 until the workload config sets "peak_flops".
 */
#include "device/mr_peak.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "kernels/mr_kernels.h"

static const struct {
	const char *name;
	double bf16, fp32; /* TFLOP/s */
} peaks[] = {
	{ "H100 PCIe", 756.5, 51.2 },
	{ "GH200", 989.4, 66.9 },
	{ "H200", 989.4, 66.9 },
	{ "H100", 989.4, 66.9 },
	{ "A100", 312.0, 19.5 },
	{ "L40S", 362.05, 91.6 },
};

double mr_dev_peak_flops(const char *model, enum mr_dtype act)
{
	size_t i;

	for (i = 0; model && i < sizeof(peaks) / sizeof(peaks[0]); i++)
		if (strstr(model, peaks[i].name))
			return 1e12 * (act == MR_DT_BF16 ? peaks[i].bf16 : peaks[i].fp32);
	return 0.0;
}

static double peak;
static pthread_once_t peak_once = PTHREAD_ONCE_INIT;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Best of three 512^3 sgemms on this thread, after a warm-up one. */
static double measure(void)
{
	const int n = 512, reps = 3;
	float *a = calloc((size_t)n * n * 3, sizeof(float));
	double best = 0.0;

	if (!a)
		return 0.0;
	for (int r = 0; r < n * n * 2; r++)
		a[r] = 0.001f * (float)(r % 97);
	mr_matmul_fwd(NULL, a + 2 * n * n, a, a + n * n, NULL, n, n, n);
	for (int r = 0; r < reps; r++) {
		double t0 = now_s(), dt;

		mr_matmul_fwd(NULL, a + 2 * n * n, a, a + n * n, NULL, n, n, n);
		dt = now_s() - t0;
		if (dt > 0 && 2.0 * n * n * n / dt > best)
			best = 2.0 * n * n * n / dt;
	}
	free(a);
	return best;
}

static void boot_id(char *buf, size_t cap)
{
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

	buf[0] = '\0';
	if (f) {
		if (!fgets(buf, (int)cap, f))
			buf[0] = '\0';
		fclose(f);
	}
	buf[strcspn(buf, "\n ")] = '\0';
}

/* The cached peak in fd if it is this boot's and fresh, else 0. */
static double cached(int fd, const char *boot)
{
	char buf[160], b[64];
	long long written;
	double v;
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	if (n <= 0)
		return 0.0;
	buf[n] = '\0';
	if (sscanf(buf, "%63s %lld %lf", b, &written, &v) != 3 || strcmp(b, boot) ||
	    (long long)time(NULL) - written > MR_PEAK_TTL_S || written > (long long)time(NULL) ||
	    !(v > 0))
		return 0.0;
	return v;
}

static void measure_once(void)
{
	char boot[64], line[160];
	int fd, n;

	boot_id(boot, sizeof(boot));
	fd = open(MR_PEAK_CACHE, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0 || !boot[0] || flock(fd, LOCK_EX) != 0) {
		if (fd >= 0)
			close(fd);
		peak = measure();
		return;
	}
	peak = cached(fd, boot);
	if (!(peak > 0)) {
		peak = measure();
		n = snprintf(line, sizeof(line), "%s %lld %.6e\n", boot, (long long)time(NULL),
			     peak);
		if (peak > 0 && (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n))
			errno = 0; /* the next process measures again: nothing lost */
	}
	flock(fd, LOCK_UN);
	close(fd);
}

double mr_cpu_sgemm_peak(void)
{
	pthread_once(&peak_once, measure_once);
	return peak;
}
