package dockertest

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/felix-broker/felix/shardmap"
)

// This file checks the map history of a run: as etcd stored it (every
// revision, read back after the test) and as the brokers saw it.

// statePrefix is where ctl keeps the default cluster's state in etcd (see
// package ctl's doc for the layout, whose JSON values are read here as
// any tool would read them).
const statePrefix = "/felix/default/"

// endKey is put after the run, outside ctl's prefix, so that reading the
// history knows where it ends.
const endKey = "/felix-dockertest-end"

type storedMember struct {
	ID    string `json:"id"`
	Addr  string `json:"addr"`
	Admin string `json:"admin"`
	Live  bool   `json:"live"`
}

type storedStream struct {
	Name             string   `json:"name"`
	Shards           int      `json:"shards"`
	RetentionBytes   int64    `json:"retention_bytes"`
	RetentionAgeNano int64    `json:"retention_age_ns"`
	Owners           []string `json:"owners"`
}

// writer is ctl's writer key: who committed the epoch of its revision.
type writer struct {
	Name     string `json:"name"`
	ID       string `json:"id"`
	Election string `json:"election"`
}

// committed is one map as etcd stored it.
type committed struct {
	epoch  uint64
	rev    int64
	writer writer
	view   string // mapView of the members and streams at rev
}

// history is the map history etcd holds, checked as it is read.
type history struct {
	maps    []committed
	byEpoch map[uint64]committed
	// sessionEnd is the revision each election key was deleted at (its
	// session lease expired, or the ctl resigned).
	sessionEnd map[string]int64
	errs       []string
}

