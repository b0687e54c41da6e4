#!/usr/bin/env bash
# One RWX volume, 50 then 500 nodes, through the real csi-attacher and `tessera
# controller --csi-endpoint` on the local control plane (or KUBECONFIG). See
# bench/rwx/rwx.rs.
#   BENCH_RWX_SCALES=50,50,50,500 (a scale repeated counts by its medians; at most
#   1024: the CRD's limit of tickets on one volume)
#   BENCH_ATTACHER_WORKERS=100 BENCH_ATTACHER_QPS=200 BENCH_ATTACHER_BURST=400
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[[ -n "${KUBECONFIG:-}" ]] || bash tests/harness/cluster.sh up
cargo bench --bench rwx
