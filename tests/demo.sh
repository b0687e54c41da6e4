#!/usr/bin/env bash
# `make demo`: Tessera on a local control plane, narrated.
#
# Builds what it needs, starts the control plane (tests/harness), `tessera controller`
# (with its CSI socket), two node agents (node A and node B, on this machine), the real
# external-provisioner and external-attacher, then walks a PVC through provisioning,
# attachment on A, a move to B and deletion, printing the tickets at each step.
# There is no kubelet: the demo writes through the node's FUSE mount point itself.
#
#   make demo          stays up until Ctrl-C, then tears down
#   make demo ONCE=1   runs the flow once, tears down, exits 0 only if every step passed
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DEMO="$ROOT/target/demo"
# The demo runs its own control plane, apart from the one the tests use.
export HARNESS_CLUSTER_DIR="$ROOT/target/demo-cluster"
BIN="$ROOT/target/harness/bin"
NS=tessera-demo
A=demo-node-a
B=demo-node-b
STEP=0
PIDS=()

say()  { printf '\n\033[1m== %s\033[0m\n' "$*"; }
info() { printf '   %s\n' "$*"; }
fail() { printf '\n\033[31mDEMO FAILED: %s\033[0m\n' "$*" >&2; exit 1; }
step() { STEP=$((STEP + 1)); say "$STEP. $*"; }
k()    { "$BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }
# wait_for SECONDS DESCRIPTION COMMAND...: retry COMMAND until it succeeds.
wait_for() {
  local secs=$1 what=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || fail "timed out after ${secs}s waiting for: $what"
    sleep 0.5
  done
}

teardown() {
  set +e
  say "Tearing down"
  k delete pod -n "$NS" --all --wait=false >/dev/null 2>&1
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 1
  # The FUSE daemons run detached from the agents (so agent restarts keep mounts):
  # stop the demo's own and unmount what is left under target/demo.
  pkill -f "tessera mount .*$DEMO" 2>/dev/null
  grep " $DEMO" /proc/self/mountinfo | awk '{print $5}' | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
  k delete ns "$NS" --wait=false >/dev/null 2>&1
  if [[ "${ONCE:-}" == 1 ]]; then
    bash tests/harness/cluster.sh down >/dev/null 2>&1
    info "processes and the demo's control plane stopped"
  else
    info "processes stopped; the demo's control plane keeps running (HARNESS_CLUSTER_DIR=$HARNESS_CLUSTER_DIR bash tests/harness/cluster.sh down)"
  fi
}

step "Building tessera and the control plane (cached after the first run)"
cargo build --quiet
TESSERA="${CARGO_TARGET_DIR:-$ROOT/target}/debug/tessera"
bash tests/harness/build.sh
export KUBECONFIG
KUBECONFIG="$(bash tests/harness/cluster.sh up | tail -1)"
info "control plane up; KUBECONFIG=$KUBECONFIG"

rm -rf "$DEMO"; mkdir -p "$DEMO/logs" "$DEMO/backend"
trap teardown EXIT

step "Installing the CRDs, two Nodes (A and B) with their CSINodes, the CSIDriver and a StorageClass"
k apply --server-side -f crds/tessera.io.yaml >/dev/null
k wait --for=condition=Established crd/volumes.tessera.io crd/volumeattachments.tessera.io crd/mountpods.tessera.io >/dev/null
for node in $A $B; do
  k apply --server-side -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $node
  labels: {kubernetes.io/hostname: $node, topology.tessera.io/node: $node}
  annotations: {volumes.kubernetes.io/controller-managed-attach-detach: "true"}
---
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata: {name: $node}
spec:
  drivers: [{name: csi.tessera.io, nodeID: $node, topologyKeys: [topology.tessera.io/node]}]
YAML
done
k apply --server-side -f config/csidriver.yaml >/dev/null
k apply --server-side -f - >/dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: $NS}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: tessera-demo}
provisioner: csi.tessera.io
parameters: {backendRoot: $DEMO/backend, scope: Shared}
reclaimPolicy: Delete
volumeBindingMode: Immediate
allowVolumeExpansion: true
YAML
info "backend root (shared by both nodes): $DEMO/backend"

step "Starting tessera controller, two node agents and the CSI sidecars"
"$TESSERA" controller --no-leader-election --metrics-addr 127.0.0.1:0 \
  --csi-endpoint "unix://$DEMO/controller.sock" --default-backend-root "$DEMO/backend" \
  --allowed-backend-root "$DEMO/backend" \
  >"$DEMO/logs/controller.log" 2>&1 & PIDS+=($!)
for node in $A $B; do
  d="$DEMO/$node"; mkdir -p "$d/kubelet"
  "$TESSERA" node --node-name "$node" --mount-root "$d/mounts" --state-dir "$d/state" \
    --kubelet-dir "$d/kubelet" --metrics-addr 127.0.0.1:0 --csi-endpoint "unix://$d/csi.sock" \
    --allowed-backend-root "$DEMO/backend" \
    >"$DEMO/logs/node-$node.log" 2>&1 & PIDS+=($!)
