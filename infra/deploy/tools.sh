#!/usr/bin/env bash
# Builds what validates the chart offline, once, into the cache dir (never the repository):
#   helm and kubeconform from the Go module proxy, and JSON Schemas of the Kubernetes kinds the chart
#   renders, generated from k8s.io/api's Go types (infra/deploy/schemas), where kubeconform looks for them.
# Needs Go; prints where everything is. A second run is a no-op.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cache="${PARLEY_CACHE_DIR:-$HOME/.cache/parley}"
HELM_VERSION=v3.19.0
KUBECONFORM_VERSION=v0.7.0
export GOPATH="$cache/go" GOFLAGS=-mod=mod
bin="$GOPATH/bin"
command -v go >/dev/null || { echo "deploy tools: no Go toolchain; the chart checks will be skipped" >&2; exit 0; }
if [ ! -x "$bin/helm" ] || [ "$(cat "$bin/.helm-version" 2>/dev/null)" != "$HELM_VERSION" ]; then
  echo "deploy tools: building helm $HELM_VERSION (once, a few minutes)"
  go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" && echo "$HELM_VERSION" > "$bin/.helm-version"
fi
if [ ! -x "$bin/kubeconform" ] || [ "$(cat "$bin/.kubeconform-version" 2>/dev/null)" != "$KUBECONFORM_VERSION" ]; then
  echo "deploy tools: building kubeconform $KUBECONFORM_VERSION"
  go install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" \
    && echo "$KUBECONFORM_VERSION" > "$bin/.kubeconform-version"
fi
src="$root/infra/deploy/schemas"
out="$cache/k8s-schemas/$(cat "$src/main.go" "$src/go.mod" | sha256sum | cut -c1-16)"
if [ ! -f "$out/deployment-apps-v1.json" ]; then
  echo "deploy tools: generating Kubernetes JSON Schemas from k8s.io/api"
  (cd "$src" && go run . "$out")
fi
echo "deploy tools: $bin/helm, $bin/kubeconform, schemas in $out"
