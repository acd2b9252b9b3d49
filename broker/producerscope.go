package broker

import (
	"strings"

	"github.com/felix-broker/felix/transport"
)

// Producer ids are scoped by principal. An idempotent publisher picks
// its producer id, and every subscriber of the stream sees it on the
// records: kept as given, any principal allowed to publish to the stream
// could publish under another's id the sequence that one sends next,
// which would then be answered as a duplicate and never written (a
// review reproduced it). The broker a client publishes through keeps the
// id under the client's principal (scopeProducer): its name, a NUL, the
// id. Owners, replicas and logs hold the scoped id; what a client reads
// (records, errors) names the id it gave (producerName). A principal's
// name holds no NUL (transport.CertIdentity), so the first NUL ends it.
// Records written before ids were scoped hold none, and are their own.

// scopeProducer returns the id a client of principal is kept under for
// the producer id it gave.
func scopeProducer(principal, id string) string { return principal + "\x00" + id }

// producerName returns the producer id a client gave, for the id the
// broker keeps.
func producerName(id string) string {
	if _, given, ok := strings.Cut(id, "\x00"); ok {
		return given
	}
	return id
}

// maxScopedProducerID bounds a forwarded record's producer id: a scoped
// one.
const maxScopedProducerID = transport.MaxNameLen + 1 + transport.MaxProducerIDLen // the principal, a NUL, the id
