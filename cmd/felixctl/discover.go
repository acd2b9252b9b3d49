package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/transport"
)

// target is the cluster a command talks to, as discovery found it.
type target struct {
	source   string // where it was found, for messages: "felix-cluster.json", "--broker"
	caFile   string
	certFile string // the client certificate and its key
	keyFile  string
	brokers  []client.ClusterBroker // Broker mode: one, with no ID
	context  string                 // the context it came from, if any
	file     *client.ClusterFile    // the connection file, if it came from one
}

// discover finds the cluster. First match wins: the flags --broker,
// --cluster, --context; the environment FELIX_BROKER, FELIX_CLUSTER,
// FELIX_CONTEXT; the connection file in the working directory; the
// selected context. --cert/--cert-key (FELIX_CERT, FELIX_CERT_KEY) beat
// the certificate of whichever source was found, as --ca (FELIX_CA) beats
// its CA.
func (g *clientFlags) discover(a *app) (*target, error) {
	t, err := g.discoverBrokers(a)
	if err != nil {
		return nil, err
	}
	// Each of the pair from its flag, else from its variable: --cert with
	// FELIX_CERT_KEY, or FELIX_CERT with --cert-key, is a pair too.
	cert := cmp.Or(g.Cert, a.getenv("FELIX_CERT"))
	key := cmp.Or(g.CertKey, a.getenv("FELIX_CERT_KEY"))
	switch {
	case cert != "":
		t.certFile, t.keyFile = cert, key
	case g.CertKey != "":
		// Not paired with the certificate of the source found: a key is
		// given for a certificate given with it.
		return nil, usagef("--cert-key %s needs its certificate: add --cert FILE (or set FELIX_CERT)", g.CertKey)
	}
	if t.certFile == "" {
		return nil, usagef("%s names no client certificate: add --cert FILE --cert-key FILE (or set FELIX_CERT and FELIX_CERT_KEY); after `felix dev` they are felix-dev/certs/admin.crt and admin.key", t.source)
	}
	if t.keyFile == "" {
		return nil, usagef("--cert %s needs its private key: add --cert-key FILE (or set FELIX_CERT_KEY)", t.certFile)
	}
	if _, err := transport.LoadKeyPair(t.certFile, t.keyFile); err != nil {
		return nil, fmt.Errorf("cannot use %s and %s as the client certificate: %w", t.certFile, t.keyFile, err)
	}
	return t, nil
}

func (g *clientFlags) discoverBrokers(a *app) (*target, error) {
	ca := g.CA
	if ca == "" {
		ca = a.getenv("FELIX_CA")
	}
	switch {
	case g.Broker != "":
		return brokerTarget(g.Broker, ca, "--broker")
	case g.Cluster != "":
		return fileTarget(g.Cluster, ca, "--cluster")
	case g.ContextName != "":
		return contextTarget(a, g.ContextName, ca, "--context")
	case a.getenv("FELIX_BROKER") != "":
		return brokerTarget(a.getenv("FELIX_BROKER"), ca, "FELIX_BROKER")
	case a.getenv("FELIX_CLUSTER") != "":
		return fileTarget(a.getenv("FELIX_CLUSTER"), ca, "FELIX_CLUSTER")
	case a.getenv("FELIX_CONTEXT") != "":
		return contextTarget(a, a.getenv("FELIX_CONTEXT"), ca, "FELIX_CONTEXT")
	}
	if _, err := os.Stat(client.DefaultClusterFile); err != nil {
		if dir, err := configDir(a); err == nil {
			if name := selectedContext(dir); name != "" {
				return contextTarget(a, name, ca, "")
			}
		}
	}
	return fileTarget(client.DefaultClusterFile, ca, "")
}

// contextTarget is the saved context name; source says how it was named
// ("" when it is the selected one).
func contextTarget(a *app, name, ca, source string) (*target, error) {
	dir, err := configDir(a)
	if err != nil {
		return nil, err
	}
	sc, err := loadContext(dir, name)
	if err != nil {
		if source == "" {
			return nil, fmt.Errorf("the selected context is gone: %w (select another with `felixctl context use NAME`)", err)
		}
		return nil, err
	}
	if ca == "" {
		ca = sc.CA
	}
	var t *target
	if sc.Cluster != "" {
		t, err = fileTarget(sc.Cluster, ca, "context "+name)
	} else {
		t, err = brokerTarget(sc.Broker, ca, "context "+name)
	}
	if err != nil {
		return nil, err
	}
	if sc.Cert != "" {
		t.certFile, t.keyFile = sc.Cert, sc.CertKey
	}
	t.context = name
	return t, nil
}

