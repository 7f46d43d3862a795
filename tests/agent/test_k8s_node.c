/*
 * test_k8s_node.c - agent/k8s_node.c's topology path read from a Node's
 * labels, against fake_apiserver.py (a python3 http.server on an
 * ephemeral loopback port, serving nodes from a JSON file): the path
 * from three labels, a missing or malformed label named, 401 naming the
 * RBAC fix, 404 naming the node, 500/429 retried, a non-JSON answer, bad
 * labels lists, no API configured, and https with the service account's
 * CA (right and wrong; skipped without openssl).
 */
#include "harness.h"
#include "proc.h"

#include "k8s_node.h"
#include "config.h"

#define TOKEN "secret-token-0123"

static const char *script(void)
{
	return mr_test_repo_file("tests/agent/fake_apiserver.py");
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	cr_assert_not_null(f, "cannot write '%s'", path);
	fputs(text, f);
	cr_assert_eq(fclose(f), 0);
}

/* A service-account directory <scratch>/<name> with token text `token`
 * (the CA, when wanted, is copied in by the https test). */
static const char *sa_dir(const char *name, const char *token)
{
	static char dir[2][300];
	static int next;
	char *d = dir[next++ % 2], path[400];

	h_path(d, sizeof(dir[0]), name);
	mkdir(d, 0700);
	snprintf(path, sizeof(path), "%s/token", d);
	write_file(path, token);
	return d;
}

static const char *nodes_json(void)
{
	static char path[300];
	char long_value[80];

	memset(long_value, 'a', 64);
	long_value[64] = '\0';
	h_path(path, sizeof(path), "nodes.json");
	{
		char text[2048];

		snprintf(text, sizeof(text),
			 "{\"node-31\": {\"kind\": \"Node\", \"metadata\": {\"name\": \"node-31\", "
			 "\"labels\": {\"example.com/block\": \"block-2\", "
			 "\"example.com/rack\": \"rack-7\", \"kubernetes.io/hostname\": \"node-31\", "
			 "\"example.com/empty\": \"\", \"example.com/spaced\": \"rack 7\", "
			 "\"example.com/long\": \"%s\"}}},"
			 " \"bare\": {\"kind\": \"Node\", \"metadata\": {\"name\": \"bare\"}}}",
			 long_value);
		write_file(path, text);
	}
	return path;
}

struct fake {
	pid_t pid;
	int port;
	char log[300];
};

/* Starts fake_apiserver.py with extra arguments (NULL-ended, may be
 * NULL); waits (20 s at most) for the port it picked. */
static void fake_start(struct fake *f, const char *const *extra)
{
	static int seq;
	char portfile[300], name[64];
	char *argv[24] = {"/usr/bin/python3", (char *)script(), "--nodes", (char *)nodes_json(),
			  "--token", TOKEN, "--port-file", portfile};
	int n = 8;

	snprintf(name, sizeof(name), "apiserver-%d.port", seq);
	h_path(portfile, sizeof(portfile), name);
	snprintf(name, sizeof(name), "apiserver-%d.log", seq++);
	h_path(f->log, sizeof(f->log), name);
	for (int i = 0; extra && extra[i] && n < 23; i++)
		argv[n++] = (char *)extra[i];
	argv[n] = NULL;
	f->pid = h_spawn(argv, NULL, f->log);
	f->port = 0;
	for (int i = 0; i < 2000 && f->port <= 0; i++) {
		FILE *pf = fopen(portfile, "r");

		if (pf) {
			if (fscanf(pf, "%d", &f->port) != 1)
				f->port = 0;
			fclose(pf);
		}
		if (f->port <= 0) {
			cr_assert_eq(waitpid(f->pid, NULL, WNOHANG), 0,
				     "fake_apiserver.py exited; its log:\n%s", h_read(f->log));
			usleep(10 * 1000);
		}
	}
	cr_assert_gt(f->port, 0, "fake_apiserver.py wrote no port; its log:\n%s", h_read(f->log));
}

