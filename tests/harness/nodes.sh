#!/usr/bin/env bash
# Real nodes for the harness control plane: per node one kubelet and one containerd
# (with runc and the ptp/host-local CNI plugins), all built by build.sh, sharing a
# private mount namespace in which the node's directories under target/ stand at the
# standard paths (/var/lib/kubelet, /var/lib/tessera, /run, /var/log, /mnt/shared), so
# config/ runs unchanged. Called by cluster.sh under its lock:
#
#   nodes.sh up N     start nodes tessera-node-a, -b, ... until N run (0: nothing),
#                     after the harness registry (registry.sh) they may pull from
#   nodes.sh down     stop every node, unmount, remove its cgroups; stop the registry
#   nodes.sh status   one line per node; exit 0 iff every started node is Ready
#   nodes.sh enter NODE CMD...   run CMD in NODE's mount namespace
#   nodes.sh restart-kubelet NODE   stop NODE's kubelet and start it again (its Pods,
#                    mounts and containerd untouched), wait until the Node is Ready
#   nodes.sh power-off NODE   every process of NODE killed at once (SIGKILL, no TERM:
#                    kubelet, containerd, shims, containers, FUSE daemons, its GlusterFS
#                    client), as a power loss ends them; its files stay until `down`
#   nodes.sh partition NODE / heal NODE   cut NODE off the API server / reconnect it:
#                    its processes keep running, its connections stay open but carry
#                    nothing meanwhile (cmd/api-gate)
#
# The API server through a relay: every node's kubelet and every Pod reach it through
# api-gate ($CL/gate.env: a port per node's kubelet on loopback, one for the Pods on
# the host address, told apart by their node's Pod CIDR), so that `partition` can cut
# one node off without touching the host's network.
#
# Layout: $CL/nodes/<node>/{kubelet,tessera,containerd,run,log,cni,sysctl}/, config
# files, logs/ and pids; $CL/nodes.env lists the nodes.
#
# /mnt/shared on every node (the backend root of config/storageclass/storageclass.yaml
# is /mnt/shared/tessera) is a GlusterFS volume (gluster.sh): each node mounts it with
# a FUSE client of its own, the host with a third at $CL/shared. HARNESS_SHARED=dir
# instead binds the host directory $CL/shared into every node (one kernel's page cache
# and lock table: cross-node tests then prove nothing about a real backend).
set -euo pipefail

HARNESS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HARNESS_DIR/../.." && pwd)"
BIN="${HARNESS_BIN:-$ROOT/target/harness/bin}"
CL="${HARNESS_CLUSTER_DIR:-$ROOT/target/cluster}"
CL="$(mkdir -p "$CL" && cd "$CL" && pwd)"
NODES_DIR="$CL/nodes"
SHARED="$CL/shared"
# cgroup of every node process, below the root of each cgroup-v1 hierarchy; it is also
# the kubelet's cgroupRoot, so every Pod's cgroup (kubepods/<qos>/pod<uid>/<id>) is
# below it too (with cgroupsPerQOS=false the kubelet names no cgroup parent and
# containerd puts every container at /k8s.io/<id>, shared by all nodes).
CG_BASE="tessera-harness/$(printf '%s' "$CL" | sha256sum | cut -c1-8)"
CG_ROOT=/sys/fs/cgroup
SANDBOX_IMAGE=harness.tessera.io/pause:3.10
IMAGES="$ROOT/target/images"

log() { printf '[nodes] %s\n' "$*" >&2; }
# (--cache-dir: kubectl would write its discovery cache to ~/.kube/cache)
kc() { "$BIN/kubectl" --kubeconfig "$CL/kubeconfig" --cache-dir "$CL/kubectl-cache" "$@"; }
die() { log "error: $*"; exit 1; }
now_ms() { date +%s%3N; }
SHARED_FS=${HARNESS_SHARED:-gluster}
[[ $SHARED_FS == gluster || $SHARED_FS == dir ]] || die "HARNESS_SHARED=$SHARED_FS: want gluster or dir"

node_name() { printf 'tessera-node-%s' "$(printf "\\x$(printf %x $((97 + $1)))")"; }

# The address the kubelets register (it refuses loopback): the default route's source.
host_ip() { ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -n1; }

