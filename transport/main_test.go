package transport

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// echoChildEnv, when set to a certificate directory, makes the test binary
// an echo server process (see startEchoProcess).
const echoChildEnv = "FELIX_TRANSPORT_ECHO_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(echoChildEnv); dir != "" {
		os.Exit(echoChild(dir))
	}
	// Every test closes what it opens; quic-go's goroutines end with the
	// connections and listeners, so nothing is ignored here.
	goleak.VerifyTestMain(m)
}

// echoChild serves ServeEcho with node n1's certificate from dir, prints
// the address, and exits when stdin closes.
func echoChild(dir string) int {
	ca, err := LoadCA(filepath.Join(dir, "ca.crt"))
	if err == nil {
		cert := must(LoadKeyPair(filepath.Join(dir, "n1.crt"), filepath.Join(dir, "n1.key")))
		ctx, cancel := context.WithCancel(context.Background())
		go func() { io.Copy(io.Discard, os.Stdin); cancel() }()
		err = ServeEcho(ctx, "127.0.0.1:0", ServerTLS(cert, ca), Config{}, func(a net.Addr) { fmt.Println(a) })
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// startEchoProcess runs this test binary as an echo server process and
// returns its address; cleanup stops it.
func startEchoProcess(t testing.TB, p *pki) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), echoChildEnv+"="+p.dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("echo process: %v", err)
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("echo process did not report its address: %v", err)
	}
	return strings.TrimSpace(line)
}
