// Package auth owns who may do what in a Felix cluster: principals, the
// actions they are authorized for and the policy that grants them. It is
// pure: no I/O, no goroutines, no clock. The control plane keeps the
// policy in its state and pushes it to brokers with the shard map
// (versioned by the map's epoch); brokers and the control plane both call
// [Policy.Allows] to decide.
//
// A principal is the name a connection authenticated as: the common name of
// a client certificate issued by the cluster CA today (role felix-client).
// Signed bearer tokens, if added, will name principals the same way, so
// grants do not depend on how a principal proved who it is.
//
// Permissions follow what NATS and Kafka users know: a grant names a
// principal, an action and a stream pattern. A pattern is "*" (every
// stream), a prefix ending in "*" ("orders.*" matches "orders.eu" and
// "orders.us", "orders*" matches "orders" too) or an exact stream name.
// Cluster actions (cluster.read, cluster.admin) take the pattern "*".
// Superusers, named in the control plane's configuration, may do
// everything; nobody else may do anything not granted.
package auth

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Action is an operation a grant authorizes.
type Action string

// Actions.
const (
	// Publish records to the streams matched.
	Publish Action = "publish"
	// Subscribe to (read) the streams matched, and see them in the map.
	Subscribe Action = "subscribe"
	// StreamAdmin creates, deletes and configures the streams matched.
	StreamAdmin Action = "stream.admin"
	// ClusterRead reads the whole map, every stream's configuration, the
	// cluster's status and the policy.
	ClusterRead Action = "cluster.read"
	// ClusterAdmin changes the policy (grant, revoke).
	ClusterAdmin Action = "cluster.admin"
)

// Actions lists every action, in the order help text shows them.
var Actions = []Action{Publish, Subscribe, StreamAdmin, ClusterRead, ClusterAdmin}

// Grant authorizes Principal to do Action on the streams Pattern matches.
type Grant struct {
	Principal string `msgpack:"principal" json:"principal"`
	Action    Action `msgpack:"action" json:"action"`
	Pattern   string `msgpack:"pattern" json:"pattern"`
}

func (g Grant) String() string {
	return fmt.Sprintf("%s may %s %s", g.Principal, g.Action, g.Pattern)
}

// ErrInvalid is matched by every error Validate returns.
var ErrInvalid = errors.New("auth: invalid grant")

// Validate reports whether g can be stored.
func (g Grant) Validate() error {
	if g.Principal == "" || len(g.Principal) > 256 {
		return fmt.Errorf("%w: principal must be 1..256 characters", ErrInvalid)
	}
	if !slices.Contains(Actions, g.Action) {
		return fmt.Errorf("%w: unknown action %q (want one of %s)", ErrInvalid, g.Action, actionList())
	}
	if g.Pattern == "" || len(g.Pattern) > 256 {
		return fmt.Errorf("%w: pattern must be 1..256 characters (\"*\" for every stream)", ErrInvalid)
	}
	if i := strings.IndexByte(g.Pattern, '*'); i >= 0 && i != len(g.Pattern)-1 {
		return fmt.Errorf("%w: pattern %q: '*' may only end a pattern", ErrInvalid, g.Pattern)
	}
	if (g.Action == ClusterRead || g.Action == ClusterAdmin) && g.Pattern != "*" {
		return fmt.Errorf("%w: %s applies to the whole cluster: use the pattern \"*\"", ErrInvalid, g.Action)
	}
	return nil
}

func actionList() string {
	s := make([]string, len(Actions))
	for i, a := range Actions {
		s[i] = string(a)
	}
	return strings.Join(s, ", ")
}

// Matches reports whether pattern matches stream.
func Matches(pattern, stream string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(stream, prefix)
	}
	return pattern == stream
}

// Policy is the set of grants in force, plus the superusers. A Policy is
// immutable once built (share it freely); the zero Policy allows nothing.
type Policy struct {
	Superusers []string `msgpack:"superusers" json:"superusers,omitempty"` // sorted
	Grants     []Grant  `msgpack:"grants" json:"grants,omitempty"`         // sorted, no duplicates
}

