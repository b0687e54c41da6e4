#!/usr/bin/env bash
# Attach latency through the real external-attacher: Tessera vs a no-op baseline driver,
# on the local control plane (or KUBECONFIG). See bench/attach/attach.rs.
#   BENCH_SCALES=1,100,1000  BENCH_ROUNDS=20  BENCH_REAL_AGENT_MAX=100
#   BENCH_ATTACHER_WORKERS=100 BENCH_ATTACHER_QPS=200 BENCH_ATTACHER_BURST=400
#   single-attach rounds: BENCH_ROUND_ORDER=rounds|blocks  BENCH_SETTLE=1  BENCH_DAEMON_START=1
#   (the API chain floor and the daemon start: bench/attach/chain.rs, daemon_start.rs)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bash bench/attach/build-refdriver.sh
[[ -n "${KUBECONFIG:-}" ]] || bash tests/harness/cluster.sh up
cargo bench --bench attach
