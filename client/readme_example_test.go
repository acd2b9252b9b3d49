package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"testing"

	"github.com/felix-broker/felix/client"
)

// ExampleConnectFile is the README's example: connect through the file
// `felix dev` writes, publish, and read the stream from the start, failing
// with the SDK's own sentence (run outside a `felix dev` directory: "client:
// no cluster connection file: felix-cluster.json does not exist (is `felix
// dev` running in this directory?)"). It needs a running cluster, so it has
// no Output line; the test below keeps the README's copy identical to this
// one, and TestConnectFileOutsideDevDir checks that sentence.
func ExampleConnectFile() {
	ctx := context.Background()
	// README:begin
	c, err := client.ConnectFile(ctx, "") // reads felix-cluster.json, written by `felix dev`
	if err != nil {
		log.Fatal(err) // a sentence that says what to check
	}
	defer c.Close()
	ack, err := c.Publish(ctx, "orders", []byte("customer-42"), []byte("hello"))
	if err != nil {
		log.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "orders", client.Earliest())
	if err != nil {
		log.Fatal(err)
	}
	for rec, err := range sub.Records(ctx) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("offset %d: %s (ours went to offset %d on %s)\n", rec.Offset, rec.Value, ack.Offset, ack.Owner)
	}
	// README:end
}

func TestREADMEShowsTheExample(t *testing.T) {
	src, err := os.ReadFile("readme_example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	body := string(src)
	begin := strings.Index(body, "// README:begin\n") + len("// README:begin\n")
	end := strings.Index(body, "\t// README:end")
	var want strings.Builder
	for _, line := range strings.Split(strings.TrimRight(body[begin:end], "\n"), "\n") {
		want.WriteString(strings.TrimPrefix(line, "\t") + "\n")
	}
	if !strings.Contains(string(readme), "```go\n"+want.String()+"```\n") {
		t.Errorf("README.md lacks ExampleConnectFile's body as a go block; keep it in step with this:\n%s", want.String())
	}
}

// TestConnectFileOutsideDevDir: run where `felix dev` is not, the README's
// example fails with the SDK's sentence, not a nil dereference.
func TestConnectFileOutsideDevDir(t *testing.T) {
	t.Chdir(t.TempDir())
	c, err := client.ConnectFile(context.Background(), "")
	if c != nil || !errors.Is(err, client.ErrNoClusterFile) {
		t.Fatalf("ConnectFile = %v, %v; want nil and ErrNoClusterFile", c, err)
	}
	const want = "client: no cluster connection file: felix-cluster.json does not exist (is `felix dev` running in this directory?)"
	if err.Error() != want {
		t.Errorf("error = %q\nwant    %q", err, want)
	}
}