/* The API at the fake server over http, with service-account dir sa. */
static void use_api(const struct fake *f, const char *sa)
{
	char url[64];

	snprintf(url, sizeof(url), "http://127.0.0.1:%d", f->port);
	setenv("MESHRUN_K8S_API", url, 1);
	setenv("MESHRUN_K8S_SA_DIR", sa, 1);
	unsetenv("KUBERNETES_SERVICE_HOST");
	unsetenv("KUBERNETES_SERVICE_PORT");
}

/* Requests the fake server answered (its log lines). */
static int hits(const struct fake *f)
{
	return h_count(f->log, "GET /api/v1/nodes/");
}

Test(k8s_node, path_from_three_labels)
{
	struct fake f;
	struct mr_errbuf eb = {0};
	char out[MR_K8S_NODE_PATH_MAX];
	int rc;

	fake_start(&f, NULL);
	/* the token file ends in a newline, as a Secret's often does */
	use_api(&f, sa_dir("sa", TOKEN "\n"));
	rc = mr_k8s_node_topology("node-31", " example.com/block, example.com/rack ,"
				  "kubernetes.io/hostname", out, sizeof(out), &eb);
	cr_assert_eq(rc, 0, "rc %d: %s", rc, eb.msg);
	cr_assert_str_eq(out, "block-2/rack-7/node-31");
	/* one label is a path of one segment */
	rc = mr_k8s_node_topology("node-31", "example.com/rack", out, sizeof(out), &eb);
	cr_assert_eq(rc, 0, "rc %d: %s", rc, eb.msg);
	cr_assert_str_eq(out, "rack-7");
	cr_assert_eq(hits(&f), 2);
	/* the path does not fit: an error, and out left empty */
	rc = mr_k8s_node_topology("node-31", "example.com/block,example.com/rack", out, 8, &eb);
	cr_assert_eq(rc, MR_ELIMIT, "rc %d: %s", rc, eb.msg);
	cr_assert_str_eq(out, "");
	h_kill(f.pid);
}

Test(k8s_node, missing_label_named)
{
	struct fake f;
	struct mr_errbuf eb = {0};
	char out[MR_K8S_NODE_PATH_MAX];
	int rc;

	fake_start(&f, NULL);
	use_api(&f, sa_dir("sa", TOKEN));
	rc = mr_k8s_node_topology("node-31", "example.com/block,example.com/pod-zone", out,
				  sizeof(out), &eb);
	cr_assert_eq(rc, MR_ENOTFOUND, "rc %d: %s", rc, eb.msg);
	cr_assert_str_eq(eb.field, "example.com/pod-zone");
	cr_assert(strstr(eb.msg, "label 'example.com/pod-zone' is missing on node 'node-31'"),
		  "%s", eb.msg);
	cr_assert_str_eq(out, "");

	/* a node without any labels */
	mr_errbuf_clear(&eb);
	rc = mr_k8s_node_topology("bare", "example.com/block", out, sizeof(out), &eb);
	cr_assert_eq(rc, MR_ENOTFOUND, "rc %d: %s", rc, eb.msg);
	cr_assert(strstr(eb.msg, "'example.com/block' is missing on node 'bare'"), "%s", eb.msg);

	/* present but empty */
	mr_errbuf_clear(&eb);
	rc = mr_k8s_node_topology("node-31", "example.com/empty", out, sizeof(out), &eb);
	cr_assert_eq(rc, MR_ENOTFOUND, "rc %d: %s", rc, eb.msg);
	cr_assert(strstr(eb.msg, "'example.com/empty' is empty on node 'node-31'"), "%s", eb.msg);
	h_kill(f.pid);
}

