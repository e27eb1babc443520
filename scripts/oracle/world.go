package main

import (
	"encoding/json"
	"fmt"
	"os"

	networkingv1 "k8s.io/api/networking/v1"
)

// Port is one container port of a pod: the probe cells of a destination are its ports.
type Port struct {
	Name     string `json:"name,omitempty"`
	Port     int    `json:"port"`
	Protocol string `json:"protocol"`
}

// Pod is a pod of the test world. IP is empty until the pod has been created.
type Pod struct {
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Labels    map[string]string `json:"labels"`
	IP        string            `json:"ip,omitempty"`
	Ports     []Port            `json:"ports"`
}

// Key is "namespace/name", as cyclonus prints pods.
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// Namespace is a namespace of the test world with its labels.
type Namespace struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

// World is what the policies are evaluated over: namespaces and pods (with their IPs once the
// pods exist).
type World struct {
	Seed       int64       `json:"seed"`
	Namespaces []Namespace `json:"namespaces"`
	Pods       []Pod       `json:"pods"`
}

func (w *World) namespaceLabels(name string) (map[string]string, error) {
	for _, ns := range w.Namespaces {
		if ns.Name == name {
			return ns.Labels, nil
		}
	}
	return nil, fmt.Errorf("pod namespace %q is not one of the world's namespaces", name)
}

// Step is one state of the cluster's NetworkPolicies: the set in force after the step's
// changes, probed as a whole.
type Step struct {
	Description string                        `json:"description"`
	Policies    []*networkingv1.NetworkPolicy `json:"policies"`
}

// Case is one test case: one or more successive policy sets over the same world.
type Case struct {
	ID          string `json:"id"`
	Source      string `json:"source"`
	Description string `json:"description"`
	// ReuseTCPPorts: the TCP probes of the first step reuse the source ports of the closed
	// connections of the control round before it (a new connection on an old 5-tuple must
	// meet the policy in force now).
	ReuseTCPPorts bool   `json:"reuse_tcp_ports"`
	Steps         []Step `json:"steps"`
}

func readJSON(path string, into any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, into); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func writeJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	return enc.Encode(v)
}
