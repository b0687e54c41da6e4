# The real nodes' shared backend: one GlusterFS volume, served by a glusterd started
# here, mounted by a FUSE client (`glusterfs`) of its own in every node and one on the
# host. Sourced by nodes.sh (uses its CL, BIN, CG_* and log/die/cg_* helpers).
#
# Server: glusterd in a mount namespace of its own (unshare -m) where /var/lib/glusterd,
# /var/log/glusterfs and /run are binds of $CL/gluster/{lib,log,run}, so its state,
# logs, sockets and pid files stay under the cluster dir; it listens on the host's
# address only, at 24007 (its bricks know no other port), and gives its brick process
# a port from a range starting at a free port. Every server process (glusterd, the brick's glusterfsd) and the host's client
# run in the cgroup $CG_BASE/gluster: `gluster_down` kills what is left there.
#
# Volume `tessera`: distribute, one brick at $CL/gluster/brick/tessera, on the host's
# default-route address (glusterd refuses loopback brick hosts), with the client-side
# caching translators off and the clients on direct I/O, so that a read on one node
# sees what another wrote (see tests/harness/README.md, "The shared backend").
#
#   gluster_up                 server + volume started, host client at $SHARED
#   gluster_mount DIR LOG      mount the volume at DIR with a new client (in the caller's
#                              mount namespace and cgroup)
#   gluster_status             one line, exit 0 iff serving
#   gluster_down               unmount the host client, stop the server, remove $CL/gluster

G="$CL/gluster"
GVOL=tessera

gluster_port() { sed -n 's/^port=//p' "$G/ports" 2>/dev/null; }

gluster_pid() { # pid of the running glusterd, else fail
  local pid
  pid=$(cat "$G/run/glusterd.pid" 2>/dev/null) || return 1
  [[ -r /proc/$pid/cmdline && "$(tr '\0' '\n' </proc/$pid/cmdline | head -n1)" == *glusterd ]] || return 1
  echo "$pid"
}

# The gluster CLI inside the server's namespace (its socket is /run/glusterd.socket there).
gcli() { nsenter -m -t "$(gluster_pid)" -- gluster --mode=script "$@"; }

free_port() { # N free TCP ports, one per line, kept apart by holding them open together
  python3 -c 'import socket,sys
s=[socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("", 0))
print("\n".join(str(x.getsockname()[1]) for x in s))' "$1"
}

gluster_up() {
  local ip port base t=$(now_ms) i pid
  command -v glusterd >/dev/null || die "glusterd missing: apt-get install glusterfs-server glusterfs-client (.ci/install-deps.sh)"
  ip=$(host_ip); [[ -n "$ip" ]] || die "no default route: gluster needs a non-loopback brick address"
  if gluster_pid >/dev/null && mountpoint -q "$SHARED"; then return 0; fi
  gluster_down
  mkdir -p "$G"/{lib,log,run,brick,logs} "$SHARED"
  cp -a /var/lib/glusterd/groups "$G/lib/" 2>/dev/null || true
  # glusterd's port stays the default 24007: glusterd starts its brick processes
  # (glusterfsd -s HOST) without a port, and they fetch their volfile there. It binds
  # only the host's address; the brick ports come from a free range.
  port=24007
  python3 -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 24007)); s.listen()' "$ip" 2>/dev/null ||
    die "port $ip:24007 is taken (another glusterd?): gluster needs it for its brick's volfile"
  base=$(free_port 1)
  printf 'port=%s\nbase=%s\nip=%s\n' "$port" "$base" "$ip" >"$G/ports"
  cat >"$G/glusterd.vol" <<EOF
volume management
    type mgmt/glusterd
    option working-directory /var/lib/glusterd
    option transport-type socket
    option transport.socket.listen-port $port
    option transport.socket.bind-address $ip
    option transport.socket.keepalive-time 10
    option transport.socket.keepalive-interval 2
    option transport.socket.read-fail-log off
    option ping-timeout 0
    option event-threads 1
    option base-port $base
    option max-port $((base + 50))
