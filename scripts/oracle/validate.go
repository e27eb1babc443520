package main

// The API server's validation of a NetworkPolicy (the rules a case could break): a case the API
// server would refuse has no expected verdict, so it is an error here rather than whatever
// cyclonus makes of it (cyclonus reads an empty peer as "the policy's namespace").

import (
	"fmt"
	"net"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

func validatePeer(p networkingv1.NetworkPolicyPeer, path string) error {
	if p.IPBlock == nil && p.PodSelector == nil && p.NamespaceSelector == nil {
		return fmt.Errorf("%s: must specify a peer (podSelector, namespaceSelector or ipBlock)", path)
	}
	if p.IPBlock == nil {
		return nil
	}
	if p.PodSelector != nil || p.NamespaceSelector != nil {
		return fmt.Errorf("%s: ipBlock may not be combined with podSelector or namespaceSelector", path)
	}
	_, cidr, err := net.ParseCIDR(p.IPBlock.CIDR)
	if err != nil {
		return fmt.Errorf("%s.ipBlock.cidr: %w", path, err)
	}
	cidrOnes, _ := cidr.Mask.Size()
	for i, e := range p.IPBlock.Except {
		_, ex, err := net.ParseCIDR(e)
		if err != nil {
			return fmt.Errorf("%s.ipBlock.except[%d]: %w", path, i, err)
		}
		exOnes, _ := ex.Mask.Size()
		if exOnes <= cidrOnes || !cidr.Contains(ex.IP) {
			return fmt.Errorf("%s.ipBlock.except[%d]: %s must be a strict subset of cidr %s", path, i, e, p.IPBlock.CIDR)
		}
	}
	return nil
}

func validatePort(p networkingv1.NetworkPolicyPort, path string) error {
	if p.Protocol != nil {
		switch *p.Protocol {
		case "TCP", "UDP", "SCTP":
		default:
			return fmt.Errorf("%s.protocol: %q is not TCP, UDP or SCTP", path, *p.Protocol)
		}
	}
	if p.Port == nil {
		if p.EndPort != nil {
			return fmt.Errorf("%s.endPort: needs a port", path)
		}
		return nil
	}
	if p.Port.Type == intstr.String {
		if p.EndPort != nil {
			return fmt.Errorf("%s.endPort: the port must be a number, not %q", path, p.Port.StrVal)
		}
		if errs := validation.IsValidPortName(p.Port.StrVal); len(errs) > 0 {
			return fmt.Errorf("%s.port: %q: %v", path, p.Port.StrVal, errs)
		}
		return nil
	}
	if p.Port.IntVal < 1 || p.Port.IntVal > 65535 {
		return fmt.Errorf("%s.port: %d is not in 1-65535", path, p.Port.IntVal)
	}
	if p.EndPort != nil && (*p.EndPort < p.Port.IntVal || *p.EndPort > 65535) {
		return fmt.Errorf("%s.endPort: %d must be in port (%d)-65535", path, *p.EndPort, p.Port.IntVal)
	}
	return nil
}

func validatePolicy(np *networkingv1.NetworkPolicy) error {
	name := np.Namespace + "/" + np.Name
	for _, t := range np.Spec.PolicyTypes {
		if t != networkingv1.PolicyTypeIngress && t != networkingv1.PolicyTypeEgress {
			return fmt.Errorf("%s: policyTypes: %q is not Ingress or Egress", name, t)
		}
	}
	check := func(dir string, i int, ports []networkingv1.NetworkPolicyPort, peers []networkingv1.NetworkPolicyPeer) error {
		for j, p := range ports {
			if err := validatePort(p, fmt.Sprintf("%s: spec.%s[%d].ports[%d]", name, dir, i, j)); err != nil {
				return err
			}
		}
		for j, p := range peers {
			if err := validatePeer(p, fmt.Sprintf("%s: spec.%s[%d].peers[%d]", name, dir, i, j)); err != nil {
				return err
			}
		}
		return nil
	}
	for i, r := range np.Spec.Ingress {
		if err := check("ingress", i, r.Ports, r.From); err != nil {
			return err
		}
	}
	for i, r := range np.Spec.Egress {
		if err := check("egress", i, r.Ports, r.To); err != nil {
			return err
		}
	}
	return nil
}