cg_controllers() { # every mounted cgroup-v1 hierarchy
  local d
  for d in "$CG_ROOT"/*/; do
    d=${d%/}
    [[ -f "$d/cgroup.procs" && "$(stat -f -c %T "$d")" == cgroupfs && ! -f "$d/cgroup.controllers" ]] && echo "${d##*/}"
  done
  return 0
}

# Creates the node's cgroup in every hierarchy (cpuset needs cpus/mems copied down).
cg_create() { # cg_create NODE
  local c dir p
  for c in $(cg_controllers); do
    p="$CG_ROOT/$c"
    for dir in ${CG_BASE//\// } "$1"; do
      p="$p/$dir"
      mkdir -p "$p"
      if [[ $c == cpuset ]]; then
        [[ -s "$p/cpuset.cpus" ]] || cat "$(dirname "$p")/cpuset.cpus" >"$p/cpuset.cpus"
        [[ -s "$p/cpuset.mems" ]] || cat "$(dirname "$p")/cpuset.mems" >"$p/cpuset.mems"
      fi
    done
  done
}

cg_pids() { # every pid in NODE's cgroup tree (pids hierarchy, else the first one)
  local c=pids
  [[ -d "$CG_ROOT/pids" ]] || c=$(cg_controllers | head -n1)
  [[ -d "$CG_ROOT/$c/$CG_BASE/$1" ]] || return 0
  find "$CG_ROOT/$c/$CG_BASE/$1" -name cgroup.procs -exec cat {} + 2>/dev/null || true
}

cg_hierarchies() { # every mounted hierarchy, v1 and v2 (the kubelet also writes the
  local d          # hybrid host's unified one)
  for d in "$CG_ROOT"/*/; do
    d=${d%/}
    [[ -f "$d/cgroup.procs" ]] && echo "${d##*/}"
  done
  return 0
}

cg_remove() { # cg_remove NODE: rmdir the tree, deepest first, in every hierarchy
  local c d
  for c in $(cg_hierarchies); do
    [[ -d "$CG_ROOT/$c/$CG_BASE/$1" ]] || continue
    find "$CG_ROOT/$c/$CG_BASE/$1" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    for d in "$CG_ROOT/$c/$CG_BASE" "$CG_ROOT/$c/${CG_BASE%%/*}"; do rmdir "$d" 2>/dev/null || true; done
  done
}

# Mount points at or below DIR in this (the host's) namespace, deepest first.
mounts_under() {
  awk -v d="$1" '{ p = $5; gsub(/\\040/, " ", p); if (p == d || index(p, d "/") == 1) print p }' /proc/self/mountinfo |
    awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2-
}

unmount_under() { # lazy: a dead FUSE daemon's mount answers nothing else
  local m n=0
  while IFS= read -r m; do
    [[ -n "$m" ]] || continue
    umount -l "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "warning: cannot unmount $m"
    n=$((n + 1))
  done < <(mounts_under "$1")
  ((n == 0)) || log "unmounted $n mount(s) under $1"
}

shared_bind() { # DIR becomes a mount point of its own, shared (peers with the node's view)
  mkdir -p "$1"
  if ! mountpoint -q "$1"; then mount --bind "$1" "$1"; fi
  mount --make-rshared "$1"
}

kubelet_pid() { # pid of NODE's kubelet if alive
  local f="$NODES_DIR/$1/pids/kubelet.pid" pid
  [[ -f "$f" ]] || return 1
  pid=$(<"$f")
  [[ -r /proc/$pid/cmdline ]] || return 1
  [[ "$(tr '\0' '\n' </proc/$pid/cmdline | head -n1)" == "$BIN/kubelet" ]] || return 1
  echo "$pid"
}

node_alive() { # kubelet and containerd both alive
  local n=$1 pid
  kubelet_pid "$n" >/dev/null || return 1
  pid=$(cat "$NODES_DIR/$n/pids/containerd.pid" 2>/dev/null) || return 1
  [[ -r /proc/$pid/cmdline && "$(tr '\0' '\n' </proc/$pid/cmdline | head -n1)" == "$BIN/containerd" ]]
}

