package servercmd

import (
	"reflect"
	"strings"
	"testing"
)

// TestAdminHelpSaysUnauthenticated: --help of every --admin says the
// listener has no authentication, and a broker's that its metrics name
// the streams, so an operator binding it beyond loopback knows what
// anyone who reaches it reads. The broker's and ctl's said neither.
func TestAdminHelpSaysUnauthenticated(t *testing.T) {
	says := func(cmd any, want ...string) {
		t.Helper()
		f, _ := reflect.TypeOf(cmd).FieldByName("Admin")
		for _, s := range want {
			if help := f.Tag.Get("help"); !strings.Contains(help, s) {
				t.Errorf("%T --admin help %q does not say %q", cmd, help, s)
			}
		}
	}
	says(Broker{}, "no authentication", "stream names")
	says(Ctl{}, "no authentication")
	says(Dev{}, "no authentication")
}
