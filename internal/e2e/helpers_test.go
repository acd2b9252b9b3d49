package e2e

import (
	"context"
	"iter"
	"testing"

	"github.com/felix-broker/felix/client"
)

// iterPull returns a function yielding the value of the next record of sub.
func iterPull(ctx context.Context, sub *client.Subscription) (func(t *testing.T) string, func()) {
	next, stop := iter.Pull2(sub.Records(ctx))
	return func(t *testing.T) string {
		t.Helper()
		rec, err, ok := next()
		if !ok {
			t.Fatalf("subscription ended: %v", sub.Err())
		}
		if err != nil {
			t.Fatalf("subscription: %v", err)
		}
		return string(rec.Value)
	}, stop
}
