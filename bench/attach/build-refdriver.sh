#!/usr/bin/env bash
# Builds the baseline driver of `make bench-attach` (bench/attach/refdriver, its own Go
# module, so tests/harness/go.mod and the harness build stay untouched) into
# target/harness/bin/csi-noop-driver. A no-op when the binary is newer than every file of
# the module. Only the benchmark calls this; `make test` never does.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SRC="$ROOT/bench/attach/refdriver"
BIN="${HARNESS_BIN:-$ROOT/target/harness/bin}"
OUT="$BIN/csi-noop-driver"
if [[ -x "$OUT" && -z "$(find "$SRC" -newer "$OUT" -type f -print -quit)" ]]; then
  exit 0
fi
mkdir -p "$BIN"
start=$(date +%s)
cd "$SRC"
GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false -mod=readonly" CGO_ENABLED=0 \
  go build -p "${HARNESS_GO_P:-2}" -trimpath -ldflags "-s -w" -o "$OUT.new" .
mv -f "$OUT.new" "$OUT"
echo "[bench-attach] built $OUT in $(( $(date +%s) - start ))s" >&2
