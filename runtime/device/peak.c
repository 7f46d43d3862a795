/*
 * peak.c - the dense peak FLOP/s of a GPU by its name, for MFU. The
 * figures are the vendor's datasheet numbers without structured sparsity:
 * bf16 on the tensor cores (with fp32 accumulation), and fp32 on the CUDA
 * cores - the cuda backend's fp32 GEMMs run without TF32
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
#include <string.h>

#include "device/mr_device.h"

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