write_configs() { # write_configs NODE INDEX PORT IP
  local n=$1 i=$2 port=$3 ip=$4 d="$NODES_DIR/$1"
  cat >"$d/containerd.toml" <<EOF
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins.'io.containerd.internal.v1.opt']
  path = "/var/lib/containerd/opt"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$SANDBOX_IMAGE"
  # The harness registry (registry.sh): its host directory names its CA; the
  # credentials come with each pull, from the Pod's imagePullSecrets.
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$d/certs.d"

[plugins.'io.containerd.cri.v1.runtime']
  # this VM lacks CAP_SYS_RESOURCE: the sandbox's oom_score_adj write fails otherwise
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = []
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$BIN/runc"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$BIN/cni"]
    conf_dir = "$d/cni/net.d"
EOF
  mkdir -p "$d/certs.d"
  if [[ -f "$CL/registry.env" ]]; then
    local reg ca
    reg=$(sed -n 's/^TESSERA_REGISTRY=//p' "$CL/registry.env")
    ca=$(sed -n 's/^TESSERA_REGISTRY_CA=//p' "$CL/registry.env")
    mkdir -p "$d/certs.d/$reg"
    cat >"$d/certs.d/$reg/hosts.toml" <<EOF
server = "https://$reg"
[host."https://$reg"]
  capabilities = ["pull", "resolve"]
  ca = "$ca"
EOF
    # The registry is also the node's docker.io and registry.k8s.io mirror (as behind
    # an air gap): an image named without a registry (busybox:1.36) or a CSI sidecar
    # as the chart names it is pulled from it, with the node's own credentials (a
    # header: no Pod carries a pull Secret for those); it serves only what
    # registry.sh push put there (library/busybox, sig-storage/csi-*).
    local user pass upstream server
    user=$(sed -n 's/^TESSERA_REGISTRY_USER=//p' "$CL/registry.env")
    pass=$(cat "$(sed -n 's/^TESSERA_REGISTRY_PASSWORD_FILE=//p' "$CL/registry.env")")
    for upstream in docker.io registry.k8s.io; do
      server=https://$upstream
      [[ $upstream != docker.io ]] || server=https://registry-1.docker.io
      mkdir -p "$d/certs.d/$upstream"
      (umask 077 && cat >"$d/certs.d/$upstream/hosts.toml" <<EOF
server = "$server"
[host."https://$reg"]
  capabilities = ["pull", "resolve"]
  ca = "$ca"
  [host."https://$reg".header]
    Authorization = "Basic $(printf '%s:%s' "$user" "$pass" | base64 -w0)"
EOF
      )
    done
  fi
  # ptp: one veth pair per Pod, the Pod's address routed on the host side; the node's
  # Pods reach the host's addresses (the API server) and the host reaches them (probes).
  mkdir -p "$d/cni/net.d"
  cat >"$d/cni/net.d/10-tessera.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "tessera-$n", "plugins": [{"type": "ptp", "ipMasq": false,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.$((i + 1)).0/24"}]],
           "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "/var/lib/cni/networks"}}]}
EOF
  cat >"$d/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
port: $port
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $CL/pki/ca.crt}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupsPerQOS: true
cgroupRoot: /$CG_BASE/$n
enforceNodeAllocatable: []
failSwapOn: false
protectKernelDefaults: true
makeIPTablesUtilChains: false
resolvConf: ""
hairpinMode: none
podLogsDir: /var/log/pods
volumePluginDir: /var/lib/kubelet/volumeplugins
rotateCertificates: false
serverTLSBootstrap: false
registerNode: true
nodeStatusUpdateFrequency: 1s
maxPods: 250
nodeStatusReportFrequency: 10s
evictionHard: {memory.available: 1Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%, imagefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# The side-loaded images (images.sh) need no pull credentials, even once the same image
# (same config digest: the sidecars pushed to the harness registry) was pulled from the
# registry with a Secret, which makes the kubelet verify credentials for that image ID
# (KubeletEnsureSecretPulledImages); every other image is verified.
imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages
preloadedImagesVerificationAllowlist: ["harness.tessera.io/*"]
shutdownGracePeriod: 0s
EOF
}

