#!/usr/bin/env bash
# One RWX volume on many nodes, through the real csi-attacher and `tessera controller
# --csi-endpoint` on the local control plane (or KUBECONFIG), against the no-op
# baseline driver through the same attacher settings. See bench/rwx/rwx.rs.
#   NODES=1000 (make bench-rwx NODES=1000): the scales 50,50,50,NODES
#   BENCH_RWX_SCALES=50,50,50,500 (a scale repeated counts by its medians). Past
#   1024 nodes (the most tickets one VolumeAttachment holds, docs/scaling-tickets.md)
#   Tessera attaches on 1024 and refuses the rest with RESOURCE_EXHAUSTED: the run
#   reports how many, against the no-op driver attaching all of them.
#   BENCH_ATTACHER_WORKERS=100 BENCH_ATTACHER_QPS=200 BENCH_ATTACHER_BURST=400
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if [[ -n "${NODES:-}" ]]; then
  [[ "$NODES" =~ ^[0-9]+$ && "$NODES" -ge 1 ]] || { echo "NODES must be a node count, not '$NODES'" >&2; exit 2; }
  if (( NODES > 1024 )); then
    echo "NODES=$NODES: one VolumeAttachment holds at most 1024 tickets (the CRD's limit): Tessera attaches on 1024 nodes and refuses the rest (docs/scaling-tickets.md)" >&2
  fi
  export BENCH_RWX_SCALES="${BENCH_RWX_SCALES:-50,50,50,$NODES}"
fi
bash bench/attach/build-refdriver.sh
[[ -n "${KUBECONFIG:-}" ]] || bash tests/harness/cluster.sh up
cargo bench --bench rwx
