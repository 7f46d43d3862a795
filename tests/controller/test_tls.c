/*
 * test_tls.c - the controller over HTTPS, with certificates made at test
 * time by openssl: the product's own client (common/mr_httpc.h, what
 * agents, workers and the CLI use) talks to it with the right CA,
 * refuses a certificate another CA signed and says so, and a plain-HTTP
 * request gets nothing; a rotated certificate (the files swapped, as
 * Kubernetes swaps a Secret) serves new connections within seconds while
 * a long-poll parked on the old connection carries on; with a client CA,
 * every request but the probes needs a client certificate; bad files stop
 * the controller with exit 2 naming the flag; a real agent joins through
 * TLS and finishes, and one given the wrong CA stops naming it.
 */
#include <pthread.h>
#include <stdlib.h>

#include "ctl_test.h"
#include "mr_httpc.h"

static char pki[256]; /* the certificates of the test */

/* CA `ca`, and `leaf` signed by it for 127.0.0.1 (server or client) */
static void make_pki(void)
{
	char *out;
	int rc;

	if (system("command -v openssl >/dev/null 2>&1") != 0)
		cr_skip_test("openssl is not installed (scripts/deps.sh installs it)");
	cr_assert_eq(mr_test_tmpdir(pki, sizeof(pki), "mr-tls"), 0);
	rc = mr_test_sh(pki, &out,
			"set -e; ec='-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes';"
			"printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext;"
			"for ca in ca1 ca2; do openssl req -x509 $ec -keyout $ca.key -out $ca.crt "
			"-days 2 -subj /CN=$ca; done;"
			"leaf() { openssl req $ec -keyout $1.key -out $1.csr -subj /CN=$1;"
			"openssl x509 -req -in $1.csr -CA $2.crt -CAkey $2.key -CAcreateserial "
			"-out $1.crt -days 2 -extfile san.ext; };"
			"leaf srv1 ca1; leaf srv2 ca2; leaf client ca1; leaf stranger ca2;"
			"cp srv1.crt srv.crt; cp srv1.key srv.key");
	cr_assert_eq(rc, 0, "openssl: %s", out);
	free(out);
}

static const char *at(const char *name)
{
	static char buf[4][320];
	static int i;

	i = (i + 1) % 4;
	snprintf(buf[i], sizeof(buf[i]), "%s/%s", pki, name);
	return buf[i];
}

/* One GET with the product's client: 0 with *status, or the error. */
static int get(const char *url, const char *ca, const char *cert, const char *key,
	       const char *path, long *status, char *msg, size_t cap)
{
	struct mr_httpc_opts o = { .base_url = url, .tls_ca = ca, .tls_cert = cert,
				   .tls_key = key, .max_retries = 0, .timeout_ms = 10000 };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_http_resp r;
	struct mr_httpc c;
	struct mr_httpc_req q = { .path = path };
	int rc = mr_httpc_init(&c, &o, &eb);

	if (rc == 0)
		rc = mr_httpc_request(&c, &q, &r, &eb);
	if (rc == 0) {
		*status = r.status;
		mr_http_resp_release(&r);
	}
	snprintf(msg, cap, "%s", eb.msg);
	mr_httpc_release(&c);
	return rc;
}

static void start(struct ctlp *c, const char *client_ca)
{
	const char *extra[] = { "--tls-cert", at("srv.crt"), "--tls-key", at("srv.key"),
				client_ca ? "--tls-client-ca" : NULL, client_ca, NULL };

	ctlp_spawn(c, 0, extra);
	c->port = mr_proc_wait_port(&c->proc, c->port_file, 10000);
	cr_assert_gt(c->port, 0, "controller did not start (log %s)", c->log);
}

struct parked {
	char url[64];
	long status;
	int rc;
	char msg[256];
};

/* A long-poll wait on a connection made before the rotation. */
static void *park(void *arg)
{
	struct parked *p = arg;

	p->rc = get(p->url, at("ca1.crt"), NULL, NULL,
		    "/v1/jobs/t/rot/wait?node_id=a&generation=1&timeout_ms=30000", &p->status,
		    p->msg, sizeof(p->msg));
	return NULL;
}

