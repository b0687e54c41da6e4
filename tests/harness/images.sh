#!/usr/bin/env bash
# Container images for the harness nodes, with no registry and no container engine:
# one-layer OCI archives written by `oci-image` (tests/harness/cmd/oci-image) from
# binaries on this machine, imported into each node's containerd with `ctr`.
#
#   images.sh build-base     pause + busybox archives (node start-up loads them)
#   images.sh build-runtime-base   base/tessera-base.tar: the Containerfile's BASE offline
#                            (distroless cc's content: glibc, libgcc, /etc/passwd with
#                            root and nonroot 65532, /tmp), from this machine's Debian
#   images.sh build          + tessera (release binary and the libraries ldd names;
#                            TESSERA_IMAGE_BIN=PATH takes that binary instead)
#                            + tools: busybox, sqlite3 and util-linux's flock (busybox
#                            has none) from this machine, for tests/pods/locks.rs
#                            + the CSI sidecars config/ runs, built by build.sh
#   images.sh load [NODE...] import every archive into the nodes (default: all running)
#   images.sh containerfile  the Tessera image as a user builds it: `buildah build` of
#                            the Containerfile (BINARY=prebuilt: the release binary, or
#                            TESSERA_IMAGE_BIN's, at target/image/tessera); BASE from
#                            IMAGE_BASE (default: the Containerfile's, distroless;
#                            `offline`: tessera-base.tar, build-runtime-base); named
#                            IMAGE_NAME (default localhost/tessera:VERSION) in buildah's
#                            store (dangling images pruned after each build and push)
#   images.sh push REGISTRY  push that image and the CSI sidecars config/ runs to
#                            REGISTRY (buildah push; REGISTRY_AUTHFILE, REGISTRY_CERT_DIR:
#                            buildah's --authfile and --cert-dir); the sidecars from
#                            registry.k8s.io, or with SIDECARS_FROM=harness the archives
#                            `build` made (offline)
#
# Archives: target/images/<name>.tar. Image names: harness.tessera.io/<name>:<tag>
# (the deploy overlay maps config/'s names onto them).
set -euo pipefail

HARNESS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HARNESS_DIR/../.." && pwd)"
BIN="${HARNESS_BIN:-$ROOT/target/harness/bin}"
CL="${HARNESS_CLUSTER_DIR:-$ROOT/target/cluster}"
IMAGES="$ROOT/target/images"
REG=harness.tessera.io
# name:tag of each sidecar image; binaries of the same names are in $BIN.
SIDECARS=(csi-provisioner:v6.3.0 csi-attacher:v4.12.0 csi-resizer:v2.2.0 csi-node-driver-registrar:v2.17.0
  csi-snapshotter:v8.7.0 snapshot-controller:v8.7.0)

