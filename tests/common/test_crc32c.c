/*
 * test_crc32c.c - common/mr_crc32c.h against published vectors (RFC 3720
 * appendix B.4, and the "123456789" check value of the Castagnoli
 * polynomial) and against a bit-at-a-time reference written here, at
 * every start alignment and length up to 300 bytes, whole and in two
 * incremental pieces (the fast path reads 8 bytes at a time: a wrong
 * head, tail or piece join shows up here).
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "mr_crc32c.h"

/* CRC-32C one bit at a time: reflected polynomial 0x82F63B78. */
static uint32_t bitwise(const unsigned char *p, size_t n)
{
	uint32_t c = 0xFFFFFFFFu;

	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
	}
	return c ^ 0xFFFFFFFFu;
}

Test(crc32c, published_vectors)
{
	unsigned char b[32];

	cr_expect_eq(mr_crc32c(0, "123456789", 9), 0xE3069283u);
	memset(b, 0, sizeof(b));
	cr_expect_eq(mr_crc32c(0, b, 32), 0x8A9136AAu);
	memset(b, 0xFF, sizeof(b));
	cr_expect_eq(mr_crc32c(0, b, 32), 0x62A8AB43u);
	for (int i = 0; i < 32; i++)
		b[i] = (unsigned char)i;
	cr_expect_eq(mr_crc32c(0, b, 32), 0x46DD794Eu);
	for (int i = 0; i < 32; i++)
		b[i] = (unsigned char)(31 - i);
	cr_expect_eq(mr_crc32c(0, b, 32), 0x113FDB5Cu);
	cr_expect_eq(mr_crc32c(0, b, 0), 0u);
}

Test(crc32c, every_alignment_length_and_split_equals_the_bitwise_crc)
{
	unsigned char buf[320];

	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (unsigned char)(i * 131u + 7u);
	for (size_t off = 0; off < 8; off++)
		for (size_t n = 0; n <= 300; n++) {
			uint32_t want = bitwise(buf + off, n);
			size_t cut = n / 3;

			cr_assert_eq(mr_crc32c(0, buf + off, n), want, "offset %zu length %zu", off,
				     n);
			cr_assert_eq(mr_crc32c(mr_crc32c(0, buf + off, cut), buf + off + cut, n - cut),
				     want, "offset %zu length %zu split at %zu", off, n, cut);
		}
}