Test(k8s_node, value_not_a_path_segment)
{
	struct fake f;
	struct mr_errbuf eb = {0};
	char out[MR_K8S_NODE_PATH_MAX];
	int rc;

	fake_start(&f, NULL);
	use_api(&f, sa_dir("sa", TOKEN));
	rc = mr_k8s_node_topology("node-31", "example.com/block,example.com/spaced", out,
				  sizeof(out), &eb);
	cr_assert_eq(rc, MR_EPARSE, "rc %d: %s", rc, eb.msg);
	cr_assert_str_eq(eb.field, "example.com/spaced");
	cr_assert(strstr(eb.msg, "'rack 7'") && strstr(eb.msg, "[A-Za-z0-9._-]"), "%s", eb.msg);

	mr_errbuf_clear(&eb);
	rc = mr_k8s_node_topology("node-31", "example.com/long", out, sizeof(out), &eb);
	cr_assert_eq(rc, MR_EPARSE, "rc %d: %s", rc, eb.msg);
	cr_assert(strstr(eb.msg, "64 characters"), "%s", eb.msg);
	h_kill(f.pid);
}

Test(k8s_node, unauthorized_names_the_rbac_fix)
{
	struct fake f;
	struct mr_errbuf eb = {0};
	char out[MR_K8S_NODE_PATH_MAX];
	int rc;

	fake_start(&f, NULL);
	use_api(&f, sa_dir("sa-wrong", "not-the-token\n"));
	rc = mr_k8s_node_topology("node-31", "example.com/rack", out, sizeof(out), &eb);
	cr_assert_eq(rc, MR_EAUTH, "rc %d: %s", rc, eb.msg);
	cr_assert(strstr(eb.msg, "node 'node-31'"), "%s", eb.msg);
	cr_assert(strstr(eb.msg, "(401: Unauthorized)"), "%s", eb.msg);
	cr_assert(strstr(eb.msg, "ServiceAccount needs 'get' on 'nodes'"), "%s", eb.msg);
	cr_assert(strstr(eb.msg, "ClusterRole"), "%s", eb.msg);
	/* no retry of a refusal */
	cr_assert_eq(hits(&f), 1);
	h_kill(f.pid);
}

Test(k8s_node, unknown_node_names_it)
{
	struct fake f;
	struct mr_errbuf eb = {0};
	char out[MR_K8S_NODE_PATH_MAX];
	int rc;

	fake_start(&f, NULL);
	use_api(&f, sa_dir("sa", TOKEN));
	rc = mr_k8s_node_topology("ghost-1", "example.com/rack", out, sizeof(out), &eb);
	cr_assert_eq(rc, MR_ENOTFOUND, "rc %d: %s", rc, eb.msg);
	cr_assert_str_eq(eb.field, "node");
	cr_assert(strstr(eb.msg, "node 'ghost-1' not found"), "%s", eb.msg);
	cr_assert(strstr(eb.msg, "nodes \"ghost-1\" not found"), "the server's reason: %s",
		  eb.msg);
	cr_assert_eq(hits(&f), 1);
	h_kill(f.pid);
}

Test(k8s_node, server_error_retried)
{
	struct fake f;
	struct mr_errbuf eb = {0};
	char out[MR_K8S_NODE_PATH_MAX];
	const char *const fail[] = {"--fail", "2", NULL};
	int rc;

	fake_start(&f, fail);
	use_api(&f, sa_dir("sa", TOKEN));
	rc = mr_k8s_node_topology("node-31", "example.com/block,example.com/rack", out,
				  sizeof(out), &eb);
	cr_assert_eq(rc, 0, "rc %d: %s", rc, eb.msg);
	cr_assert_str_eq(out, "block-2/rack-7");
	cr_assert_eq(h_count(f.log, " 500\n"), 2, "%s", h_read(f.log));
	cr_assert_eq(hits(&f), 3);
	h_kill(f.pid);
}

Test(k8s_node, too_many_requests_retried)
{
	struct fake f;
	struct mr_errbuf eb = {0};
	char out[MR_K8S_NODE_PATH_MAX];
	const char *const fail[] = {"--fail", "1", "--fail-status", "429", NULL};
	int rc;

	fake_start(&f, fail);
	use_api(&f, sa_dir("sa", TOKEN));
	rc = mr_k8s_node_topology("node-31", "example.com/rack", out, sizeof(out), &eb);
	cr_assert_eq(rc, 0, "rc %d: %s", rc, eb.msg);
	cr_assert_str_eq(out, "rack-7");
	cr_assert_eq(hits(&f), 2);
	h_kill(f.pid);
}