Test(tls, verified_refused_and_rotated, .timeout = 120)
{
	struct ctlp c = { 0 };
	struct mr_httpc_opts o = { .max_retries = 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_httpc hc;
	struct parked p = { { 0 }, 0, 0, { 0 } };
	pthread_t th;
	char url[64], plain[64], msg[512];
	long status = 0, code = 0;
	json_t *out = NULL;
	long long t0;
	int ok;

	make_pki();
	start(&c, NULL);
	snprintf(url, sizeof(url), "https://127.0.0.1:%d", c.port);
	snprintf(plain, sizeof(plain), "http://127.0.0.1:%d", c.port);
	cr_assert_eq(get(url, at("ca1.crt"), NULL, NULL, "/healthz", &status, msg, sizeof(msg)),
		     0, "%s", msg);
	cr_expect_eq(status, 200);
	/* another CA's certificate is refused, naming the CA file */
	cr_expect_eq(get(url, at("ca2.crt"), NULL, NULL, "/healthz", &status, msg, sizeof(msg)),
		     MR_EPROTO);
	cr_expect(strstr(msg, "does not verify against the CA file") && strstr(msg, "ca2.crt"),
		  "%s", msg);
	/* plain HTTP gets nothing, and the client says why */
	cr_expect_neq(get(plain, NULL, NULL, NULL, "/healthz", &status, msg, sizeof(msg)), 0);
	cr_expect(strstr(msg, "use https://"), "%s", msg);

	/* a job of two: a parks its wait on a connection made with srv1 */
	o.base_url = url;
	o.tls_ca = at("ca1.crt");
	cr_assert_eq(mr_httpc_init(&hc, &o, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_httpc_json(&hc, "POST", "/v1/jobs/t/rot/join",
				   json_pack("{ss s{si}}", "node_id", "a", "spec", "min_nodes", 2),
				   10000, &code, &out, &eb),
		     0, "%s", eb.msg);
	cr_expect_eq(code, 200);
	json_decref(out);
	snprintf(p.url, sizeof(p.url), "%s", url);
	cr_assert_eq(pthread_create(&th, NULL, park, &p), 0);
	usleep(300 * 1000);

	/* rotate: srv2 (ca2) replaces srv1, file by file as a Secret update does */
	cr_assert_eq(mr_test_sh(pki, NULL, "cp srv2.key srv.key.tmp && mv srv.key.tmp srv.key && "
				"cp srv2.crt srv.crt.tmp && mv srv.crt.tmp srv.crt"),
		     0);
	t0 = mr_test_now_ms();
	do {
		usleep(100 * 1000);
		ok = get(url, at("ca2.crt"), NULL, NULL, "/healthz", &status, msg, sizeof(msg)) == 0;
	} while (!ok && mr_test_now_ms() - t0 < 30000);
	cr_expect(ok, "the rotated certificate was never served: %s", msg);
	cr_expect_eq(get(url, at("ca1.crt"), NULL, NULL, "/healthz", &status, msg, sizeof(msg)),
		     MR_EPROTO, "a new connection still gets the old certificate");
	/* b joins over the new certificate: the round closes, a's wait answers */
	{
		struct mr_httpc hb;

		o.tls_ca = at("ca2.crt");
		cr_assert_eq(mr_httpc_init(&hb, &o, &eb), 0, "%s", eb.msg);
		cr_assert_eq(mr_httpc_json(&hb, "POST", "/v1/jobs/t/rot/join",
					   json_pack("{ss}", "node_id", "b"), 10000, &code, &out,
					   &eb),
			     0, "%s", eb.msg);
		cr_expect_eq(code, 200);
		json_decref(out);
		mr_httpc_release(&hb);
	}
	pthread_join(th, NULL);
	cr_expect_eq(p.rc, 0, "the parked wait broke: %s", p.msg);
	cr_expect_eq(p.status, 200);
	mr_httpc_release(&hc);
	ctlp_stop(&c, 1);
	mr_test_rmdir(pki);
}

Test(tls, client_certificates_and_bad_files, .timeout = 120)
{
	struct ctlp c = { 0 };
	char url[64], msg[512], *out = NULL;
	long status = 0;
	const char *bin = getenv("MESHRUN_BUILD");
	int rc;

	make_pki();
	start(&c, at("ca1.crt"));
	snprintf(url, sizeof(url), "https://127.0.0.1:%d", c.port);
	cr_assert_eq(get(url, at("ca1.crt"), NULL, NULL, "/v1/jobs", &status, msg, sizeof(msg)), 0,
		     "%s", msg);
	cr_expect_eq(status, 401, "no client certificate, yet %ld", status);
	cr_assert_eq(get(url, at("ca1.crt"), NULL, NULL, "/healthz", &status, msg, sizeof(msg)), 0,
		     "%s", msg);
	cr_expect_eq(status, 200, "a probe needs no client certificate");
	cr_assert_eq(get(url, at("ca1.crt"), at("client.crt"), at("client.key"), "/v1/jobs",
			 &status, msg, sizeof(msg)),
		     0, "%s", msg);
	cr_expect_eq(status, 200);
	rc = get(url, at("ca1.crt"), at("stranger.crt"), at("stranger.key"), "/v1/jobs", &status,
		 msg, sizeof(msg));
	cr_expect(rc != 0 || status == 401, "another CA's client certificate: %d %ld", rc,
		  status);
	ctlp_stop(&c, 1);

	/* bad files: exit 2 naming the flag */
	bin = bin && bin[0] ? bin : "build";
	rc = mr_test_sh(pki, &out,
			"timeout 30 '%s/meshrun-controller' --port 0 --data-dir d1 "
			"--tls-cert nothere.crt --tls-key srv.key",
			bin);
	cr_expect_eq(rc, 2, "%s", out);
	cr_expect(strstr(out, "tls_cert") && strstr(out, "nothere.crt"), "%s", out);
	free(out);
	rc = mr_test_sh(pki, &out,
			"timeout 30 '%s/meshrun-controller' --port 0 --data-dir d2 "
			"--tls-cert srv1.crt --tls-key srv2.key",
			bin);
	cr_expect_eq(rc, 2, "%s", out);
	cr_expect(strstr(out, "is not the key of the certificate"), "%s", out);
	free(out);
	mr_test_rmdir(pki);
}

/* A real agent through TLS: an in-process job of two ranks (their KV
 * calls go through the same client) finishes; with another CA the agent
 * stops at its join, naming the CA file. */
Test(tls, an_agent_trains_through_tls_and_refuses_another_ca, .timeout = 300)
{
	struct ctlp c = { 0 };
	const char *bin = getenv("MESHRUN_BUILD");
	char *out = NULL;
	int rc;

	make_pki();
	start(&c, NULL);
	bin = bin && bin[0] ? bin : "build";
	rc = mr_test_sh(pki, &out,
			"MESHRUN_TLS_CA=ca1.crt timeout 240 '%s/meshrun-agent' --controller "
			"https://127.0.0.1:%d --job t/train --nnodes 1 --nproc-per-node 2 "
			"--health-port -1 --workload-config '{\"steps\": 2, \"n_layer\": 1, "
			"\"d_model\": 32, \"n_head\": 2, \"vocab_size\": 64, \"seq_len\": 16, "
			"\"threads\": 1}'",
			bin, c.port);
	cr_expect_eq(rc, 0, "%s", out);
	cr_expect(strstr(out, "state=succeeded"), "%s", out);
	free(out);
	rc = mr_test_sh(pki, &out,
			"timeout 120 '%s/meshrun-agent' --controller https://127.0.0.1:%d "
			"--tls-ca ca2.crt --job t/other --nnodes 1 --health-port -1 -- true",
			bin, c.port);
	cr_expect_neq(rc, 0, "%s", out);
	cr_expect(strstr(out, "does not verify against the CA file 'ca2.crt'"), "%s", out);
	free(out);
	rc = mr_test_sh(pki, &out,
			"timeout 120 '%s/meshrun-agent' --controller https://127.0.0.1:%d "
			"--tls-ca nothere.crt --job t/x --nnodes 1 --health-port -1 -- true",
			bin, c.port);
	cr_expect_eq(rc, 2, "%s", out);
	cr_expect(strstr(out, "tls_ca") && strstr(out, "nothere.crt"), "%s", out);
	free(out);
	ctlp_stop(&c, 1);
	mr_test_rmdir(pki);
}
