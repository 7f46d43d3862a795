/*
 * httpd_tls.c - the server's TLS credentials: the certificate chain and
 * key read from PEM files, handed to GnuTLS per handshake through
 * libmicrohttpd's certificate callback, and read again when the files
 * change (Kubernetes rotates a mounted Secret by swapping its files), so
 * a new certificate takes effect at the next handshake without a
 * restart and without touching open connections. A client CA, when
 * given, makes the server ask every client for a certificate; requests
 * other than the probes must then come with one that CA signed
 * (mr__httpd_tls_client_ok).
 *
 * GnuTLS's callback has no user pointer, so the credentials are one per
 * process (the controller serves one TLS port); a second TLS server in
 * the same process is refused. Every generation of credentials is kept
 * until the server stops: a handshake in flight may still use the one it
 * was handed, and rotations are rare.
 *
 * Non-goals: OCSP, CRLs, SNI (one certificate).
 */
#include <errno.h>
#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "httpd_int.h"
#include "mr_file.h"
#include "mr_log.h"

#define MAX_CHAIN 8
#define RELOAD_CHECK_MS 1000

struct creds {
	gnutls_pcert_st pcert[MAX_CHAIN];
	unsigned n;
	gnutls_privkey_t key;
	struct creds *older;
};

struct file_id {
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtime;
};

struct mr__httpd_tls {
	char *cert_file, *key_file;
	char *client_ca_pem; /* libmicrohttpd copies nothing: kept here */
	struct file_id cert_id, key_id;
	uint64_t checked_ms;
	unsigned long long reloads;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct creds *current; /* newest first, older ones chained */
static int in_use;

static void creds_free(struct creds *c)
{
	while (c) {
		struct creds *o = c->older;

		for (unsigned i = 0; i < c->n; i++)
			gnutls_pcert_deinit(&c->pcert[i]);
		if (c->key)
			gnutls_privkey_deinit(c->key);
		free(c);
		c = o;
	}
}

static int file_id_of(const char *path, struct file_id *id)
{
	struct stat st;

	if (stat(path, &st) < 0)
		return -1;
	id->dev = st.st_dev;
	id->ino = st.st_ino;
	id->size = st.st_size;
	id->mtime = st.st_mtim;
	return 0;
}

static int same_id(const struct file_id *a, const struct file_id *b)
{
	return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
	       a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}

/* The whole of a PEM file (at most 1 MiB) into a malloc'd, NUL-terminated
 * datum; eb names `what` and the path. */
static int read_pem(const char *path, const char *what, gnutls_datum_t *d, struct mr_errbuf *eb)
{
	size_t size = 0;
	char *buf;
	int rc = mr_file_read_small(path, what, 1 << 20, &buf, &size, NULL);

	if (rc == MR_ELIMIT || (rc == 0 && size == 0)) {
		free(buf);
		return mr_errf_field(eb, MR_EINVAL, what, "%s: '%s' is %s", what, path,
				     rc ? "larger than 1 MiB" : "empty");
	}
	if (rc < 0)
		return rc == MR_ENOMEM ? rc
				       : mr_errf_field(eb, rc, what, "%s: cannot read '%s': %s", what,
						       path,
						       rc == MR_ENOTFOUND ? "no such file"
									  : mr_strerror(rc));
	d->data = (unsigned char *)buf;
	d->size = (unsigned)size;
	return 0;
}

/* Loads the chain and the key, and checks that the key is the first
 * certificate's. */
static int creds_load(const char *cert_file, const char *key_file, struct creds **out,
		      struct mr_errbuf *eb)
{
	struct creds *c = calloc(1, sizeof(*c));
	gnutls_datum_t cd = { 0 }, kd = { 0 }, sig = { 0 };
	gnutls_pubkey_t pub;
	const gnutls_datum_t probe = { (unsigned char *)"meshrun", 7 };
	int rc, g;

