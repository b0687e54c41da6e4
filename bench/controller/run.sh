#!/usr/bin/env bash
# 1,000 volumes through `tessera controller` on the local control plane (or KUBECONFIG).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[[ -n "${KUBECONFIG:-}" ]] || bash tests/harness/cluster.sh up
cargo bench --bench controller
