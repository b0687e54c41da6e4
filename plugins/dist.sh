#!/usr/bin/env bash
# `make dist`: the release archives of `kubectl tessera` and its krew manifest.
# For each Rust target of DIST_TARGETS (default: this machine's), builds the plugin
# in release mode, packs `kubectl-tessera` and LICENSE into
#   $DIST_DIR/kubectl-tessera_v<version>_<os>_<arch>.tar.gz   (+ .sha256)
# (reproducible: sorted names, fixed mtime and owner, gzip without a timestamp), and
# renders plugins/tessera.yaml.in to $DIST_DIR/tessera.yaml with a platform per
# archive, its uri under $DIST_URL/v<version>/ and its sha256.
#
#   DIST_DIR      where to write (default target/dist)
#   DIST_URL      where the release's archives will be downloadable from
#   DIST_TARGETS  Rust target triples, space separated (each must be installed:
#                 `rustup target add ...`, and a linker for it)
#   TESSERA_PLUGIN_BIN  package this binary (for this machine's target) instead of
#                 building (tests/manifests/krew.rs uses the test build)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

CARGO="${CARGO:-cargo}"
DIST_DIR="${DIST_DIR:-$ROOT/target/dist}"
DIST_URL="${DIST_URL:-https://tessera.io/releases/download}"
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
[[ -n "$VERSION" ]] || { echo "dist.sh: no version in Cargo.toml" >&2; exit 1; }
HOST="$(rustc -vV | sed -n 's/^host: //p')"
DIST_TARGETS="${DIST_TARGETS:-$HOST}"
# Fixed timestamps in the archives: the commit's time when there is one.
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"

# krew's os and arch names for a Rust target triple.
platform() {
  local os arch
  case "$1" in
    *-linux-*) os=linux ;;
    *-apple-darwin) os=darwin ;;
    *) echo "dist.sh: no krew os for target $1" >&2; return 1 ;;
  esac
  case "$1" in
    x86_64-*) arch=amd64 ;;
    aarch64-*) arch=arm64 ;;
    armv7-*|arm-*) arch=arm ;;
    *) echo "dist.sh: no krew arch for target $1" >&2; return 1 ;;
  esac
  echo "$os $arch"
}

mkdir -p "$DIST_DIR"
platforms=""
for target in $DIST_TARGETS; do
  read -r os arch < <(platform "$target")
  if [[ -n "${TESSERA_PLUGIN_BIN:-}" ]]; then
    [[ "$target" == "$HOST" ]] || { echo "dist.sh: TESSERA_PLUGIN_BIN is for $HOST only, not $target" >&2; exit 1; }
    bin="$TESSERA_PLUGIN_BIN"
  else
    # Without symbols: a quarter of the binary (a panic's backtrace loses its
    # function names; the plugin's errors are messages, not panics).
    CARGO_PROFILE_RELEASE_STRIP=symbols \
      "$CARGO" build --release --locked --bin kubectl-tessera --target "$target"
    bin="${CARGO_TARGET_DIR:-$ROOT/target}/$target/release/kubectl-tessera"
  fi
  name="kubectl-tessera_v${VERSION}_${os}_${arch}.tar.gz"
  stage="$(mktemp -d)"
  trap 'rm -rf "$stage"' EXIT
  install -m 0755 "$bin" "$stage/kubectl-tessera"
  install -m 0644 LICENSE "$stage/LICENSE"
  tar -C "$stage" --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
    -cf - kubectl-tessera LICENSE | gzip -n -9 > "$DIST_DIR/$name"
  rm -rf "$stage"
  trap - EXIT
  sum="$(sha256sum "$DIST_DIR/$name" | cut -d' ' -f1)"
  echo "$sum  $name" > "$DIST_DIR/$name.sha256"
  platforms+="  - selector:
      matchLabels: {os: $os, arch: $arch}
    uri: $DIST_URL/v$VERSION/$name
    sha256: $sum
    bin: kubectl-tessera
    files:
      - {from: kubectl-tessera, to: .}
      - {from: LICENSE, to: .}
"
  echo "dist: $DIST_DIR/$name ($sum)"
done

# The template, its comment header left out, with the platforms in place.
{
  sed -e '/^#/d' -e "s|@VERSION@|$VERSION|g" -e '/^@PLATFORMS@$/,$d' plugins/tessera.yaml.in
  printf '%s' "$platforms"
} > "$DIST_DIR/tessera.yaml"
echo "dist: $DIST_DIR/tessera.yaml"
