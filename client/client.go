package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// Client is a connection to a Felix cluster through one broker (the one
// given to [Connect]), plus connections to the owners of the shards it
// subscribes to. It is safe for concurrent use. Close it when done.
type Client struct {
	cfg config
	tel *telemetry
	// home is the connection to the broker publishes and requests go
	// through: the one given to Connect, until it fails every dial for
	// WithHomeFailover (moveHome, home.go).
	home atomic.Pointer[brokerConn]

	// ctx ends when the client is closed; dials and waits select on it.
	ctx    context.Context
	cancel context.CancelFunc
	closed atomic.Bool

	// shardMap is the newest shard map seen, nil before the first; only
	// storeMap sets it.
	shardMap atomic.Pointer[shardmap.Map]
	// maps serializes storeMap, so that two maps of different clusters
	// arriving at once cannot undo each other's judgment.
	maps struct {
		sync.Mutex
		left map[string]bool // the clusters whose maps the client replaced by another cluster's
	}
	// connsEnded counts the connections to brokers that ended other than
	// by the client's choice (watchEnd); mapFetched is its count when the
	// shard map was last fetched after one ended. While they differ, the
	// map is fetched before the next publisher picks a shard by it
	// (catchUpMap): a broker lost may have come back with another map.
	connsEnded, mapFetched atomic.Uint64
	// mapNamed is the newest map epoch a broker named in refusing a
	// record of a stream it does not hold as this client does (deleted,
	// or created again), or in the ack of a record it placed by that map:
	// the shard map is fetched before the next publisher picks a shard by
	// it (catchUpMap).
	mapNamed atomic.Uint64
	// mapTaken wakes idleCloser when a new shard map is taken
	// (idleconns.go). Capacity one.
	mapTaken chan struct{}

	// leaving guards until: the brokers that said they are shutting
	// down, and until when they are skipped (brokerLeaving, home.go).
	leaving struct {
		sync.Mutex
		until map[string]time.Time
	}

	// pub carries Client.Publish and Client.PublishAsync.
	pub *Publisher

	// mu guards the registries Close walks to stop everything.
	mu struct {
		sync.Mutex
		conns      map[string]*brokerConn
		publishers map[*Publisher]struct{}
		subs       map[*Subscription]struct{}
		// extra are the subscriptions' own connections (subconns.go),
		// retired the counters of those closed, by address.
		extra   map[*brokerConn]struct{}
		retired map[string]ConnStats
	}
	// wg counts the client's goroutines: a reader and a flusher per
	// publish stream, one per subscribed shard, and idleCloser.
	wg sync.WaitGroup
}

// Connect connects to the Felix broker at addr ("host:port") and returns a
// client of the cluster it belongs to. Any broker serves: publishes are
// forwarded to the shard's owner, subscriptions follow the shard map.
//
// The broker is verified against the cluster CA given with [WithCA] or
// [WithCAFile]; one of them is required unless [WithInsecure] is given.
// The client presents the certificate given with [WithClientCert] or
// [WithClientCertFile] (required): its name is the principal whose
// permissions every operation is checked against.
// Connect returns once the broker has answered the client's first request
// (for the shard map) on the connection, or the dial timeout
// ([WithDialTimeout]) has passed without an answer; it fails if ctx ends,
// if the dial fails, or if the broker refuses the connection (a
// [*DialError]: errors.Is(err, [ErrLimitExceeded]) when the principal has
// as many connections to the broker as it allows, [ErrUnauthorized] for a
// certificate that is not a client's).
func Connect(ctx context.Context, addr string, opts ...Opt) (*Client, error) {
	cfg := newConfig(opts)
	if !cfg.insecure && cfg.ca == nil {
		if cfg.caFile == "" {
			return nil, fmt.Errorf("client: connect to %s: no cluster CA to verify the broker with: pass WithCA or WithCAFile (or WithInsecure, for development only)", addr)
		}
		pool, err := transport.LoadCA(cfg.caFile)
		if err != nil {
			return nil, fmt.Errorf("client: connect to %s: %w", addr, err)
		}
		cfg.ca = pool
	}
	if cfg.cert == nil {
		if cfg.certFile == "" {
			return nil, fmt.Errorf("client: connect to %s: no client certificate: brokers accept only clients with a certificate from the cluster CA; pass WithClientCert or WithClientCertFile (`felix dev` writes admin.crt and admin.key, named in felix-cluster.json)", addr)
		}
		cert, err := transport.LoadKeyPair(cfg.certFile, cfg.keyFile)
		if err != nil {
			return nil, fmt.Errorf("client: connect to %s: %w", addr, err)
		}
		cfg.cert = &cert
	}
	tel, err := newTelemetry(&cfg)
	if err != nil {
		return nil, fmt.Errorf("client: connect to %s: metrics: %w", addr, err)
	}
	c := &Client{cfg: cfg, tel: tel}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.mu.conns = map[string]*brokerConn{}
	c.mu.publishers = map[*Publisher]struct{}{}
	c.mu.subs = map[*Subscription]struct{}{}
	c.mu.extra = map[*brokerConn]struct{}{}
	c.mu.retired = map[string]ConnStats{}
	c.mapTaken = make(chan struct{}, 1)
	c.wg.Add(1)
	go c.idleCloser()
	home, _ := c.conn(addr)
	c.home.Store(home)
	c.pub = newPublisher(c, "")
	if _, err := home.get(ctx); err != nil {
		c.Close()
		return nil, err
	}
	// A broker refuses a connection only once the handshake is done (it
	// closes it with limit_exceeded or unauthorized): the answer to the
	// first request says whether it took it. Otherwise the map is best
	// effort: it picks the shard of keyless records (one per publisher:
	// Publisher.keylessShard) and routes subscriptions, and whatever
	// needs it fetches it again if this fails. fetchMap bounds it by the
	// request timeout: a broker that took the handshake and never
	// answers does not hold Connect.
	_, err = c.refreshMap(ctx)
	var derr *DialError
	if errors.As(err, &derr) {
		c.Close()
		return nil, derr
	}
	if err != nil {
		cfg.logger.Debug("client: no shard map yet", "broker", addr, "err", err)
	}
	return c, nil
}

