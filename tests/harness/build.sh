#!/usr/bin/env bash
# Builds Tessera's test control plane and nodes into target/harness/bin/ (relative
# to the repository root):
#
#   k8s-harness      pki | etcd | kube-apiserver | kube-controller-manager |
#                    kube-scheduler | freeports | wait-ready | readyz
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler
#                    symlinks to k8s-harness (dispatch on argv[0])
#   kubectl, csi-attacher, csi-provisioner, csi-resizer, csi-sanity, kwok,
#   kubelet, csi-node-driver-registrar (tools of this module)
#   oci-image, pause, api-gate (cmd/: image builder and sandbox binary of the nodes;
#                    the relay through which the nodes reach the API server)
#   containerd, containerd-shim-runc-v2, ctr, runc, cni/{ptp,host-local,loopback}
#                    (module nodes/: the node runtime)
#   helm             (module helm/: the chart's tests, tests/manifests/chart.rs)
#   csi-snapshotter, snapshot-controller, ../snapshot-crds/*.yaml
#                    (module snapshot/: external-snapshotter v8 needs k8s.io v0.37;
#                    the VolumeSnapshot CRDs copied from its client module)
#   promtool         (module prometheus/: Prometheus's rule checker and tester, for
#                    config/monitoring/'s alert rules, tests/manifests/monitoring.rs)
#   kstatus          (module kstatus/: cli-utils' kstatus over objects on stdin, for
#                    tests/controller/gitops_health.rs)
#
# A no-op when every binary exists and the stamp files are newer than the sources
# of its part (see the *_SRC patterns below); editing only top-level *.go files
# relinks only k8s-harness. Uses the default GOMODCACHE/GOCACHE so repeated builds
# are incremental.
#
# Environment:
#   HARNESS_FORCE=1     rebuild even if up to date
#   HARNESS_GO_P=N      go build -p (default 2)
#   HARNESS_BIN=DIR     output dir (default <repo>/target/harness/bin)
#   HARNESS_NO_NODES=1  skip the node runtime (containerd, runc, CNI plugins)
set -euo pipefail

HARNESS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HARNESS_DIR/../.." && pwd)"
BIN="${HARNESS_BIN:-$ROOT/target/harness/bin}"
STAMP="$BIN/.build-stamp"   # .harness / .tools suffixes
GO_P="${HARNESS_GO_P:-2}"

K8S_VERSION=v1.36.3
LDFLAGS="-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36 -X k8s.io/component-base/version.gitTreeState=clean"

HARNESS_BINS=(k8s-harness)
LINKS=(etcd kube-apiserver kube-controller-manager kube-scheduler)
# go.mod `tool` directives; binaries are named after the last path element.
TOOLS=(
  k8s.io/kubernetes/cmd/kubectl
  github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher
  github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner
  github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer
  github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
  sigs.k8s.io/kwok/cmd/kwok
  k8s.io/kubernetes/cmd/kubelet
  github.com/kubernetes-csi/node-driver-registrar/cmd/csi-node-driver-registrar
)
# cmd/: small binaries of this module (stdlib only), built in seconds.
SMALL=(oci-image pause api-gate)
# nodes/go.mod (a module of its own: containerd and runc do not resolve in this
# module's graph). runc needs cgo and libseccomp-dev (.ci/install-deps.sh).
CONTAINERD_VERSION=v2.4.2
NODE_TOOLS=(
  github.com/containerd/containerd/v2/cmd/containerd
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
  github.com/containerd/containerd/v2/cmd/ctr
)
# helm/go.mod (a module of its own: Helm v4 needs k8s.io v0.37, this module pins v0.36).
HELM_VERSION=v4.3.1
HELM_TOOL=helm.sh/helm/v4/cmd/helm
# snapshot/go.mod (a module of its own, like helm/: external-snapshotter v8.7.0 needs
# k8s.io v0.37).
SNAPSHOT_VERSION=v8.7.0
SNAPSHOT_TOOLS=(
  github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter
  github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller
)
SNAPSHOT_CRDS="$BIN/../snapshot-crds"
# prometheus/go.mod (a module of its own: Prometheus pins its own client-go). Built
# without the service-discovery plugins (remove_all_sd: the cloud SDKs, most of its
# build time); promtool's `check rules` and `test rules` need none of them.
PROMETHEUS_VERSION=v0.316.0   # the Go module of Prometheus 3.16.0
PROMTOOL_LDFLAGS="-s -w -X github.com/prometheus/common/version.Version=3.16.0"
PROMTOOL=github.com/prometheus/prometheus/cmd/promtool
# kstatus/go.mod (a module of its own: sigs.k8s.io/cli-utils v0.37.2 pins its own
# k8s.io versions).
CNI_PLUGINS=(
  github.com/containernetworking/plugins/plugins/main/ptp
  github.com/containernetworking/plugins/plugins/ipam/host-local
  github.com/containernetworking/plugins/plugins/main/loopback
)

