#!/usr/bin/env bash
# Tessera test control plane: etcd + kube-apiserver + kube-controller-manager
# + kube-scheduler on loopback, each a detached process (own session/process
# group), built by tests/harness/build.sh.
#
#   cluster.sh up       start (or reuse) the cluster; safe to call concurrently;
#                       with HARNESS_NODES=N also N real nodes (nodes.sh)
#   cluster.sh down     stop every process started by `up`, nodes included
#   cluster.sh status   print what runs; exit 0 iff the cluster is up and ready
#   cluster.sh restart-apiserver   stop kube-apiserver and start it again with the
#                       same arguments (HARNESS_APISERVER_DOWN_SECONDS: how long it
#                       stays away, default 0); returns once it is ready
#
# Layout (relative to the repository root):
#   target/cluster/kubeconfig       admin kubeconfig (system:masters client cert)
#   target/cluster/cluster.env      KUBECONFIG=, TESSERA_APISERVER_URL=, ports
#   target/cluster/pki/             CA, serving/admin certs, SA keys
#   target/cluster/logs/<c>.log     component logs
#   target/cluster/pids/<c>.pid     component pids (= process group ids)
#   target/cluster.lock             flock(1) lock serializing up/down
#
# HARNESS_CLUSTER_DIR=DIR moves all of target/cluster/ (lock: DIR.lock), so
# independent clusters can run side by side from the same binaries.
#
# Environment:
#   HARNESS_LOCK_TIMEOUT   seconds to wait for the lock (default 3600: a cold
#                          build by another caller may hold it that long)
#   HARNESS_READY_TIMEOUT  seconds to wait for /readyz (default 180)
#   HARNESS_KCM_CONTROLLERS  override kube-controller-manager --controllers
#   HARNESS_KCM_FLAGS      more kube-controller-manager flags, space-separated (for
#                          example a shorter --node-monitor-grace-period; the tests
#                          run with Kubernetes' defaults)
#   HARNESS_NO_SCHEDULER=1 do not start kube-scheduler
#   HARNESS_PROFILING=true serve /debug/pprof on kube-apiserver (admin only)
#   HARNESS_NODES=N        also start (or keep) N nodes tessera-node-a, -b, ... (default
#                          0: control plane only; `make cluster-up` passes NODES=2). A
#                          cluster started with N > 0 serves the API on every address
#                          (its Pods reach it at the host's address); one started with
#                          0 serves on loopback only and cannot take nodes later.
set -euo pipefail

HARNESS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HARNESS_DIR/../.." && pwd)"
BIN="${HARNESS_BIN:-$ROOT/target/harness/bin}"
CL="${HARNESS_CLUSTER_DIR:-$ROOT/target/cluster}"
CL="$(mkdir -p "$CL" && cd "$CL" && pwd)"
PKI="$CL/pki"
LOGS="$CL/logs"
PIDS="$CL/pids"
LOCK="$CL.lock"
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler)

KCM_CONTROLLERS="${HARNESS_KCM_CONTROLLERS:-garbage-collector-controller,persistentvolume-binder-controller,persistentvolume-attach-detach-controller,persistentvolumeclaim-protection-controller,persistentvolume-protection-controller,persistentvolume-expander-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller,root-ca-certificate-publisher-controller,clusterrole-aggregation-controller}"

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

now_ms() { date +%s%3N; }
T0=$(now_ms)
elapsed() { local t=$(( $(now_ms) - T0 )); printf '%d.%03ds' $((t / 1000)) $((t % 1000)); }

take_lock() {
  exec 9>"$LOCK"
  if command -v flock >/dev/null 2>&1; then
    flock -w "${HARNESS_LOCK_TIMEOUT:-3600}" 9 || die "timed out waiting for $LOCK"
  else
    log "warning: flock(1) not found; concurrent calls are not serialized"
  fi
}

# pid of component $1 if it is alive and really is our binary, else nothing.
alive_pid() {
  local f="$PIDS/$1.pid" pid argv0
  [[ -f "$f" ]] || return 1
  pid=$(<"$f")
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  argv0=$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | head -n1) || return 1
  [[ "$argv0" == "$BIN/$1" ]] || return 1
  # zombies do not count
  [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]] || return 1
  echo "$pid"
}

expected_components() {
  local c
  for c in "${COMPONENTS[@]}"; do
    [[ "$c" == kube-scheduler && -n "${HARNESS_NO_SCHEDULER:-}" ]] && continue
    echo "$c"
  done
}

