#!/usr/bin/env bash
# `make demo`: Tessera on two real nodes, narrated.
#
# Starts the control plane and two real nodes (kubelet, containerd, runc; built from
# Go modules by tests/harness), loads the images offline, deploys Tessera from config/
# (controller Deployment, node DaemonSet, CSI sidecars), then walks a PVC through a
# real Pod on node A writing data, the Pod deleted and the volume detached by the
# kubelet, and a Pod on node B reading the same bytes, printing Tessera's tickets at
# each step.
#
#   make demo          stays up until Ctrl-C, then tears down (a re-run starts clean)
#   make demo ONCE=1   runs the flow once, tears down, exits 0 only if every step passed
#
# The nodes' cluster lives in target/nodes-cluster (HARNESS_CLUSTER_DIR), apart from the
# control plane the other tests use; one cluster with nodes runs per host.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

export HARNESS_CLUSTER_DIR="${HARNESS_CLUSTER_DIR:-$ROOT/target/nodes-cluster}"
export KUBECONFIG="$HARNESS_CLUSTER_DIR/kubeconfig"
BIN="$ROOT/target/harness/bin"
NS=tessera-demo
STEP=0

say()  { printf '\n\033[1m== %s\033[0m\n' "$*"; }
info() { printf '   %s\n' "$*"; }
fail() { printf '\n\033[31mDEMO FAILED: %s\033[0m\n' "$*" >&2; exit 1; }
step() { STEP=$((STEP + 1)); say "$STEP. $*"; }
k()    { "$BIN/kubectl" --kubeconfig "$KUBECONFIG" --cache-dir "$HARNESS_CLUSTER_DIR/kubectl-cache" "$@"; }
# wait_for SECONDS DESCRIPTION COMMAND...: retry COMMAND until it succeeds.
wait_for() {
  local secs=$1 what=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || fail "timed out after ${secs}s waiting for: $what"
    sleep 0.5
  done
}
show() { k get "$@" 2>&1 | sed 's/^/   /'; }

teardown() {
  set +e
  say "Tearing down"
  k delete ns "$NS" --wait=true --timeout=60s >/dev/null 2>&1
  bash tests/harness/cluster.sh down >/dev/null 2>&1
  info "nodes and control plane stopped, mounts and cgroups removed"
}

step "Building tessera, the control plane and the nodes (cached after the first run)"
# Cargo prints while it waits for a lock held by another build, so the demo never sits silent.
cargo build --bin tessera 2>&1 | sed -u 's/^/   /'
bin="${CARGO_TARGET_DIR:-$ROOT/target}/debug/tessera"
bash tests/harness/build.sh 2>&1 | sed -u 's/^/   /'

step "Starting the control plane and two real nodes"
trap 'teardown; exit 130' INT TERM
# (KEEP_CLUSTER=1 with ONCE=1: leave the nodes and Tessera running, for tests/pods/)
if [[ "${ONCE:-}" == 1 && "${KEEP_CLUSTER:-}" != 1 ]]; then trap teardown EXIT; fi
# A previous run cut short leaves its cluster behind: start clean.
bash tests/harness/cluster.sh down >/dev/null 2>&1 || true
HARNESS_NODES=2 bash tests/harness/cluster.sh up 2>&1 | sed -u 's/^/   /'
env_of() { sed -n "s/^$1=//p" "$HARNESS_CLUSTER_DIR/nodes.env"; }
read -r A B <<<"$(env_of TESSERA_NODES)"
TESSERA_SHARED_DIR=$(env_of TESSERA_SHARED_DIR)
show nodes -o wide

step "Loading the images into the nodes (no registry) and deploying config/"
TESSERA_IMAGE_BIN="$bin" bash tests/harness/images.sh build 2>&1 | sed -u 's/^/   /'
bash tests/harness/images.sh load 2>&1 | sed -u 's/^/   /'
bash tests/harness/deploy.sh up 2>&1 | sed -u 's/^/   /'
show csinodes

step "A claim, and a Pod on $A that writes 8 MiB and its checksum"
k create ns "$NS" >/dev/null
wait_for 60 "the namespace's default ServiceAccount" k -n "$NS" get serviceaccount default
k -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: tessera-shared
  resources: {requests: {storage: 64Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: writer}
spec:
  nodeName: $A
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: harness.tessera.io/busybox:1.35
    imagePullPolicy: Never
    command: [sh, -c, 'dd if=/dev/urandom of=/data/big bs=1M count=8 2>/dev/null && cd /data && sha256sum big > big.sha256 && cat big.sha256 && exec sleep 3600']
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
YAML
wait_for 120 "Pod writer Running" sh -c "[ \"\$('$BIN/kubectl' --kubeconfig '$KUBECONFIG' -n $NS get pod writer -o jsonpath='{.status.phase}')\" = Running ]"
wait_for 60 "the writer's checksum" sh -c "'$BIN/kubectl' --kubeconfig '$KUBECONFIG' -n $NS logs writer | grep -q big"
PV=$(k -n "$NS" get pvc data -o jsonpath='{.spec.volumeName}')
info "the writer says: $(k -n "$NS" logs writer)"
show pvc,pods -n "$NS" -o wide
show volumes.tessera.io,volumeattachments.tessera.io,mountpods.tessera.io
show volumeattachments.storage.k8s.io

step "The writer is deleted: the kubelet unpublishes, the volume detaches from $A"
t0=$SECONDS
k -n "$NS" delete pod writer --wait=true >/dev/null
wait_for 30 "the storage VolumeAttachment of $PV gone" sh -c "! '$BIN/kubectl' --kubeconfig '$KUBECONFIG' get volumeattachments.storage.k8s.io -o jsonpath='{.items[*].spec.source.persistentVolumeName}' | grep -q $PV"
info "detached $((SECONDS - t0)) s after the delete"
show volumeattachments.tessera.io,mountpods.tessera.io

step "A Pod on $B checks the same bytes"
k -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: reader}
spec:
  nodeName: $B
  restartPolicy: Never
  containers:
  - name: app
    image: harness.tessera.io/busybox:1.35
    imagePullPolicy: Never
    command: [sh, -c, 'cd /data && sha256sum -c big.sha256']
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
YAML
wait_for 120 "Pod reader Succeeded" sh -c "[ \"\$('$BIN/kubectl' --kubeconfig '$KUBECONFIG' -n $NS get pod reader -o jsonpath='{.status.phase}')\" = Succeeded ]"
info "the reader says: $(k -n "$NS" logs reader)"
show volumeattachments.tessera.io

if [[ "${ONCE:-}" != 1 ]]; then
  say "Tessera runs on two real nodes. Try: KUBECONFIG=$KUBECONFIG $BIN/kubectl get tessera; Ctrl-C tears down"
  while :; do sleep 3600; done
fi

step "Claim deleted: PV, Volume and data gone"
VOL=$(k get pv "$PV" -o jsonpath='{.spec.csi.volumeHandle}')
k -n "$NS" delete pod reader --wait=true >/dev/null
k -n "$NS" delete pvc data --wait=true >/dev/null
wait_for 60 "Volume $VOL gone" sh -c "! '$BIN/kubectl' --kubeconfig '$KUBECONFIG' get volumes.tessera.io $VOL"
[[ ! -e "$TESSERA_SHARED_DIR/tessera/$VOL" ]] || fail "the data of $VOL is still in the backend"
info "PV, Volume and its data directory are gone"
say "DEMO PASSED"
