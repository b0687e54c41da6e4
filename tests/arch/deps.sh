#!/usr/bin/env bash
# What each crate of the workspace may depend on, checked on `cargo tree` (normal
# dependencies, transitively): fails, naming the chain, when a crate gains a
# dependency its role forbids. Run by `make lint` (and so `make test`).
#
#   tessera-text        plain values: nothing but thiserror and jiff
#   tessera-api         CRD types, names, pure arbitration: no runtime, API client or gRPC
#   tessera-host        the Linux host: nothing Kubernetes, no async runtime
#   tessera-fuse        the FUSE daemon: nothing Kubernetes, no gRPC
#   tessera-csi-proto   generated CSI code: nothing of Tessera's, nothing Kubernetes
#   tessera-runtime     what the roles share: no role, no FUSE
#   tessera-controller  the controllers: no other role, no FUSE, no CSI
#   tessera-csi         the CSI services: no other role, no FUSE
#   tessera-node        the node agent: no other role, no CSI
#   tessera-plugin      kubectl tessera's judgements: no role, no runtime, no API client
#
# The roles (controller, csi, node) never depend on one another: the `tessera`
# binary (src/cli.rs) is the one place they meet.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

fail=0
# forbid CRATE DEP...: CRATE must not depend on any DEP.
forbid() {
  local crate=$1 deps dep
  shift
  if ! cargo metadata --format-version 1 --no-deps 2>/dev/null | grep -q "\"name\":\"$crate\""; then
    return 0 # not (yet) in the workspace
  fi
  deps=$(cargo tree -p "$crate" -e normal --prefix none --format '{p}' | awk '{print $1}' | sort -u)
  for dep in "$@"; do
    if grep -qx -- "$dep" <<<"$deps"; then
      echo "deps: $crate depends on $dep, which its role forbids; the chain:" >&2
      cargo tree -p "$crate" -e normal -i "$dep" --depth 8 >&2 || true
      fail=1
    fi
  done
}
# only CRATE DEP...: CRATE's own dependencies are among DEP (nothing else, not even
# transitively named here).
only() {
  local crate=$1 deps dep
  shift
  deps=$(cargo tree -p "$crate" -e normal --depth 1 --prefix none --format '{p}' | awk 'NR > 1 {print $1}' | sort -u)
  for dep in $deps; do
    if ! printf '%s\n' "$@" | grep -qx -- "$dep"; then
      echo "deps: $crate depends on $dep; it may depend only on: $*" >&2
      fail=1
    fi
  done
}

kubernetes_client=(kube-client kube-runtime hyper hyper-util tower tonic reqwest)
roles=(tessera-controller tessera-csi tessera-node tessera-plugin)
only tessera-text thiserror jiff
forbid tessera-api tokio "${kubernetes_client[@]}" nix fuser tessera-host tessera-fuse tessera-runtime "${roles[@]}"
forbid tessera-host tokio kube kube-core k8s-openapi "${kubernetes_client[@]}" tessera-api fuser tessera-runtime "${roles[@]}"
forbid tessera-fuse kube kube-core k8s-openapi "${kubernetes_client[@]}" tessera-api tokio tessera-runtime "${roles[@]}"
forbid tessera-csi-proto kube kube-core k8s-openapi tessera-api tessera-host tessera-fuse tessera-runtime "${roles[@]}"
forbid tessera-runtime fuser tessera-fuse tessera-host "${roles[@]}"
forbid tessera-controller tessera-csi tessera-node tessera-plugin tessera-fuse tessera-csi-proto fuser
forbid tessera-csi tessera-controller tessera-node tessera-plugin tessera-fuse fuser
forbid tessera-node tessera-controller tessera-csi tessera-plugin tessera-csi-proto
forbid tessera-plugin tessera-controller tessera-csi tessera-node tessera-runtime tessera-fuse fuser tokio "${kubernetes_client[@]}"

if ((fail)); then
  exit 1
fi
echo "deps: every crate within what its role allows"
