package client_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/felix-broker/felix/client"
)

// ExampleConnectFile is the README's five-line example: connect through the
// file `felix dev` writes, publish, and read the stream from the start. It
// needs a running cluster, so it has no Output line; the test below keeps
// the README's copy identical to this one.
func ExampleConnectFile() {
	ctx := context.Background()
	// README:begin
	c, _ := client.ConnectFile(ctx, "") // reads felix-cluster.json, written by `felix dev`
	ack, _ := c.Publish(ctx, "orders", []byte("customer-42"), []byte("hello"))
	sub, _ := c.Subscribe(ctx, "orders", client.Earliest())
	for rec := range sub.Records(ctx) {
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
	for _, line := range strings.Split(strings.TrimRight(body[begin:end], "\n"), "\n") {
		if !strings.Contains(string(readme), strings.TrimSpace(line)) {
			t.Errorf("README.md lacks the example line %q; keep it in step with ExampleConnectFile", strings.TrimSpace(line))
		}
	}
}