Test(k8s_node, server_error_gives_up_after_three_tries)
{
	struct fake f;
	struct mr_errbuf eb = {0};
	char out[MR_K8S_NODE_PATH_MAX];
	const char *const fail[] = {"--fail", "10", NULL};
	int rc;

	fake_start(&f, fail);
	use_api(&f, sa_dir("sa", TOKEN));
	rc = mr_k8s_node_topology("node-31", "example.com/rack", out, sizeof(out), &eb);
	cr_assert_eq(rc, MR_EPROTO, "rc %d: %s", rc, eb.msg);
	cr_assert(strstr(eb.msg, "with an error 3 times (500: injected failure)") &&
		  strstr(eb.msg, "/api/v1/nodes/node-31"), "%s", eb.msg);
	cr_assert_eq(hits(&f), 3);
	h_kill(f.pid);
}

Test(k8s_node, connection_refused_retried_then_named)
{
	struct mr_errbuf eb = {0};
	char out[MR_K8S_NODE_PATH_MAX];
	char url[64];
	int rc;

	/* a port nothing listens on */
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", h_free_port());
	setenv("MESHRUN_K8S_API", url, 1);
	setenv("MESHRUN_K8S_SA_DIR", sa_dir("sa", TOKEN), 1);
	rc = mr_k8s_node_topology("node-31", "example.com/rack", out, sizeof(out), &eb);
	cr_assert_eq(rc, MR_ECONN, "rc %d: %s", rc, eb.msg);
	cr_assert(strstr(eb.msg, url) && strstr(eb.msg, "3 tries"), "%s", eb.msg);
	cr_assert_str_eq(eb.field, "MESHRUN_K8S_API");
}

Test(k8s_node, non_json_answer_names_the_url)
{
	struct fake f;
	struct mr_errbuf eb = {0};
	char out[MR_K8S_NODE_PATH_MAX], url[96];
	const char *const nj[] = {"--non-json", NULL};
	int rc;

	fake_start(&f, nj);
	use_api(&f, sa_dir("sa", TOKEN));
	rc = mr_k8s_node_topology("node-31", "example.com/rack", out, sizeof(out), &eb);
	cr_assert_eq(rc, MR_EPARSE, "rc %d: %s", rc, eb.msg);
	snprintf(url, sizeof(url), "'http://127.0.0.1:%d/api/v1/nodes/node-31'", f.port);
	cr_assert(strstr(eb.msg, url), "%s", eb.msg);
	cr_assert(strstr(eb.msg, "not a JSON object"), "%s", eb.msg);
	h_kill(f.pid);
}

Test(k8s_node, bad_labels_lists)
{
	char many[256] = "", big[400];
	struct {
		const char *labels, *says;
	} bad[] = {
		{"", "the list is empty"},
		{NULL, "the list is empty"},
		{",example.com/rack", "empty key at position 1"},
		{"example.com/rack,", "empty key at position 2"},
		{"a, ,b", "empty key at position 2"},
		{"example.com/my rack", "'example.com/my rack' has a character"},
		{"a;b", "'a;b' has a character"},
		{many, "more than 8 keys"},
		{big, "key 1 is 318 characters (at most 317)"},
	};
	char out[MR_K8S_NODE_PATH_MAX];

	for (int i = 0; i < 9; i++)
		snprintf(many + strlen(many), sizeof(many) - strlen(many), "%sk%d", i ? "," : "",
			 i);
	memset(big, 'k', 318);
	big[318] = '\0';
	/* checked before any request: no API configured at all */
	unsetenv("MESHRUN_K8S_API");
	unsetenv("KUBERNETES_SERVICE_HOST");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct mr_errbuf eb = {0};
		int rc = mr_k8s_node_topology("node-31", bad[i].labels, out, sizeof(out), &eb);

		cr_assert_eq(rc, MR_EINVAL, "'%s': rc %d: %s", bad[i].labels, rc, eb.msg);
		cr_assert_str_eq(eb.field, "labels", "'%s'", bad[i].labels);
		cr_assert(strstr(eb.msg, bad[i].says), "'%s': %s", bad[i].labels, eb.msg);
	}
	/* and the node name */
	{
		struct mr_errbuf eb = {0};
		int rc = mr_k8s_node_topology("node/31", "example.com/rack", out, sizeof(out), &eb);

		cr_assert_eq(rc, MR_EINVAL, "rc %d: %s", rc, eb.msg);
		cr_assert_str_eq(eb.field, "node");
	}
}

