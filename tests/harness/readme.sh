#!/usr/bin/env bash
# Runs README.md's "Install on your cluster" commands as they are written, on the
# harness nodes (tests/run.sh, after helm.sh test), so the README cannot drift from
# what works: the first ```sh block of that section, every line through one shell
# (`set -e`), in the repository's root.
#
# What the test gives the commands is what the README asks a user to have, and
# nothing else:
#   * kubectl and helm on PATH (wrappers naming the cluster's kubeconfig and keeping
#     Helm's files in $CL/readme/), buildah (images.sh's store);
#   * logged in to the registry (the harness registry: TLS, basic auth): `buildah
#     login` (REGISTRY_AUTH_FILE) and `helm registry login`; its CA trusted as a user's
#     system trusts theirs (SSL_CERT_FILE: the system's CAs and the harness CA);
#   * REGISTRY, REGISTRY_USER, REGISTRY_PASSWORD.
# And what this machine differs in from a user's (the environment, not the commands):
#   * no Internet: the Containerfile's base made from this machine's libraries
#     (IMAGE_BASE=offline), the CSI sidecars copied from the harness's builds
#     (SIDECARS_FROM=harness), the debug binary the tests built (TESSERA_IMAGE_BIN);
#     the nodes' containerd take docker.io and registry.k8s.io from the harness
#     registry (nodes.sh: a mirror, as behind an air gap), so the chart's sidecar
#     images and the example's busybox:1.36 resolve unchanged;
#   * no kube-proxy: `helm install` gets the API server's address as extraEnv (a
#     values file the helm wrapper adds to install and upgrade).
# Checked: every command succeeds, the example Pod says "hello from <node>", the
# ticket list names its volume, and after the last command nothing of Tessera is
# left but the namespace (the user's): no CRD, no release, no cluster-scoped object.
set -euo pipefail

HARNESS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HARNESS_DIR/../.." && pwd)"
BIN="${HARNESS_BIN:-$ROOT/target/harness/bin}"
CL="${HARNESS_CLUSTER_DIR:-$ROOT/target/cluster}"
CL="$(cd "$CL" && pwd)"
W="$CL/readme"
NS=tessera-system

log() { printf '[readme] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
k() { "$BIN/kubectl" --kubeconfig "$CL/kubeconfig" --cache-dir "$CL/kubectl-cache" "$@"; }

[[ -f "$CL/registry.env" ]] || die "no harness registry: make cluster-up (with nodes) first"
# shellcheck disable=SC1091
. "$CL/registry.env"
# shellcheck disable=SC1091
. "$CL/cluster.env"
# shellcheck disable=SC1091
if [[ -f "$CL/gate.env" ]]; then . "$CL/gate.env"; fi
POD_API_PORT=${TESSERA_GATE_PODS_PORT:-$TESSERA_APISERVER_PORT}

# The section's commands: the first ```sh block after its heading.
block=$(awk '/^## Install on your cluster$/ { s = 1; next }
  s && /^## / { exit }
  s && /^```sh$/ { c = 1; next }
  c && /^```$/ { exit }
  c' "$ROOT/README.md")
[[ -n "$block" ]] || die "README.md has no \"Install on your cluster\" section with a sh block"
n=$(grep -cv '^\s*$' <<<"$block")
(( n <= 12 )) || die "the README's install section has $n commands: at most about ten"

# The user's tools and login.
rm -rf "$W"
mkdir -p "$W/bin" "$W/helm"
cat >"$W/bin/kubectl" <<EOF
#!/bin/sh
exec "$BIN/kubectl" --kubeconfig "$CL/kubeconfig" --cache-dir "$CL/kubectl-cache" "\$@"
EOF
cat >"$W/values.yaml" <<EOF
# The harness's cluster: no kube-proxy (tests/harness/readme.sh).
extraEnv:
  - {name: KUBERNETES_SERVICE_HOST, value: "$TESSERA_HOST_IP"}
  - {name: KUBERNETES_SERVICE_PORT, value: "$POD_API_PORT"}
EOF
cat >"$W/bin/helm" <<EOF
#!/bin/sh
export HELM_CACHE_HOME="$W/helm/cache" HELM_CONFIG_HOME="$W/helm/config" HELM_DATA_HOME="$W/helm/data"
case "\$1" in
  install|upgrade) exec "$BIN/helm" --kubeconfig "$CL/kubeconfig" "\$@" --values "$W/values.yaml" ;;
  *) exec "$BIN/helm" --kubeconfig "$CL/kubeconfig" "\$@" ;;
