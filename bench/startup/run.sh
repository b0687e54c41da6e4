#!/usr/bin/env bash
# Pod start-up with and without a Tessera claim, on the harness's two real nodes
# (bench/startup/startup.rs). Without KUBECONFIG: starts the nodes and deploys Tessera
# (tests/demo.sh, as `make test` does), and stops them afterwards (KEEP_CLUSTER=1 keeps
# them). BENCH_STARTUP_PODS (100), BENCH_STARTUP_ROUNDS (2), BENCH_STARTUP_CLASS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if [[ -z "${KUBECONFIG:-}" ]]; then
  nodes_cluster="$PWD/target/nodes-cluster"
  ONCE=1 KEEP_CLUSTER=1 HARNESS_CLUSTER_DIR="$nodes_cluster" bash tests/demo.sh >/dev/null
  [[ -n "${KEEP_CLUSTER:-}" ]] || trap 'HARNESS_CLUSTER_DIR="$nodes_cluster" bash tests/harness/cluster.sh down >/dev/null 2>&1 || true' EXIT
  export KUBECONFIG="$nodes_cluster/kubeconfig"
fi
cargo bench --bench startup
