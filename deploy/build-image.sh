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
# The public CAs, for what felix dials over https beyond the cluster's own
# CA (an OTLP collector): the build host's bundle, where Go looks for it.
bundle=/etc/ssl/certs/ca-certificates.crt
if [ -r "$bundle" ]; then
	mkdir -p "$ctx/rootfs/etc/ssl/certs"
	cp "$bundle" "$ctx/rootfs/etc/ssl/certs/"
else
	echo "build-image: no $bundle on this host: the image has no public CAs (mount a bundle and set SSL_CERT_FILE to export telemetry over https)" >&2
fi
docker build -t "${FELIX_IMAGE:-felix:dev}" -f deploy/Dockerfile "$ctx"