all_alive() {
  local c
  [[ -f "$CL/kubeconfig" ]] || return 1
  for c in $(cat "$CL/components" 2>/dev/null || expected_components); do
    alive_pid "$c" >/dev/null || return 1
  done
}

# pids of processes of *this* cluster, found without pid files (orphans whose
# pid file was lost): argv0 is exactly one of our component paths under $BIN
# and an argument points into $CL (data dir, cert dir or kubeconfig).
our_processes() {
  local p args argv0 c
  for p in /proc/[0-9]*; do
    args=$(tr '\0' '\n' 2>/dev/null <"$p/cmdline") || continue
    argv0=${args%%$'\n'*}
    for c in "${COMPONENTS[@]}"; do
      if [[ "$argv0" == "$BIN/$c" && "$args" == *"$CL/"* ]]; then echo "${p#/proc/}"; fi
    done
  done
  return 0
}

stop_pid() { # stop_pid NAME PID: TERM the process group, then KILL after 15s
  local name=$1 pid=$2 pgid i t=$(now_ms)
  pgid=$(awk '{print $5}' "/proc/$pid/stat" 2>/dev/null) || true
  if [[ -n "$pgid" && "$pgid" == "$pid" ]]; then
    kill -TERM -- "-$pgid" 2>/dev/null || true
  else
    kill -TERM "$pid" 2>/dev/null || true
  fi
  for i in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || { log "stopped $name (pid $pid) in $(( $(now_ms) - t ))ms"; return 0; }
    sleep 0.1
  done
  log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
  if [[ -n "$pgid" && "$pgid" == "$pid" ]]; then
    kill -KILL -- "-$pgid" 2>/dev/null || true
  else
    kill -KILL "$pid" 2>/dev/null || true
  fi
  for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  log "warning: $name (pid $pid) still present"
}

