/*
 * parse.c - validation of names, keys and job specs for the controller.
 *
 * Job names are "ns/name", each part a Kubernetes DNS label
 * ([a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?; the grammar is common/mr_jobname.h,
 * shared with the CLI). Node ids are 1..253 printable
 * ASCII bytes without spaces. KV keys are 1..256 bytes of [A-Za-z0-9._/-].
 * Every failure is a 400 in the ctl_res naming the field.
 *
 * Non-goals: parsing HTTP (api/), applying specs (job.c).
 */
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "mr_jobname.h"
#include "mr_json.h"

int mr__ctl_valid_node_id(const char *s)
{
	size_t n = strlen(s);

	if (n < 1 || n > CTL_MAX_NODE_ID)
		return 0;
	for (size_t i = 0; i < n; i++) {
		if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
			return 0;
	}
	return 1;
}

int mr__ctl_valid_key(const char *s, size_t len)
{
	if (len < 1 || len > CTL_MAX_KEY)
		return 0;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '/' || c == '-'))
			return 0;
	}
	return 1;
}

int mr__ctl_mesh_fits(const struct ctl_spec *s, int32_t n, int32_t *dp)
{
	int64_t world = (int64_t)n * s->nproc_per_node;
	int64_t tpc = (int64_t)s->tp * s->pp * s->cp;
	int64_t d;

	if (n < 1 || world % tpc)
		return 0;
	d = world / tpc;
	if (s->dp && d != s->dp)
		return 0;
	if ((d * s->cp) % s->ep)
		return 0;
	if (dp)
		*dp = (int32_t)d;
	return 1;
}

static int get_i32(const json_t *o, const char *field, const char *path, int64_t lo,
		   int64_t hi, int32_t *out, struct ctl_res *res)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	int64_t v = *out;

	if (mr_json_get_int(o, field, 0, lo, hi, &v, &eb)) {
		mr__res_err(res, 400, "invalid_field", path, "%s", eb.msg);
		return MR_EINVAL;
	}
	*out = (int32_t)v;
	return 0;
}