done
wait_for 30 "controller CSI socket" test -S "$DEMO/controller.sock"
"$BIN/csi-provisioner" --csi-address="$DEMO/controller.sock" --kubeconfig="$KUBECONFIG" \
  --leader-election=false --extra-create-metadata --timeout=30s \
  >"$DEMO/logs/csi-provisioner.log" 2>&1 & PIDS+=($!)
"$BIN/csi-attacher" --csi-address="$DEMO/controller.sock" --kubeconfig="$KUBECONFIG" \
  --leader-election=false --timeout=15s \
  >"$DEMO/logs/csi-attacher.log" 2>&1 & PIDS+=($!)
info "logs in $DEMO/logs/"

step "A PersistentVolumeClaim: external-provisioner calls CreateVolume, Tessera creates a Volume"
k apply -n "$NS" -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: demo-data}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: tessera-demo
  resources: {requests: {storage: 1Gi}}
YAML
pvc_bound() { [[ "$(k get pvc -n "$NS" demo-data -o jsonpath='{.status.phase}')" == Bound ]]; }
wait_for 60 "PVC bound" pvc_bound
PV=$(k get pvc -n "$NS" demo-data -o jsonpath='{.spec.volumeName}')
info "PVC bound to $PV"
k get volumes.tessera.io "$PV"

attached_on() { # attached_on NODE: the storage VolumeAttachment of PV on NODE says attached
  [[ "$(k get volumeattachments.storage.k8s.io -o jsonpath="{range .items[?(@.spec.nodeName=='$1')]}{.spec.source.persistentVolumeName}={.status.attached}{'\n'}{end}")" == *"$PV=true"* ]]
}
mountpoint_on() { k get mountpods.tessera.io -l "tessera.io/volume=$PV,tessera.io/node=$1" -o jsonpath='{.items[0].status.mountPoint}'; }
run_pod_on() {
  k apply -n "$NS" -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: app}
spec:
  nodeName: $1
  containers: [{name: app, image: busybox, command: [sleep, infinity], volumeMounts: [{name: data, mountPath: /data}]}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: demo-data}}]
YAML
}

step "A Pod on node A: attach-detach controller → storage VolumeAttachment → external-attacher → ControllerPublish → ticket"
run_pod_on $A
wait_for 60 "volume attached on node A" attached_on $A
info "storage.k8s.io VolumeAttachment attached on $A; Tessera's view:"
k get volumeattachments.tessera.io "$PV"
k get mountpods.tessera.io -l "tessera.io/volume=$PV" -o wide
MP_A=$(mountpoint_on $A)
[[ -n "$MP_A" ]] || fail "no mount point reported on node A"
echo "written on node A at $(date -u +%FT%TZ)" > "$MP_A/hello.txt"
SUM=$(sha256sum "$MP_A/hello.txt" | cut -d' ' -f1)
info "wrote hello.txt through A's FUSE mount ($MP_A); it lands in the backend:"
ls -l "$DEMO/backend/$PV/"

step "The Pod moves to node B: detach from A first, then attach on B (never two writers)"
k delete pod -n "$NS" app --grace-period=0 --force >/dev/null 2>&1 || true
detached_from_a() { ! attached_on $A && [[ -z "$(k get mountpods.tessera.io -l "tessera.io/volume=$PV,tessera.io/node=$A" -o name)" ]]; }
wait_for 60 "detached from node A" detached_from_a
run_pod_on $B
wait_for 60 "volume attached on node B" attached_on $B
k get volumeattachments.tessera.io "$PV"
MP_B=$(mountpoint_on $B)
[[ "$(sha256sum "$MP_B/hello.txt" | cut -d' ' -f1)" == "$SUM" ]] || fail "data changed across the move"
info "read through B's FUSE mount: $(cat "$MP_B/hello.txt") (checksum intact)"

step "What kubectl shows now"
k get volumes.tessera.io,volumeattachments.tessera.io,mountpods.tessera.io -o wide
k get volumeattachments.tessera.io "$PV" -o jsonpath='{range .spec.attachmentTickets.*}ticket {.id} ({.type}) → node {.nodeID}{"\n"}{end}'

if [[ "${ONCE:-}" == 1 ]]; then
  step "Deleting the Pod and the PVC: the PV, the Volume and its data go"
  k delete pod -n "$NS" app --grace-period=0 --force >/dev/null 2>&1 || true
  k delete pvc -n "$NS" demo-data >/dev/null
  gone() { ! k get volumes.tessera.io "$PV" >/dev/null 2>&1 && ! k get pv "$PV" >/dev/null 2>&1; }
  wait_for 120 "PV and Volume deleted" gone
  [[ ! -e "$DEMO/backend/$PV" ]] || fail "the volume's data directory is still there"
  info "PV, Volume and data directory are gone"
  say "DEMO PASSED"
  exit 0
fi
say "Tessera runs. Try: KUBECONFIG=$KUBECONFIG $BIN/kubectl get tessera   (Ctrl-C ends the demo)"
while true; do sleep 3600; done
