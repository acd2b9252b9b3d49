#!/usr/bin/env sh
# Builds the felix image from this checkout: a static binary on scratch.
set -eu
cd "$(dirname "$0")/.."
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o deploy/felix ./cmd/felix
docker build -t "${FELIX_IMAGE:-felix:dev}" deploy
rm -f deploy/felix