esac
EOF
chmod +x "$W/bin/kubectl" "$W/bin/helm"
cat /etc/ssl/certs/ca-certificates.crt "$TESSERA_REGISTRY_CA" >"$W/ca-bundle.crt" 2>/dev/null ||
  cat "$TESSERA_REGISTRY_CA" >"$W/ca-bundle.crt"
bash "$HARNESS_DIR/registry.sh" login >&2
export PATH="$W/bin:$PATH" SSL_CERT_FILE="$W/ca-bundle.crt" REGISTRY_AUTH_FILE="$CL/registry/auth.json"
helm registry login "$TESSERA_REGISTRY" --username "$TESSERA_REGISTRY_USER" --password-stdin \
  <"$TESSERA_REGISTRY_PASSWORD_FILE" >&2
REGISTRY_USER=$TESSERA_REGISTRY_USER REGISTRY_PASSWORD=$(cat "$TESSERA_REGISTRY_PASSWORD_FILE")
export REGISTRY_USER REGISTRY_PASSWORD
# This machine's differences (see the header).
export IMAGE_BASE=offline SIDECARS_FROM=harness
export TESSERA_IMAGE_BIN="${TESSERA_IMAGE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/tessera}"
[[ -x "$TESSERA_IMAGE_BIN" ]] || (cd "$ROOT" && ${CARGO:-cargo} build --bin tessera)

[[ -z "$(k get namespace "$NS" -o name --ignore-not-found)" ]] ||
  die "namespace $NS exists: the README's commands start on a cluster without Tessera"
[[ -z "$(k get crd -o name | grep '\.tessera\.io$' || true)" ]] ||
  die "Tessera's CRDs exist: the README's commands start on a cluster without Tessera"

# The block, with its one user choice made: REGISTRY is the harness registry.
script=$(sed "s|^export REGISTRY=[^ ]*|export REGISTRY=$TESSERA_REGISTRY|" <<<"$block")
grep -q "^export REGISTRY=$TESSERA_REGISTRY" <<<"$script" || die "the block does not start with export REGISTRY=..."
log "running README.md \"Install on your cluster\" ($n commands) in $ROOT"
t0=$(date +%s%3N)
out="$W/output"
if ! (cd "$ROOT" && bash -e -o pipefail -x -c "$script") 2>&1 | tee "$out" >&2; then
  k -n "$NS" get pods -o wide >&2 || true
  die "a command of the README's install section failed (output: $out)"
fi
took=$(( $(date +%s%3N) - t0 ))
rm -f "$ROOT"/tessera-*.tgz

# What the commands showed, and what they left.
grep -q '^hello from tessera-node-' "$out" || die "the example Pod did not say hello from a node"
grep -q '^pvc-' "$out" || die "kubectl get volumeattachments.tessera.io listed no volume of the claim"
# (the claim's PersistentVolume goes once Tessera deleted its volume)
end=$(( $(date +%s) + 60 ))
while [[ -n "$(k get pv -o jsonpath='{range .items[?(@.spec.csi.driver=="csi.tessera.io")]}{.metadata.name}{"\n"}{end}')" ]]; do
  (( $(date +%s) < end )) || die "PersistentVolumes of csi.tessera.io left: $(k get pv -o name)"
  sleep 1
done
leftover=$(k get clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings,storageclasses,csidrivers,crds \
  -o name | grep -i 'tessera' || true)
[[ -z "$leftover" ]] || die "left after the README's uninstall: $(echo $leftover)"
# (the release's Pods go after their owners, within their grace period)
in_ns() {
  k -n "$NS" get all,secrets,configmaps,serviceaccounts -o name |
    grep -v '^secret/tessera-registry$\|^configmap/kube-root-ca.crt$\|^serviceaccount/default$' || true
}
end=$(( $(date +%s) + 60 ))
while [[ -n "$(in_ns)" ]]; do
  (( $(date +%s) < end )) || die "objects left in $NS: $(in_ns | tr '\n' ' ')"
  sleep 1
done
k delete namespace "$NS" --wait=true --timeout=120s >/dev/null
log "PASSED: README.md's install section ran as written ($n commands, $((took / 1000)) s): image and chart pushed, installed from oci://$TESSERA_REGISTRY/charts, the example Pod wrote through Tessera, uninstalled to nothing but the namespace and its pull Secret"
