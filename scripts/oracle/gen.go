package main

// The random generator: cyclonus's shapes (targets, peers, ports, protocols, policyTypes,
// conflicting policies) drawn at random from a seed. Pods are upstream's netpol suite: namespaces
// x, y, z with pods a, b, c, each serving 80 and 81 over TCP, UDP and SCTP, the ports named as
// cyclonus names them (serve-80-tcp, ...).

import (
	"fmt"
	"net"
	"strings"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var (
	worldNamespaces = []string{"x", "y", "z"}
	worldPods       = []string{"a", "b", "c"}
	protocols       = []string{"TCP", "UDP", "SCTP"}
	serverPorts     = []int{80, 81}
)

const nsNameLabel = "kubernetes.io/metadata.name"

// genWorld: the labels and port names of a seed's world. Beside upstream's labels (ns=x,
// pod=a, the namespace name label) a seed gives namespaces a `team` and some pods a `tier`, and
// on some pods swaps which port a name stands for (serve-80-tcp naming port 81), so that named
// ports resolve per destination pod.
func genWorld(seed int64) *World {
	r := newRNG(seed, 0)
	w := &World{Seed: seed}
	for _, ns := range worldNamespaces {
		w.Namespaces = append(w.Namespaces, Namespace{Name: ns, Labels: map[string]string{
			"ns": ns, nsNameLabel: ns, "team": pick(r, []string{"blue", "green"}),
		}})
	}
	for _, ns := range worldNamespaces {
		for _, name := range worldPods {
			labels := map[string]string{"pod": name}
			if r.chance(60) {
				labels["tier"] = pick(r, []string{"web", "db"})
			}
			var ports []Port
			for _, proto := range protocols {
				swap := r.chance(20)
				for _, port := range serverPorts {
					named := port
					if swap {
						named = 161 - port // 80 <-> 81
					}
					ports = append(ports, Port{
						Name:     fmt.Sprintf("serve-%d-%s", named, strings.ToLower(proto)),
						Port:     port,
						Protocol: proto,
					})
				}
			}
			w.Pods = append(w.Pods, Pod{Namespace: ns, Name: name, Labels: labels, Ports: ports})
		}
	}
	return w
}

type gen struct {
	r     *rng
	world *World
}

func sel(labels map[string]string, exprs ...metav1.LabelSelectorRequirement) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: labels, MatchExpressions: exprs}
}

func expr(key string, op metav1.LabelSelectorOperator, values ...string) metav1.LabelSelectorRequirement {
	return metav1.LabelSelectorRequirement{Key: key, Operator: op, Values: values}
}

// podSelector: empty, by label, by expression (In, NotIn, Exists, DoesNotExist), or both.
func (g *gen) podSelector() *metav1.LabelSelector {
	r := g.r
	switch r.intn(8) {
	case 0, 1:
		return sel(nil)
	case 2, 3:
		return sel(map[string]string{"pod": pick(r, worldPods)})
	case 4:
		return sel(nil, expr("pod", metav1.LabelSelectorOpIn, some(r, worldPods, 2)...))
	case 5:
		return sel(nil, expr("pod", metav1.LabelSelectorOpNotIn, pick(r, worldPods)))
	case 6:
		return sel(nil, expr("tier", pick(r, []metav1.LabelSelectorOperator{
			metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist})))
	default:
		return sel(map[string]string{"tier": pick(r, []string{"web", "db"})},
			expr("pod", metav1.LabelSelectorOpIn, some(r, worldPods, 2)...))
	}
}

// namespaceSelector: empty (all namespaces), by ns label, by the name label, by team, NotIn.
func (g *gen) namespaceSelector() *metav1.LabelSelector {
	r := g.r
	switch r.intn(6) {
	case 0:
		return sel(nil)
	case 1, 2:
		return sel(map[string]string{"ns": pick(r, worldNamespaces)})
	case 3:
		return sel(nil, expr(nsNameLabel, metav1.LabelSelectorOpIn, some(r, worldNamespaces, 2)...))
	case 4:
		return sel(map[string]string{"team": pick(r, []string{"blue", "green"})})
	default:
		return sel(nil, expr("ns", metav1.LabelSelectorOpNotIn, pick(r, worldNamespaces)))
	}
}

