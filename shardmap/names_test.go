package shardmap

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateStreamName: a valid name is one plain path element; nothing
// that could name the directory itself, its parent, a hidden file or a
// path through a separator is accepted.
func TestValidateStreamName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"orders", true},
		{"0", true},
		{"00", true},
		{"a.b-c_D", true},
		{"a..b", true}, // dots inside a name are just characters
		{"trailing.", true},
		{strings.Repeat("x", MaxStreamName), true},
		{"", false},
		{".", false},
		{"..", false},
		{"...", false},
		{".hidden", false},
		{"../x", false},
		{"a/b", false},
		{"/abs", false},
		{`a\b`, false},
		{"a\x00b", false},
		{"a\nb", false},
		{"a\tb", false},
		{"a\x7fb", false},
		{"has space", false},
		{"ünïcode", false},
		{"名前", false},
		{strings.Repeat("x", MaxStreamName+1), false},
	} {
		err := ValidateStreamName(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateStreamName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidStreamName) {
			t.Errorf("ValidateStreamName(%q) = %v, does not match ErrInvalidStreamName", tc.name, err)
		}
		if err := (StreamConfig{Name: tc.name, Shards: 1}).Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate of stream %q = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// FuzzValidateStreamName: every accepted name is a single local path
// element that is neither "." nor ".." nor hidden.
func FuzzValidateStreamName(f *testing.F) {
	for _, s := range []string{"orders", ".", "..", "a/b", "../x", ".hidden", "0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if ValidateStreamName(name) != nil {
			return
		}
		if !filepath.IsLocal(name) || filepath.Base(name) != name || name == "." || name == ".." ||
			strings.ContainsAny(name, `/\`+"\x00") || strings.HasPrefix(name, ".") {
			t.Fatalf("accepted %q, which is not one plain path element", name)
		}
	})
}
