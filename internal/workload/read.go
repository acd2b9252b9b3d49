package workload

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/history"
	"github.com/felix-broker/felix/transport"
)

// ReadShards reads every shard of stream through cl from offset 0 up to
// ends[shard] (which must be committed).
func ReadShards(ctx context.Context, cl *client.Client, stream string, ends []uint64) ([][]history.Entry, error) {
	logs := make([][]history.Entry, len(ends))
	for s, end := range ends {
		sub, err := cl.Subscribe(ctx, stream, client.Earliest(), client.Shard(s))
		if err != nil {
			return nil, fmt.Errorf("workload: read %s/%d: %w", stream, s, err)
		}
		for rec, err := range sub.Records(ctx) {
			if err != nil {
				sub.Stop()
				return nil, fmt.Errorf("workload: read %s/%d after %d records: %w", stream, s, len(logs[s]), err)
			}
			logs[s] = append(logs[s], history.Entry{Offset: rec.Offset, Value: string(rec.Value)})
			if rec.Offset >= end {
				break
			}
		}
		sub.Stop()
	}
	return logs, nil
}

// ReadReplica reads shard of stream from offset 0 to end from the broker
// at addr, on a connection to it alone (tlsConf: a client's, verifying
// that broker's node certificate), so that the records come from its own
// replica: the SDK's subscriptions choose their broker by the map. wait
// bounds the wait for each frame (a restarted replica may still be
// catching up).
func ReadReplica(ctx context.Context, addr string, tlsConf *tls.Config, stream string, shard int, end uint64, wait time.Duration) ([]history.Entry, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := transport.Dial(dctx, addr, tlsConf, transport.Config{})
	if err != nil {
		return nil, fmt.Errorf("workload: dial %s: %w", addr, err)
	}
	defer conn.CloseWithError(0, "done")
	s, err := conn.OpenStreamSync(dctx)
	if err != nil {
		return nil, fmt.Errorf("workload: open a stream to %s: %w", addr, err)
	}
	defer s.Close()
	defer s.CancelRead(0)
	w, r := transport.NewWriter(s), transport.NewReader(s, 0)
	if err := w.Write(&transport.Subscribe{Stream: stream, Shard: int32(shard), Start: transport.StartEarliest, Credit: 1 << 16}); err != nil {
		return nil, fmt.Errorf("workload: subscribe to %s/%d at %s: %w", stream, shard, addr, err)
	}
	var out []history.Entry
	for {
		s.SetReadDeadline(time.Now().Add(wait))
		f, err := r.Read()
		if err != nil {
			return out, fmt.Errorf("workload: read %s/%d from %s after %d records: %w", stream, shard, addr, len(out), err)
		}
		switch f := f.(type) {
		case *transport.Records:
			for _, rec := range f.Records {
				out = append(out, history.Entry{Offset: rec.Offset, Value: string(rec.Value)})
				if rec.Offset >= end {
					return out, nil
				}
			}
		case *transport.Error:
			return out, fmt.Errorf("workload: read %s/%d from %s after %d records: %w", stream, shard, addr, len(out), f)
		default:
			return out, fmt.Errorf("workload: read %s/%d from %s: unexpected %T %+v", stream, shard, addr, f, f)
		}
	}
}

// SettleAfterUnknown is how long after a publish of unknown outcome
// returned its record may still be committed: a broker holds a record
// for a leader for up to its ForwardTimeout (10 s by default), then
// proposes it; with a margin.
const SettleAfterUnknown = 12 * time.Second

// Settle waits, once every publisher stopped, until SettleAfterUnknown
// has passed since the last publish of pubs with an unknown outcome
// returned: a record still in flight then lands before the final read's
// end marker, or past it, where ShardEnds still finds it.
func Settle(ctx context.Context, pubs []history.Publish) {
	var last time.Time
	for _, p := range pubs {
		if p.Outcome == history.Unknown && p.Return.After(last) {
			last = p.Return
		}
	}
	if wait := time.Until(last.Add(SettleAfterUnknown)); wait > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// ShardEnds returns the offset of the last record committed on each shard
// of stream: the greatest of marks[shard] (the offset of a record acked
// there after every publisher stopped) and, on a replicated stream, the
// replicas' high-water marks (ReplicaState.Next - 1). A final read to
// these ends, rather than to the marks, also checks the records committed
// after a mark: one of unknown outcome written late, or a copy of an
// acked record written again. It logs (logf) each end past its mark.
func ShardEnds(ctx context.Context, cl *client.Client, stream string, marks []uint64, logf func(string, ...any)) ([]uint64, error) {
	ends := append([]uint64(nil), marks...)
	states, err := cl.ReplicaStatus(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("workload: the ends of %s: %w", stream, err)
	}
	for _, st := range states {
		if st.Err == "" && st.Shard >= 0 && st.Shard < len(ends) && st.Next > 0 {
			ends[st.Shard] = max(ends[st.Shard], st.Next-1)
		}
	}
	for s := range ends {
		if ends[s] != marks[s] {
			logf("%s/%d: records committed past the end marker at %d, up to %d: read to there", stream, s, marks[s], ends[s])
		}
	}
	return ends, nil
}
