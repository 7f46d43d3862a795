/*
 * mr_dtype.h - the element types a device computes its activations in
 * (struct mr_dev.act, device/mr_device.h): fp32, or bf16 with fp32
 * master weights, gradients and optimizer state.
 */
#ifndef MR_DTYPE_H
#define MR_DTYPE_H

enum mr_dtype { MR_DT_F32, MR_DT_BF16 };

#endif
