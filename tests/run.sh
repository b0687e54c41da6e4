#!/usr/bin/env bash
# Runs every test. Without KUBECONFIG the local control plane from tests/harness is
# started first and stopped at the end, and the end-to-end demo (`make demo ONCE=1`:
# real external-provisioner and external-attacher, two node agents, FUSE mounts) runs
# on a control plane of its own; with KUBECONFIG the cargo tests run against that
# cluster and nothing is started or stopped.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

started=0
if [[ -z "${KUBECONFIG:-}" ]]; then
  ONCE=1 bash tests/demo.sh
  if ! bash tests/harness/cluster.sh status >/dev/null 2>&1; then
    started=1
  fi
  bash tests/harness/cluster.sh up
fi

log="$(mktemp)"
set +e
cargo test --lib --bins --tests -- --test-threads="${TEST_THREADS:-4}" 2>&1 | tee "$log"
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
set -e
if [[ $started == 1 ]]; then
  bash tests/harness/cluster.sh down || true
fi
# One closing line for the whole run.
awk -v where="$where" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tessera: %d passed, %d failed%s\n", p, f, where }' "$log"
rm -f "$log"
exit "$rc"