func brokerTarget(addr, ca, source string) (*target, error) {
	if ca == "" {
		return nil, usagef("%s needs the cluster CA certificate to verify the broker with: add --ca FILE (or set FELIX_CA); after `felix dev` it is felix-dev/certs/ca.crt", source)
	}
	if err := checkCA(ca); err != nil {
		return nil, err
	}
	return &target{source: source, caFile: ca, brokers: []client.ClusterBroker{{Addr: addr}}}, nil
}

// fileTarget reads the connection file at path; source says where the path
// came from ("" for the default).
func fileTarget(path, ca, source string) (*target, error) {
	cf, err := client.LoadClusterFile(path)
	if errors.Is(err, client.ErrNoClusterFile) {
		return nil, &noFileError{path: path, source: source, err: err}
	}
	if err != nil {
		return nil, err
	}
	if ca == "" {
		ca = cf.CAFile
	}
	if ca != "" {
		if err := checkCA(ca); err != nil {
			return nil, err
		}
	}
	name := path
	if strings.HasPrefix(source, "context ") {
		name = source + " (" + path + ")"
	}
	return &target{source: name, caFile: ca, certFile: cf.CertFile, keyFile: cf.KeyFile, brokers: cf.Brokers, file: cf}, nil
}

// checkCA loads the CA certificate at path once, so that a wrong path or
// file is reported as such rather than as brokers that cannot be reached.
func checkCA(path string) error {
	if _, err := transport.LoadCA(path); err != nil {
		return fmt.Errorf("cannot use %s as the cluster CA certificate: %w (`felix dev` writes it to felix-dev/certs/ca.crt)", path, err)
	}
	return nil
}

// conn is a client connected through one broker of the target.
type conn struct {
	*client.Client
	id   string // broker id, "" when given by address and not in the map
	addr string
}

// connect connects through broker via (an id), or through whichever
// broker of the target answers first when via is empty.
func (g *clientFlags) connect(ctx context.Context, a *app, via string) (*conn, error) {
	t, err := g.discover(a)
	if err != nil {
		return nil, err
	}
	if via == "" {
		return g.connectAny(ctx, a, t)
	}
	if b, ok := t.find(via); ok {
		c, err := g.dial(ctx, a, t, b)
		if err != nil {
			return nil, g.whyNot(ctx, a, t, b, nil, err)
		}
		return c, nil
	}
	// The id is not in the file (or there is no file): ask the cluster.
	home, err := g.connectAny(ctx, a, t)
	if err != nil {
		return nil, err
	}
	defer home.Close()
	m, err := home.Map(ctx)
	if err != nil {
		return nil, &brokerError{ID: home.id, Addr: home.addr, Err: err}
	}
	node, ok := m.Node(via)
	if !ok {
		var ids []string
		for _, n := range m.Nodes {
			ids = append(ids, n.ID)
		}
		return nil, usagef("--via %s: the cluster has no broker %s; its brokers are %s", via, via, strings.Join(ids, ", "))
	}
	b := client.ClusterBroker{ID: node.ID, Addr: node.Addr}
	c, err := g.dial(ctx, a, t, b)
	if err != nil {
		return nil, g.whyNot(ctx, a, t, b, home, err)
	}
	return c, nil
}

// whyNot adds to the error of dialing broker b what the rest of the
// cluster says about it: whether another broker answers (through home,
// when already connected), and whether the control plane has b down.
func (g *clientFlags) whyNot(ctx context.Context, a *app, t *target, b client.ClusterBroker, home *conn, err error) error {
	be := &brokerError{ID: b.ID, Addr: b.Addr, Err: err}
	var dialErr *client.DialError
	if !errors.As(err, &dialErr) || tlsProblem(err) || dnsProblem(err) != nil || b.ID == "" {
		return be
	}
	if home == nil {
		others := &target{source: t.source, caFile: t.caFile, certFile: t.certFile, keyFile: t.keyFile}
		for _, o := range t.brokers {
			if o.ID != b.ID {
				others.brokers = append(others.brokers, o)
			}
		}
		if len(others.brokers) == 0 {
			return be
		}
		h, herr := g.connectAny(ctx, a, others)
		if herr != nil {
			return be
		}
		defer h.Close()
		home = h
	}
	be.othersUp = home.id
	if home.id == "" {
		be.othersUp = home.addr
	}
	if m, merr := home.Map(ctx); merr == nil {
		if n, ok := m.Node(b.ID); ok {
			be.known, be.live = true, n.Live
		}
	}
	return be
}