# Runs inside the node's fresh mount namespace (unshare -m): put the standard paths
# in place, bind files with the values the kubelet demands over the kernel tunables
# it would otherwise write (protectKernelDefaults), then start containerd and the
# kubelet detached; the namespace lives as long as they do.
node_init() { # node_init NODE IP (as `nodes.sh _init`)
  local n=$1 ip=$2 d="$NODES_DIR/$1" f
  # Nothing done here may reach the host: only the node's shared dirs propagate.
  [[ "$(findmnt -no PROPAGATION /)" == private ]] || die "/ is not a private mount in the node namespace"
  mount -t tmpfs -o mode=755 tessera-node /var/lib
  mkdir -p /var/lib/kubelet /var/lib/tessera /var/lib/containerd /var/lib/cni
  mount --bind "$d/kubelet" /var/lib/kubelet       # shared with $d/kubelet on the host
  mount --bind "$d/tessera" /var/lib/tessera       # shared
  mount --bind "$d/containerd" /var/lib/containerd
  mount --bind "$d/cni/state" /var/lib/cni
  mount --bind "$d/run" /run
  mount --bind "$d/log" /var/log
  mount -t tmpfs -o mode=755 tessera-node /mnt
  mkdir -p /mnt/shared
  if [[ $SHARED_FS == gluster ]]; then
    # The node's own client; shared, so that Pods' Bidirectional/HostToContainer
    # hostPath mounts of /mnt/shared (and what is mounted below it) see it.
    gluster_mount /mnt/shared "$d/logs/glusterfs.log"
    mount --make-rshared /mnt/shared
  else
    mount --bind "$SHARED" /mnt/shared             # shared with the host's $SHARED
  fi
  for f in vm/overcommit_memory:1 vm/panic_on_oom:0 kernel/panic:10 kernel/panic_on_oops:1 net/ipv4/ip_forward:1; do
    echo "${f#*:}" >"$d/sysctl/${f%%:*}"
    mount --bind "$d/sysctl/${f%%:*}" "/proc/sys/${f%%:*}"
  done
  mkdir -p /run/containerd /var/log/pods /var/log/containers /var/lib/kubelet/device-plugins
  export PATH="$BIN:$PATH"
  setsid "$BIN/containerd" --config "$d/containerd.toml" </dev/null >"$d/logs/containerd.log" 2>&1 &
  echo $! >"$d/pids/containerd.pid"
  local i
  for ((i = 0; i < 300; i++)); do
    [[ -S /run/containerd/containerd.sock ]] && break
    kill -0 "$(<"$d/pids/containerd.pid")" 2>/dev/null || die "containerd exited: $(tail -n 5 "$d/logs/containerd.log")"
    sleep 0.1
  done
  [[ -S /run/containerd/containerd.sock ]] || die "containerd socket did not appear"
  # The pinned sandbox image and the test image, before the kubelet takes Pods.
  for f in "$IMAGES"/pause.tar "$IMAGES"/busybox.tar; do
    "$BIN/ctr" --address /run/containerd/containerd.sock -n k8s.io images import "$f" >/dev/null 2>"$d/logs/ctr.err" ||
      { cat "$d/logs/ctr.err" >&2; die "cannot import $f"; }
  done
  start_kubelet "$n" "$ip"
}

start_kubelet() { # start_kubelet NODE IP, in the node's mount namespace and cgroup
  local n=$1 ip=$2 d="$NODES_DIR/$1"
  export PATH="$BIN:$PATH"
  # Through api-gate's listener for this node, when it has one.
  local kubeconfig="$CL/pki/admin.kubeconfig" gate
  gate=$(sed -n "s/^TESSERA_GATE_PORT_${n//-/_}=//p" "$CL/gate.env" 2>/dev/null || true)
  if [[ -n "$gate" ]]; then
    kubeconfig="$d/kubelet.kubeconfig"
    sed -E "s#(server: https://127\.0\.0\.1:)[0-9]+#\1$gate#" "$CL/pki/admin.kubeconfig" >"$kubeconfig"
  fi
  setsid "$BIN/kubelet" --config="$d/kubelet.yaml" --kubeconfig="$kubeconfig" \
    --hostname-override="$n" --node-ip="$ip" --root-dir=/var/lib/kubelet \
    --cert-dir=/var/lib/kubelet/pki --v="${HARNESS_KUBELET_V:-1}" \
    </dev/null >>"$d/logs/kubelet.log" 2>&1 &
  echo $! >"$d/pids/kubelet.pid"
}

