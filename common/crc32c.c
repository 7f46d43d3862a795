/*
 * crc32c.c - CRC-32C, table and SSE4.2 versions (see mr_crc32c.h).
 */
#include <pthread.h>
#include <string.h>

#include "mr_crc32c.h"

#define POLY 0x82F63B78u /* 0x1EDC6F41 reflected */

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void make_table(void)
{
	int i, k;

	for (i = 0; i < 256; i++) {
		uint32_t c = (uint32_t)i;
		for (k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
		table[0][i] = c;
	}
	for (i = 0; i < 256; i++)
		for (k = 1; k < 8; k++)
			table[k][i] = (table[k - 1][i] >> 8) ^ table[0][table[k - 1][i] & 0xff];
}

uint32_t mr_crc32c_sw(uint32_t crc, const void *buf, size_t n)
{
	const unsigned char *p = buf;

	pthread_once(&table_once, make_table);
	crc = ~crc;
	for (; n >= 8; n -= 8, p += 8) {
		uint32_t lo, hi;
		memcpy(&lo, p, 4);
		memcpy(&hi, p + 4, 4);
		lo ^= crc; /* little-endian hosts (every target of meshrun) */
		crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^
		      table[5][(lo >> 16) & 0xff] ^ table[4][lo >> 24] ^ table[3][hi & 0xff] ^
		      table[2][(hi >> 8) & 0xff] ^ table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
	}
	while (n--)
		crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
	return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const void *buf,
							     size_t n)
{
	const unsigned char *p = buf;
	uint64_t c = ~crc;

	for (; n >= 8; n -= 8, p += 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		c = __builtin_ia32_crc32di(c, v);
	}
	while (n--)
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
	return ~(uint32_t)c;
}

static int hw;
static pthread_once_t hw_once = PTHREAD_ONCE_INIT;

static void probe_hw(void)
{
	__builtin_cpu_init();
	hw = __builtin_cpu_supports("sse4.2");
}

uint32_t mr_crc32c(uint32_t crc, const void *buf, size_t n)
{
	pthread_once(&hw_once, probe_hw);
	return hw ? crc32c_hw(crc, buf, n) : mr_crc32c_sw(crc, buf, n);
}
#else
uint32_t mr_crc32c(uint32_t crc, const void *buf, size_t n)
{
	return mr_crc32c_sw(crc, buf, n);
}
#endif
