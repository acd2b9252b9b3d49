package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

type k8sObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec"`
}

type k8sSelector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

type k8sService struct {
	ClusterIP                string            `json:"clusterIP"`
	PublishNotReadyAddresses bool              `json:"publishNotReadyAddresses"`
	Selector                 map[string]string `json:"selector"`
	Ports                    []k8sServicePort  `json:"ports"`
}

type k8sServicePort struct {
	Name     string `json:"name"`
	Port     int    `json:"port"`
	Protocol string `json:"protocol"`
}

type k8sContainerPort struct {
	Name          string `json:"name"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
}

type k8sStatefulSet struct {
	ServiceName         string      `json:"serviceName"`
	Replicas            int         `json:"replicas"`
	PodManagementPolicy string      `json:"podManagementPolicy"`
	Selector            k8sSelector `json:"selector"`
	Template            struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec struct {
			Containers []k8sContainer `json:"containers"`
			Volumes    []k8sVolume    `json:"volumes"`
		} `json:"spec"`
	} `json:"template"`
	VolumeClaimTemplates []struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	} `json:"volumeClaimTemplates"`
}

type k8sContainer struct {
	Name string   `json:"name"`
	Args []string `json:"args"`
	Env  []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"env"`
	Ports          []k8sContainerPort `json:"ports"`
	StartupProbe   *k8sProbe          `json:"startupProbe"`
	ReadinessProbe *k8sProbe          `json:"readinessProbe"`
	LivenessProbe  *k8sProbe          `json:"livenessProbe"`
	VolumeMounts   []struct {
		Name        string `json:"name"`
		MountPath   string `json:"mountPath"`
		SubPathExpr string `json:"subPathExpr"`
	} `json:"volumeMounts"`
}

type k8sProbe struct {
	HTTPGet struct {
		Path string `json:"path"`
		Port any    `json:"port"`
	} `json:"httpGet"`
}

type k8sSecretRef struct {
	Name  string `json:"name"`
	Items []struct {
		Key  string `json:"key"`
		Path string `json:"path"`
	} `json:"items"`
}

type k8sVolume struct {
	Name   string `json:"name"`
	Secret *struct {
		SecretName string `json:"secretName"`
	} `json:"secret"`
	Projected *struct {
		Sources []struct {
			Secret *k8sSecretRef `json:"secret"`
		} `json:"sources"`
	} `json:"projected"`
}

type k8sPDB struct {
	MinAvailable   any         `json:"minAvailable"`
	MaxUnavailable any         `json:"maxUnavailable"`
	Selector       k8sSelector `json:"selector"`
}

// env returns the container's variables with $(VAR) references to
// earlier ones expanded as the kubelet does, pod stands for POD_NAME.
func (c k8sContainer) env(pod string) map[string]string {
	m := map[string]string{"POD_NAME": pod, "POD_IP": "10.0.0.1"}
	ref := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	for _, e := range c.Env {
		if e.Name == "POD_NAME" || e.Name == "POD_IP" {
			continue
		}
		m[e.Name] = ref.ReplaceAllStringFunc(e.Value, func(s string) string {
			if v, ok := m[s[2:len(s)-1]]; ok {
				return v
			}
			return s
		})
	}
	return m
}

func (c k8sContainer) port(name string) (int, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

// manifests decodes every document of k8s/felix.yaml, strictly (a
// duplicate key fails), and returns them by kind/name.
func manifests(t *testing.T) map[string]k8sObject {
	t.Helper()
	b, err := os.ReadFile("k8s/felix.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]k8sObject{}
	for i, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(b), -1) {
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			t.Fatalf("k8s/felix.yaml document %d: %v", i, err)
		}
		if string(js) == "null" {
			continue // comments only
		}
		var o k8sObject
		if err := json.Unmarshal(js, &o); err != nil {
			t.Fatalf("k8s/felix.yaml document %d: %v", i, err)
		}
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			t.Fatalf("k8s/felix.yaml document %d: no apiVersion, kind or name: %s", i, js)
		}
		key := o.Kind + "/" + o.Metadata.Name
		if _, dup := objs[key]; dup {
			t.Fatalf("k8s/felix.yaml: %s twice", key)
		}
		objs[key] = o
	}
	return objs
}

func spec[T any](t *testing.T, o k8sObject) T {
	t.Helper()
	var s T
	if err := json.Unmarshal(o.Spec, &s); err != nil {
		t.Fatalf("%s/%s spec: %v", o.Kind, o.Metadata.Name, err)
	}
	return s
}

func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestK8sFlags: every argument and FELIX_* variable the manifests give
// felix exists.
func TestK8sFlags(t *testing.T) {
	for key, o := range manifests(t) {
		if o.Kind != "StatefulSet" {
			continue
		}
		for _, c := range spec[k8sStatefulSet](t, o).Template.Spec.Containers {
			var env []string
			for _, e := range c.Env {
				env = append(env, e.Name)
			}
			checkInvocation(t, "k8s/felix.yaml: "+key+"/"+c.Name, c.Args, env)
		}
	}
}

