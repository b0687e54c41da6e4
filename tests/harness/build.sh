#!/usr/bin/env bash
# Builds Tessera's test control plane into target/harness/bin/ (relative to
# the repository root):
#
#   k8s-harness      pki | etcd | kube-apiserver | kube-controller-manager |
#                    kube-scheduler | freeports | wait-ready | readyz
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler
#                    symlinks to k8s-harness (dispatch on argv[0])
#   kubectl, csi-attacher, csi-provisioner, csi-resizer, csi-sanity, kwok
#
# A no-op when every binary exists and the stamp files are newer than every
# harness source (*.go, go.mod, go.sum, this script); editing only *.go files
# relinks only k8s-harness. Uses the default
# GOMODCACHE/GOCACHE so repeated builds are incremental.
#
# Environment:
#   HARNESS_FORCE=1     rebuild even if up to date
#   HARNESS_GO_P=N      go build -p (default 2)
#   HARNESS_BIN=DIR     output dir (default <repo>/target/harness/bin)
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
)

log() { printf '[harness-build] %s\n' "$*" >&2; }

# Two parts, each with its own stamp (recording when its build *started*, so a
# source edited during a build triggers the next one):
#   harness: k8s-harness, rebuilt when any *.go, go.mod, go.sum or build.sh changes
#   tools:   kubectl + sidecars, rebuilt only when go.mod, go.sum or build.sh change
newer_than() { # newer_than STAMP NAME-PATTERN...: prints a source newer than STAMP
  local stamp=$1; shift
  local expr=() n
  for n in "$@"; do expr+=(${expr[0]+-o} -name "$n"); done
  find "$HARNESS_DIR" -maxdepth 2 \( "${expr[@]}" \) -newer "$stamp" -print -quit
}

harness_up_to_date() {
  [[ -z "${HARNESS_FORCE:-}" && -f "$STAMP.harness" ]] || return 1
  local b
  for b in "${HARNESS_BINS[@]}" "${LINKS[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
  [[ -z "$(newer_than "$STAMP.harness" '*.go' go.mod go.sum build.sh)" ]]
}

tools_up_to_date() {
  [[ -z "${HARNESS_FORCE:-}" && -f "$STAMP.tools" ]] || return 1
  local b
  for b in "${TOOLS[@]}"; do [[ -x "$BIN/${b##*/}" ]] || return 1; done
  [[ -z "$(newer_than "$STAMP.tools" go.mod go.sum build.sh)" ]]
}

up_to_date() { harness_up_to_date && tools_up_to_date; }

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
fi

log "built in $(( $(date +%s) - start ))s into $BIN"
