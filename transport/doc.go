// Package transport owns how Felix processes talk to each other: QUIC
// listening and dialing with a tuned [quic.Config], TLS (the cluster CA,
// node and client certificates, mTLS between nodes), and the framing of
// typed msgpack frames on QUIC streams.
//
// It must never know about logs, offsets as anything but numbers, shard
// ownership or routing: those belong to wal, shardmap and broker. A frame
// here is a value that crosses a stream; what it means is decided elsewhere.
//
// # Revocation
//
// [CA.Revoke] keeps the cluster's certificate revocation list, an X.509
// CRL signed by the CA ([CRLFile], crl.pem). A node enforces it with
// [WatchCRL] set as [Config.Revocations]: its [Listener] closes a
// connection whose client certificate is listed with [CodeUnauthorized]
// right after the handshake (the client sees a typed refusal, not a
// handshake failure), [Dial] refuses a listed server certificate, and a
// reload of the file that lists the certificate of a live connection
// closes it the same way. The check is a map lookup per handshake and
// per live connection at a reload, never per frame. Certificates
// themselves are not reloaded.
//
// # Wire format
//
// A frame on a stream is a 4-byte big-endian length N of what follows, one
// byte [FrameType], and N-1 bytes of msgpack body. The body of every frame
// is a msgpack array whose elements are the struct's fields in declaration
// order. A decoder requires the fields the first version of a frame had and
// ignores extra trailing elements, so a field can be added at the end
// without breaking older peers. The hot frames ([Publish], [Ack],
// [Records], [Credit]) and the small ones are encoded by hand without
// reflection; the frames that carry shard-map values ([Request],
// [Response], [MapUpdate]) embed those values as msgpack maps encoded by
// reflection, keyed by the shardmap struct tags.
//
// Decoding validates every length against the bytes actually present, so
// garbage yields an [*Error] with [CodeMalformed] (never a panic) and the
// memory a decode allocates is bounded by a small multiple of the body
// length.
//
// # Usage
//
//	ln, err := transport.Listen(":7100", transport.ServerTLS(cert, ca), cfg)
//	...
//	conn, err := ln.Accept(ctx)
//	if conn.ConnectionState().TLS.NegotiatedProtocol == transport.ALPNPeer {
//		peer, err := transport.PeerNodeID(conn) // mTLS required
//		...
//	}
//	str, err := conn.AcceptStream(ctx)
//	r, w := transport.NewReader(str, cfg.MaxFrame), transport.NewWriter(str)
//	for {
//		f, err := r.Read()
//		...
//		switch f := f.(type) {
//		case *transport.Publish:
//			...
//			w.Buffer(&transport.Ack{Seq: f.Seq, ...})
//		}
//		if !r.Ready() {
//			w.Flush() // many acks, one stream write
//		}
//	}
//
// Wire errors are [*Error] values; compare them with errors.Is against the
// sentinels ([ErrNotOwner], [ErrUnavailable], ...), which match on code.
package transport
