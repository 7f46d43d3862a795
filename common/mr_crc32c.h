/*
 * mr_crc32c.h - CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected),
 * the checksum of checkpoint shards (as in iSCSI, ext4 and LevelDB).
 *
 * Incremental: crc = mr_crc32c(0, a, na); crc = mr_crc32c(crc, b, nb)
 * equals mr_crc32c(0, ab, na + nb). "123456789" gives 0xE3069283.
 * Uses the SSE4.2 crc32 instruction where the CPU has it, a slicing-by-8
 * table otherwise; both give the same values.
 *
 * Non-goals: other polynomials, hardware on other architectures.
 */
#ifndef MR_CRC32C_H
#define MR_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t mr_crc32c(uint32_t crc, const void *buf, size_t n);
/* The table version alone (tests compare it with the hardware path). */
uint32_t mr_crc32c_sw(uint32_t crc, const void *buf, size_t n);

#endif
