package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildFelix builds the felix binary into dir and returns its path. Tests
// use it so the brokers they start run the code under test; `felix dev`
// runs its own executable instead.
func BuildFelix(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "felix")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "github.com/felix-broker/felix/cmd/felix")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("cluster: go build felix: %w\n%s", err, b)
	}
	return out, nil
}
