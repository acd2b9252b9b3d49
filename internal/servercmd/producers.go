package servercmd

import (
	"time"

	"github.com/felix-broker/felix/broker"
)

// BrokerProducers are the flags bounding what each shard's owner
// remembers of idempotent producers (see the fields of broker.Config of
// the same names). Their defaults are broker's.
type BrokerProducers struct {
	MaxProducers         int           `help:"Most idempotent producers each open shard remembers; past it the least recently used is forgotten (a retry of its records is then written again)." default:"10000" env:"FELIX_MAX_PRODUCERS"`
	ProducerExpiry       time.Duration `help:"How long a shard remembers an idempotent producer that publishes nothing to it; a retry later than this is written again." default:"15m" env:"FELIX_PRODUCER_EXPIRY"`
	ProducerWindow       int           `help:"How many of each idempotent producer's latest records a shard keeps the acks of: a retry of one of them gets its original ack, of an older one duplicate_sequence. Keep it at least the clients' in-flight window." default:"256" env:"FELIX_PRODUCER_WINDOW"`
	ProducerRebuildBytes int64         `help:"Most bytes of a shard's newest records read, when its log opens, to learn its idempotent producers again (records older than --producer-expiry are not read)." default:"67108864" env:"FELIX_PRODUCER_REBUILD_BYTES"`
}

// apply sets the bounds in cfg and returns it.
func (p BrokerProducers) apply(cfg broker.Config) broker.Config {
	cfg.MaxProducers = p.MaxProducers
	cfg.ProducerExpiry = p.ProducerExpiry
	cfg.ProducerWindow = p.ProducerWindow
	cfg.ProducerRebuildBytes = p.ProducerRebuildBytes
	return cfg
}