// readHistory reads every revision etcd holds under statePrefix, from the
// first, and checks it:
//   - every write of the epoch key puts a strictly greater epoch, so no
//     two maps share an epoch;
//   - it comes with a writer record in the same transaction, whose
//     election key exists at that revision and was the first created
//     among those that do: the map was written by the leader of that
//     revision, never by a ctl whose session (lease) had ended.
//
// etcd revisions order every write, so this holds whatever the clocks of
// the machines, unlike a comparison of log timestamps.
func readHistory(ctx context.Context, cli *clientv3.Client) (*history, error) {
	put, err := cli.Put(ctx, endKey, time.Now().String())
	if err != nil {
		return nil, fmt.Errorf("mark the end of the history: %w", err)
	}
	end := put.Header.Revision
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h := &history{byEpoch: map[uint64]committed{}, sessionEnd: map[string]int64{}}
	members := map[string]storedMember{}
	streams := map[string]storedStream{}
	elections := map[string]int64{} // live election keys: create revision
	var lastEpoch uint64
	for resp := range cli.Watch(wctx, "/felix", clientv3.WithPrefix(), clientv3.WithRev(1)) {
		if err := resp.Err(); err != nil {
			return nil, fmt.Errorf("read etcd's history: %w", err)
		}
		for i := 0; i < len(resp.Events); {
			rev := resp.Events[i].Kv.ModRevision
			var epoch *uint64
			var wr *writer
			for ; i < len(resp.Events) && resp.Events[i].Kv.ModRevision == rev; i++ {
				ev := resp.Events[i]
				key, put := string(ev.Kv.Key), ev.Type == clientv3.EventTypePut
				rest, ours := strings.CutPrefix(key, statePrefix)
				if !ours {
					continue
				}
				bad := func(err error) { h.errs = append(h.errs, fmt.Sprintf("revision %d: key %s: %v", rev, key, err)) }
				switch {
				case rest == "epoch" && put:
					e, err := strconv.ParseUint(string(ev.Kv.Value), 10, 64)
					if err != nil {
						bad(err)
					}
					epoch = &e
				case rest == "writer" && put:
					var w writer
					if err := json.Unmarshal(ev.Kv.Value, &w); err != nil {
						bad(err)
					}
					wr = &w
				case strings.HasPrefix(rest, "members/"):
					id := strings.TrimPrefix(rest, "members/")
					if !put {
						delete(members, id)
						continue
					}
					var m storedMember
					if err := json.Unmarshal(ev.Kv.Value, &m); err != nil {
						bad(err)
					}
					members[id] = m
				case strings.HasPrefix(rest, "streams/"):
					name := strings.TrimPrefix(rest, "streams/")
					if !put {
						delete(streams, name)
						continue
					}
					var s storedStream
					if err := json.Unmarshal(ev.Kv.Value, &s); err != nil {
						bad(err)
					}
					streams[name] = s
				case strings.HasPrefix(rest, "election/"):
					if put {
						if _, ok := elections[key]; !ok {
							elections[key] = ev.Kv.CreateRevision
						}
					} else {
						delete(elections, key)
						h.sessionEnd[key] = rev
					}
				}
			}
			if epoch == nil {
				continue
			}
			if *epoch <= lastEpoch {
				h.errs = append(h.errs, fmt.Sprintf("revision %d: epoch %d written after epoch %d", rev, *epoch, lastEpoch))
			}
			lastEpoch = max(lastEpoch, *epoch)
			c := committed{epoch: *epoch, rev: rev, view: storedView(members, streams)}
			if wr == nil {
				h.errs = append(h.errs, fmt.Sprintf("revision %d: epoch %d written with no writer record", rev, *epoch))
			} else {
				c.writer = *wr
				created, alive := elections[wr.Election]
				switch {
				case !alive:
					h.errs = append(h.errs, fmt.Sprintf("revision %d: epoch %d written by %s (%s) after its election session ended (at revision %d)",
						rev, *epoch, wr.Name, wr.Election, h.sessionEnd[wr.Election]))
				case slices.ContainsFunc(mapValues(elections), func(r int64) bool { return r < created }):
					h.errs = append(h.errs, fmt.Sprintf("revision %d: epoch %d written by %s, not the first in line of the election", rev, *epoch, wr.Name))
				}
			}
			if _, dup := h.byEpoch[c.epoch]; !dup {
				h.byEpoch[c.epoch] = c
			}
			h.maps = append(h.maps, c)
		}
		if resp.Header.Revision >= end && len(resp.Events) > 0 && resp.Events[len(resp.Events)-1].Kv.ModRevision >= end {
			return h, nil
		}
	}
	return nil, fmt.Errorf("read etcd's history: watch ended before revision %d: %w", end, ctx.Err())
}

// epochs lists the epochs committed, in order, with their writers.
func (h *history) epochs() string {
	var b strings.Builder
	for i, m := range h.maps {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%d@%d(%s)", m.epoch, m.rev, m.writer.Name)
	}
	return b.String()
}

