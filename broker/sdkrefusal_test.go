package broker

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
)

// TestSDKOverConnectionLimit: a principal at its MaxConnsPerPrincipal on
// a real broker, which refuses the next connection with limit_exceeded
// (its connection close code). The SDK says so with an error matching
// client.ErrLimitExceeded: Connect fails with it (it succeeded, and its
// publishes failed "connection lost, outcome unknown"), and a
// subscription, which needs connections of its own, ends with it (it
// retried in silence forever).
func TestSDKOverConnectionLimit(t *testing.T) {
	ip := startLimited(t, 1, func(c *Config) { c.MaxConnsPerPrincipal = 1 })
	b := ip.brokers[0]
	a, ctx := sdkClient(t, ip, b) // the principal's one connection
	if _, err := a.Publish(ctx, "orders", nil, []byte("x")); err != nil {
		t.Fatal(err)
	}

	caFile := filepath.Join(ip.dir, "certs", "ca.crt")
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	second, err := client.Connect(cctx, b.Addr().String(), client.WithCAFile(caFile), adminCert(caFile), client.WithLogger(quiet()))
	cancel()
	var derr *client.DialError
	switch {
	case err == nil:
		defer second.Close()
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, perr := second.Publish(pctx, "orders", nil, []byte("y"))
		cancel()
		t.Errorf("Connect over the principal's connection limit succeeded; its Publish: %v (Is(ErrLimitExceeded)=%v, Is(ErrConnectionLost)=%v)",
			perr, errors.Is(perr, client.ErrLimitExceeded), errors.Is(perr, client.ErrConnectionLost))
	case !errors.As(err, &derr) || !errors.Is(err, client.ErrLimitExceeded) || errors.Is(err, client.ErrConnectionLost):
		t.Errorf("Connect over the limit: want a *DialError matching ErrLimitExceeded, got %v", err)
	default:
		t.Logf("Connect over the limit: %v", err)
	}

	sub, err := a.Subscribe(ctx, "orders", client.Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for rec, err := range sub.Records(rctx) {
		switch {
		case err == nil:
			t.Errorf("subscription over the connection limit read %q", rec.Value)
		case !errors.Is(err, client.ErrLimitExceeded):
			t.Errorf("subscription over the connection limit: want ErrLimitExceeded, got %v", err)
		default:
			t.Logf("subscription over the limit: %v", err)
		}
		return
	}
	t.Error("the subscription's iterator ended with no error")
}
