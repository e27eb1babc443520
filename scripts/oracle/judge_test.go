package main

// The wrapper's own checks: cases of upstream's netpol e2e suite (test/e2e/network/netpol) with
// the truth tables upstream expects, over this program's world and cell enumeration. They test
// what is ours (the world, named-port resolution per destination, defaulting, the cells) and
// that cyclonus answers upstream's tables.

import (
	"fmt"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// testWorld: upstream's world with IPs 10.0.16.2.. in x/a, x/b, ..., z/c order and cyclonus's port
// names, except that y/b's TCP names are swapped (serve-80-tcp is its port 81).
func testWorld() *World {
	w := &World{}
	for _, ns := range worldNamespaces {
		w.Namespaces = append(w.Namespaces, Namespace{Name: ns, Labels: map[string]string{"ns": ns, nsNameLabel: ns}})
	}
	i := 2
	for _, ns := range worldNamespaces {
		for _, name := range worldPods {
			var ports []Port
			for _, proto := range protocols {
				for _, port := range serverPorts {
					named := port
					if ns == "y" && name == "b" && proto == "TCP" {
						named = 161 - port
					}
					ports = append(ports, Port{Name: fmt.Sprintf("serve-%d-%s", named, map[string]string{"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}[proto]), Port: port, Protocol: proto})
				}
			}
			w.Pods = append(w.Pods, Pod{Namespace: ns, Name: name, Labels: map[string]string{"pod": name}, IP: fmt.Sprintf("10.0.16.%d", i), Ports: ports})
			i++
		}
	}
	return w
}

func np(ns string, target map[string]string, types []networkingv1.PolicyType) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: target},
			PolicyTypes: types,
		},
	}
}

// expect checks every cell against want(cell) and reports the first few disagreements.
func expect(t *testing.T, cells []Cell, want func(c Cell) bool) {
	t.Helper()
	if len(cells) != 9*8*6 {
		t.Fatalf("%d cells, want 9 pods x 8 others x 6 ports = 432", len(cells))
	}
	bad := 0
	for _, c := range cells {
		if c.Allowed != want(c) {
			bad++
			if bad <= 5 {
				t.Errorf("%s -> %s %s/%d (%s): allowed=%v, upstream expects %v", c.Src, c.Dst, c.Protocol, c.Port, c.PortName, c.Allowed, want(c))
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d cells disagree", bad)
	}
}

func mustJudge(t *testing.T, w *World, policies ...*networkingv1.NetworkPolicy) []Cell {
	t.Helper()
	cells, err := judge(w, policies)
	if err != nil {
		t.Fatal(err)
	}
	return cells
}

func nsOf(key string) string { return key[:1] }

// upstream: "should support a 'default-deny-ingress' policy".
func TestDefaultDenyIngress(t *testing.T) {
	p := np("x", nil, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress})
	expect(t, mustJudge(t, testWorld(), p), func(c Cell) bool { return nsOf(c.Dst) != "x" })
}

// A policy stored without policyTypes (as a client may write it) is defaulted as the API server
// does: Ingress, plus Egress because it has egress rules; the empty egress rule allows all.
func TestPolicyTypesDefaulted(t *testing.T) {
	p := np("x", nil, nil)
	p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{}}
	expect(t, mustJudge(t, testWorld(), p), func(c Cell) bool { return nsOf(c.Dst) != "x" })
}

// upstream: "should allow ingress access on one named port" — the name resolves against each
// destination: y/b's serve-80-tcp is its port 81.
func TestIngressNamedPortPerDestination(t *testing.T) {
	p := np("y", nil, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress})
	port := intstr.FromString("serve-80-tcp")
	p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &port}}}}
	expect(t, mustJudge(t, testWorld(), p), func(c Cell) bool {
		if nsOf(c.Dst) != "y" {
			return true
		}
		if c.Protocol != "TCP" {
			return false
		}
		if c.Dst == "y/b" {
			return c.Port == 81
		}
		return c.Port == 80
	})
}

// upstream: "should allow egress access on one named port" (without its DNS rule).
func TestEgressNamedPort(t *testing.T) {
	p := np("x", nil, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress})
	port := intstr.FromString("serve-80-udp")
	p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &port, Protocol: protoPtr("UDP")}}}}
	expect(t, mustJudge(t, testWorld(), p), func(c Cell) bool {
		return nsOf(c.Src) != "x" || (c.Protocol == "UDP" && c.Port == 80)
	})
}

// upstream: "should enforce except clause while egress access to server in CIDR block": x/a may
// reach <z/c>/4 (host bits set, as upstream writes it) except z/c's /32.
func TestEgressCIDRExcept(t *testing.T) {
	p := np("x", map[string]string{"pod": "a"}, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress})
	p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{
		IPBlock: &networkingv1.IPBlock{CIDR: "10.0.16.10/4", Except: []string{"10.0.16.10/32"}},
	}}}}
	expect(t, mustJudge(t, testWorld(), p), func(c Cell) bool { return c.Src != "x/a" || c.Dst != "z/c" })
}

// upstream: "should allow ingress access from namespace on one named port" is a conjunction of
// selectors; here the AND form (one peer with both) and the OR form (two peers) differ.
func TestPodAndNamespaceSelectorAndVersusOr(t *testing.T) {
	and := np("x", map[string]string{"pod": "a"}, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress})
	and.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": "y"}},
	}}}}
	expect(t, mustJudge(t, testWorld(), and), func(c Cell) bool { return c.Dst != "x/a" || c.Src == "y/b" })
	or := and.DeepCopy()
	or.Spec.Ingress[0].From = []networkingv1.NetworkPolicyPeer{
		{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}}},
		{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": "y"}}},
	}
	expect(t, mustJudge(t, testWorld(), or), func(c Cell) bool {
		return c.Dst != "x/a" || c.Src == "x/b" || nsOf(c.Src) == "y"
	})
}

// A port range (endPort) covers both ends, for its protocol only.
func TestPortRange(t *testing.T) {
	p := np("z", nil, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress})
	start := intstr.FromInt32(79)
	end := int32(80)
	p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &start, EndPort: &end, Protocol: protoPtr("SCTP")}}}}
	expect(t, mustJudge(t, testWorld(), p), func(c Cell) bool {
		return nsOf(c.Dst) != "z" || (c.Protocol == "SCTP" && c.Port == 80)
	})
}

// An invalid policy is an error naming it, not a crash.
func TestInvalidPolicyIsAnError(t *testing.T) {
	p := np("x", nil, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress})
	p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{}}}}
	if _, err := judge(testWorld(), []*networkingv1.NetworkPolicy{p}); err == nil {
		t.Fatal("a peer with nothing set was accepted")
	}
}

// The generator is a function of the seed: the same seed, the same world and cases.
func TestGeneratorReplays(t *testing.T) {
	w := testWorld()
	a := fmt.Sprintf("%+v %+v", genWorld(7), genCase(w, 7, 3))
	b := fmt.Sprintf("%+v %+v", genWorld(7), genCase(w, 7, 3))
	if a != b {
		t.Fatal("seed 7 case 3 differs between two runs")
	}
}
