// Package logonce decides which events are worth a log line when the same
// event may repeat without end: a denied principal retrying, a client over
// a limit. It remembers the keys it has seen, in bounded memory, so that a
// hostile client cannot turn repetition into a log flood nor into memory.
package logonce

import "sync"

// DefaultMax is how many keys a zero Set remembers.
const DefaultMax = 4096

// Set reports the first occurrence of each key. It remembers at most Max
// keys (DefaultMax when zero); when full it forgets them all and starts
// again, so a key may be reported again after Max other keys. The zero
// value is ready to use and safe for concurrent use.
type Set struct {
	Max int

	mu   sync.Mutex
	seen map[string]struct{}
}

// First reports whether key has not been seen since the set last forgot.
func (s *Set) First(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen[key]; ok {
		return false
	}
	limit := s.Max
	if limit <= 0 {
		limit = DefaultMax
	}
	if s.seen == nil || len(s.seen) >= limit {
		s.seen = make(map[string]struct{})
	}
	s.seen[key] = struct{}{}
	return true
}
