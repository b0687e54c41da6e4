#!/usr/bin/env bash
# `make dashboard-picture`: docs/figures/dashboard.svg, config/monitoring/
# tessera-dashboard.json over a real run, drawn without Grafana (Grafana is AGPL and
# not used here):
#   1. Prometheus 3.16.0 (cmd/prometheus, no web UI needed, no service discovery:
#      tag remove_all_sd), from the same module as promtool, tests/harness/prometheus/;
#   2. the run, tests/node/dashboard_run.rs (#[ignore]d: a real controller, a real node
#      agent with FUSE mounts and I/O, a takeover; root and /dev/fuse), scraped by it
#      every 2 s into target/dashboard/data; the local control plane is started for it
#      (and stopped) unless KUBECONFIG names a cluster;
#   3. Prometheus again over that data, scraping nothing, and bench/dashboard.py runs
#      every panel's queries through its HTTP API and draws the picture.
# TESSERA_DASHBOARD_SECS: the run's length (default 240); SKIP_RUN=1: draw again from
# the last run's data (target/dashboard/). Not part of `make test`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="$ROOT/target/harness/bin"
OUT="$ROOT/target/dashboard"

if [[ ! -x "$BIN/prometheus" || tests/harness/prometheus/go.sum -nt "$BIN/prometheus" ]]; then
  echo "[dashboard] building prometheus ..." >&2
  (cd tests/harness/prometheus &&
    go build -trimpath -tags remove_all_sd \
      -ldflags "-s -w -X github.com/prometheus/common/version.Version=3.16.0" \
      -o "$BIN/prometheus" github.com/prometheus/prometheus/cmd/prometheus)
fi

if [[ -z "${SKIP_RUN:-}" ]]; then
  started=0
  if [[ -z "${KUBECONFIG:-}" ]]; then
    bash tests/harness/cluster.sh status >/dev/null 2>&1 || started=1
    bash tests/harness/cluster.sh up
  fi
  rc=0
  cargo test --test node -- --ignored --exact dashboard_run::a_run_for_the_dashboard_picture --nocapture || rc=$?
  if [[ $started == 1 ]]; then
    bash tests/harness/cluster.sh down || true
  fi
  [[ $rc == 0 ]] || exit "$rc"
fi

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
printf 'global: {}\n' >"$OUT/query.yml"
"$BIN/prometheus" --config.file="$OUT/query.yml" --storage.tsdb.path="$OUT/data" \
  --web.listen-address="127.0.0.1:$port" >"$OUT/query.log" 2>&1 &
pid=$!
trap 'kill "$pid"; wait "$pid" || true' EXIT
for _ in $(seq 120); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/-/ready', timeout=2)" 2>/dev/null && break
  sleep 0.5
done
python3 bench/dashboard.py --prometheus "http://127.0.0.1:$port" --run "$OUT/run.json" --out docs/figures/dashboard.svg
