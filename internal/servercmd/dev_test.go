package servercmd

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestIsGoRun(t *testing.T) {
	for arg0, want := range map[string]bool{
		"/tmp/go-build2971623614/b001/exe/felix":             true,
		"/home/me/.cache/go-build/tmp/go-build1/b001/exe/fx": true,
		"/root/.cache/go-build/d0/d0871c2f9e-d/felix":        true,
		"/home/me/go-build/felix":                            false,
		"felixctl":                                           false,
		"/usr/local/bin/felix":                               false,
		"/home/me/go/bin/felixctl":                           false,
		"./felix":                                            false,
	} {
		if got := isGoRun(arg0); got != want {
			t.Errorf("isGoRun(%q) = %v, want %v", arg0, got, want)
		}
	}
}

// POST /restart of felix dev's admin listener is served to loopback
// clients only, and never to a request a browser makes for a web page.
func TestRestartServedToLocalClientsOnly(t *testing.T) {
	served := 0
	h := localOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ }))
	for _, tc := range []struct {
		name, remote string
		header       map[string]string
		want         int
	}{
		{"loopback v4", "127.0.0.1:5000", nil, http.StatusOK},
		{"loopback v6", "[::1]:5000", nil, http.StatusOK},
		{"another host", "10.1.2.3:5000", nil, http.StatusForbidden},
		{"no address", "", nil, http.StatusForbidden},
		{"a web page's request", "127.0.0.1:5000", map[string]string{"Origin": "https://evil.example"}, http.StatusForbidden},
		{"cross-site fetch", "127.0.0.1:5000", map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
	} {
		served = 0
		r := httptest.NewRequest(http.MethodPost, "/restart?broker=broker-0", nil)
		r.RemoteAddr = tc.remote
		for k, v := range tc.header {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want || (served == 1) != (tc.want == http.StatusOK) {
			t.Errorf("%s: status %d, served %d times; want %d", tc.name, w.Code, served, tc.want)
		}
	}
}
