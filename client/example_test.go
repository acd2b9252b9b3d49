package client_test

import (
	"context"
	"fmt"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/shardmap"
)

// Connect to a broker, create a stream, publish a record and read it back.
// It needs a running cluster (felix dev), so it has no Output line.
func Example() {
	ctx := context.Background()
	c, err := client.Connect(ctx, "localhost:7400", client.WithCAFile("ca.crt"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	_ = c.CreateStream(ctx, shardmap.StreamConfig{Name: "orders", Shards: 3})
	ack, err := c.Publish(ctx, "orders", []byte("customer-42"), []byte("hello"))
	fmt.Println(ack, err)
	sub, err := c.Subscribe(ctx, "orders", client.Earliest())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sub.Stop()
	for rec, err := range sub.Records(ctx) {
		fmt.Println(rec.Shard, rec.Offset, string(rec.Value), err)
		break
	}
}
