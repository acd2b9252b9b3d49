package telemetry

import (
	"io"
	"log/slog"
	"net/http"
	"testing"
)

// TestAdminPprof checks that /debug/pprof is served only when configured,
// and that the other endpoints are served either way.
func TestAdminPprof(t *testing.T) {
	for _, tc := range []struct {
		pprof bool
		want  map[string]int
	}{
		{false, map[string]int{
			"/healthz": 200, "/readyz": 200,
			"/debug/pprof/": 404, "/debug/pprof/goroutine?debug=1": 404, "/debug/pprof/symbol": 404,
		}},
		{true, map[string]int{
			"/healthz": 200, "/readyz": 200,
			"/debug/pprof/": 200, "/debug/pprof/goroutine?debug=1": 200, "/debug/pprof/symbol": 200,
		}},
	} {
		a, err := StartAdmin(AdminConfig{Addr: "127.0.0.1:0", Pprof: tc.pprof, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		for path, want := range tc.want {
			resp, err := http.Get("http://" + a.Addr().String() + path)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("pprof=%v: GET %s = %d, want %d", tc.pprof, path, resp.StatusCode, want)
			}
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