	if (!c)
		return MR_ENOMEM;
	if ((rc = read_pem(cert_file, "tls_cert", &cd, eb)) < 0 ||
	    (rc = read_pem(key_file, "tls_key", &kd, eb)) < 0)
		goto out;
	c->n = MAX_CHAIN;
	g = gnutls_pcert_list_import_x509_raw(c->pcert, &c->n, &cd, GNUTLS_X509_FMT_PEM, 0);
	if (g < 0 || c->n == 0) {
		c->n = 0;
		rc = mr_errf_field(eb, MR_EINVAL, "tls_cert",
				   "tls_cert: '%s' holds no PEM certificate (chain of at most %d): %s",
				   cert_file, MAX_CHAIN, gnutls_strerror(g));
		goto out;
	}
	if ((g = gnutls_privkey_init(&c->key)) < 0 ||
	    (g = gnutls_privkey_import_x509_raw(c->key, &kd, GNUTLS_X509_FMT_PEM, NULL, 0)) < 0) {
		rc = mr_errf_field(eb, MR_EINVAL, "tls_key",
				   "tls_key: '%s' holds no unencrypted PEM private key: %s",
				   key_file, gnutls_strerror(g));
		goto out;
	}
	/* the key must be the certificate's: sign with one, verify with the other */
	pub = c->pcert[0].pubkey;
	if (gnutls_privkey_sign_data(c->key, GNUTLS_DIG_SHA256, 0, &probe, &sig) < 0 ||
	    gnutls_pubkey_verify_data2(pub, gnutls_pk_to_sign(gnutls_pubkey_get_pk_algorithm(
							   pub, NULL),
						   GNUTLS_DIG_SHA256),
				       0, &probe, &sig) < 0) {
		rc = mr_errf_field(eb, MR_EINVAL, "tls_key",
				   "tls_key: '%s' is not the key of the certificate in '%s'",
				   key_file, cert_file);
		goto out;
	}
	rc = 0;
out:
	gnutls_free(sig.data);
	free(cd.data);
	free(kd.data);
	if (rc < 0)
		creds_free(c);
	else
		*out = c;
	return rc;
}

/* GnuTLS asks for the server's certificate at each handshake. */
static int retrieve(gnutls_session_t s, const gnutls_datum_t *req_ca, int nreq,
		    const gnutls_pk_algorithm_t *algos, int nalgos, gnutls_pcert_st **pcert,
		    unsigned int *pcert_length, gnutls_privkey_t *key)
{
	(void)s;
	(void)req_ca;
	(void)nreq;
	(void)algos;
	(void)nalgos;
	pthread_mutex_lock(&lock);
	if (!current) {
		pthread_mutex_unlock(&lock);
		return -1;
	}
	*pcert = current->pcert;
	*pcert_length = current->n;
	*key = current->key;
	pthread_mutex_unlock(&lock);
	return 0;
}

int mr__httpd_tls_open(struct mr__httpd_tls **out, const struct mr_httpd_opts *o,
		       struct mr_errbuf *eb)
{
	struct mr__httpd_tls *t;
	struct creds *c = NULL;
	int rc;

