package auth

import (
	"errors"
	"testing"
)

func TestMatches(t *testing.T) {
	for _, tc := range []struct {
		pattern, stream string
		want            bool
	}{
		{"*", "orders", true},
		{"orders", "orders", true},
		{"orders", "orders.eu", false},
		{"orders.*", "orders.eu", true},
		{"orders.*", "orders", false},
		{"orders*", "orders", true},
		{"orders*", "ordersx", true},
		{"ord", "orders", false},
	} {
		if got := Matches(tc.pattern, tc.stream); got != tc.want {
			t.Errorf("Matches(%q, %q) = %v, want %v", tc.pattern, tc.stream, got, tc.want)
		}
	}
}

func TestPolicyAllows(t *testing.T) {
	p := NewPolicy([]string{"root"}, []Grant{
		{"alice", Publish, "orders.*"},
		{"alice", Subscribe, "orders.eu"},
		{"bob", ClusterRead, "*"},
		{"carol", StreamAdmin, "tmp*"},
	})
	for _, tc := range []struct {
		who    string
		action Action
		stream string
		want   bool
	}{
		{"root", ClusterAdmin, "", true},
		{"root", Publish, "anything", true},
		{"alice", Publish, "orders.eu", true},
		{"alice", Publish, "orders", false},
		{"alice", Subscribe, "orders.eu", true},
		{"alice", Subscribe, "orders.us", false},
		{"alice", StreamAdmin, "orders.eu", false},
		{"bob", ClusterRead, "", true},
		{"bob", Publish, "orders.eu", false},
		{"carol", StreamAdmin, "tmp-1", true},
		{"mallory", Publish, "orders.eu", false},
		{"", Publish, "orders.eu", false},
	} {
		if got := p.Allows(tc.who, tc.action, tc.stream); got != tc.want {
			t.Errorf("%s %s %q = %v, want %v", tc.who, tc.action, tc.stream, got, tc.want)
		}
		err := p.Check(tc.who, tc.action, tc.stream)
		var d *Denied
		if tc.want != (err == nil) || !tc.want && !errors.As(err, &d) {
			t.Errorf("Check(%s %s %q) = %v", tc.who, tc.action, tc.stream, err)
		}
	}
	if !p.Sees("alice", "orders.us") || p.Sees("alice", "payments") || !p.Sees("bob", "payments") || p.Sees("mallory", "orders.eu") {
		t.Error("Sees: alice sees orders.*, bob sees all, mallory nothing")
	}
	var nilPolicy *Policy
	if nilPolicy.Allows("root", Publish, "x") {
		t.Error("a nil policy allows nothing")
	}
}

func TestWithWithout(t *testing.T) {
	g := Grant{"alice", Publish, "orders"}
	p := NewPolicy(nil, nil)
	q := p.With(g)
	if !q.Allows("alice", Publish, "orders") || p.Allows("alice", Publish, "orders") {
		t.Fatal("With must return a new policy and leave the old one alone")
	}
	if q.With(g) != q {
		t.Fatal("granting twice must not change the policy")
	}
	r, ok := q.Without(g)
	if !ok || r.Allows("alice", Publish, "orders") || !q.Allows("alice", Publish, "orders") {
		t.Fatal("Without must remove the grant from a new policy")
	}
	if _, ok := r.Without(g); ok {
		t.Fatal("Without of a missing grant must report false")
	}
}

func TestGrantValidate(t *testing.T) {
	for _, g := range []Grant{
		{"", Publish, "x"},
		{"a", "delete-everything", "x"},
		{"a", Publish, ""},
		{"a", Publish, "a*b"},
		{"a", ClusterRead, "orders"},
	} {
		if err := g.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalid", g, err)
		}
	}
	if err := (Grant{"a", Publish, "orders.*"}).Validate(); err != nil {
		t.Error(err)
	}
}
