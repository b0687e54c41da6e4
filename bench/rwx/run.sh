#!/usr/bin/env bash
# One RWX volume, 50 then 500 tickets on as many nodes, through `tessera controller` on
# the local control plane (or KUBECONFIG). See bench/rwx/rwx.rs.
#   BENCH_RWX_SCALES=50,500
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[[ -n "${KUBECONFIG:-}" ]] || bash tests/harness/cluster.sh up
cargo bench --bench rwx