restart_kubelet() { # restart_kubelet NODE: stop the kubelet (TERM), start it again with
  # its node's containers, mounts and state untouched (what an upgrade or a crash of
  # the kubelet alone does); waits until the Node is Ready again
  local n=$1 d="$NODES_DIR/$1" pid i cpid t=$(now_ms)
  pid=$(kubelet_pid "$n") || die "$n: no kubelet runs"
  kill -TERM "$pid"
  for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && die "$n: the kubelet did not stop"
  cpid=$(<"$d/pids/containerd.pid")
  nsenter -m -t "$cpid" -- bash -c '
    for c in "${@:3}"; do echo $$ >"'"$CG_ROOT"'/$c/'"$CG_BASE"'/$1/cgroup.procs"; done
    exec bash "'"$HARNESS_DIR/nodes.sh"'" _kubelet "$1" "$2"' _ "$n" "$(host_ip)" $(cg_controllers) 9>&-
  wait_ready "$n"
  log "restarted the kubelet of $n in $(( $(now_ms) - t ))ms"
}

start_node() { # start_node INDEX
  local i=$1 n d port ip t=$(now_ms)
  n=$(node_name "$i"); d="$NODES_DIR/$n"
  ip=$(host_ip); [[ -n "$ip" ]] || die "no default route: the kubelet needs a non-loopback node IP"
  stop_node "$n"
  [[ -z "$(mounts_under "$d")" ]] || die "$d still has mounts"
  rm -rf "$d"
  mkdir -p "$d"/{kubelet,tessera,containerd,run,log,cni/state,sysctl/vm,sysctl/kernel,sysctl/net/ipv4,logs,pids}
  mkdir -p "$SHARED/tessera"   # (with gluster: through the host's client)
  # A Shared backend root only the first node has (deploy.sh declares it; see there).
  if [[ $i == 0 ]]; then mkdir -p "$d/tessera/first-node-only"; fi
  shared_bind "$d/kubelet"; shared_bind "$d/tessera"
  if [[ $SHARED_FS == dir ]]; then shared_bind "$SHARED"; fi
  bash "$HARNESS_DIR/images.sh" build-base
  port=$("$BIN/k8s-harness" freeports 1)
  write_configs "$n" "$i" "$port" "$ip"
  cg_create "$n"
  # The namespace's first process joins the node's cgroups; everything it starts
  # (containerd, shims, runc, containers, the kubelet) stays below them.
  unshare -m --propagation unchanged -- bash -c '
    for c in "${@:3}"; do echo $$ >"'"$CG_ROOT"'/$c/'"$CG_BASE"'/$1/cgroup.procs"; done
    exec bash "'"$HARNESS_DIR/nodes.sh"'" _init "$1" "$2"' _ "$n" "$ip" $(cg_controllers) 9>&-
  log "started $n in $(( $(now_ms) - t ))ms (kubelet port $port, node IP $ip, pod CIDR 10.244.$((i + 1)).0/24)"
}

stop_node() { # stop_node NODE: kubelet first (TERM), then every process of the node
  local n=$1 d="$NODES_DIR/$1" pid i pids
  if pid=$(kubelet_pid "$n"); then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  # containerd, shims, containers, FUSE daemons: all below the node's cgroup. Freeze
  # first so that nothing forks while we kill.
  for ((i = 0; i < 50; i++)); do
    pids=$(cg_pids "$n")
    [[ -n "$pids" ]] || break
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.1
  done
  [[ -z "$(cg_pids "$n")" ]] || log "warning: processes left in cgroup $CG_BASE/$n: $(cg_pids "$n" | tr '\n' ' ')"
  if [[ -d "$d" ]]; then unmount_under "$d"; fi
  cg_remove "$n"
  rm -f "$d/pids/"*.pid 2>/dev/null || true
}

