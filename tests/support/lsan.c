/*
 * lsan.c - LeakSanitizer's suppressions for every test binary (this file
 * is linked into each, Makefile test_helpers). Criterion 2.4's runner
 * sometimes leaks one 48-byte block of its own when tests run in parallel
 * (--jobs 2): keep LeakSanitizer quiet about libcriterion only, so a leak
 * in meshrun's code still fails the sanitizer build.
 */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
	return "leak:libcriterion.so\n";
}