end-volume
EOF
  cg_create gluster
  unshare -m --propagation private -- bash -c '
    for c in "${@:2}"; do echo $$ >"'"$CG_ROOT"'/$c/'"$CG_BASE"'/gluster/cgroup.procs"; done
    G=$1
    mount --bind "$G/lib" /var/lib/glusterd
    mount --bind "$G/log" /var/log/glusterfs
    mount --bind "$G/run" /run
    exec glusterd -f "$G/glusterd.vol" -p /run/glusterd.pid' _ "$G" $(cg_controllers) 9>&- ||
    die "glusterd did not start: $(tail -n 5 "$G/log/glusterd.log" 2>/dev/null)"
  local deadline=$(( $(date +%s) + 60 ))
  until gluster_pid >/dev/null && gcli volume list >/dev/null 2>&1; do
    (( $(date +%s) < deadline )) || break
    sleep 0.2
  done
  gcli volume list >/dev/null 2>&1 || die "glusterd does not answer: $(tail -n 5 "$G/log/glusterd.log" 2>/dev/null)"
  # `force`: the brick is on the root filesystem.
  gcli volume create "$GVOL" transport tcp "$ip:$G/brick/$GVOL" force >"$G/logs/create.log" 2>&1 ||
    die "gluster volume create: $(cat "$G/logs/create.log")"
  # Coherence across clients (README, "The shared backend"): no client-side data or
  # metadata caches, writes reach the brick before write()/close() return.
  local o
  for o in performance.write-behind=off performance.flush-behind=off performance.read-ahead=off \
    performance.io-cache=off performance.quick-read=off performance.open-behind=off \
    performance.stat-prefetch=off performance.readdir-ahead=off performance.nl-cache=off \
    performance.strict-o-direct=on network.ping-timeout=5; do
    gcli volume set "$GVOL" "${o%%=*}" "${o#*=}" >>"$G/logs/create.log" 2>&1 ||
      die "gluster volume set $o: $(tail -n 2 "$G/logs/create.log")"
  done
  gcli volume start "$GVOL" >>"$G/logs/create.log" 2>&1 || die "gluster volume start: $(tail -n 2 "$G/logs/create.log")"
  # The host's client, in the server's cgroup (killed with it).
  bash -c 'for c in "${@:2}"; do echo $$ >"'"$CG_ROOT"'/$c/'"$CG_BASE"'/gluster/cgroup.procs"; done
    exec bash "'"$HARNESS_DIR/nodes.sh"'" _gluster-mount "$1" "'"$G"'/logs/client-host.log"' _ "$SHARED" $(cg_controllers) 9>&-
  mkdir -p "$SHARED/tessera"
  log "gluster: volume $GVOL on $ip:$G/brick/$GVOL, glusterd port $port, host client at $SHARED ($(( $(now_ms) - t ))ms)"
}

gluster_mount() { # gluster_mount DIR LOG: a new FUSE client, here; waits for the mount
  local dir=$1 logf=$2 port ip i
  port=$(gluster_port); ip=$(sed -n 's/^ip=//p' "$G/ports" 2>/dev/null)
  [[ -n "$port" && -n "$ip" ]] || die "gluster is not up ($G/ports missing)"
  mkdir -p "$dir"
  # Timeouts 0: the kernel asks the client for every lookup and getattr, so a name or a
  # size another client changed is seen at once (the client has no cache of its own:
  # performance.stat-prefetch, io-cache... are off on the volume). direct-io: no kernel
  # page cache for files, so a read after a lock (SQLite keeps its file open) sees what
  # another node wrote; without it two nodes' SQLite writers lost rows (README).
  # fopen-keep-cache=off: glusterfs's default keeps a file's pages across opens.
  glusterfs --process-name fuse --volfile-server="$ip" --volfile-server-port="$port" \
    --volfile-id="$GVOL" --attribute-timeout=0 --entry-timeout=0 --negative-timeout=0 \
    --fopen-keep-cache=off --direct-io-mode=enable \
    --log-file="$logf" "$dir" 9>&- || die "glusterfs client for $dir did not start: $(tail -n 5 "$logf")"
  for ((i = 0; i < 100; i++)); do
    [[ "$(findmnt -no FSTYPE --mountpoint "$dir" 2>/dev/null)" == fuse.glusterfs ]] && stat "$dir" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "the gluster mount at $dir did not appear: $(tail -n 5 "$logf")"
}

gluster_status() { # one line; exit 0 iff glusterd runs and the host's client is mounted
  local pid
  if pid=$(gluster_pid) && mountpoint -q "$SHARED"; then
    printf '%-24s running  glusterd pid %s  volume %s at %s\n' gluster "$pid" "$GVOL" "$SHARED"
  else
    printf '%-24s STOPPED (or the host client at %s is not mounted)\n' gluster "$SHARED"; return 1
  fi
}

gluster_down() {
  local i pids
  [[ -d "$G" || -d "$CG_ROOT/pids/$CG_BASE/gluster" ]] || return 0
  if [[ "$(findmnt -no FSTYPE --mountpoint "$SHARED" 2>/dev/null)" == fuse.glusterfs ]]; then
    umount "$SHARED" 2>/dev/null || umount -l "$SHARED" 2>/dev/null || log "warning: cannot unmount $SHARED"
  fi
  for ((i = 0; i < 50; i++)); do
    pids=$(cg_pids gluster)
    [[ -n "$pids" ]] || break
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.1
  done
  [[ -z "$(cg_pids gluster)" ]] || log "warning: processes left in cgroup $CG_BASE/gluster: $(cg_pids gluster | tr '\n' ' ')"
  cg_remove gluster
  rm -rf "$G"
}