func mapValues(m map[string]int64) []int64 {
	out := make([]int64, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// A view is a canonical text of a map's members and streams with their
// owners: what etcd stores of a map and what a broker's map holds (the
// policy is not shown to clients; the grants are checked apart).
func storedView(members map[string]storedMember, streams map[string]storedStream) string {
	var ns []shardmap.Node
	for _, m := range members {
		ns = append(ns, shardmap.Node{ID: m.ID, Addr: m.Addr, Admin: m.Admin, Live: m.Live})
	}
	var ss []shardmap.Stream
	for _, s := range streams {
		ss = append(ss, shardmap.Stream{StreamConfig: shardmap.StreamConfig{Name: s.Name, Shards: s.Shards,
			RetentionBytes: s.RetentionBytes, RetentionAge: time.Duration(s.RetentionAgeNano)}, Placement: shardmap.NewPlacement(s.Owners...)})
	}
	return mapView(ns, ss)
}

func mapView(nodes []shardmap.Node, streams []shardmap.Stream) string {
	var lines []string
	for _, n := range nodes {
		lines = append(lines, fmt.Sprintf("node %s %s %s live=%v", n.ID, n.Addr, n.Admin, n.Live))
	}
	for _, s := range streams {
		lines = append(lines, fmt.Sprintf("stream %s %d %d %v %s", s.Name, s.Shards, s.RetentionBytes, s.RetentionAge, joinOwners(s.Placement)))
	}
	slices.Sort(lines)
	return strings.Join(lines, "; ")
}

// sample is a map a broker held when asked.
type sample struct {
	at    time.Time
	epoch uint64
	view  string
}

// mapWatch asks every broker for its map (map.get, answered from the
// broker's own copy) every 100ms until stop, and keeps each change.
type mapWatch struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	seen   map[string][]sample // by broker
}

func (c *Cluster) watchMaps(ctx context.Context) (*mapWatch, error) {
	w := &mapWatch{seen: map[string][]sample{}}
	wctx, cancel := context.WithCancel(ctx)
	w.cancel = cancel
	for _, b := range c.Brokers {
		cl, err := c.Client(ctx, b)
		if err != nil {
			w.stop()
			return nil, err
		}
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			defer cl.Close()
			var last sample
			for wctx.Err() == nil {
				rctx, rcancel := context.WithTimeout(wctx, 2*time.Second)
				m, err := cl.Map(rctx)
				rcancel()
				if err == nil {
					s := sample{at: time.Now(), epoch: m.Epoch, view: mapView(m.Nodes, m.Streams)}
					if s.epoch != last.epoch || s.view != last.view {
						w.mu.Lock()
						w.seen[b.Name] = append(w.seen[b.Name], s)
						w.mu.Unlock()
						last = s
					}
				}
				select {
				case <-wctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
	}
	return w, nil
}

func (w *mapWatch) stop() {
	w.cancel()
	w.wg.Wait()
}

// check returns what contradicts h in the maps the brokers held: a map
// at an epoch etcd never committed, or other than the one it committed at
// that epoch, or an epoch going back.
func (w *mapWatch) check(h *history) (maps int, errs []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for b, ss := range w.seen {
		var last uint64
		for _, s := range ss {
			maps++
			if s.epoch < last {
				errs = append(errs, fmt.Sprintf("%s went back from epoch %d to %d at %s", b, last, s.epoch, s.at.Format("15:04:05.000")))
			}
			last = max(last, s.epoch)
			if s.epoch == 0 {
				continue // the empty map a broker holds before its first
			}
			c, ok := h.byEpoch[s.epoch]
			switch {
			case !ok:
				errs = append(errs, fmt.Sprintf("%s held a map at epoch %d, which etcd never committed: %s", b, s.epoch, s.view))
			case c.view != s.view:
				errs = append(errs, fmt.Sprintf("%s held a map at epoch %d other than the one committed:\n  held:      %s\n  committed: %s", b, s.epoch, s.view, c.view))
			}
		}
	}
	return maps, errs
}

// loggedEpochs are the epochs a node's log says it applied (a broker:
// "shard map applied") or pushed (a ctl: "map pushed").
var loggedEpochs = regexp.MustCompile(`msg="(?:shard map applied|map pushed)"[^\n]*? epoch=(\d+)`)

// checkLogged returns the epochs the brokers applied or the ctls pushed,
// by their logs, that etcd never committed.
func (c *Cluster) checkLogged(h *history) (lines int, errs []string) {
	for _, n := range append(append([]*Node{}, c.Ctls...), c.Brokers...) {
		for _, m := range loggedEpochs.FindAllStringSubmatch(c.Logs(n, 100000), -1) {
			lines++
			e, _ := strconv.ParseUint(m[1], 10, 64)
			if _, ok := h.byEpoch[e]; !ok && e != 0 {
				errs = append(errs, fmt.Sprintf("%s's log: %s, an epoch etcd never committed", n.Name, m[0]))
			}
		}
	}
	return lines, errs
}

// joinOwners lists p's owners in shard order, comma-separated.
func joinOwners(p shardmap.Placement) string {
	var owners []string
	for _, o := range p.All() {
		owners = append(owners, o)
	}
	return strings.Join(owners, ",")
}