Test(k8s_node, no_api_configured)
{
	struct mr_errbuf eb = {0};
	char out[MR_K8S_NODE_PATH_MAX];
	int rc;

	unsetenv("MESHRUN_K8S_API");
	unsetenv("KUBERNETES_SERVICE_HOST");
	unsetenv("KUBERNETES_SERVICE_PORT");
	rc = mr_k8s_node_topology("node-31", "example.com/rack", out, sizeof(out), &eb);
	cr_assert_eq(rc, MR_EINVAL, "rc %d: %s", rc, eb.msg);
	cr_assert_str_eq(eb.field, "KUBERNETES_SERVICE_HOST");
	cr_assert(strstr(eb.msg, "not in a pod? set MESHRUN_TOPOLOGY instead"), "%s", eb.msg);

	/* in a pod on an IPv6 cluster: the host goes in brackets; without
	 * the service account's CA nothing is sent */
	mr_errbuf_clear(&eb);
	setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
	setenv("KUBERNETES_SERVICE_PORT", "443", 1);
	setenv("MESHRUN_K8S_SA_DIR", sa_dir("sa-no-ca", TOKEN), 1);
	rc = mr_k8s_node_topology("node-31", "example.com/rack", out, sizeof(out), &eb);
	cr_assert_eq(rc, MR_EIO, "rc %d: %s", rc, eb.msg);
	cr_assert(strstr(eb.msg, "ca.crt") && strstr(eb.msg, "'https://[fd00::1]:443'"), "%s",
		  eb.msg);
}

/* ---- https with the service account's CA --------------------------------- */

static int have_openssl(void)
{
	return system("command -v openssl >/dev/null 2>&1") == 0 &&
	       system("/usr/bin/python3 -c 'import ssl' >/dev/null 2>&1") == 0;
}

/* A CA "ca" signing a server certificate for 127.0.0.1, and an
 * unrelated CA "other", in dir (PEM files). */
static void make_certs(const char *dir)
{
	char cmd[2048], log[400];
	const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

	snprintf(cmd, sizeof(cmd),
		 "(cd '%s' && printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && "
		 "openssl req -x509 %s -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca && "
		 "openssl req -x509 %s -keyout other.key -out other.pem -days 2 "
		 "-subj /CN=other-ca && "
		 "openssl req %s -keyout srv.key -out srv.csr -subj /CN=127.0.0.1 && "
		 "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
		 "-out srv.pem -days 2 -extfile san.ext) > '%s/openssl.log' 2>&1",
		 dir, ec, ec, ec, dir);
	snprintf(log, sizeof(log), "%s/openssl.log", dir);
	cr_assert_eq(system(cmd), 0, "openssl failed making the test certificates:\n%s",
		     h_read(log));
}

static void copy_file(const char *from, const char *to)
{
	char *text = h_read(from);

	cr_assert(text && text[0], "'%s' is empty", from);
	write_file(to, text);
	free(text);
}