func maskedCIDR(ip net.IP, ones int) *net.IPNet {
	mask := net.CIDRMask(ones, 32)
	return &net.IPNet{IP: ip.Mask(mask), Mask: mask}
}

// ipBlock: a CIDR around a pod's address (/32 to /0, sometimes written with host bits set as
// upstream's e2e suite writes "<podIP>/4"), sometimes with one or two excepts inside it (a
// pod's /32 or a narrower block).
func (g *gen) ipBlock() *networkingv1.IPBlock {
	r := g.r
	base := net.ParseIP(pick(r, g.world.Pods).IP).To4()
	ones := pick(r, []int{32, 30, 28, 26, 24, 16, 8, 4, 1, 0})
	cidr := maskedCIDR(base, ones)
	text := cidr.String()
	if ones < 32 && ones > 0 && r.chance(30) {
		text = fmt.Sprintf("%s/%d", base, ones) // host bits set: the API server accepts it
	}
	block := &networkingv1.IPBlock{CIDR: text}
	if ones < 32 && r.chance(40) {
		for n := 1 + r.intn(2); n > 0; n-- {
			var except *net.IPNet
			if r.chance(50) {
				inner := net.ParseIP(pick(r, g.world.Pods).IP).To4()
				if !cidr.Contains(inner) {
					continue
				}
				except = maskedCIDR(inner, 32)
			} else {
				longer := ones + 1 + r.intn(32-ones)
				except = maskedCIDR(base, longer)
			}
			text := except.String()
			dup := false
			for _, e := range block.Except {
				dup = dup || e == text
			}
			if !dup {
				block.Except = append(block.Except, text)
			}
		}
	}
	return block
}

func (g *gen) peer() networkingv1.NetworkPolicyPeer {
	switch g.r.intn(7) {
	case 0, 1:
		return networkingv1.NetworkPolicyPeer{PodSelector: g.podSelector()}
	case 2, 3:
		return networkingv1.NetworkPolicyPeer{NamespaceSelector: g.namespaceSelector()}
	case 4:
		return networkingv1.NetworkPolicyPeer{PodSelector: g.podSelector(), NamespaceSelector: g.namespaceSelector()}
	default:
		return networkingv1.NetworkPolicyPeer{IPBlock: g.ipBlock()}
	}
}

func protoPtr(p string) *v1.Protocol {
	proto := v1.Protocol(p)
	return &proto
}

// port: numeric (with or without a protocol: none means TCP), named (mostly with the protocol
// the name is for, sometimes another, sometimes a name no pod has), protocol only, or a range.
func (g *gen) port() networkingv1.NetworkPolicyPort {
	r := g.r
	var proto *v1.Protocol
	if r.chance(80) {
		proto = protoPtr(pick(r, protocols))
	}
	switch r.intn(6) {
	case 0, 1:
		p := intstr.FromInt32(int32(pick(r, []int{80, 81, 80, 81, 79})))
		return networkingv1.NetworkPolicyPort{Protocol: proto, Port: &p}
	case 2, 3:
		forProto := pick(r, protocols)
		if proto != nil && r.chance(80) {
			forProto = string(*proto)
		} else if proto == nil && r.chance(80) {
			forProto = "TCP"
		}
		name := fmt.Sprintf("serve-%d-%s", pick(r, []int{80, 81, 80, 81, 99}), strings.ToLower(forProto))
		p := intstr.FromString(name)
		return networkingv1.NetworkPolicyPort{Protocol: proto, Port: &p}
	case 4:
		return networkingv1.NetworkPolicyPort{Protocol: protoPtr(pick(r, protocols))}
	default:
		start := pick(r, []int{79, 80, 81})
		end := int32(start + r.intn(3))
		p := intstr.FromInt32(int32(start))
		return networkingv1.NetworkPolicyPort{Protocol: proto, Port: &p, EndPort: &end}
	}
}