// Close stops every publisher and subscription of the client, closes its
// connections and waits for its goroutines to end. Records in flight fail
// with an error matching [ErrClosed] (their outcome is unknown: call Flush
// first to wait for them). Calls after Close fail with ErrClosed. Close is
// idempotent and always returns nil.
func (c *Client) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		c.wg.Wait()
		return nil
	}
	c.cancel()
	c.mu.Lock()
	pubs := make([]*Publisher, 0, len(c.mu.publishers)+1)
	for p := range c.mu.publishers {
		pubs = append(pubs, p)
	}
	subs := make([]*Subscription, 0, len(c.mu.subs))
	for s := range c.mu.subs {
		subs = append(subs, s)
	}
	conns := make([]*brokerConn, 0, len(c.mu.conns)+len(c.mu.extra))
	for _, b := range c.mu.conns {
		conns = append(conns, b)
	}
	for b := range c.mu.extra {
		conns = append(conns, b)
	}
	c.mu.Unlock()

	for _, s := range subs {
		s.stop(nil)
	}
	c.pub.shutdown()
	for _, p := range pubs {
		p.shutdown()
	}
	for _, b := range conns {
		b.close()
	}
	c.wg.Wait()
	c.tel.later.Close()
	return nil
}

// track registers a publisher or subscription so Close stops it; it fails
// with ErrClosed on a closed client.
func (c *Client) track(p *Publisher, s *Subscription) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return ErrClosed
	}
	if p != nil {
		c.mu.publishers[p] = struct{}{}
	}
	if s != nil {
		c.mu.subs[s] = struct{}{}
	}
	return nil
}

func (c *Client) untrack(p *Publisher, s *Subscription) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.mu.publishers, p)
	delete(c.mu.subs, s)
}

// cachedMap returns the newest shard map seen, or nil.
func (c *Client) cachedMap() *shardmap.Map { return c.shardMap.Load() }

// storeMap keeps m if it supersedes the cached map (supersedes), and
// returns the map the client has then.
func (c *Client) storeMap(m *shardmap.Map) *shardmap.Map {
	if m == nil {
		return c.cachedMap()
	}
	c.maps.Lock()
	defer c.maps.Unlock()
	old := c.shardMap.Load()
	if !supersedes(m, old, c.maps.left) {
		return old
	}
	if otherCluster(m, old) {
		if c.maps.left == nil {
			c.maps.left = map[string]bool{}
		}
		c.maps.left[old.Cluster] = true
		c.cfg.logger.Warn("client: the brokers serve the shard map of another cluster than the one this client knew (was the cluster rebuilt, its control plane's state lost?); following it, and never the old cluster's again",
			"cluster", m.Cluster, "epoch", m.Epoch, "was_cluster", old.Cluster, "was_epoch", old.Epoch)
	}
	c.shardMap.Store(m)
	c.tookMap()
	return m
}

// supersedes reports whether the client takes m in place of old, its
// cached map (nil before the first). Within one cluster the epoch
// decides: only a newer map replaces the cached one, so a replayed or
// lagging broker's map never rolls the client back. A map of another
// cluster than old's (both name theirs, and the names differ) is taken
// whatever its epoch: the cluster was rebuilt (its control plane lost its
// state, made a new ID, and starts its epochs over), or the brokers the
// client reaches now serve another cluster; the cached map's epoch says
// nothing of its. But never a map of a cluster the client has left
// (left): a broker still serving the old cluster's maps does not take it
// back. A map that names no cluster (from a control plane older than
// cluster IDs) is judged by its epoch alone, as is any map compared with
// one that names none.
func supersedes(m, old *shardmap.Map, left map[string]bool) bool {
	switch {
	case old == nil:
		return true
	case m.Cluster != "" && left[m.Cluster]:
		return false
	case otherCluster(m, old):
		return true
	}
	return m.NewerThan(old)
}