// dnsProblem returns the DNS error in err's chain, if any: a name that
// does not resolve from this host.
func dnsProblem(err error) *net.DNSError {
	var d *net.DNSError
	if errors.As(err, &d) {
		return d
	}
	return nil
}

func (t *target) find(id string) (client.ClusterBroker, bool) {
	i := slices.IndexFunc(t.brokers, func(b client.ClusterBroker) bool { return b.ID == id })
	if i < 0 {
		return client.ClusterBroker{}, false
	}
	return t.brokers[i], true
}

// dial connects to broker b of t.
func (g *clientFlags) dial(ctx context.Context, a *app, t *target, b client.ClusterBroker) (*conn, error) {
	opts := []client.Opt{client.WithLogger(a.log), client.WithDialTimeout(g.DialTimeout)}
	if t.caFile != "" {
		opts = append(opts, client.WithCAFile(t.caFile))
	}
	opts = append(opts, client.WithClientCertFile(t.certFile, t.keyFile))
	cl, err := client.Connect(ctx, b.Addr, opts...)
	if err != nil {
		return nil, &brokerError{ID: b.ID, Addr: b.Addr, Err: err}
	}
	id := b.ID
	if id == "" {
		id = g.idOf(ctx, cl, b.Addr)
	}
	return &conn{Client: cl, id: id, addr: b.Addr}, nil
}

// idOf finds the id of the broker at addr in the map it serves.
func (g *clientFlags) idOf(ctx context.Context, cl *client.Client, addr string) string {
	m, err := cl.Map(ctx)
	if err != nil {
		return ""
	}
	for _, n := range m.Nodes {
		if n.Addr == addr {
			return n.ID
		}
	}
	return ""
}

// connectAny dials every broker of t at once and keeps the first listed
// that answers, so that one broker down costs no dial timeout.
func (g *clientFlags) connectAny(ctx context.Context, a *app, t *target) (*conn, error) {
	if len(t.brokers) == 1 {
		c, err := g.dial(ctx, a, t, t.brokers[0])
		if err != nil {
			var b *brokerError
			errors.As(err, &b)
			return nil, &noBrokerError{source: t.source, errs: []*brokerError{b}}
		}
		return c, nil
	}
	results := make(chan dialResult, len(t.brokers))
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, b := range t.brokers {
		go func() {
			c, err := g.dial(dctx, a, t, b)
			results <- dialResult{i, c, err}
		}()
	}
	// Prefer the first broker in the file's order, but do not wait out the
	// dial timeout of a broker that is down: once one answered, the ones
	// listed before it get a short grace.
	var (
		got    = make([]*dialResult, len(t.brokers))
		grace  <-chan time.Time
		chosen *conn
	)
	best := func() (int, bool) { // lowest answered index, and whether all before it failed
		for i, r := range got {
			if r == nil {
				return -1, false
			}
			if r.err == nil {
				return i, true
			}
		}
		return -1, true
	}
	for n := 0; n < len(t.brokers); {
		select {
		case r := <-results:
			got[r.i] = &r
			n++
			if r.err == nil && grace == nil {
				grace = time.After(100 * time.Millisecond)
			}
		case <-grace:
			n = len(t.brokers) // stop waiting
			continue
		}
		if i, settled := best(); settled {
			if i >= 0 {
				chosen = got[i].c
			}
			break
		}
	}
	if chosen == nil {
		for _, r := range got {
			if r != nil && r.err == nil {
				chosen = r.c
				break
			}
		}
	}
	cancel()
	var errs []*brokerError
	for n := countDone(got); n < len(t.brokers); n++ {
		r := <-results
		got[r.i] = &r
	}
	for _, r := range got {
		if r.c != nil && r.c != chosen {
			r.c.Close()
		}
		var b *brokerError
		if errors.As(r.err, &b) {
			errs = append(errs, b)
		}
	}
	if chosen == nil {
		return nil, &noBrokerError{source: t.source, errs: errs}
	}
	return chosen, nil
}

// dialResult is the outcome of dialing the i-th broker of a target.
type dialResult struct {
	i   int
	c   *conn
	err error
}

func countDone(got []*dialResult) int {
	n := 0
	for _, r := range got {
		if r != nil {
			n++
		}
	}
	return n
}
