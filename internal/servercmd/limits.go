package servercmd

import (
	"time"

	"github.com/felix-broker/felix/broker"
)

// BrokerLimits are the flags of a broker's client resource limits (see the
// fields of broker.Config of the same names for what each bounds). Their
// defaults are broker's.
type BrokerLimits struct {
	MaxRecordBytes                int           `help:"Largest record (key, value, headers and producer id), in bytes, at most 33554432 (32 MiB); a larger one is refused with payload_too_large, whatever its frame size." default:"1048576" env:"FELIX_MAX_RECORD_BYTES"`
	MaxHeaders                    int           `help:"Most headers on one record (more: invalid)." default:"64" env:"FELIX_MAX_HEADERS"`
	MaxHeaderBytes                int           `help:"Most bytes of header names and values on one record (more: payload_too_large)." default:"16384" env:"FELIX_MAX_HEADER_BYTES"`
	MaxConns                      int           `help:"Most client connections to this broker (peers are not counted)." default:"4096" env:"FELIX_MAX_CONNS"`
	MaxConnsPerPrincipal          int           `help:"Most client connections of one principal (client certificate name)." default:"64" env:"FELIX_MAX_CONNS_PER_PRINCIPAL"`
	MaxStreamsPerConn             int           `help:"Most open streams on one client connection." default:"256" env:"FELIX_MAX_STREAMS_PER_CONN"`
	FirstFrameTimeout             time.Duration `help:"Close a stream that sends no frame within this long of opening." default:"10s" env:"FELIX_FIRST_FRAME_TIMEOUT"`
	MaxSubsPerConn                int           `help:"Most subscriptions on one client connection." default:"128" env:"FELIX_MAX_SUBS_PER_CONN"`
	MaxCredit                     int           `help:"Most outstanding credit of one subscription, in records." default:"65536" env:"FELIX_MAX_CREDIT"`
	SubscriptionBytes             int           `help:"Most record bytes one subscription reads and holds at once (one Records frame; at most the frame limit, 4 MiB or more, less the framing of 512 records)." default:"1048576" env:"FELIX_SUBSCRIPTION_BYTES"`
	SubscriptionBytesPerPrincipal int           `help:"Most record bytes all the subscriptions of one principal hold at once." default:"67108864" env:"FELIX_SUBSCRIPTION_BYTES_PER_PRINCIPAL"`
	PublishInFlight               int           `help:"Most records one publisher stream may have in flight or answered and not yet written; past it the broker stops reading the stream." default:"4096" env:"FELIX_PUBLISH_IN_FLIGHT"`
	PublishBytesPerPrincipal      int           `help:"Most bytes of records in flight (plus 512 per unwritten answer) over all the publisher streams of one principal." default:"67108864" env:"FELIX_PUBLISH_BYTES_PER_PRINCIPAL"`
	TailBytes                     int           `help:"Most bytes of recent records each shard keeps in memory for live subscribers." default:"1048576" env:"FELIX_TAIL_BYTES"`
}

// apply sets the limits in cfg and returns it.
func (l BrokerLimits) apply(cfg broker.Config) broker.Config {
	cfg.MaxPayload = l.MaxRecordBytes
	cfg.MaxHeaders = l.MaxHeaders
	cfg.MaxHeaderBytes = l.MaxHeaderBytes
	cfg.MaxConns = l.MaxConns
	cfg.MaxConnsPerPrincipal = l.MaxConnsPerPrincipal
	cfg.MaxStreamsPerConn = l.MaxStreamsPerConn
	cfg.FirstFrameTimeout = l.FirstFrameTimeout
	cfg.MaxSubsPerConn = l.MaxSubsPerConn
	cfg.MaxCredit = l.MaxCredit
	cfg.SubscriptionBytes = l.SubscriptionBytes
	cfg.SubscriptionBytesPerPrincipal = l.SubscriptionBytesPerPrincipal
	cfg.PublishInFlight = l.PublishInFlight
	cfg.PublishBytesPerPrincipal = l.PublishBytesPerPrincipal
	cfg.TailBytes = l.TailBytes
	return cfg
}
