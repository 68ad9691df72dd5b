#!/usr/bin/env bash
# scripts/image.sh — sluice's release image, built and run without Docker.
#
#   scripts/image.sh build    build the static binary as the Dockerfile does
#                             and write the image from scratch layers
#                             (cmd/sluice-image); the last line printed is
#                             the OCI archive's path
#   scripts/image.sh load     build, then load the archive into podman
#                             (podman and runc installed with apt-get when
#                             missing); the last line printed is the image
#   scripts/image.sh run [PODMAN-OPTION... --] [SLUICE-ARG...]
#                             run the loaded image as a cluster would: root
#                             filesystem read-only, /tmp the only writable
#                             path (a tmpfs, or SLUICE_IMAGE_TMP), the
#                             image's user (65532) and entrypoint
#   scripts/image.sh demo     `make demo` inside the image: the embedded
#                             bulk load of testdata/ (mounted read-only),
#                             no network; the summary is written to
#                             $SLUICE_CACHE/image/demo/demo-summary.json
#
# The image has the layout of the Dockerfile's (e2e/image_test.go checks
# it): /usr/local/bin/sluice as the entrypoint, user 65532:65532, working
# directory /tmp, the build host's CA bundle (Debian's ca-certificates) at
# /etc/ssl/certs/ca-certificates.crt, the OCI labels. Nothing is pulled:
# the image has no base.
#
# Podman runs it with runc: crun 1.8 (Debian 12) refuses to start on a
# machine whose cgroup v2 hierarchy has controllers beside cgroup v1 ones
# ("cgroups in hybrid mode not supported"), which runc accepts. The
# containers' open-file and process limits are this shell's hard limits
# (processes: at most the kernel's pid_max), since podman's defaults for
# root are above what a sandboxed root may set.
#
# Environment:
#   SLUICE_CACHE              cache root                       (.cache, relative to the repository)
#   VERSION, REVISION         the labels and `sluice --version` (git describe, git rev-parse HEAD)
#   SLUICE_IMAGE_RUNTIME      podman's OCI runtime             (runc)
#   SLUICE_IMAGE_TMP          run, demo: a host directory to mount at /tmp
#                             instead of a tmpfs (demo: $SLUICE_CACHE/image/demo)
#
# Layout under $SLUICE_CACHE/image:
#   sluice            the static binary
#   oci/              the image as an OCI image layout
#   sluice.oci.tar    the same as an archive (what podman load reads)
#   image             the loaded image's name (localhost/sluice:<version>)
#   demo/             the demo's /tmp: its summary

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SLUICE_CACHE:-.cache}"
[[ "$CACHE" = /* ]] || CACHE="$ROOT/$CACHE"
DIR="$CACHE/image"
RUNTIME="${SLUICE_IMAGE_RUNTIME:-runc}"
VERSION="${VERSION:-$(git -C "$ROOT" describe --tags --always --dirty 2>/dev/null || echo dev)}"
REVISION="${REVISION:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)}"
# An image tag allows letters, digits, _, . and -.
TAG="$(tr -c 'A-Za-z0-9_.\n-' - <<<"$VERSION")"
IMAGE="localhost/sluice:$TAG"

NAME=image.sh
log() { echo "$NAME: $*" >&2; }
die() { log "$*"; exit 1; }

build() {
  command -v go >/dev/null || die "go is missing"
  mkdir -p "$DIR"
  log "building the static binary (version $VERSION, revision $REVISION)"
  # As the Dockerfile's build stage builds it.
  (cd "$ROOT" && CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath \
    -ldflags "-s -w -X main.version=$VERSION -X main.revision=$REVISION" \
    -o "$DIR/sluice" ./cmd/sluice)
  local ca=/etc/ssl/certs/ca-certificates.crt
  [[ -s "$ca" ]] || install_packages ca-certificates
  rm -rf "$DIR/oci" "$DIR/sluice.oci.tar"
  log "writing the image"
  (cd "$ROOT" && go run ./cmd/sluice-image --binary "$DIR/sluice" --ca-bundle "$ca" \
    --version "$VERSION" --revision "$REVISION" --ref "$IMAGE" --out "$DIR/oci") >&2
  tar -C "$DIR/oci" -cf "$DIR/sluice.oci.tar" .
  echo "$DIR/sluice.oci.tar"
}

# install_packages PACKAGE... installs Debian packages with apt-get.
install_packages() {
  local sudo=()
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null || die "$* missing and this is not root: run 'apt-get install -y --no-install-recommends $*' as root"
    sudo=(sudo)
  fi
  log "installing $* (Debian packages)"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

install_podman() {
  command -v podman >/dev/null && command -v "$RUNTIME" >/dev/null && return 0
  install_packages podman "$RUNTIME"
  command -v podman >/dev/null || die "apt-get installed podman but it is not on PATH"
}

load() {
  local archive
  archive="$(build | tail -n 1)"
  install_podman
  podman load -q -i "$archive" >&2
  echo "$IMAGE" >"$DIR/image"
  echo "$IMAGE"
}

# loaded prints the name of the image load loaded last.
loaded() {
  [[ -s "$DIR/image" ]] || die "no image loaded: run $0 load first"
  local image
  image="$(<"$DIR/image")"
  podman image exists "$image" || die "$image is not in podman's storage: run $0 load"
  echo "$image"
}

# hard_limit OPTION [MAX] prints ulimit's hard limit, at most MAX, in
# podman's --ulimit terms.
hard_limit() {
  local v
  v="$(ulimit -H "$1")"
  [[ "$v" == unlimited ]] && v="${2:--1}"
  [[ -n "${2:-}" ]] && ((v > $2)) && v="$2"
  echo "$v:$v"
}

# run [PODMAN-OPTION... --] [SLUICE-ARG...]
run() {
  local opts=() args=("$@") i
  for i in "${!args[@]}"; do
    if [[ "${args[$i]}" == -- ]]; then
      opts=("${args[@]:0:$i}")
      args=("${args[@]:$((i + 1))}")
      break
    fi
  done
  local tmp=(--tmpfs /tmp)
  if [[ -n "${SLUICE_IMAGE_TMP:-}" ]]; then
    tmp=(-v "$SLUICE_IMAGE_TMP:/tmp")
  fi
  install_podman
  local image
  image="$(loaded)"
  # --read-only-tmpfs=false: podman would otherwise mount writable tmpfs
  # on /run, /var/tmp and /tmp beside the read-only root.
  exec podman run --rm --runtime "$RUNTIME" \
    --read-only --read-only-tmpfs=false "${tmp[@]}" \
    --ulimit "nofile=$(hard_limit -n)" --ulimit "nproc=$(hard_limit -u "$(</proc/sys/kernel/pid_max)")" \
    "${opts[@]}" "$image" "${args[@]}"
}

demo() {
  local out="${SLUICE_IMAGE_TMP:-$DIR/demo}"
  rm -rf "$out"
  mkdir -p "$out"
  chmod 1777 "$out" # the image's user writes there, as in /tmp
  # The Makefile's demo command, the input mounted read-only.
  SLUICE_IMAGE_TMP="$out" run --network none -v "$ROOT/testdata:/data:ro" -- \
    bulk-load --embedded --capacity 2000 --partitions 20 --workers 2 \
    --topic earthquakes --id-field id --summary-json /tmp/demo-summary.json \
    /data/usgs-earthquakes-2025-05.csv
}

case "${1:-}" in
  build) build ;;
  load) load ;;
  run) shift; run "$@" ;;
  demo) demo ;;
  *) die "usage: $0 build|load|run [PODMAN-OPTION... --] [SLUICE-ARG...]|demo" ;;
esac