// NewPolicy returns the policy with superusers and grants, copied, sorted
// and without duplicates.
func NewPolicy(superusers []string, grants []Grant) *Policy {
	p := &Policy{Superusers: slices.Clone(superusers), Grants: slices.Clone(grants)}
	slices.Sort(p.Superusers)
	p.Superusers = slices.Compact(p.Superusers)
	slices.SortFunc(p.Grants, compareGrants)
	p.Grants = slices.Compact(p.Grants)
	return p
}

func compareGrants(a, b Grant) int {
	if c := strings.Compare(a.Principal, b.Principal); c != 0 {
		return c
	}
	if c := strings.Compare(string(a.Action), string(b.Action)); c != 0 {
		return c
	}
	return strings.Compare(a.Pattern, b.Pattern)
}

// IsSuperuser reports whether principal may do everything. A nil policy
// has no superuser.
func (p *Policy) IsSuperuser(principal string) bool {
	if p == nil || principal == "" {
		return false
	}
	_, ok := slices.BinarySearch(p.Superusers, principal)
	return ok
}

// Allows reports whether principal may do action on stream ("" for the
// cluster actions). A nil policy allows nothing.
func (p *Policy) Allows(principal string, action Action, stream string) bool {
	if p == nil || principal == "" {
		return false
	}
	if p.IsSuperuser(principal) {
		return true
	}
	for _, g := range p.of(principal) {
		if g.Action == action && Matches(g.Pattern, stream) {
			return true
		}
	}
	return false
}

// Sees reports whether principal may see stream in the map and in stream
// listings: it has cluster.read, or any grant whose pattern matches stream.
func (p *Policy) Sees(principal, stream string) bool {
	if p == nil || principal == "" {
		return false
	}
	if p.IsSuperuser(principal) {
		return true
	}
	for _, g := range p.of(principal) {
		if g.Action == ClusterRead || Matches(g.Pattern, stream) && g.Action != ClusterAdmin {
			return true
		}
	}
	return false
}

// of returns principal's grants (a sub-slice; grants are sorted by
// principal first).
func (p *Policy) of(principal string) []Grant {
	lo, _ := slices.BinarySearchFunc(p.Grants, principal, func(g Grant, name string) int {
		return strings.Compare(g.Principal, name)
	})
	hi := lo
	for hi < len(p.Grants) && p.Grants[hi].Principal == principal {
		hi++
	}
	return p.Grants[lo:hi]
}

// With returns a policy with g added (p itself when it already holds g).
func (p *Policy) With(g Grant) *Policy {
	if p == nil {
		p = &Policy{}
	}
	if slices.Contains(p.Grants, g) {
		return p
	}
	return NewPolicy(p.Superusers, append(slices.Clone(p.Grants), g))
}

// Without returns a policy with g removed, and whether p held it.
func (p *Policy) Without(g Grant) (*Policy, bool) {
	if p == nil || !slices.Contains(p.Grants, g) {
		return p, false
	}
	return NewPolicy(p.Superusers, slices.DeleteFunc(slices.Clone(p.Grants), func(h Grant) bool { return h == g })), true
}

// Denied is the error for an operation the policy does not allow. Its
// message names the principal, the action and the stream, and how to grant
// it; it never carries a secret.
type Denied struct {
	Principal string
	Action    Action
	Stream    string // "" for cluster actions
}

func (e *Denied) Error() string {
	if e.Stream == "" {
		return fmt.Sprintf("principal %q is not authorized for %s (an operator can run `felixctl acl grant %s %s`)",
			e.Principal, e.Action, e.Principal, e.Action)
	}
	return fmt.Sprintf("principal %q is not authorized for %s on stream %q (an operator can run `felixctl acl grant %s %s %s`)",
		e.Principal, e.Action, e.Stream, e.Principal, e.Action, e.Stream)
}

// Check returns nil when principal may do action on stream, and a
// *Denied otherwise.
func (p *Policy) Check(principal string, action Action, stream string) error {
	if p.Allows(principal, action, stream) {
		return nil
	}
	return &Denied{Principal: principal, Action: action, Stream: stream}
}
