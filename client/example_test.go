package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/felix-broker/felix/client"
)

// Connect to a broker, create a stream, publish a record and read it back.
// It needs a running cluster (felix dev), so it has no Output line.
func Example() {
	ctx := context.Background()
	c, err := client.Connect(ctx, "localhost:7100", client.WithCAFile("ca.crt"),
		client.WithClientCertFile("admin.crt", "admin.key"))
	if err != nil {
		log.Fatal(err) // the message says what to check: the address, the CA
	}
	defer c.Close()
	err = c.CreateStream(ctx, client.StreamConfig{Name: "orders", Shards: 3})
	if err != nil && !errors.Is(err, client.ErrStreamExists) {
		log.Fatal(err)
	}
	ack, err := c.Publish(ctx, "orders", []byte("customer-42"), []byte("hello"))
	if errors.Is(err, client.ErrUnavailable) {
		log.Fatal("the shard's owner is down: ", err)
	} else if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ack.Stream, ack.Shard, ack.Offset, ack.Owner)
	sub, err := c.Subscribe(ctx, "orders", client.Earliest())
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Stop()
	for rec, err := range sub.Records(ctx) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(rec.Shard, rec.Offset, string(rec.Value))
		break
	}
}