log() { printf '[harness-build] %s\n' "$*" >&2; }

# Seven parts, each with its own stamp (recording when its build *started*, so a
# source edited during a build triggers the next one):
#   harness: k8s-harness, rebuilt when a top-level *.go, go.mod, go.sum or build.sh changes
#   tools:   kubectl, kubelet + sidecars, rebuilt only when go.mod, go.sum or build.sh change
#   small:   cmd/*, rebuilt when cmd/**/*.go, go.mod or build.sh change
#   nodes:   containerd, runc, CNI plugins, rebuilt when nodes/go.{mod,sum} or build.sh change
#   helm:    helm, rebuilt when helm/go.{mod,sum} or build.sh change
#   snapshot: csi-snapshotter, snapshot-controller, rebuilt when snapshot/go.{mod,sum} or build.sh change
#   prometheus: promtool, rebuilt when prometheus/go.{mod,sum} or build.sh change
#   kstatus: kstatus, rebuilt when kstatus/{*.go,go.mod,go.sum} or build.sh change
newer_than() { # newer_than STAMP DIR DEPTH NAME-PATTERN...: prints a source newer than STAMP
  local stamp=$1 dir=$2 depth=$3; shift 3
  local expr=() n
  for n in "$@"; do expr+=(${expr[0]+-o} -name "$n"); done
  find "$dir" -maxdepth "$depth" \( "${expr[@]}" \) -newer "$stamp" -print -quit
}

fresh() { # fresh PART BINARY...: stamp exists and every binary is executable
  local part=$1 b; shift
  [[ -z "${HARNESS_FORCE:-}" && -f "$STAMP.$part" ]] || return 1
  for b in "$@"; do [[ -x "$BIN/$b" ]] || return 1; done
}

harness_up_to_date() {
  fresh harness "${HARNESS_BINS[@]}" "${LINKS[@]}" &&
    [[ -z "$(newer_than "$STAMP.harness" "$HARNESS_DIR" 1 '*.go' go.mod go.sum build.sh)" ]]
}

tools_up_to_date() {
  fresh tools "${TOOLS[@]##*/}" &&
    [[ -z "$(newer_than "$STAMP.tools" "$HARNESS_DIR" 1 go.mod go.sum build.sh)" ]]
}

small_up_to_date() {
  fresh small "${SMALL[@]}" &&
    [[ -z "$(newer_than "$STAMP.small" "$HARNESS_DIR" 1 go.mod build.sh)" ]] &&
    [[ -z "$(newer_than "$STAMP.small" "$HARNESS_DIR/cmd" 3 '*.go')" ]]
}

nodes_up_to_date() {
  [[ -n "${HARNESS_NO_NODES:-}" ]] && return 0
  fresh nodes "${NODE_TOOLS[@]##*/}" runc "${CNI_PLUGINS[@]/#*\//cni/}" &&
    [[ -z "$(newer_than "$STAMP.nodes" "$HARNESS_DIR" 1 build.sh)" ]] &&
    [[ -z "$(newer_than "$STAMP.nodes" "$HARNESS_DIR/nodes" 1 go.mod go.sum)" ]]
}

helm_up_to_date() {
  fresh helm helm &&
    [[ -z "$(newer_than "$STAMP.helm" "$HARNESS_DIR" 1 build.sh)" ]] &&
    [[ -z "$(newer_than "$STAMP.helm" "$HARNESS_DIR/helm" 1 go.mod go.sum)" ]]
}

