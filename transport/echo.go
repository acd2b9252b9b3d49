package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/quic-go/quic-go"
)

// Echo serves the echo protocol on ln until ctx ends or ln is closed: on
// every stream of every connection it reads frames and writes each back
// unchanged, pipelined frames in one write. On a framing error it writes
// the [*Error] frame back and closes that stream; the connection and its
// other streams carry on. It closes the connections it accepted and waits
// for all its goroutines before returning, with nil after ctx ended or ln
// closed.
//
// It is the floor to measure Felix against: a broker's round trip minus
// the work. A benchmark can run it in its own process to measure the
// cross-process QUIC round trip.
func Echo(ctx context.Context, ln *Listener, maxFrame int) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // runs first: stops every connection, then we wait
	for {
		conn, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, quic.ErrServerClosed) {
				return nil
			}
			return fmt.Errorf("transport: echo: accepting on %s: %w", ln.Addr(), err)
		}
		wg.Go(func() { echoConn(ctx, conn, maxFrame) })
	}
}

func echoConn(ctx context.Context, conn *quic.Conn, maxFrame int) {
	var wg sync.WaitGroup
	defer wg.Wait()
	defer conn.CloseWithError(closeNormal, "echo: done")
	for {
		s, err := conn.AcceptStream(ctx)
		if err != nil {
			return
		}
		wg.Go(func() { echoStream(s, maxFrame) })
	}
}

// Stream error codes echoStream sends in STOP_SENDING / RESET_STREAM.
const (
	streamCodeProtocol = quic.StreamErrorCode(CodeMalformed)
	streamCodeAbort    = quic.StreamErrorCode(CodeInternal)
)

func echoStream(s *quic.Stream, maxFrame int) {
	r, w := NewReader(s, maxFrame), NewWriter(s)
	w.SetMaxFrame(maxFrame)
	for {
		f, err := r.Read()
		if err != nil {
			var werr *Error
			switch {
			case err == io.EOF:
				if w.Flush() == nil {
					s.Close()
					return
				}
			case errors.As(err, &werr):
				// The bytes after a framing error mean nothing: answer,
				// stop reading, close.
				if w.Write(werr) == nil {
					s.CancelRead(streamCodeProtocol)
					s.Close()
					return
				}
			}
			s.CancelRead(streamCodeAbort)
			s.CancelWrite(streamCodeAbort)
			return
		}
		if err := w.Buffer(f); err != nil {
			err = w.Write(ErrorFrom(err))
		} else if !r.Ready() {
			err = w.Flush()
		}
		if err != nil {
			s.CancelRead(streamCodeAbort)
			s.CancelWrite(streamCodeAbort)
			return
		}
	}
}

// ServeEcho listens on addr and serves [Echo] until ctx ends, for a
// process whose only job is to echo (the cross-process round-trip floor).
// ready, if not nil, is called with the bound address once it listens.
func ServeEcho(ctx context.Context, addr string, tlsConf *tls.Config, cfg Config, ready func(net.Addr)) error {
	ln, err := Listen(addr, tlsConf, cfg)
	if err != nil {
		return err
	}
	defer ln.Close()
	if ready != nil {
		ready(ln.Addr())
	}
	return Echo(ctx, ln, cfg.MaxFrame)
}