int mr__ctl_parse_spec(const json_t *obj, const struct ctl_limits *lim, struct ctl_spec *spec,
		       const char **name, struct ctl_res *res)
{
	static const char *const keys[] = { "name", "min_nodes", "max_nodes", "nproc_per_node",
					    "mesh", "last_call_ms", "heartbeat_timeout_ms",
					    "max_restarts", "hang_timeout_ms", "straggler_factor",
					    "rank_order", NULL };
	static const char *const mesh_keys[] = { "tp", "pp", "cp", "ep", "dp", NULL };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	const char *nm = NULL, *slash;
	json_t *mesh = NULL;
	int64_t v = 0;

	*spec = lim->defaults;
	spec->min_nodes = 0;
	spec->max_nodes = 0;
	spec->nproc_per_node = 1;
	spec->tp = spec->pp = spec->cp = spec->ep = 1;
	spec->dp = 0;
	if (!json_is_object(obj)) {
		mr__res_err(res, 400, "invalid_field", "spec", "'spec' must be an object");
		return MR_EINVAL;
	}
	if (mr_json_check_keys(obj, keys, &eb) ||
	    mr_json_get_str(obj, "name", 1, 127, &nm, &eb)) {
		mr__res_err(res, 400, "invalid_field", eb.field[0] ? eb.field : "name", "%s",
			    eb.msg);
		return MR_EINVAL;
	}
	slash = strchr(nm, '/');
	if (!slash) {
		mr__res_err(res, 400, "invalid_field", "name",
			    "'name' must be 'namespace/name', got '%.127s'", nm);
		return MR_EINVAL;
	}
	if (!mr_job_name_valid(nm)) {
		mr__res_err(res, 400, "invalid_field", "name",
			    "'name': '%.127s' is not two DNS labels joined by '/'", nm);
		return MR_EINVAL;
	}
	if (mr_json_get_int(obj, "min_nodes", 1, 1, 1000000, &v, &eb)) {
		mr__res_err(res, 400, "invalid_field", "min_nodes", "%s", eb.msg);
		return MR_EINVAL;
	}
	spec->min_nodes = (int32_t)v;
	spec->max_nodes = spec->min_nodes;
	if (get_i32(obj, "max_nodes", "max_nodes", 1, 1000000, &spec->max_nodes, res) ||
	    get_i32(obj, "nproc_per_node", "nproc_per_node", 1, 1024, &spec->nproc_per_node,
		    res) ||
	    get_i32(obj, "last_call_ms", "last_call_ms", 0, 3600000, &spec->last_call_ms, res) ||
	    get_i32(obj, "heartbeat_timeout_ms", "heartbeat_timeout_ms", 100, 3600000,
		    &spec->heartbeat_timeout_ms, res) ||
	    get_i32(obj, "max_restarts", "max_restarts", 0, 1000000, &spec->max_restarts, res) ||
	    get_i32(obj, "hang_timeout_ms", "hang_timeout_ms", 0, 86400000, &spec->hang_timeout_ms,
		    res))
		return MR_EINVAL;
	if (json_object_get(obj, "straggler_factor")) {
		double f = 0.0;

		if (mr_json_get_double(obj, "straggler_factor", 1, 0.0, 100.0, &f, &eb) ||
		    (f > 0.0 && f < 1.01)) {
			mr__res_err(res, 400, "invalid_field", "straggler_factor", "%s",
				    eb.msg[0] ? eb.msg
					      : "'straggler_factor' must be 0 (off) or in [1.01, 100]");
			return MR_EINVAL;
		}
		spec->straggler_pct = (int32_t)(f * 100.0 + 0.5);
	}
	if (json_object_get(obj, "rank_order")) {
		const char *ro = NULL;

		if (mr_json_get_str(obj, "rank_order", 1, 16, &ro, &eb) ||
		    (strcmp(ro, "index") && strcmp(ro, "topology"))) {
			mr__res_err(res, 400, "invalid_field", "rank_order", "%s",
				    eb.msg[0] ? eb.msg
					      : "'rank_order' must be \"index\" or \"topology\"");
			return MR_EINVAL;
		}
		spec->rank_order = strcmp(ro, "topology") ? CTL_ORDER_INDEX : CTL_ORDER_TOPOLOGY;
	}
	if (spec->max_nodes < spec->min_nodes) {
		mr__res_err(res, 400, "invalid_field", "max_nodes",
			    "'max_nodes' (%d) is below 'min_nodes' (%d)", spec->max_nodes,
			    spec->min_nodes);
		return MR_EINVAL;
	}
	if (spec->max_nodes > (int32_t)lim->max_members) {
		mr__res_err(res, 400, "invalid_field", "max_nodes",
			    "'max_nodes' (%d) is above the member limit %u", spec->max_nodes,
			    lim->max_members);
		return MR_EINVAL;
	}
	if (mr_json_get_obj(obj, "mesh", 0, &mesh, &eb)) {
		mr__res_err(res, 400, "invalid_field", "mesh", "%s", eb.msg);
		return MR_EINVAL;
	}
	if (mesh) {
		if (mr_json_check_keys(mesh, mesh_keys, &eb)) {
			mr__res_err(res, 400, "invalid_field", "mesh", "mesh: %s", eb.msg);
			return MR_EINVAL;
		}
		if (get_i32(mesh, "tp", "mesh.tp", 1, 65536, &spec->tp, res) ||
		    get_i32(mesh, "pp", "mesh.pp", 1, 65536, &spec->pp, res) ||
		    get_i32(mesh, "cp", "mesh.cp", 1, 65536, &spec->cp, res) ||
		    get_i32(mesh, "ep", "mesh.ep", 1, 65536, &spec->ep, res) ||
		    get_i32(mesh, "dp", "mesh.dp", 0, 1 << 24, &spec->dp, res))
			return MR_EINVAL;
	}
	{
		int fits = 0;

		for (int32_t n = spec->max_nodes; n >= spec->min_nodes && !fits; n--)
			fits = mr__ctl_mesh_fits(spec, n, NULL);
		if (!fits) {
			mr__res_err(res, 400, "invalid_field", "mesh",
				    "no node count in [%d, %d] x nproc_per_node %d fits the mesh "
				    "tp=%d pp=%d cp=%d ep=%d dp=%d",
				    spec->min_nodes, spec->max_nodes, spec->nproc_per_node, spec->tp,
				    spec->pp, spec->cp, spec->ep, spec->dp);
			return MR_EINVAL;
		}
	}
	*name = nm;
	return 0;
}

json_t *mr__ctl_spec_json(const struct ctl_spec *s)
{
	return json_pack("{si si si s{si si si si si} si si si si sf ss}", "min_nodes",
			 s->min_nodes, "max_nodes", s->max_nodes, "nproc_per_node",
			 s->nproc_per_node, "mesh", "tp", s->tp, "pp", s->pp, "cp", s->cp, "ep",
			 s->ep, "dp", s->dp, "last_call_ms", s->last_call_ms,
			 "heartbeat_timeout_ms", s->heartbeat_timeout_ms, "max_restarts",
			 s->max_restarts, "hang_timeout_ms", s->hang_timeout_ms,
			 "straggler_factor", s->straggler_pct / 100.0, "rank_order",
			 s->rank_order == CTL_ORDER_TOPOLOGY ? "topology" : "index");
}