// rule: no peers (everyone) or one to three; no ports (all) or one to three.
func (g *gen) rule() ([]networkingv1.NetworkPolicyPort, []networkingv1.NetworkPolicyPeer) {
	var ports []networkingv1.NetworkPolicyPort
	var peers []networkingv1.NetworkPolicyPeer
	if !g.r.chance(35) {
		for n := 1 + g.r.intn(3); n > 0; n-- {
			ports = append(ports, g.port())
		}
	}
	if !g.r.chance(25) {
		for n := 1 + g.r.intn(3); n > 0; n-- {
			peers = append(peers, g.peer())
		}
	}
	return ports, peers
}

// rules: 0 (deny everything in that direction) to 3.
func (g *gen) ingress() []networkingv1.NetworkPolicyIngressRule {
	rules := []networkingv1.NetworkPolicyIngressRule{}
	for n := pick(g.r, []int{0, 1, 1, 1, 2, 2, 3}); n > 0; n-- {
		ports, peers := g.rule()
		rules = append(rules, networkingv1.NetworkPolicyIngressRule{Ports: ports, From: peers})
	}
	return rules
}

func (g *gen) egress() []networkingv1.NetworkPolicyEgressRule {
	rules := []networkingv1.NetworkPolicyEgressRule{}
	for n := pick(g.r, []int{0, 1, 1, 1, 2, 2, 3}); n > 0; n-- {
		ports, peers := g.rule()
		rules = append(rules, networkingv1.NetworkPolicyEgressRule{Ports: ports, To: peers})
	}
	return rules
}

// policy: a target in a namespace, Ingress, Egress or both; sometimes rules for a direction
// policyTypes does not name (the API keeps them and they have no effect).
func (g *gen) policy(name string) *networkingv1.NetworkPolicy {
	r := g.r
	np := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: pick(r, worldNamespaces)},
	}
	np.Spec.PodSelector = *g.podSelector()
	types := pick(r, [][]networkingv1.PolicyType{
		{networkingv1.PolicyTypeIngress}, {networkingv1.PolicyTypeIngress},
		{networkingv1.PolicyTypeEgress},
		{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
	})
	np.Spec.PolicyTypes = types
	for _, t := range types {
		if t == networkingv1.PolicyTypeIngress {
			np.Spec.Ingress = g.ingress()
		} else {
			np.Spec.Egress = g.egress()
		}
	}
	if len(types) == 1 && r.chance(10) {
		if types[0] == networkingv1.PolicyTypeIngress {
			np.Spec.Egress = g.egress()
		} else {
			np.Spec.Ingress = g.ingress()
		}
	}
	return np
}

// genCase: one to four policies (overlapping targets and conflicting rules come from drawing
// them independently in three namespaces); a fifth of the cases have a second step that
// replaces, adds or deletes one policy.
func genCase(w *World, seed int64, index int) *Case {
	g := &gen{r: newRNG(seed, uint64(index)+1), world: w}
	n := pick(g.r, []int{1, 2, 2, 3, 3, 4})
	var policies []*networkingv1.NetworkPolicy
	for i := 0; i < n; i++ {
		policies = append(policies, g.policy(fmt.Sprintf("p%d", i)))
	}
	c := &Case{
		ID:            fmt.Sprintf("seed %d case %d", seed, index),
		Source:        "random",
		Description:   fmt.Sprintf("%d random policies", n),
		ReuseTCPPorts: g.r.chance(50),
		Steps:         []Step{{Description: "create", Policies: policies}},
	}
	if g.r.chance(20) {
		next := append([]*networkingv1.NetworkPolicy{}, policies...)
		var what string
		switch i := g.r.intn(len(next)); g.r.intn(3) {
		case 0:
			fresh := g.policy(next[i].Name)
			fresh.Namespace = next[i].Namespace
			next[i] = fresh
			what = "replace " + fresh.Namespace + "/" + fresh.Name
		case 1:
			next = append(next, g.policy(fmt.Sprintf("p%d", n)))
			what = "add " + next[n].Namespace + "/" + next[n].Name
		default:
			what = "delete " + next[i].Namespace + "/" + next[i].Name
			next = append(next[:i], next[i+1:]...)
		}
		c.Steps = append(c.Steps, Step{Description: what, Policies: next})
	}
	return c
}