// TestK8sWiring: names, ports, URLs, Secrets and selectors agree across
// the manifests.
func TestK8sWiring(t *testing.T) {
	objs := manifests(t)
	ctlObj, ok := objs["StatefulSet/felix-ctl"]
	if !ok {
		t.Fatal("no StatefulSet felix-ctl")
	}
	ctl := spec[k8sStatefulSet](t, ctlObj)
	if ctl.Replicas != 3 || ctl.PodManagementPolicy != "Parallel" {
		t.Errorf("felix-ctl: %d replicas, policy %q; want 3, Parallel", ctl.Replicas, ctl.PodManagementPolicy)
	}
	if len(ctl.VolumeClaimTemplates) != 1 {
		t.Errorf("felix-ctl: %d volume claim templates, want one (its etcd data)", len(ctl.VolumeClaimTemplates))
	}
	svcObj, ok := objs["Service/"+ctl.ServiceName]
	if !ok {
		t.Fatalf("felix-ctl: no Service %q (its serviceName)", ctl.ServiceName)
	}
	svc := spec[k8sService](t, svcObj)
	if svc.ClusterIP != "None" || !svc.PublishNotReadyAddresses {
		t.Errorf("Service %s: clusterIP %q, publishNotReadyAddresses %v; want a headless Service publishing not-ready pods (the members resolve each other before any is ready)",
			ctl.ServiceName, svc.ClusterIP, svc.PublishNotReadyAddresses)
	}
	if !selects(svc.Selector, ctl.Template.Metadata.Labels) || !selects(ctl.Selector.MatchLabels, ctl.Template.Metadata.Labels) {
		t.Errorf("felix-ctl: the Service or the StatefulSet does not select its pods")
	}
	if len(ctl.Template.Spec.Containers) != 1 {
		t.Fatalf("felix-ctl: %d containers", len(ctl.Template.Spec.Containers))
	}
	c := ctl.Template.Spec.Containers[0]

	// Every pod's environment: its member name, URLs and advertised
	// address are its stable DNS name, and the initial cluster lists them.
	var advertised []string
	var members map[string]string
	for i := range ctl.Replicas {
		pod := fmt.Sprintf("%s-%d", ctlObj.Metadata.Name, i)
		dns := pod + "." + ctl.ServiceName
		env := c.env(pod)
		if env["FELIX_ETCD_NAME"] != pod {
			t.Errorf("%s: FELIX_ETCD_NAME %q", pod, env["FELIX_ETCD_NAME"])
		}
		ic := initialCluster(t, pod, env["FELIX_ETCD_INITIAL_CLUSTER"])
		if members != nil && !mapsEqual(ic, members) {
			t.Errorf("%s: initial cluster differs", pod)
		}
		members = ic
		peer := mustURL(t, pod, env["FELIX_ETCD_PEER_URL"])
		client := mustURL(t, pod, env["FELIX_ETCD_CLIENT_URL"])
		for _, u := range []struct {
			what string
			port string
		}{{"peer", "etcd-peer"}, {"client", "etcd-client"}} {
			v := peer
			if u.what == "client" {
				v = client
			}
			want, ok := c.port(u.port)
			if v.Scheme != "https" || v.Hostname() != dns || !ok || v.Port() != fmt.Sprint(want) {
				t.Errorf("%s: etcd %s URL %s; want https://%s:%d (container port %s)", pod, u.what, v, dns, want, u.port)
			}
		}
		if ic[pod] != peer.String() {
			t.Errorf("%s: the initial cluster lists %q, its peer URL is %s", pod, ic[pod], peer)
		}
		host, port := splitHostPort(t, pod, env["FELIX_ADVERTISE"])
		if q, _ := c.port("quic"); host != dns || port != q {
			t.Errorf("%s: advertises %s; want %s:%d", pod, env["FELIX_ADVERTISE"], dns, q)
		}
		advertised = append(advertised, env["FELIX_ADVERTISE"])
		if _, p := splitHostPort(t, pod, env["FELIX_ADMIN"]); !slices.Contains(c.Ports, k8sContainerPort{"admin", p, "TCP"}) {
			t.Errorf("%s: FELIX_ADMIN %s is not the admin container port", pod, env["FELIX_ADMIN"])
		}
	}
	if len(members) != ctl.Replicas {
		t.Errorf("initial cluster %v: %d members, %d replicas", members, len(members), ctl.Replicas)
	}
	for _, p := range c.Ports {
		if !slices.ContainsFunc(svc.Ports, func(sp k8sServicePort) bool {
			return sp.Port == p.ContainerPort && (sp.Protocol == p.Protocol || sp.Protocol == "" && p.Protocol == "TCP")
		}) && p.Name != "admin" {
			t.Errorf("Service %s lacks port %s (%d/%s)", ctl.ServiceName, p.Name, p.ContainerPort, p.Protocol)
		}
	}

	// Each pod sees its own Secret only: the projected volume holds
	// felix-ctl-N-certs under felix-ctl-N/, mounted by subPathExpr.
	var certs *k8sVolume
	for i := range ctl.Template.Spec.Volumes {
		if ctl.Template.Spec.Volumes[i].Name == "certs" {
			certs = &ctl.Template.Spec.Volumes[i]
		}
	}
	if certs == nil || certs.Projected == nil {
		t.Fatal("felix-ctl: no projected certs volume")
	}
	var secrets []string
	for _, src := range certs.Projected.Sources {
		if src.Secret == nil {
			continue
		}
		secrets = append(secrets, src.Secret.Name)
		pod, ok := strings.CutSuffix(src.Secret.Name, "-certs")
		var paths []string
		for _, it := range src.Secret.Items {
			paths = append(paths, it.Path)
			if it.Path != pod+"/"+it.Key {
				t.Errorf("Secret %s: key %s at %s, want %s/%s", src.Secret.Name, it.Key, it.Path, pod, it.Key)
			}
		}
		sort.Strings(paths)
		want := []string{pod + "/ca.crt", pod + "/" + pod + ".crt", pod + "/" + pod + ".key"}
		sort.Strings(want)
		if !ok || !slices.Equal(paths, want) {
			t.Errorf("Secret %s: items %v, want %v", src.Secret.Name, paths, want)
		}
	}
	if len(secrets) != ctl.Replicas {
		t.Errorf("felix-ctl: Secrets %v, want one per replica", secrets)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.Name == "certs" {
			mounted = m.SubPathExpr == "$(POD_NAME)" && m.MountPath == c.env("x")["FELIX_CERTS"]
		}
	}
	if !mounted {
		t.Error("felix-ctl: the certs volume is not mounted at FELIX_CERTS by subPathExpr $(POD_NAME)")
	}
	checkProbes(t, "felix-ctl", c)

	pdbOK := false
	for _, o := range objs {
		if o.Kind != "PodDisruptionBudget" {
			continue
		}
		pdb := spec[k8sPDB](t, o)
		if selects(pdb.Selector.MatchLabels, ctl.Template.Metadata.Labels) {
			pdbOK = fmt.Sprint(pdb.MinAvailable) == "2"
		}
	}
	if !pdbOK {
		t.Error("felix-ctl: no PodDisruptionBudget with minAvailable 2")
	}

	// The brokers reach every ctl member, and each mounts its own Secret.
	sort.Strings(advertised)
	brokers := 0
	for key, o := range objs {
		if o.Kind != "StatefulSet" || key == "StatefulSet/felix-ctl" {
			continue
		}
		brokers++
		b := spec[k8sStatefulSet](t, o)
		bc := b.Template.Spec.Containers[0]
		env := bc.env(o.Metadata.Name + "-0")
		got := strings.Split(env["FELIX_CTL"], ",")
		sort.Strings(got)
		if !slices.Equal(got, advertised) {
			t.Errorf("%s: FELIX_CTL %q, want every ctl member %v", key, env["FELIX_CTL"], advertised)
		}
		if env["FELIX_NODE_ID"] != o.Metadata.Name {
			t.Errorf("%s: FELIX_NODE_ID %q", key, env["FELIX_NODE_ID"])
		}
		for _, v := range b.Template.Spec.Volumes {
			if v.Name == "certs" && (v.Secret == nil || v.Secret.SecretName != o.Metadata.Name+"-certs") {
				t.Errorf("%s: certs volume is not Secret %s-certs", key, o.Metadata.Name)
			}
		}
		checkProbes(t, key, bc)
	}
	if brokers != 3 {
		t.Errorf("%d broker StatefulSets, want 3", brokers)
	}
}

// checkProbes: every probe asks the admin port for /healthz or /readyz.
func checkProbes(t *testing.T, where string, c k8sContainer) {
	t.Helper()
	for name, p := range map[string]*k8sProbe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil {
			if name != "startup" {
				t.Errorf("%s: no %s probe", where, name)
			}
			continue
		}
		if _, ok := c.port(fmt.Sprint(p.HTTPGet.Port)); !ok || (p.HTTPGet.Path != "/healthz" && p.HTTPGet.Path != "/readyz") {
			t.Errorf("%s: %s probe %s on port %v", where, name, p.HTTPGet.Path, p.HTTPGet.Port)
		}
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("%s: readiness probe on %s, want /readyz", where, c.ReadinessProbe.HTTPGet.Path)
	}
}