prometheus_up_to_date() {
  fresh prometheus promtool &&
    [[ -z "$(newer_than "$STAMP.prometheus" "$HARNESS_DIR" 1 build.sh)" ]] &&
    [[ -z "$(newer_than "$STAMP.prometheus" "$HARNESS_DIR/prometheus" 1 go.mod go.sum)" ]]
}

snapshot_up_to_date() {
  fresh snapshot "${SNAPSHOT_TOOLS[@]##*/}" &&
    [[ -f "$SNAPSHOT_CRDS/snapshot.storage.k8s.io_volumesnapshots.yaml" ]] &&
    [[ -z "$(newer_than "$STAMP.snapshot" "$HARNESS_DIR" 1 build.sh)" ]] &&
    [[ -z "$(newer_than "$STAMP.snapshot" "$HARNESS_DIR/snapshot" 1 go.mod go.sum)" ]]
}

kstatus_up_to_date() {
  fresh kstatus kstatus &&
    [[ -z "$(newer_than "$STAMP.kstatus" "$HARNESS_DIR" 1 build.sh)" ]] &&
    [[ -z "$(newer_than "$STAMP.kstatus" "$HARNESS_DIR/kstatus" 1 '*.go' go.mod go.sum)" ]]
}

up_to_date() { harness_up_to_date && tools_up_to_date && small_up_to_date && nodes_up_to_date && helm_up_to_date && snapshot_up_to_date && prometheus_up_to_date && kstatus_up_to_date; }

if up_to_date; then
  log "up to date ($BIN)"
  exit 0
fi

command -v go >/dev/null 2>&1 || { log "error: 'go' not found in PATH (need Go >= 1.26)"; exit 1; }

mkdir -p "$BIN"
# Serialize concurrent builds (parallel test processes may all call us).
exec 9>"$BIN/.build.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
  if up_to_date; then log "up to date (built by a concurrent caller)"; exit 0; fi
fi

start=$(date +%s)
cd "$HARNESS_DIR"
# -buildvcs=false: the module lives in a sub-directory of the repository;
# VCS stamping is useless here and fails on checkouts without git metadata.
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false -mod=readonly"
export CGO_ENABLED="${CGO_ENABLED:-0}"
log "go: $(go version)"

if ! harness_up_to_date; then
  touch "$STAMP.harness.new"
  log "building k8s-harness (kube-apiserver, kube-controller-manager, kube-scheduler, etcd) ..."
  go build -p "$GO_P" -trimpath -ldflags "$LDFLAGS" -o "$BIN/k8s-harness.new" .
  mv -f "$BIN/k8s-harness.new" "$BIN/k8s-harness"
  for l in "${LINKS[@]}"; do ln -sfn k8s-harness "$BIN/$l"; done
  mv -f "$STAMP.harness.new" "$STAMP.harness"
  log "k8s-harness done after $(( $(date +%s) - start ))s"
fi

if ! tools_up_to_date; then
  touch "$STAMP.tools.new"
  log "building tools: ${TOOLS[*]##*/} ..."
  tmp="$BIN/.tools.new"
  rm -rf "$tmp"; mkdir -p "$tmp"
  go build -p "$GO_P" -trimpath -ldflags "$LDFLAGS" -o "$tmp/" "${TOOLS[@]}"
  for t in "${TOOLS[@]}"; do mv -f "$tmp/${t##*/}" "$BIN/${t##*/}"; done
  rm -rf "$tmp"
  mv -f "$STAMP.tools.new" "$STAMP.tools"
  log "tools done after $(( $(date +%s) - start ))s"
fi

if ! small_up_to_date; then
  touch "$STAMP.small.new"
  log "building ${SMALL[*]} ..."
  go build -p "$GO_P" -trimpath -ldflags "-s -w" -o "$BIN/" "${SMALL[@]/#/./cmd/}"
  mv -f "$STAMP.small.new" "$STAMP.small"
fi

