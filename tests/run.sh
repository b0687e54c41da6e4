#!/usr/bin/env bash
# Runs every test. Without KUBECONFIG the local control plane from tests/harness is
# started first and stopped at the end; then two real nodes (kubelet, containerd, runc)
# with a control plane of their own (target/nodes-cluster) run the demo (`make demo
# ONCE=1`: Tessera deployed from config/, a Pod moved between nodes), the real-Pod
# tests (tests/pods/, #[ignore]d elsewhere) and the Helm install
# (tests/harness/helm.sh test: Tessera's image built from the Containerfile, pushed
# to the harness registry and pulled with a pull Secret), and are stopped. With KUBECONFIG the
# cargo tests run against that cluster and nothing is started or stopped.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# Real-Pod tests that fail because of a known, documented product bug (not a flake):
# skipped by name and said in the closing line, never counted as passed. None today.
KNOWN_BROKEN=""
KNOWN_BROKEN_SKIP=""
for t in $KNOWN_BROKEN; do KNOWN_BROKEN_SKIP+=" --skip $t"; done

started=0
if [[ -z "${KUBECONFIG:-}" ]]; then
  if ! bash tests/harness/cluster.sh status >/dev/null 2>&1; then
    started=1
  fi
  bash tests/harness/cluster.sh up
fi

log="$(mktemp)"
set +e
cargo test --workspace --no-fail-fast --lib --bins --tests -- --test-threads="${TEST_THREADS:-4}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
# The backend-quota tests that need XFS project quotas are #[ignore]d: run them (and
# only them: --ignored with the filter backend_quota::) here where the kernel has XFS
# quota support, otherwise in a QEMU VM on Debian's 6.12 kernel (tests/vm/xfs-quota.sh),
# and say which.
modprobe xfs 2>/dev/null
where=""
if [[ -e /proc/fs/xfs/xqmstat ]]; then
  cargo test --test fuse -- --ignored backend_quota:: 2>&1 | tee -a "$log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
else
  bin=$(cargo test --test fuse --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
  TEST_ARGS="--ignored --test-threads=1 backend_quota::" bash tests/vm/xfs-quota.sh "$bin" 2>&1 | tee -a "$log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  where=" (the XFS project-quota tests ran in a QEMU VM: this kernel has no CONFIG_XFS_QUOTA)"
fi
if [[ $started == 1 ]]; then
  bash tests/harness/cluster.sh down || true
fi
nodes=" (no real nodes: KUBECONFIG names a cluster)"
if [[ -z "${KUBECONFIG:-}" ]]; then
  # Real nodes: the demo deploys Tessera on them and leaves them up for the Pod tests.
  nodes_cluster="$ROOT/target/nodes-cluster"
  ONCE=1 KEEP_CLUSTER=1 HARNESS_CLUSTER_DIR="$nodes_cluster" bash tests/demo.sh 2>&1 | tee -a "$log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  pods() { HARNESS_CLUSTER_DIR="$nodes_cluster" KUBECONFIG="$nodes_cluster/kubeconfig" \
    cargo test --test pods -- --ignored --test-threads=1 --nocapture "$@" 2>&1 | tee -a "$log"; }
  pods --skip failover:: --skip release:: $KNOWN_BROKEN_SKIP
  if [[ ${PIPESTATUS[0]} != 0 ]]; then
    rc=1
    # A failed test leaves its namespace, claims and volumes behind, and Tessera is
    # not removed while volumes exist (deploy.sh down): the Helm, README and upgrade
    # stages below would fail for it too. Remove what the tests left, and say so.
    k() { "$ROOT/target/harness/bin/kubectl" --kubeconfig "$nodes_cluster/kubeconfig" "$@"; }
    left=$(k get ns -o name | grep -v -E '^namespace/(default|kube-system|kube-public|kube-node-lease|tessera-system)$' || true)
    if [[ -n "$left" ]]; then
      echo "[tests] a failed test left $(echo $left); deleting them so the next stages start clean" | tee -a "$log"
      k delete $left --wait=true --timeout=300s 2>&1 | tee -a "$log" || true
      for _ in $(seq 1 120); do
        [[ -z "$(k get volumes.tessera.io -o name 2>/dev/null)" ]] && break
        sleep 2
      done
      echo "[tests] Tessera volumes left: $(k get volumes.tessera.io -o name 2>/dev/null | wc -l)" | tee -a "$log"
    fi
  fi
  # The Helm chart on the same nodes: the kustomize install replaced by `helm install`
  # of images built from the Containerfile and pulled from the harness registry with a
  # pull Secret (mount Pods included), a Pod on a claim to Running, then `helm
  # uninstall` leaves only the CRDs, which `kubectl delete -k crds/` removes.
  HARNESS_CLUSTER_DIR="$nodes_cluster" bash tests/harness/helm.sh test 2>&1 | tee -a "$log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  # README.md's "Install on your cluster", command by command, as written.
  HARNESS_CLUSTER_DIR="$nodes_cluster" bash tests/harness/readme.sh 2>&1 | tee -a "$log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  # Upgrades from the previous release (tests/upgrade/) under a writing Pod: Helm,
  # then kustomize, which leaves this checkout's config/ deployed.
  pods release::helm_upgrade
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  pods release::kustomize_upgrade
  if [[ ${PIPESTATUS[0]} != 0 ]]; then
    rc=1
    HARNESS_CLUSTER_DIR="$nodes_cluster" bash tests/harness/deploy.sh up 2>&1 | tee -a "$log"
  fi
  # Last, since they cut node A off and then kill it for good: the partition and the
  # power-off failover tests (tests/pods/failover.rs).
  pods failover::
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  HARNESS_CLUSTER_DIR="$nodes_cluster" bash tests/harness/cluster.sh down || true
  nodes="; the real-Pod tests, the Helm install (images pulled from the harness registry), the README's install section, the upgrades from the previous release and the partition and power-off failovers ran on two real nodes"
  [[ -z "$KNOWN_BROKEN" ]] ||
    nodes+="; NOT RUN (a known bug, docs/troubleshooting.md \"Known issues\"): $KNOWN_BROKEN"
fi
set -e
# The panics of the run in short (each failed test's reason among them), just before
# the closing line: the end of a CI log is the part that gets read, and backtraces and
# later tests' output would otherwise push the reasons out of it.
why=$(awk '/ panicked at /{ print; n = 6; next }
           n > 0 && (/^stack backtrace:/ || /^note: / || /^$/) { n = 0 }
           n > 0 { print "    " substr($0, 1, 400); n-- }' "$log" | head -n 120) || true
if [[ -n "$why" ]]; then
  echo "--- the panics of this run, in short ---"
  echo "$why"
fi
# One closing line for the whole run.
awk -v where="$where" -v nodes="$nodes" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tessera: %d passed, %d failed%s%s\n", p, f, where, nodes }' "$log"
rm -f "$log"
exit "$rc"