gate_up() { # gate_up N: the API relay with a listener per node, unless one runs
  local want=$1 ports i n args=() api
  if [[ -f "$CL/pids/api-gate.pid" ]] && kill -0 "$(<"$CL/pids/api-gate.pid")" 2>/dev/null; then return 0; fi
  api=$(sed -n 's/^TESSERA_APISERVER_PORT=//p' "$CL/cluster.env")
  [[ -n "$api" ]] || die "no TESSERA_APISERVER_PORT in $CL/cluster.env"
  ports=$("$BIN/k8s-harness" freeports $((want + 1)))
  mkdir -p "$CL/pids"
  : >"$CL/gate.cut"
  {
    echo "TESSERA_GATE_PODS_PORT=$(sed -n 1p <<<"$ports")"
    args+=(-listen "pods=$(host_ip):$(sed -n 1p <<<"$ports")")
    for ((i = 0; i < want; i++)); do
      n=$(node_name "$i")
      echo "TESSERA_GATE_PORT_${n//-/_}=$(sed -n "$((i + 2))p" <<<"$ports")"
      args+=(-listen "$n=127.0.0.1:$(sed -n "$((i + 2))p" <<<"$ports")" -cidr "$n=10.244.$((i + 1)).0/24")
    done
  } >"$CL/gate.env"
  setsid "$BIN/api-gate" -to "127.0.0.1:$api" -control "$CL/gate.cut" "${args[@]}" \
    </dev/null >"$CL/logs/api-gate.log" 2>&1 &
  echo $! >"$CL/pids/api-gate.pid"
  log "api-gate: the nodes reach the API server through it ($CL/gate.env)"
}

gate_down() {
  local pid
  if [[ -f "$CL/pids/api-gate.pid" ]]; then
    pid=$(<"$CL/pids/api-gate.pid")
    kill "$pid" 2>/dev/null || true
    rm -f "$CL/pids/api-gate.pid"
  fi
  rm -f "$CL/gate.env" "$CL/gate.cut"
}

partition() { # partition NODE cut|heal
  local n=$1 f="$CL/gate.cut"
  [[ -f "$f" ]] || die "no api-gate runs"
  if [[ $2 == cut ]]; then
    grep -qx "$n" "$f" || echo "$n" >>"$f"
    log "$n cut off the API server (its connections hold their bytes)"
  else
    { grep -vx "$n" "$f" || true; } >"$f.new"; mv "$f.new" "$f"
    log "$n reconnected to the API server"
  fi
  sleep 0.3   # api-gate reads the file every 100 ms
}

power_off() { # power_off NODE: what a power loss does to the node's processes
  local n=$1 pids i t=$(now_ms)
  [[ -n "$(cg_pids "$n")" ]] || die "$n: no process runs"
  # Repeated until the cgroup is empty: a process may fork between the read and the kill.
  for ((i = 0; i < 100; i++)); do
    pids=$(cg_pids "$n")
    [[ -n "$pids" ]] || break
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.02
  done
  [[ -z "$(cg_pids "$n")" ]] || die "$n: processes left: $(cg_pids "$n" | tr '\n' ' ')"
  log "powered off $n in $(( $(now_ms) - t ))ms: every process of its cgroup killed"
}

wait_ready() { # wait_ready NODE... : Node objects Ready (kubelet registered, runtime+network
  # ready) and schedulable (the node-lifecycle controller lifted the not-ready taint)
  local deadline=$(( $(date +%s) + ${HARNESS_NODE_READY_TIMEOUT:-120} )) n st
  for n in "$@"; do
    while :; do
      st=$(kc get node "$n" \
        -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.spec.taints[*].key}' 2>/dev/null || true)
      [[ "$st" == "True " ]] && break
      node_alive "$n" || { tail -n 20 "$NODES_DIR/$n/logs/kubelet.log" "$NODES_DIR/$n/logs/containerd.log" >&2; die "$n exited"; }
      if (( $(date +%s) > deadline )); then
        tail -n 20 "$NODES_DIR/$n/logs/kubelet.log" >&2
        die "$n not Ready after ${HARNESS_NODE_READY_TIMEOUT:-120}s"
      fi
      sleep 0.2
    done
  done
}

