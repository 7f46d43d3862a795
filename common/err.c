/* err.c - the error table behind mr_strerror() and mr_err_name(). */
#include "mr_err.h"

#include <stdarg.h>
#include <stdio.h>

const char *mr_strerror(int err)
{
	switch (err) {
#define MR__ERR_MSG(name, value, msg) \
	case value:                   \
		return msg;
		MR_ERR_TABLE(MR__ERR_MSG)
#undef MR__ERR_MSG
	}
	return "unknown error";
}

const char *mr_err_name(int err)
{
	switch (err) {
#define MR__ERR_NAME(name, value, msg) \
	case value:                    \
		return "MR_E" #name;
		MR_ERR_TABLE(MR__ERR_NAME)
#undef MR__ERR_NAME
	}
	return "MR_EUNKNOWN";
}

int mr_errf(struct mr_errbuf *eb, int err, const char *fmt, ...)
{
	va_list ap;

	if (!eb || eb->msg[0])
		return err;
	eb->field[0] = '\0'; /* msg and field always describe the same error */
	va_start(ap, fmt);
	vsnprintf(eb->msg, sizeof(eb->msg), fmt, ap);
	va_end(ap);
	return err;
}

int mr_errf_field(struct mr_errbuf *eb, int err, const char *field, const char *fmt, ...)
{
	va_list ap;

	if (!eb || eb->msg[0])
		return err;
	snprintf(eb->field, sizeof(eb->field), "%s", field ? field : "");
	va_start(ap, fmt);
	vsnprintf(eb->msg, sizeof(eb->msg), fmt, ap);
	va_end(ap);
	return err;
}

void mr_errbuf_clear(struct mr_errbuf *eb)
{
	if (eb) {
		eb->msg[0] = '\0';
		eb->field[0] = '\0';
	}
}
