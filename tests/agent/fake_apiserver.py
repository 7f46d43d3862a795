#!/usr/bin/env python3
"""fake_apiserver.py - the one Kubernetes API call agent/k8s_node.c makes,
for tests/agent/test_k8s_node.c.

Serves GET /api/v1/nodes/<name> from a JSON file mapping node names to
Node objects, on 127.0.0.1 and a port the kernel picks (written to
--port-file once listening). Answers like the API server: 401 with a
Status body when the bearer token is not --token, 404 for an unknown
node. Knobs for the client's failure paths: --fail N answers the first N
requests with --fail-status (500), --non-json answers 200 with a body
that is not JSON, --tls CERT KEY serves https. Each request is one line
on stderr ("GET <path> <status>"), which the tests count.

Non-goals: any other path or verb, watches, real authorization.
"""
import argparse
import http.server
import json
import os
import ssl
import sys


def status_body(code, reason, message):
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": message, "reason": reason, "code": code}


class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self, code, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        # logged before the answer leaves, so a test that has its answer
        # can count it
        sys.stderr.write("GET %s %d\n" % (self.path, code))
        sys.stderr.flush()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (http.server's name)
        o = self.server.opts
        self.server.hits += 1
        if self.server.hits <= o.fail:
            self.reply(o.fail_status, status_body(o.fail_status, "InternalError",
                                                  "injected failure"))
            return
        if self.headers.get("Authorization") != "Bearer " + o.token:
            self.reply(401, status_body(401, "Unauthorized", "Unauthorized"))
            return
        prefix = "/api/v1/nodes/"
        if not self.path.startswith(prefix):
            self.reply(404, status_body(404, "NotFound", "the server could not find "
                                        "the requested resource"))
            return
        name = self.path[len(prefix):]
        if name not in self.server.nodes:
            self.reply(404, status_body(404, "NotFound",
                                        'nodes "%s" not found' % name))
            return
        if o.non_json:
            self.reply(200, b"<html>not the API server</html>\n", "text/html")
            return
        self.reply(200, self.server.nodes[name])

    def log_message(self, fmt, *args):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--fail", type=int, default=0)
    ap.add_argument("--fail-status", type=int, default=500)
    ap.add_argument("--non-json", action="store_true")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    o = ap.parse_args()

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    with open(o.nodes) as f:
        srv.nodes = json.load(f)
    srv.opts = o
    srv.hits = 0
    if o.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(o.tls[0], o.tls[1])
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    tmp = o.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % srv.server_address[1])
    os.rename(tmp, o.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
