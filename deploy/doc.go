// Package deploy holds Felix's deployment files: the Dockerfile and its
// build script, the Docker Compose cluster (docker-compose.yml), the
// Kubernetes manifests (k8s/) and the systemd units (systemd/). It has no
// code of its own; its tests check the files against the felix binary
// built from this checkout: every document parses, every flag and FELIX_*
// environment variable the files give a command is one that command has,
// and the names, URLs and ports the files repeat in several places agree.
package deploy
