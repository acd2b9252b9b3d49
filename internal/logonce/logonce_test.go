package logonce

import (
	"strconv"
	"testing"
)

func TestFirstOncePerKeyAndBounded(t *testing.T) {
	var s Set
	s.Max = 3
	if !s.First("a") || s.First("a") {
		t.Fatal("a: want first then not")
	}
	s.First("b")
	s.First("c")
	if s.First("b") {
		t.Fatal("b reported twice before the set was full")
	}
	// A fourth key fills it: the set forgets and starts again.
	if !s.First("d") || !s.First("a") {
		t.Fatal("after forgetting, keys are new again")
	}
	for i := range 10000 {
		s.First(strconv.Itoa(i))
	}
	if len(s.seen) > 3 {
		t.Fatalf("set holds %d keys, bound 3", len(s.seen))
	}
}