	*out = NULL;
	if (!o->tls_cert || !o->tls_key)
		return mr_errf_field(eb, MR_EINVAL, o->tls_cert ? "tls_key" : "tls_cert",
				     "TLS needs both tls_cert and tls_key");
	pthread_mutex_lock(&lock);
	rc = in_use ? MR_ECONFLICT : 0;
	in_use |= rc == 0;
	pthread_mutex_unlock(&lock);
	if (rc < 0)
		return mr_errf(eb, rc, "httpd: one TLS server per process");
	t = calloc(1, sizeof(*t));
	if (!t || !(t->cert_file = strdup(o->tls_cert)) || !(t->key_file = strdup(o->tls_key))) {
		rc = MR_ENOMEM;
		goto fail;
	}
	if (o->tls_client_ca) {
		gnutls_datum_t d = { 0 };
		gnutls_x509_crt_t *list = NULL;
		unsigned n = 0;

		if ((rc = read_pem(o->tls_client_ca, "tls_client_ca", &d, eb)) < 0)
			goto fail;
		if (gnutls_x509_crt_list_import2(&list, &n, &d, GNUTLS_X509_FMT_PEM, 0) < 0 ||
		    n == 0) {
			free(d.data);
			rc = mr_errf_field(eb, MR_EINVAL, "tls_client_ca",
					   "tls_client_ca: '%s' holds no PEM certificate",
					   o->tls_client_ca);
			goto fail;
		}
		for (unsigned i = 0; i < n; i++)
			gnutls_x509_crt_deinit(list[i]);
		gnutls_free(list);
		t->client_ca_pem = (char *)d.data; /* NUL-terminated by read_pem */
	}
	file_id_of(t->cert_file, &t->cert_id);
	file_id_of(t->key_file, &t->key_id);
	if ((rc = creds_load(t->cert_file, t->key_file, &c, eb)) < 0)
		goto fail;
	pthread_mutex_lock(&lock);
	current = c;
	pthread_mutex_unlock(&lock);
	*out = t;
	return 0;
fail:
	if (t) {
		free(t->cert_file);
		free(t->key_file);
		free(t->client_ca_pem);
		free(t);
	}
	pthread_mutex_lock(&lock);
	in_use = 0;
	pthread_mutex_unlock(&lock);
	return rc < 0 ? rc : mr_errf(eb, MR_ENOMEM, "httpd: out of memory");
}

int mr__httpd_tls_options(struct mr__httpd_tls *t, struct MHD_OptionItem *opts)
{
	int k = 0;

	opts[k++] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_CERT_CALLBACK, 0,
					     (void *)retrieve };
	if (t->client_ca_pem)
		opts[k++] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_MEM_TRUST, 0,
						     t->client_ca_pem };
	return k;
}

void mr__httpd_tls_check(struct mr__httpd_tls *t, uint64_t now_ms)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct file_id ci, ki;
	struct creds *c = NULL;

	if (!t || now_ms - t->checked_ms < RELOAD_CHECK_MS)
		return;
	t->checked_ms = now_ms;
	if (file_id_of(t->cert_file, &ci) < 0 || file_id_of(t->key_file, &ki) < 0 ||
	    (same_id(&ci, &t->cert_id) && same_id(&ki, &t->key_id)))
		return;
	/* a rotation may be half done (the cert swapped, not yet the key):
	 * keep serving the old pair and try again at the next check */
	if (creds_load(t->cert_file, t->key_file, &c, &eb) < 0) {
		mr_log_warn("tls_reload_failed", "cert=%s key=%s reason=%s",
			    mr_log_q(t->cert_file), mr_log_q(t->key_file), mr_log_q(eb.msg));
		t->cert_id = ci; /* once per change, not every second */
		t->key_id = ki;
		return;
	}
	t->cert_id = ci;
	t->key_id = ki;
	pthread_mutex_lock(&lock);
	c->older = current;
	current = c;
	pthread_mutex_unlock(&lock);
	t->reloads++;
	mr_log_info("tls_reloaded", "cert=%s reloads=%llu", mr_log_q(t->cert_file), t->reloads);
}

int mr__httpd_tls_client_ok(struct mr__httpd_tls *t, struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci;
	unsigned status = 0;

	if (!t || !t->client_ca_pem)
		return 1;
	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
	if (!ci || !ci->tls_session)
		return 0;
	if (gnutls_certificate_type_get((gnutls_session_t)ci->tls_session) != GNUTLS_CRT_X509 ||
	    !gnutls_certificate_get_peers((gnutls_session_t)ci->tls_session, NULL))
		return 0;
	return gnutls_certificate_verify_peers2((gnutls_session_t)ci->tls_session, &status) ==
		       0 &&
	       status == 0;
}

void mr__httpd_tls_close(struct mr__httpd_tls *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&lock);
	creds_free(current);
	current = NULL;
	in_use = 0;
	pthread_mutex_unlock(&lock);
	free(t->cert_file);
	free(t->key_file);
	free(t->client_ca_pem);
	free(t);
}