write_env() {
  local names=() n
  for n in $(ls "$NODES_DIR" 2>/dev/null); do node_alive "$n" && names+=("$n"); done
  {
    echo "TESSERA_NODES=${names[*]}"
    echo "TESSERA_NODE_IP=$(host_ip)"
    for n in "${names[@]}"; do
      local v=${n#tessera-node-}; v=${v^^}
      echo "TESSERA_NODE_${v}=$n"
      echo "TESSERA_NODE_${v}_KUBELET_DIR=$NODES_DIR/$n/kubelet"
      echo "TESSERA_NODE_${v}_CONTAINERD=$NODES_DIR/$n/run/containerd/containerd.sock"
    done
    echo "TESSERA_SHARED_DIR=$SHARED"
    echo "TESSERA_SHARED_FS=$SHARED_FS"
    cat "$CL/gate.env" 2>/dev/null || true
  } >"$CL/nodes.env"
}

cmd_up() {
  local want=${1:-0} i n started=() t=$(now_ms)
  [[ "$want" =~ ^[0-9]+$ ]] || die "usage: nodes.sh up N"
  ((want > 0)) || return 0
  ((want <= 26)) || die "at most 26 nodes"
  for b in kubelet containerd containerd-shim-runc-v2 runc ctr cni/ptp cni/host-local cni/loopback oci-image pause; do
    [[ -x "$BIN/$b" ]] || die "$BIN/$b missing (build.sh builds it)"
  done
  [[ "$(findmnt -no PROPAGATION /)" == private ]] ||
    die "/ is a shared mount here: the nodes' private mount namespaces would leak mounts to the host"
  if [[ $SHARED_FS == gluster ]]; then gluster_up; fi
  gate_up "$want"
  # The registry the nodes pull Tessera's images from (registry.sh), before the nodes:
  # their containerd configuration names it.
  bash "$HARNESS_DIR/registry.sh" up
  for ((i = 0; i < want; i++)); do
    n=$(node_name "$i")
    if node_alive "$n"; then continue; fi
    start_node "$i"
    started+=("$n")
  done
  if ((${#started[@]})); then
    wait_ready "${started[@]}"
    log "nodes Ready: ${started[*]} ($(( ($(now_ms) - t) / 1000 )).$(printf '%03d' $(( ($(now_ms) - t) % 1000 )))s)"
  fi
  write_env
}

cmd_down() {
  local n
  for n in $(ls "$NODES_DIR" 2>/dev/null); do
    stop_node "$n"
    kc delete node "$n" --wait=false >/dev/null 2>&1 || true
  done
  gluster_down
  gate_down
  bash "$HARNESS_DIR/registry.sh" down
  [[ ! -d "$SHARED" ]] || unmount_under "$SHARED"
  rm -f "$CL/nodes.env"
  rmdir "$CG_ROOT"/*/"$CG_BASE" "$CG_ROOT"/*/"${CG_BASE%%/*}" 2>/dev/null || true
  local left
  left=$(mounts_under "$CL")
  [[ -z "$left" ]] || die "mounts left under $CL: $left"
}

cmd_status() {
  local n rc=0 st
  if [[ -d "$G" ]]; then gluster_status || rc=1; fi
  if [[ -f "$CL/registry.env" ]]; then bash "$HARNESS_DIR/registry.sh" status || rc=1; fi
  for n in $(ls "$NODES_DIR" 2>/dev/null); do
    if node_alive "$n"; then
      st=$(kc get node "$n" \
        -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || echo "?")
      printf '%-24s running  kubelet pid %s  Ready=%s\n' "$n" "$(kubelet_pid "$n")" "$st"
      [[ "$st" == True ]] || rc=1
    else
      printf '%-24s STOPPED\n' "$n"; rc=1
    fi
  done
  return $rc
}

# shellcheck source=tests/harness/gluster.sh
. "$HARNESS_DIR/gluster.sh"

case "${1:-}" in
  up) cmd_up "${2:-0}" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  enter) n=$2; shift 2; exec nsenter -m -t "$(kubelet_pid "$n")" -- "$@" ;;
  _init) node_init "$2" "$3" ;;
  _kubelet) start_kubelet "$2" "$3" ;;
  restart-kubelet) restart_kubelet "$2" ;;
  power-off) power_off "$2" ;;
  partition) partition "$2" cut ;;
  heal) partition "$2" heal ;;
  gluster-up) gluster_up ;;      # the shared backend alone (nodes.sh up starts it too)
  gluster-down) gluster_down ;;
  _gluster-mount) gluster_mount "$2" "$3" ;;
  *) echo "usage: $0 up N|down|status|enter NODE CMD...|restart-kubelet NODE" >&2; exit 2 ;;
esac
