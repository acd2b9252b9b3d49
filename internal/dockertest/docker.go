package dockertest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/felix-broker/felix/internal/cluster"
)

// docker runs the docker CLI and returns its standard output, trimmed; a
// failure carries what it wrote to standard error.
func docker(ctx context.Context, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := dockerCmd(ctx, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		return "", fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, msg)
	}
	return strings.TrimSpace(stdout.String()), nil
}

func dockerCmd(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "docker", args...)
}

// Available reports why the Docker engine cannot be used from here, or
// nil if it can.
func Available(ctx context.Context) error {
	if _, err := exec.LookPath("docker"); err != nil {
		return errors.New("no docker command on PATH")
	}
	if _, err := docker(ctx, "version", "--format", "{{.Server.Version}}"); err != nil {
		return fmt.Errorf("no Docker engine answering: %w", err)
	}
	return nil
}

// dockerfile is the test image: the static felix binary on an empty
// base, run as root so that it reads the certificates the test writes
// and bind-mounts (deploy/Dockerfile is the image for production).
const dockerfile = `FROM scratch
COPY felix /felix
ENTRYPOINT ["/felix"]
`

// BuildImage builds `felix` from the code under test (static, CGO off)
// and an image of it FROM scratch, tagged felix-dockertest:<hash of the
// binary>; an image of that tag that already exists is reused. dir is a
// scratch directory for the build context. Nothing is pulled.
func BuildImage(ctx context.Context, dir string) (string, error) {
	bin, err := cluster.BuildFelix(ctx, dir)
	if err != nil {
		return "", err
	}
	f, err := os.Open(bin)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	_, err = io.Copy(h, f)
	f.Close()
	if err != nil {
		return "", fmt.Errorf("dockertest: hash %s: %w", bin, err)
	}
	tag := "felix-dockertest:" + hex.EncodeToString(h.Sum(nil))[:16]
	if _, err := docker(ctx, "image", "inspect", "--format", "{{.Id}}", tag); err == nil {
		return tag, nil
	}
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		return "", err
	}
	if _, err := docker(ctx, "build", "--quiet", "--label", label+"=image", "-t", tag, dir); err != nil {
		return "", fmt.Errorf("dockertest: build image: %w", err)
	}
	pruneImages(ctx, tag)
	return tag, nil
}

// pruneImages removes the images of earlier builds (other code), so that
// they do not pile up: one per change of the code. An image a container
// still uses stays (docker refuses).
func pruneImages(ctx context.Context, keep string) {
	out, err := docker(ctx, "images", "--filter", "label="+label, "--format", "{{.Repository}}:{{.Tag}}")
	if err != nil {
		return
	}
	for _, img := range strings.Fields(out) {
		if img != keep && strings.HasPrefix(img, "felix-dockertest:") {
			_, _ = docker(ctx, "rmi", img) // best effort
		}
	}
}

// label marks every image, network and container this package creates,
// with the run's id as value, so that leftovers of a run killed before
// its cleanup can be found (`docker ps -a --filter label=felix.dockertest`).
const label = "felix.dockertest"
