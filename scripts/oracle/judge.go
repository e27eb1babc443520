package main

import (
	"fmt"

	"github.com/mattfenwick/cyclonus/pkg/matcher"
	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// Cell is the expected verdict for one (source pod, destination pod, port, protocol).
type Cell struct {
	Src      string `json:"src"`
	Dst      string `json:"dst"`
	SrcIP    string `json:"src_ip"`
	DstIP    string `json:"dst_ip"`
	Port     int    `json:"port"`
	Protocol string `json:"protocol"`
	PortName string `json:"port_name,omitempty"`
	Allowed  bool   `json:"allowed"`
	// Ingress and Egress: whether each side alone allows it (both must).
	Ingress bool `json:"ingress"`
	Egress  bool `json:"egress"`
}

// defaultPolicyTypes applies the API server's defaulting: a policy stored without policyTypes
// has Ingress, and Egress too when it has egress rules. cyclonus's matcher expects the stored
// (defaulted) form.
func defaultPolicyTypes(np *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	if len(np.Spec.PolicyTypes) > 0 {
		return np
	}
	out := np.DeepCopy()
	out.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	if len(np.Spec.Egress) > 0 {
		out.Spec.PolicyTypes = append(out.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
	}
	return out
}

// buildPolicy runs cyclonus's policy builder; it panics on invalid input (its own guards), which
// becomes an error naming the policies.
func buildPolicy(policies []*networkingv1.NetworkPolicy) (p *matcher.Policy, err error) {
	defaulted := make([]*networkingv1.NetworkPolicy, 0, len(policies))
	for _, np := range policies {
		if err := validatePolicy(np); err != nil {
			return nil, fmt.Errorf("the API server would refuse this policy: %w", err)
		}
		defaulted = append(defaulted, defaultPolicyTypes(np))
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cyclonus rejected the policies: %v", r)
		}
	}()
	return matcher.BuildNetworkPolicies(false, defaulted), nil
}

// allowed asks cyclonus's matcher about one flow; its ipBlock matcher panics on an address or
// CIDR it cannot parse.
func allowed(p *matcher.Policy, t *matcher.Traffic) (r *matcher.AllowedResult, err error) {
	defer func() {
		if rec := recover(); rec != nil {
			err = fmt.Errorf("cyclonus could not evaluate %s -> %s: %v", t.Source.IP, t.Destination.IP, rec)
		}
	}()
	return p.IsTrafficAllowed(t), nil
}

func peer(w *World, pod *Pod) (*matcher.TrafficPeer, error) {
	nsLabels, err := w.namespaceLabels(pod.Namespace)
	if err != nil {
		return nil, err
	}
	if pod.IP == "" {
		return nil, fmt.Errorf("pod %s has no IP: the world file must be the one written after the pods were created", pod.Key())
	}
	return &matcher.TrafficPeer{
		Internal: &matcher.InternalPeer{
			PodLabels:       pod.Labels,
			NamespaceLabels: nsLabels,
			Namespace:       pod.Namespace,
		},
		IP: pod.IP,
	}, nil
}

// judge returns the expected verdict of every cell: every ordered pair of distinct pods, on
// every container port of the destination (its port name is the one the destination gives
// that port and protocol, as a named port in a policy is resolved against the destination).
// A pod's traffic to its own IP never leaves its network namespace and is not a cell.
func judge(w *World, policies []*networkingv1.NetworkPolicy) ([]Cell, error) {
	p, err := buildPolicy(policies)
	if err != nil {
		return nil, err
	}
	var cells []Cell
	for i := range w.Pods {
		src := &w.Pods[i]
		from, err := peer(w, src)
		if err != nil {
			return nil, err
		}
		for j := range w.Pods {
			dst := &w.Pods[j]
			if i == j {
				continue
			}
			to, err := peer(w, dst)
			if err != nil {
				return nil, err
			}
			for _, port := range dst.Ports {
				t := &matcher.Traffic{
					Source:           from,
					Destination:      to,
					ResolvedPort:     port.Port,
					ResolvedPortName: port.Name,
					Protocol:         v1.Protocol(port.Protocol),
				}
				r, err := allowed(p, t)
				if err != nil {
					return nil, err
				}
				cells = append(cells, Cell{
					Src: src.Key(), Dst: dst.Key(), SrcIP: src.IP, DstIP: dst.IP,
					Port: port.Port, Protocol: port.Protocol, PortName: port.Name,
					Allowed: r.IsAllowed(), Ingress: r.Ingress.IsAllowed(), Egress: r.Egress.IsAllowed(),
				})
			}
		}
	}
	return cells, nil
}