Test(k8s_node, https_with_the_service_account_ca, .timeout = 60)
{
	struct fake f;
	struct mr_errbuf eb = {0};
	char out[MR_K8S_NODE_PATH_MAX], pem[400], key[400], from[400], ca[400], port[16];
	const char *dir = h_tmpdir();
	const char *good, *wrong;
	int rc;

	if (!have_openssl())
		cr_skip_test("no openssl (or python3 without ssl) to make a test CA");
	make_certs(dir);
	snprintf(pem, sizeof(pem), "%s/srv.pem", dir);
	snprintf(key, sizeof(key), "%s/srv.key", dir);
	{
		const char *const tls[] = {"--tls", pem, key, NULL};

		fake_start(&f, tls);
	}
	good = sa_dir("sa-good", TOKEN "\n");
	snprintf(from, sizeof(from), "%s/ca.pem", dir);
	snprintf(ca, sizeof(ca), "%s/ca.crt", good);
	copy_file(from, ca);
	wrong = sa_dir("sa-wrong-ca", TOKEN "\n");
	snprintf(from, sizeof(from), "%s/other.pem", dir);
	snprintf(ca, sizeof(ca), "%s/ca.crt", wrong);
	copy_file(from, ca);

	/* the in-cluster way: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT */
	unsetenv("MESHRUN_K8S_API");
	snprintf(port, sizeof(port), "%d", f.port);
	setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1", 1);
	setenv("KUBERNETES_SERVICE_PORT", port, 1);
	setenv("MESHRUN_K8S_SA_DIR", good, 1);
	rc = mr_k8s_node_topology("node-31", "example.com/block,example.com/rack,"
				  "kubernetes.io/hostname", out, sizeof(out), &eb);
	cr_assert_eq(rc, 0, "rc %d: %s\nserver log:\n%s", rc, eb.msg, h_read(f.log));
	cr_assert_str_eq(out, "block-2/rack-7/node-31");

	/* a CA that did not sign the server's certificate: refused, saying so */
	setenv("MESHRUN_K8S_SA_DIR", wrong, 1);
	mr_errbuf_clear(&eb);
	rc = mr_k8s_node_topology("node-31", "example.com/rack", out, sizeof(out), &eb);
	cr_assert_eq(rc, MR_EPROTO, "rc %d: %s", rc, eb.msg);
	cr_assert(strstr(eb.msg, "request to 'https://127.0.0.1:"), "%s", eb.msg);
	cr_assert(strstr(eb.msg, "certificate"), "%s", eb.msg);
	cr_assert(strstr(eb.msg, ca), "names the CA file: %s", eb.msg);
	cr_assert_str_eq(out, "");

	/* the right CA, but the server's certificate is for 127.0.0.1 only:
	 * the host name is verified too */
	setenv("KUBERNETES_SERVICE_HOST", "localhost", 1);
	setenv("MESHRUN_K8S_SA_DIR", good, 1);
	mr_errbuf_clear(&eb);
	rc = mr_k8s_node_topology("node-31", "example.com/rack", out, sizeof(out), &eb);
	cr_assert_eq(rc, MR_EPROTO, "rc %d: %s", rc, eb.msg);
	cr_assert(strstr(eb.msg, "request to 'https://localhost:"), "%s", eb.msg);
	/* only the first request reached the handler */
	cr_assert_eq(hits(&f), 1);
	h_kill(f.pid);
}

/* The agent's config: topology_labels with NODE_NAME become its topology
 * path at load; without NODE_NAME the load stops naming it. */
Test(k8s_node, the_agent_config_reads_its_path_from_the_node)
{
	struct mr_agent_config cfg;
	struct mr_errbuf eb = {0};
	struct fake f;
	char *args[] = {"meshrun-agent", "--topology-labels",
			"example.com/block,example.com/rack,kubernetes.io/hostname", "--", "true",
			NULL};

	fake_start(&f, NULL);
	use_api(&f, sa_dir("sa-config", TOKEN));
	unsetenv("NODE_NAME");
	cr_expect_lt(mr_agent_config_load(&cfg, "meshrun-agent", 5, args, &eb), 0);
	cr_expect_str_eq(eb.field, "NODE_NAME");
	mr_agent_config_release(&cfg);
	setenv("NODE_NAME", "node-31", 1);
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_agent_config_load(&cfg, "meshrun-agent", 5, args, &eb), 0, "%s", eb.msg);
	cr_expect_str_eq(cfg.topology, "block-2/rack-7/node-31");
	mr_agent_config_release(&cfg);
	unsetenv("NODE_NAME");
	h_kill(f.pid);
}