if ! nodes_up_to_date; then
  touch "$STAMP.nodes.new"
  log "building the node runtime: ${NODE_TOOLS[*]##*/} runc ${CNI_PLUGINS[*]##*/} ..."
  tmp="$BIN/.nodes.new"
  rm -rf "$tmp"; mkdir -p "$tmp/cni" "$BIN/cni"
  (
    cd "$HARNESS_DIR/nodes"
    CGO_ENABLED=0 go build -p "$GO_P" -trimpath -tags no_btrfs,no_devmapper,no_zfs \
      -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
      -o "$tmp/" "${NODE_TOOLS[@]}"
    CGO_ENABLED=0 go build -p "$GO_P" -trimpath -ldflags "-s -w" -o "$tmp/cni/" "${CNI_PLUGINS[@]}"
    # seccomp: containerd's default sandbox profile needs it (libseccomp-dev).
    CGO_ENABLED=1 go build -p "$GO_P" -trimpath -tags seccomp -ldflags "-s -w" -o "$tmp/" github.com/opencontainers/runc
  )
  for t in "${NODE_TOOLS[@]##*/}" runc; do mv -f "$tmp/$t" "$BIN/$t"; done
  for t in "${CNI_PLUGINS[@]##*/}"; do mv -f "$tmp/cni/$t" "$BIN/cni/$t"; done
  rm -rf "$tmp"
  mv -f "$STAMP.nodes.new" "$STAMP.nodes"
fi

if ! helm_up_to_date; then
  touch "$STAMP.helm.new"
  log "building helm $HELM_VERSION ..."
  (
    cd "$HARNESS_DIR/helm"
    go build -p "$GO_P" -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
      -o "$BIN/helm.new" "$HELM_TOOL"
  )
  mv -f "$BIN/helm.new" "$BIN/helm"
  mv -f "$STAMP.helm.new" "$STAMP.helm"
  log "helm done after $(( $(date +%s) - start ))s"
fi

if ! snapshot_up_to_date; then
  touch "$STAMP.snapshot.new"
  log "building external-snapshotter $SNAPSHOT_VERSION: ${SNAPSHOT_TOOLS[*]##*/} ..."
  (
    cd "$HARNESS_DIR/snapshot"
    go build -p "$GO_P" -trimpath -ldflags "-s -w" -o "$BIN/" "${SNAPSHOT_TOOLS[@]}"
    client=$(go list -m -f '{{.Dir}}' github.com/kubernetes-csi/external-snapshotter/client/v8)
    rm -rf "$SNAPSHOT_CRDS"; mkdir -p "$SNAPSHOT_CRDS"
    for c in volumesnapshotclasses volumesnapshotcontents volumesnapshots; do
      install -m 0644 "$client/config/crd/snapshot.storage.k8s.io_$c.yaml" "$SNAPSHOT_CRDS/"
    done
  )
  mv -f "$STAMP.snapshot.new" "$STAMP.snapshot"
  log "external-snapshotter done after $(( $(date +%s) - start ))s"
fi

if ! prometheus_up_to_date; then
  touch "$STAMP.prometheus.new"
  log "building promtool (prometheus $PROMETHEUS_VERSION) ..."
  (
    cd "$HARNESS_DIR/prometheus"
    go build -p "$GO_P" -trimpath -tags remove_all_sd -ldflags "$PROMTOOL_LDFLAGS" -o "$BIN/promtool.new" "$PROMTOOL"
  )
  mv -f "$BIN/promtool.new" "$BIN/promtool"
  mv -f "$STAMP.prometheus.new" "$STAMP.prometheus"
  log "promtool done after $(( $(date +%s) - start ))s"
fi

if ! kstatus_up_to_date; then
  touch "$STAMP.kstatus.new"
  log "building kstatus (sigs.k8s.io/cli-utils) ..."
  (
    cd "$HARNESS_DIR/kstatus"
    go build -p "$GO_P" -trimpath -ldflags "-s -w" -o "$BIN/kstatus.new" .
  )
  mv -f "$BIN/kstatus.new" "$BIN/kstatus"
  mv -f "$STAMP.kstatus.new" "$STAMP.kstatus"
  log "kstatus done after $(( $(date +%s) - start ))s"
fi

log "built in $(( $(date +%s) - start ))s into $BIN"
