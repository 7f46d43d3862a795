/*
 * k8s_node.h - where this agent runs, read from its Node's labels.
 *
 * Kubernetes' downward API cannot expose a Node's labels to a pod, so an
 * agent that needs its topology path (widest domain first, e.g.
 * "block-2/rack-7/node-31") reads its own Node object from the API
 * server: GET {api}/api/v1/nodes/{node} with the pod's service-account
 * token, then the values of the labels it was told to use.
 *
 * Environment:
 *   MESHRUN_K8S_API     the API base URL ("http://127.0.0.1:8001" for a
 *                       proxy or a test); default https://
 *                       $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
 *                       (an IPv6 host in brackets)
 *   MESHRUN_K8S_SA_DIR  the service-account directory; default
 *                       /var/run/secrets/kubernetes.io/serviceaccount:
 *                       `token` is sent as the bearer token (read at
 *                       every call: Kubernetes rotates projected tokens),
 *                       `ca.crt` verifies the server over https (peer and
 *                       host, never turned off)
 *
 * Each call is one request of 10 s at most (5 s to connect), tried up
 * to 3 times with a short backoff on connection errors, timeouts, 5xx
 * and 429. The answer is capped at 1 MiB.
 *
 * The agent's ServiceAccount needs `get` on `nodes`, a cluster-scoped
 * resource, so a ClusterRole bound to it (a Role is not enough).
 *
 * Non-goals: watching the Node for changes, reading anything but labels,
 * kubeconfig files, client certificates.
 */
#ifndef MR_AGENT_K8S_NODE_H
#define MR_AGENT_K8S_NODE_H

#include <stddef.h>

#include "mr_err.h"

#define MR_K8S_NODE_MAX_LABELS 8      /* keys in a labels list */
#define MR_K8S_NODE_KEY_MAX (253 + 1 + 63) /* "prefix/name": DNS subdomain, '/', name */
#define MR_K8S_NODE_SEGMENT_MAX 63    /* a label value, one segment of the path */
/* the longest path: every segment at its longest, '/' between, NUL */
#define MR_K8S_NODE_PATH_MAX (MR_K8S_NODE_MAX_LABELS * (MR_K8S_NODE_SEGMENT_MAX + 1))

/*
 * The topology path of node `node` from the values of its labels
 * `labels` (comma-separated label keys, widest domain first, spaces
 * around the commas ignored): "v1/v2/.../vN" into out (cap bytes,
 * MR_K8S_NODE_PATH_MAX always suffices). Every label must be on the node
 * with a value of 1..63 characters from [A-Za-z0-9._-].
 *
 * 0, or a negative MR_E* with eb naming the field/label and the reason:
 * MR_EINVAL (bad node name or labels list, no API configured: "not in a
 * pod?"), MR_EIO (the token or CA file unreadable), MR_EAUTH (401/403:
 * the ServiceAccount lacks `get` on `nodes`), MR_ENOTFOUND (no such node,
 * or a label missing on it), MR_EPARSE (the answer is not a JSON object,
 * or a label value is not a path segment), MR_ECONN / MR_ETIMEDOUT /
 * MR_EPROTO (no answer after the tries; an unexpected status; TLS
 * refused), MR_ELIMIT (the answer over 1 MiB, the token over 64 KiB,
 * or cap too small).
 * out is "" on failure.
 */
int mr_k8s_node_topology(const char *node, const char *labels, char *out, size_t cap,
			 struct mr_errbuf *eb);

#endif
