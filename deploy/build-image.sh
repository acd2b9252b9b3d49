#!/usr/bin/env sh
# Builds the felix image from this checkout: a static binary on scratch,
# running as 65532:65532, tagged $FELIX_IMAGE (default felix:dev).
set -eu
cd "$(dirname "$0")/.."
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$ctx/felix" ./cmd/felix
mkdir -p "$ctx/rootfs/ca" "$ctx/rootfs/certs" "$ctx/rootfs/data"
chmod 0700 "$ctx/rootfs/ca" "$ctx/rootfs/certs" "$ctx/rootfs/data"
docker build -t "${FELIX_IMAGE:-felix:dev}" -f deploy/Dockerfile "$ctx"