stop_all() {
  local c pid wave jobs
  # waves: scheduler and KCM together, then the apiserver, then etcd.
  # Wait only for the stoppers (a bare `wait` would also wait for daemons this
  # shell started in the same `up`).
  for wave in "kube-scheduler kube-controller-manager" kube-apiserver etcd; do
    jobs=()
    for c in $wave; do
      if pid=$(alive_pid "$c"); then stop_pid "$c" "$pid" & jobs+=($!); fi
    done
    [[ ${#jobs[@]} -eq 0 ]] || wait "${jobs[@]}"
    for c in $wave; do rm -f "$PIDS/$c.pid"; done
  done
  for pid in $(our_processes); do
    log "stopping orphan pid $pid ($(tr '\0' ' ' 2>/dev/null </proc/$pid/cmdline | cut -c1-80))"
    stop_pid orphan "$pid"
  done
}

start_component() { # start_component NAME ARGS... -> pid file; detached (setsid)
  local name=$1; shift
  # setsid: own session and process group (pid == pgid), immune to the
  # caller's terminal signals; fd 9 (the lock) must not leak into daemons.
  setsid "$BIN/$name" "$@" </dev/null >"$LOGS/$name.log" 2>&1 9>&- &
  local pid=$!
  echo "$pid" >"$PIDS/$name.pid"
  log "started $name (pid $pid, log $LOGS/$name.log)"
}

wait_tcp() { # wait_tcp PORT SECONDS PID
  local port=$1 secs=$2 pid=$3 i
  for (( i=0; i<secs*10; i++ )); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

fail_start() {
  local c
  log "error: $*"
  for c in "${COMPONENTS[@]}"; do
    if [[ -s "$LOGS/$c.log" ]]; then
      log "---- last lines of $LOGS/$c.log ----"
      tail -n 25 "$LOGS/$c.log" >&2
    fi
  done
  [[ ! -d "$CL/nodes" && ! -d "$CL/gluster" ]] || bash "$HARNESS_DIR/nodes.sh" down 9>&- || true
  stop_all
  exit 1
}

cmd_up() {
  take_lock

  local nodes=${HARNESS_NODES:-0}
  [[ "$nodes" =~ ^[0-9]+$ ]] || die "HARNESS_NODES=$nodes: want a number"
  if all_alive; then
    if "$BIN/k8s-harness" wait-ready --kubeconfig "$CL/kubeconfig" --timeout 30s; then
      if ((nodes > 0)); then
        grep -q '^TESSERA_APISERVER_BIND=0.0.0.0$' "$CL/cluster.env" ||
          die "this control plane serves on loopback only (started without nodes): run cluster.sh down first"
        bash "$HARNESS_DIR/build.sh" 9>&-
        bash "$HARNESS_DIR/nodes.sh" up "$nodes" 9>&-
      fi
      log "reusing running cluster ($(elapsed)); KUBECONFIG=$CL/kubeconfig"
      echo "$CL/kubeconfig"
      return 0
    fi
    log "cluster processes alive but /readyz failing for 30s; restarting"
  fi

  # Stale or partial cluster: clean up before starting fresh.
  [[ ! -d "$CL/nodes" && ! -d "$CL/gluster" ]] || bash "$HARNESS_DIR/nodes.sh" down 9>&-
  stop_all
  bash "$HARNESS_DIR/build.sh" 9>&-
  local tb=$(now_ms)

  # Never wipe through a mount (a node's FUSE mount reaches backend data).
  if grep -qF " $CL/" /proc/self/mountinfo; then die "mounts left under $CL; run cluster.sh down"; fi
  rm -rf "${CL:?}"/*
  mkdir -p "$PKI" "$LOGS" "$PIDS" "$CL/etcd"
  local ports API EC EP
  ports=$("$BIN/k8s-harness" freeports 3)
  API=$(sed -n 1p <<<"$ports"); EC=$(sed -n 2p <<<"$ports"); EP=$(sed -n 3p <<<"$ports")

  # With nodes, their Pods reach the apiserver at the host's address (no kube-proxy).
  local bind=127.0.0.1 host_ip
  host_ip=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -n1)
  # With nodes, every controller a default cluster runs (`*`: Deployments, DaemonSets,
  # StatefulSets, Jobs, the ephemeral-volume controller that makes a generic ephemeral
  # volume's claim, the VolumeAttributesClass protection, Pods of deleted Nodes, the
  # not-ready taint lifted once a Node is Ready ...; those needing a cloud or
  # --allocate-node-cidrs stay off, as they do on a cluster without them).
  # ServiceAccount admission mounts the token real Pods need; without nodes it stays
  # off (a Pod created right after its namespace would race the serviceaccount controller).
  local NODE_CONTROLLERS="" disable_admission=ServiceAccount
  if ((nodes > 0)); then
    disable_admission=
    [[ -n "$host_ip" ]] || die "nodes need a non-loopback address (no default route)"
    bind=0.0.0.0
    NODE_CONTROLLERS='*'
  fi
  "$BIN/k8s-harness" pki --port "$API" ${host_ip:+--ip "$host_ip"} "$PKI"
  expected_components >"$CL/components"

  start_component etcd --data-dir "$CL/etcd" --client-port "$EC" --peer-port "$EP" --log-level=error
  wait_tcp "$EC" 60 "$(<"$PIDS/etcd.pid")" || fail_start "etcd did not listen on 127.0.0.1:$EC"

  start_component kube-apiserver \
    --etcd-servers="http://127.0.0.1:$EC" \
    --bind-address="$bind" \
    --advertise-address=127.0.0.1 \
    --secure-port="$API" \
    --cert-dir="$PKI" \
    --tls-cert-file="$PKI/serving.crt" \
    --tls-private-key-file="$PKI/serving.key" \
    --client-ca-file="$PKI/ca.crt" \
    --kubelet-client-certificate="$PKI/admin.crt" \
    --kubelet-client-key="$PKI/admin.key" \
    --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --authorization-mode=RBAC \
    --allow-privileged=true \
    ${disable_admission:+--disable-admission-plugins=$disable_admission} \
    --enable-priority-and-fairness=false \
    --endpoint-reconciler-type=none \
    --profiling="${HARNESS_PROFILING:-false}" \
    --event-ttl=30m

  "$BIN/k8s-harness" wait-ready --kubeconfig "$PKI/admin.kubeconfig" \
      --timeout "${HARNESS_READY_TIMEOUT:-180}s" \
      --pids "$(<"$PIDS/etcd.pid"),$(<"$PIDS/kube-apiserver.pid")" \
    || fail_start "kube-apiserver did not become ready"
  log "kube-apiserver ready on https://127.0.0.1:$API after $(elapsed)"

  start_component kube-controller-manager \
    --kubeconfig="$PKI/admin.kubeconfig" \
    --leader-elect=false \
    --secure-port=0 \
    --controllers="$KCM_CONTROLLERS${NODE_CONTROLLERS:+,$NODE_CONTROLLERS}" \
    --service-account-private-key-file="$PKI/sa.key" \
    --root-ca-file="$PKI/ca.crt" \
    --cluster-name=tessera \
    --profiling=false \
    ${HARNESS_KCM_FLAGS:-}

  if [[ -z "${HARNESS_NO_SCHEDULER:-}" ]]; then
    start_component kube-scheduler \
      --kubeconfig="$PKI/admin.kubeconfig" \
      --leader-elect=false \
      --secure-port=0 \
      --profiling=false
  fi

  # Flag errors make KCM/scheduler exit within a second; catch that here.
  sleep 1
  local c
  for c in $(<"$CL/components"); do
    alive_pid "$c" >/dev/null || fail_start "$c exited during start-up"
  done

  cp "$PKI/admin.kubeconfig" "$CL/kubeconfig.tmp"
  mv -f "$CL/kubeconfig.tmp" "$CL/kubeconfig"
  cat >"$CL/cluster.env" <<EOF
KUBECONFIG=$CL/kubeconfig
TESSERA_APISERVER_URL=https://127.0.0.1:$API
TESSERA_APISERVER_PORT=$API
TESSERA_ETCD_CLIENT_PORT=$EC
TESSERA_ETCD_PEER_PORT=$EP
TESSERA_HARNESS_BIN=$BIN
TESSERA_APISERVER_BIND=$bind
TESSERA_HOST_IP=$host_ip
EOF
  local ts=$(( $(now_ms) - tb ))
  log "cluster up in $(elapsed) (control plane start $((ts / 1000)).$(printf '%03d' $((ts % 1000)))s, rest was build/lock); KUBECONFIG=$CL/kubeconfig"
  if ((nodes > 0)); then
    bash "$HARNESS_DIR/nodes.sh" up "$nodes" 9>&- || fail_start "nodes did not start"
  fi
  echo "$CL/kubeconfig"
}

cmd_down() {
  take_lock
  [[ ! -d "$CL/nodes" && ! -d "$CL/gluster" ]] || bash "$HARNESS_DIR/nodes.sh" down 9>&-
  stop_all
  rm -rf "$CL/etcd" "$CL/kubeconfig" "$CL/cluster.env" "$CL/components"
  local left
  left=$(our_processes)
  [[ -z "$left" ]] || die "processes still running: $left"
  log "cluster down ($(elapsed)); logs kept in $LOGS"
}

cmd_restart_apiserver() { # stop kube-apiserver, start it again with the same arguments
  take_lock
  local pid args=()
  pid=$(alive_pid kube-apiserver) || die "kube-apiserver is not running (cluster.sh up first)"
  mapfile -d '' -t args <"/proc/$pid/cmdline"
  stop_pid kube-apiserver "$pid"
  sleep "${HARNESS_APISERVER_DOWN_SECONDS:-0}"
  start_component kube-apiserver "${args[@]:1}"
  "$BIN/k8s-harness" wait-ready --kubeconfig "$PKI/admin.kubeconfig" \
      --timeout "${HARNESS_READY_TIMEOUT:-180}s" \
      --pids "$(<"$PIDS/etcd.pid"),$(<"$PIDS/kube-apiserver.pid")" \
    || die "kube-apiserver did not become ready again"
  log "kube-apiserver ready again after $(elapsed)"
}

cmd_status() {
  local c pid rc=0
  for c in "${COMPONENTS[@]}"; do
    if pid=$(alive_pid "$c"); then
      printf '%-24s running  pid %s\n' "$c" "$pid"
    elif grep -qx "$c" "$CL/components" 2>/dev/null; then
      printf '%-24s STOPPED\n' "$c"; rc=1
    else
      printf '%-24s not started\n' "$c"
    fi
  done
  if [[ -f "$CL/cluster.env" ]]; then sed 's/^/  /' "$CL/cluster.env"; fi
  if [[ -f "$CL/kubeconfig" && -x "$BIN/k8s-harness" ]] && "$BIN/k8s-harness" readyz -q --kubeconfig "$CL/kubeconfig"; then
    echo "readyz: ok"
  else
    echo "readyz: not ready"; rc=1
  fi
  if [[ -d "$CL/nodes" ]]; then bash "$HARNESS_DIR/nodes.sh" status || rc=1; fi
  local orphans
  orphans=$(our_processes | tr '\n' ' ')
  echo "processes running from $BIN: ${orphans:-none}"
  return $rc
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  restart-apiserver) cmd_restart_apiserver ;;
  *) echo "usage: $0 up|down|status|restart-apiserver" >&2; exit 2 ;;
esac