// otherCluster reports whether m and old both name their cluster, and
// not the same one.
func otherCluster(m, old *shardmap.Map) bool {
	return old != nil && m.Cluster != "" && old.Cluster != "" && m.Cluster != old.Cluster
}

// catchUpMap fetches the shard map once if a broker named a newer one
// than the cached map (mapNamed), and until a fetch succeeds after a
// connection to a broker ended (connsEnded): the cluster may have been
// rebuilt meanwhile, its new map of a lower epoch than the cached one
// (supersedes), and nothing else would fetch it. A failure leaves the
// cached map: the broker judges the record by its own, and refuses it
// again if need be.
func (c *Client) catchUpMap(ctx context.Context) {
	named, ended := c.mapNamed.Load(), c.connsEnded.Load()
	if named == 0 && ended == c.mapFetched.Load() {
		return
	}
	if m := c.cachedMap(); m == nil || m.Epoch < named || ended != c.mapFetched.Load() {
		if _, err := c.refreshMap(ctx); err == nil {
			raise(&c.mapFetched, ended)
		}
	}
	c.mapNamed.CompareAndSwap(named, 0)
}

// raise sets v to epoch if that is more.
func raise(v *atomic.Uint64, epoch uint64) {
	for {
		old := v.Load()
		if epoch <= old || v.CompareAndSwap(old, epoch) {
			return
		}
	}
}

// refreshMap fetches the shard map from the home broker or, when it cannot
// be reached or does not answer within the request timeout, from the
// other live brokers of the cached map, each within the request timeout.
func (c *Client) refreshMap(ctx context.Context) (*shardmap.Map, error) {
	home := c.homeConn()
	m, err := c.fetchMap(ctx, home)
	if err == nil {
		return c.storeMap(m), nil
	}
	var werr *transport.Error
	if errors.As(err, &werr) || ctx.Err() != nil || c.closed.Load() {
		return nil, err
	}
	if cached := c.cachedMap(); cached != nil {
		for _, n := range cached.Nodes {
			if n.Addr == "" || n.Addr == home.addr || !n.Live {
				continue
			}
			b, cerr := c.conn(n.Addr)
			if cerr != nil {
				return nil, cerr
			}
			if m, err2 := c.fetchMap(ctx, b); err2 == nil {
				return c.storeMap(m), nil
			}
		}
	}
	return nil, err
}

// fetchMap asks broker b for its shard map, waiting no longer than the
// request timeout (WithRequestTimeout): a broker answers map.get from its
// own copy, so one that has not answered by then is stuck, and the
// caller (a subscription's shard goroutine, a publisher, Connect) goes on
// without it rather than waiting as long as b's connection stays up.
func (c *Client) fetchMap(ctx context.Context, b *brokerConn) (*shardmap.Map, error) {
	resp, err := c.boundedRequest(ctx, b, &transport.Request{Op: opMapGet})
	if err != nil {
		return nil, fmt.Errorf("client: getting shard map from %s: %w", b.addr, err)
	}
	if resp.Map == nil {
		return nil, fmt.Errorf("client: getting shard map from %s: %w", b.addr, &transport.Error{Code: transport.CodeInternal, Message: "response carries no map"})
	}
	return resp.Map, nil
}

// boundedRequest sends req to broker b, waiting no longer than the request
// timeout (WithRequestTimeout), for a request the SDK makes on its own
// behalf that b answers from what it holds.
func (c *Client) boundedRequest(ctx context.Context, b *brokerConn, req *transport.Request) (*transport.Response, error) {
	rctx, cancel := context.WithTimeout(ctx, c.cfg.requestTimeout)
	defer cancel()
	resp, err := c.request(rctx, b, req)
	if err != nil && ctx.Err() == nil && rctx.Err() != nil {
		err = fmt.Errorf("no answer within %v (WithRequestTimeout; is the broker overloaded or stuck?): %w", c.cfg.requestTimeout, err)
	}
	return resp, err
}

// mapWith returns a shard map that has stream, refreshing the cached one
// if it does not. It fails with an error matching transport.ErrUnknownStream
// and shardmap.ErrUnknownStream if the cluster does not have it.
func (c *Client) mapWith(ctx context.Context, stream string) (*shardmap.Map, *shardmap.Stream, error) {
	if m := c.cachedMap(); m != nil {
		if st, ok := m.Stream(stream); ok {
			return m, st, nil
		}
	}
	m, err := c.refreshMap(ctx)
	if err != nil {
		return nil, nil, err
	}
	st, ok := m.Stream(stream)
	if !ok {
		return nil, nil, unknownStream(stream, m.Epoch)
	}
	return m, st, nil
}

func unknownStream(stream string, epoch uint64) error {
	return fmt.Errorf("client: stream %q: %w (%w; shard map epoch %d; create it first, check the name, or ask for a grant on it: the map shows only the streams this client's principal has a permission on)",
		stream, &transport.Error{Code: transport.CodeUnknownStream, Message: "no such stream"}, shardmap.ErrUnknownStream, epoch)
}
