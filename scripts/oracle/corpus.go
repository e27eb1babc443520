package main

// cyclonus's own test-case generator (the cases its `generate` command runs against a cluster),
// as cases of ours: each step's actions applied to the policy set in force, the set probed
// after every step. Cases whose actions create, delete or relabel pods or namespaces are left
// out (and counted): this world's pods are fixed.

import (
	"fmt"

	"github.com/mattfenwick/cyclonus/pkg/generator"
	networkingv1 "k8s.io/api/networking/v1"
)

type corpus struct {
	Cases []*Case `json:"cases"`
	// Skipped: cases left out, with why.
	Skipped []string `json:"skipped"`
}

func policyKey(np *networkingv1.NetworkPolicy) string { return np.Namespace + "/" + np.Name }

func applyActions(in []*networkingv1.NetworkPolicy, actions []*generator.Action) ([]*networkingv1.NetworkPolicy, string, error) {
	out := append([]*networkingv1.NetworkPolicy{}, in...)
	var what []string
	put := func(np *networkingv1.NetworkPolicy) {
		for i, old := range out {
			if policyKey(old) == policyKey(np) {
				out[i] = np
				return
			}
		}
		out = append(out, np)
	}
	for _, a := range actions {
		switch {
		case a.CreatePolicy != nil:
			put(a.CreatePolicy.Policy)
			what = append(what, "create "+policyKey(a.CreatePolicy.Policy))
		case a.UpdatePolicy != nil:
			put(a.UpdatePolicy.Policy)
			what = append(what, "update "+policyKey(a.UpdatePolicy.Policy))
		case a.DeletePolicy != nil:
			key := a.DeletePolicy.Namespace + "/" + a.DeletePolicy.Name
			kept := out[:0]
			for _, np := range out {
				if policyKey(np) != key {
					kept = append(kept, np)
				}
			}
			out = kept
			what = append(what, "delete "+key)
		default:
			return nil, "", fmt.Errorf("an action on pods or namespaces (this world's pods are fixed)")
		}
	}
	return out, fmt.Sprint(what), nil
}

// genCorpus: cyclonus's generator over this world; ipBlock cases are built around z/c's IP as
// cyclonus's CLI builds them.
func genCorpus(w *World) (*corpus, error) {
	var zc string
	for _, p := range w.Pods {
		if p.Namespace == "z" && p.Name == "c" {
			zc = p.IP
		}
	}
	if zc == "" {
		return nil, fmt.Errorf("the world has no pod z/c with an IP")
	}
	tcs := generator.NewTestCaseGenerator(false, zc, worldNamespaces, nil, nil).GenerateTestCases()
	out := &corpus{}
	for i, tc := range tcs {
		c := &Case{
			ID:          fmt.Sprintf("cyclonus case %d", i),
			Source:      "cyclonus-generator",
			Description: tc.Description,
		}
		var policies []*networkingv1.NetworkPolicy
		var err error
		for _, step := range tc.Steps {
			var what string
			policies, what, err = applyActions(policies, step.Actions)
			if err != nil {
				break
			}
			c.Steps = append(c.Steps, Step{Description: what, Policies: policies})
		}
		if err != nil {
			out.Skipped = append(out.Skipped, fmt.Sprintf("%s (%s): %v", c.ID, tc.Description, err))
			continue
		}
		out.Cases = append(out.Cases, c)
	}
	return out, nil
}
