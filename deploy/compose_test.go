package deploy

import (
	"encoding/json"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

type composeFile struct {
	Services map[string]composeService `json:"services"`
	Volumes  map[string]any            `json:"volumes"`
}

type composeService struct {
	Command     []string          `json:"command"`
	Environment map[string]string `json:"environment"`
	Healthcheck *struct {
		Test []string `json:"test"`
	} `json:"healthcheck"`
	Volumes     []string `json:"volumes"`
	NetworkMode string   `json:"network_mode"`
	DependsOn   map[string]struct {
		Condition string `json:"condition"`
	} `json:"depends_on"`
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	b, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSONStrict(b)
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	var f composeFile
	if err := json.Unmarshal(js, &f); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	if len(f.Services) == 0 {
		t.Fatal("docker-compose.yml: no services")
	}
	return f
}

// mount returns the volume s mounts at dir.
func (s composeService) mount(dir string) string {
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == dir {
			return parts[0]
		}
	}
	return ""
}

// TestComposeFlags: every flag and FELIX_* variable the compose file gives
// felix exists.
func TestComposeFlags(t *testing.T) {
	f := loadCompose(t)
	for name, s := range f.Services {
		var env []string
		for k := range s.Environment {
			env = append(env, k)
		}
		checkInvocation(t, "docker-compose.yml: "+name, s.Command, env)
		if s.Healthcheck != nil {
			test := s.Healthcheck.Test
			if len(test) < 2 || test[0] != "CMD" || test[1] != "/felix" {
				t.Errorf("docker-compose.yml: %s: health check %q does not run /felix", name, test)
				continue
			}
			checkInvocation(t, "docker-compose.yml: "+name+" healthcheck", test[2:], nil)
		}
	}
}

// TestComposeCluster: the compose file's three ctl members form one etcd
// cluster over https under the names they are reached by, each with a
// certificate of its own name in a volume of its own, and the brokers
// list every member.
func TestComposeCluster(t *testing.T) {
	f := loadCompose(t)
	ctls := map[string]composeService{}   // by service name
	issued := map[string]composeService{} // certs steps by "ctl NAME" / "node NAME"
	var brokers []string
	for name, s := range f.Services {
		if len(s.Command) == 0 {
			continue
		}
		switch s.Command[0] {
		case "ctl":
			ctls[name] = s
		case "broker":
			brokers = append(brokers, name)
		case "certs":
			if len(s.Command) >= 3 {
				issued[s.Command[1]+" "+s.Command[2]] = s
			}
		}
		for _, v := range s.Volumes {
			vol, _, _ := strings.Cut(v, ":")
			if _, ok := f.Volumes[vol]; !ok && !strings.HasPrefix(vol, ".") && !strings.HasPrefix(vol, "/") {
				t.Errorf("%s mounts undeclared volume %q", name, vol)
			}
		}
	}
	if len(ctls) != 3 {
		t.Fatalf("%d ctl services, want 3", len(ctls))
	}
	var advertised []string
	var cluster map[string]string
	for name, s := range ctls {
		env := s.Environment
		member := env["FELIX_ETCD_NAME"]
		if member != name {
			t.Errorf("%s: FELIX_ETCD_NAME %q, want the service name (what the other members resolve)", name, member)
		}
		ic, ok := argValue(s.Command, "etcd-initial-cluster")
		if !ok {
			t.Fatalf("%s: no --etcd-initial-cluster", name)
		}
		c := initialCluster(t, name, ic)
		if cluster != nil && !mapsEqual(c, cluster) {
			t.Errorf("%s: initial cluster %v differs from another member's %v", name, c, cluster)
		}
		cluster = c
		if c[member] != env["FELIX_ETCD_PEER_URL"] {
			t.Errorf("%s: peer URL %q, but the initial cluster lists %q", name, env["FELIX_ETCD_PEER_URL"], c[member])
		}
		for _, key := range []string{"FELIX_ETCD_PEER_URL", "FELIX_ETCD_CLIENT_URL"} {
			u := mustURL(t, name, env[key])
			if u.Scheme != "https" || u.Hostname() != name {
				t.Errorf("%s: %s %s: want https://%s:PORT", name, key, u, name)
			}
		}
		host, port := splitHostPort(t, name, env["FELIX_ADVERTISE"])
		listen, _ := argValue(s.Command, "listen")
		if _, lport := splitHostPort(t, name, listen); host != name || lport != port {
			t.Errorf("%s: advertises %s, listens on %s", name, env["FELIX_ADVERTISE"], listen)
		}
		advertised = append(advertised, env["FELIX_ADVERTISE"])

		// Its certificate: a step issues the ctl certificate of its
		// member name into the volume it mounts at its --certs.
		certs, _ := argValue(s.Command, "certs")
		step, ok := issued["ctl "+member]
		if !ok {
			t.Errorf("%s: no certs step issues `certs ctl %s`", name, member)
		} else if out, _ := argValue(step.Command, "out"); step.mount(out) == "" || step.mount(out) != s.mount(certs) {
			t.Errorf("%s: mounts %q at %s, its certificate goes to %q", name, s.mount(certs), certs, step.mount(out))
		}
		if _, ok := s.DependsOn["certs-"+name]; !ok {
			t.Errorf("%s: does not wait for its certificate step", name)
		}
	}
	if len(cluster) != len(ctls) {
		t.Errorf("initial cluster %v has %d members, %d ctl services", cluster, len(cluster), len(ctls))
	}
	sort.Strings(advertised)
	mounted := map[string]string{}
	for _, name := range brokers {
		s := f.Services[name]
		list, _ := argValue(s.Command, "ctl")
		got := strings.Split(list, ",")
		sort.Strings(got)
		if !slices.Equal(got, advertised) {
			t.Errorf("%s: --ctl %s, want every ctl member %v", name, list, advertised)
		}
		id, _ := argValue(s.Command, "id")
		certs, _ := argValue(s.Command, "certs")
		step, ok := issued["node "+id]
		if !ok {
			t.Errorf("%s: no certs step issues `certs node %s`", name, id)
		} else if out, _ := argValue(step.Command, "out"); step.mount(out) != s.mount(certs) {
			t.Errorf("%s: mounts %q at %s, its certificate goes to %q", name, s.mount(certs), certs, step.mount(out))
		}
		if other, ok := mounted[s.mount(certs)]; ok {
			t.Errorf("%s and %s mount the same certificate volume", name, other)
		}
		mounted[s.mount(certs)] = name
		for ctl := range ctls {
			if d, ok := s.DependsOn[ctl]; !ok || d.Condition != "service_healthy" {
				t.Errorf("%s: does not wait for %s to be healthy", name, ctl)
			}
		}
	}
	if len(brokers) != 3 {
		t.Errorf("%d brokers, want 3", len(brokers))
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