log() { printf '[images] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

img() { "$BIN/oci-image" "$@"; }

build_base() {
  mkdir -p "$IMAGES"
  [[ -x /bin/busybox ]] && /bin/busybox --list >/dev/null 2>&1 ||
    die "/bin/busybox (Debian's busybox-static) missing: run .ci/install-deps.sh"
  [[ "$(ldd /bin/busybox 2>&1 || true)" == *"not a dynamic"* ]] || die "/bin/busybox is not static (install busybox-static)"
  img --name "$REG/pause:3.10" --out "$IMAGES/pause.tar" --file "$BIN/pause:/pause" --entrypoint /pause --user 65535:65535
  img --name "$REG/busybox:1.35" --out "$IMAGES/busybox.tar" --file /bin/busybox:/bin/busybox \
    --busybox-applets /bin/busybox:/bin --dir /tmp:1777 --dir /root:700 --dir /etc --cmd sh
}

# What gcr.io/distroless/cc-debian12 gives the Containerfile, from this machine's
# libraries (the binary is built here against them): the runtime of a Rust binary
# (loader, libc, libm, libgcc_s), root and nonroot (65532) users, /tmp.
build_runtime_base() {
  local etc="$IMAGES/base/etc" f libs=()
  mkdir -p "$etc"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$etc/group"
  for f in /lib/x86_64-linux-gnu/libc.so.6 /lib/x86_64-linux-gnu/libm.so.6 /lib/x86_64-linux-gnu/libgcc_s.so.1 \
    /lib64/ld-linux-x86-64.so.2; do
    [[ -e "$f" ]] || die "$f missing"
    libs+=(--file "$(readlink -f "$f"):$f")
  done
  img --name "$REG/tessera-base:1" --out "$IMAGES/base/tessera-base.tar" "${libs[@]}" \
    --file "$etc/passwd:/etc/passwd:644" --file "$etc/group:/etc/group:644" \
    --dir /tmp:1777 --dir /root:700 --dir /home/nonroot
}

# --file arguments for BINARY's shared libraries and loader (none for a static binary).
lib_args() {
  local line lib
  { ldd "$1" 2>/dev/null || true; } | while read -r line; do
    case "$line" in
      *"=> /"*) lib=${line#*=> }; lib=${lib%% (*} ;;
      /*) lib=${line%% (*} ;;
      *) continue ;;
    esac
    echo "--file"
    echo "$(readlink -f "$lib"):$lib"
  done
}

build_tessera() {
  local target="${CARGO_TARGET_DIR:-$ROOT/target}" bin
  if [[ -n "${TESSERA_IMAGE_BIN:-}" ]]; then
    # A binary built already (tests/run.sh: the debug build the tests use, which
    # saves a release build); its debug info stripped into a copy.
    [[ -x "$TESSERA_IMAGE_BIN" ]] || die "TESSERA_IMAGE_BIN=$TESSERA_IMAGE_BIN is not an executable"
    bin="$IMAGES/tessera.bin"
    objcopy --strip-debug "$TESSERA_IMAGE_BIN" "$bin"
  else
    log "cargo build --release --bin tessera"
    (cd "$ROOT" && ${CARGO:-cargo} build --release --locked --bin tessera)
    bin="$target/release/tessera"
  fi
  [[ -x "$bin" ]] || die "$bin missing"
  local libs=()
  mapfile -t libs < <(lib_args "$bin")
  # The node agent's image is also its mount Pods' (pod mode: `tessera mount` as the
  # container's args, the entrypoint being /usr/bin/tessera); in process mode
  # /proc/self/exe re-executes the binary for `tessera mount`; /tmp for the
  # readOnlyRootFilesystem controller is not needed (it writes nothing).
  img --name "$REG/tessera:$VERSION" --out "$IMAGES/tessera.tar" --file "$bin:/usr/bin/tessera:755" \
    "${libs[@]}" --entrypoint /usr/bin/tessera --dir /tmp:1777
  log "tessera image: $(( $(stat -c %s "$IMAGES/tessera.tar") / 1048576 )) MiB, libraries: $((${#libs[@]} / 2))"
}

# busybox with the host's sqlite3 and flock(1) and their libraries: the real-Pod lock
# tests take flock and (through SQLite) fcntl locks.
build_tools() {
  local b libs=()
  mkdir -p "$IMAGES"
  for b in /usr/bin/sqlite3 /usr/bin/flock; do
    [[ -x "$b" ]] || die "$b missing (Debian's sqlite3 and util-linux): run .ci/install-deps.sh"
  done
  # One --file per library even where both binaries name it.
  mapfile -t libs < <({ lib_args /usr/bin/sqlite3; lib_args /usr/bin/flock; } | paste - - | sort -u | tr '\t' '\n')
  img --name "$REG/tools:1" --out "$IMAGES/tools.tar" --file /bin/busybox:/bin/busybox \
    --busybox-applets /bin/busybox:/bin --file /usr/bin/sqlite3:/usr/bin/sqlite3 \
    --file /usr/bin/flock:/usr/bin/flock "${libs[@]}" --dir /tmp:1777 --dir /root:700 --dir /etc --cmd sh
  log "tools image: $(( $(stat -c %s "$IMAGES/tools.tar") / 1048576 )) MiB, libraries: $((${#libs[@]} / 2))"
}

build_sidecars() {
  local s name
  for s in "${SIDECARS[@]}"; do
    name=${s%%:*}
    [[ -x "$BIN/$name" ]] || die "$BIN/$name missing (build.sh builds it)"
    img --name "$REG/$s" --out "$IMAGES/$name.tar" --file "$BIN/$name:/$name" --entrypoint "/$name"
  done
}

# shellcheck source=tests/harness/buildah.sh
. "$HARNESS_DIR/buildah.sh"
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n1)

# Drop buildah's untagged images (build stages, replaced builds, pulled copies).
prune() {
  local ids
  ids=$(bah images -a -q --filter dangling=true 2>/dev/null | sort -u)
  [[ -z "$ids" ]] || bah rmi -f $ids >/dev/null 2>&1 || true
}

build_containerfile() {
  local target="${CARGO_TARGET_DIR:-$ROOT/target}" src base=() t0 name="${IMAGE_NAME:-localhost/tessera:$VERSION}"
  if [[ -n "${TESSERA_IMAGE_BIN:-}" ]]; then
    src=$TESSERA_IMAGE_BIN
  else
    log "cargo build --release --bin tessera"
    (cd "$ROOT" && ${CARGO:-cargo} build --release --locked --bin tessera)
    src="$target/release/tessera"
  fi
  [[ -x "$src" ]] || die "$src is not an executable"
  # The build context's one file from target/ (.containerignore), debug info stripped.
  mkdir -p "$ROOT/target/image"
  objcopy --strip-debug "$src" "$ROOT/target/image/tessera.new"
  mv -f "$ROOT/target/image/tessera.new" "$ROOT/target/image/tessera"
  case "${IMAGE_BASE:-}" in
    "") ;;
    offline) build_runtime_base; base=(--build-arg "BASE=oci-archive:$IMAGES/base/tessera-base.tar") ;;
    *) base=(--build-arg "BASE=$IMAGE_BASE") ;;
  esac
  t0=$(date +%s%3N)
  # --isolation chroot: no container runtime, nothing host-wide (the prebuilt path has
  # no RUN step anyway); -q: only the image ID on stdout.
  bah build --isolation chroot -q --build-arg BINARY=prebuilt --build-arg "VERSION=$VERSION" \
    ${IMAGE_SOURCE:+--build-arg "SOURCE=$IMAGE_SOURCE"} "${base[@]}" \
    -t "$name" -f "$ROOT/Containerfile" "$ROOT" >/dev/null
  prune # the stages, and the builds this one replaced
  log "built $name from the Containerfile with buildah in $(( $(date +%s%3N) - t0 ))ms:" \
    "$(bah images --format '{{.Size}}' "$name" | head -n1) uncompressed (binary $(( $(stat -c %s "$ROOT/target/image/tessera") / 1048576 )) MiB)"
}

# push REGISTRY: Tessera's image and the CSI sidecars, as config/ and the chart name them.
push() {
  local reg=${1:?usage: images.sh push REGISTRY} name="${IMAGE_NAME:-localhost/tessera:$VERSION}" s id t0 opts=()
  [[ -n "${REGISTRY_AUTHFILE:-}" ]] && opts+=(--authfile "$REGISTRY_AUTHFILE")
  [[ -n "${REGISTRY_CERT_DIR:-}" ]] && opts+=(--cert-dir "$REGISTRY_CERT_DIR")
  t0=$(date +%s%3N)
  bah push -q "${opts[@]}" "$name" "docker://$reg/tessera:$VERSION" >&2
  log "pushed $reg/tessera:$VERSION in $(( $(date +%s%3N) - t0 ))ms"
  # IMAGE_ALSO_TAGS: the same image under other tags too (the harness's stand-in for
  # a previous release's image: tests/upgrade/README.md).
  for s in ${IMAGE_ALSO_TAGS:-}; do
    bah push -q "${opts[@]}" "$name" "docker://$reg/tessera:$s" >&2
    log "pushed $reg/tessera:$s (the same image)"
  done
  t0=$(date +%s%3N)
  for s in "${SIDECARS[@]}"; do
    [[ ${s%%:*} != snapshot-controller ]] || continue # a cluster add-on, not Tessera's
    if [[ "${SIDECARS_FROM:-upstream}" == harness ]]; then
      [[ -f "$IMAGES/${s%%:*}.tar" ]] || die "$IMAGES/${s%%:*}.tar missing: images.sh build first"
      id=$(bah pull -q "oci-archive:$IMAGES/${s%%:*}.tar")
    else
      id=$(bah pull -q "docker://registry.k8s.io/sig-storage/$s")
    fi
    bah push -q "${opts[@]}" "$id" "docker://$reg/sig-storage/$s" >&2
  done
  # The harness's busybox as Docker Hub's library/busybox:$MIRROR_BUSYBOX_TAG: the
  # nodes' containerd use the registry as their docker.io mirror (nodes.sh), so the
  # examples' `image: busybox:1.36` resolves with no Internet, as behind a mirror.
  if [[ "${SIDECARS_FROM:-upstream}" == harness ]]; then
    id=$(bah pull -q "oci-archive:$IMAGES/busybox.tar")
    bah push -q "${opts[@]}" "$id" "docker://$reg/library/busybox:${MIRROR_BUSYBOX_TAG:-1.36}" >&2
  fi
  log "pushed the CSI sidecars to $reg/sig-storage/ in $(( $(date +%s%3N) - t0 ))ms"
  prune # the sidecars' copies
}

running_nodes() {
  local n
  for n in $(ls "$CL/nodes" 2>/dev/null); do
    [[ -S "$CL/nodes/$n/run/containerd/containerd.sock" ]] && echo "$n"
  done
  return 0
}

load() {
  local nodes=("$@") n f t sock have want loaded
  ((${#nodes[@]})) || mapfile -t nodes < <(running_nodes)
  ((${#nodes[@]})) || { log "no running node to load into"; return 0; }
  for n in "${nodes[@]}"; do
    t=$(date +%s%3N); loaded=0
    sock="$CL/nodes/$n/run/containerd/containerd.sock"
    # (ctr relays containerd's cgroup-v1 deprecation warning on every call: keep it
    # out of the way unless something fails)
    # Name and digest: a tag loaded with another build before (then moved back to a
    # digest still kept under its `name@digest` record) must be loaded again.
    have=$("$BIN/ctr" --address "$sock" -n k8s.io images ls 2>/dev/null | awk 'NR > 1 { print $1 " " $3 }')
    for f in "$IMAGES"/*.tar; do
      want=$(tar -xOf "$f" index.json |
        sed -n 's/.*"io.containerd.image.name":"\([^"]*\)".*"digest":"\(sha256:[0-9a-f]*\)".*/\1 \2/p')
      if [[ -n "$want" ]] && grep -qxF "$want" <<<"$have"; then continue; fi
      "$BIN/ctr" --address "$sock" -n k8s.io images import "$f" >/dev/null 2>"$IMAGES/.ctr.err" ||
        { cat "$IMAGES/.ctr.err" >&2; die "import of $f into $n failed"; }
      loaded=$((loaded + 1))
    done
    log "$n: imported $loaded of $(ls "$IMAGES"/*.tar | wc -l) images (others already there) in $(( $(date +%s%3N) - t ))ms"
  done
}

case "${1:-}" in
  build-base) build_base ;;
  build-runtime-base) build_runtime_base ;;
  build) build_base; build_tessera; build_tools; build_sidecars ;;
  load) shift; load "$@" ;;
  containerfile) build_containerfile ;;
  push) shift; push "$@" ;;
  *) echo "usage: $0 build-base|build-runtime-base|build|load [NODE...]|containerfile|push REGISTRY" >&2; exit 2 ;;
esac
