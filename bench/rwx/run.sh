#!/usr/bin/env bash
# One RWX volume, 50 then 250 tickets on as many nodes, through `tessera controller` on
# the local control plane (or KUBECONFIG). See bench/rwx/rwx.rs.
#   BENCH_RWX_SCALES=50,250 (at most 256: the CRD's limit of tickets on one volume)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[[ -n "${KUBECONFIG:-}" ]] || bash tests/harness/cluster.sh up
cargo bench --bench rwx
