package ctlclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/transport"
)

// AdminClient makes admin requests to the control plane on one QUIC
// connection, one stream per request. It is safe for concurrent use.
type AdminClient struct {
	conn *quic.Conn
	addr string
}

// Dial connects to the control plane at addr for admin requests, with a
// node certificate (a broker relaying its clients' requests, each
// naming its principal in transport.Request.Principal) or a ctl
// certificate. tlsConf is normally transport.ClientTLS(ca, &cert, "",
// transport.ALPNCtl); the server must present a control plane
// certificate. ctl refuses client certificates: the first request on
// such a connection fails with CodeUnauthorized (a client makes admin
// requests through a broker).
func Dial(ctx context.Context, addr string, tlsConf *tls.Config, cfg transport.Config) (*AdminClient, error) {
	conn, err := transport.Dial(ctx, addr, transport.VerifyPeer(tlsConf, transport.RoleCtl, ""), cfg)
	if err != nil {
		return nil, fmt.Errorf("ctl: dial %s: %w", addr, err)
	}
	return &AdminClient{conn: conn, addr: addr}, nil
}

// Request sends req and returns ctl's response. A refusal comes back as a
// *transport.Error (compare with errors.Is against transport.ErrStreamExists
// and the other sentinels).
func (c *AdminClient) Request(ctx context.Context, req *transport.Request) (*transport.Response, error) {
	return Request(ctx, c.conn, req)
}

// Close closes the connection.
func (c *AdminClient) Close() error {
	return c.conn.CloseWithError(0, "")
}

// Request runs one admin exchange on a new stream of conn, a connection
// to a ctl: write the request, close the send side, read one Response or
// Error. ctx bounds the whole exchange. A refusal comes back as a
// *transport.Error. [AdminClient.Request] and [Member.Request] use it, and
// so does a ctl forwarding a change to the leader on its own connection.
func Request(ctx context.Context, conn *quic.Conn, req *transport.Request) (*transport.Response, error) {
	if req == nil {
		return nil, errors.New("ctl: request: nil request")
	}
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return nil, fmt.Errorf("ctl: request %s: open stream: %w", req.Op, ctxErr(ctx, err))
	}
	// Cancel the stream's reads and writes when ctx ends; this also
	// releases the stream on every return path.
	stop := context.AfterFunc(ctx, func() {
		str.CancelWrite(streamCodeDone)
		str.CancelRead(streamCodeDone)
	})
	defer func() {
		if stop() {
			str.CancelRead(streamCodeDone)
		}
	}()
	if err := transport.NewWriter(str).Write(req); err != nil {
		return nil, fmt.Errorf("ctl: request %s: %w", req.Op, ctxErr(ctx, err))
	}
	// ctl may answer and stop reading before the FIN is sent, which makes
	// Close fail; the request was written whole, so read the answer.
	_ = str.Close()
	f, err := transport.NewReader(str, MaxMapFrame).Read()
	if err != nil {
		return nil, fmt.Errorf("ctl: request %s: read response: %w", req.Op, ctxErr(ctx, err))
	}
	switch f := f.(type) {
	case *transport.Response:
		return f, nil
	case *transport.Error:
		return nil, f
	}
	return nil, fmt.Errorf("ctl: request %s: %w", req.Op, transport.Errorf(transport.CodeUnexpectedFrame, "answer is a %v frame, not a response", f.Type()))
}

// ctxErr prefers ctx's error to the stream error its cancellation caused,
// and returns ctl's refusal of the connection (a client certificate,
// CodeUnauthorized) as the *transport.Error ctl closed it with.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if we := transport.ClosedWith(err); we != nil && we.Code == transport.CodeUnauthorized {
		return we
	}
	return err
}
