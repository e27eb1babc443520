/*
Copyright 2023 The Kubernetes Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

// Package singlenode runs sigs.k8s.io/network-policy-api's conformance tests (its
// conformance/tests and conformance/utils/suite packages, unchanged) on a single-node cluster.
// It is TestConformanceProfiles of the module's conformance/conformance_profile_test.go with one
// difference: the suite reads its manifests from this package's embedded base/ instead of the
// module's. scripts/cluster/build adds base/ with `go build -overlay` (it is not in the
// repository): the module's conformance/base unchanged except base/manifests.yaml, patched by
// ../single-node-base.patch (why: that file's header). Built by `scripts/cluster/build
// netpol-conformance-1node.test`; it does not compile without the overlay.
package singlenode

import (
	"embed"
	"os"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/yaml"

	api "sigs.k8s.io/network-policy-api/apis/v1beta1"
	confv1a1 "sigs.k8s.io/network-policy-api/conformance/apis/v1alpha1"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/flags"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"
)

// The suite's manifests at the paths the tests name (base/manifests.yaml, base/admin_tier/...).
//
//go:embed base
var manifests embed.FS

// TestConformanceProfiles is the module's test of that name, run with --conformance-profiles.
func TestConformanceProfiles(t *testing.T) {
	cfg, err := config.GetConfig()
	if err != nil {
		t.Fatalf("Error loading Kubernetes config: %v", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatalf("Error initializing Kubernetes client: %v", err)
	}
	kubeConfig, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		t.Fatalf("error building Kube config for client-go: %v", err)
	}
	clientSet, err := kubernetes.NewForConfig(kubeConfig)
	if err != nil {
		t.Fatalf("error when creating Kubernetes ClientSet: %v", err)
	}
	if err = api.Install(c.Scheme()); err != nil {
		t.Fatalf("Error installing api scheme: %v", err)
	}
	if err = apiextensionsv1.AddToScheme(c.Scheme()); err != nil {
		t.Fatalf("Error installing apiextensions scheme: %v", err)
	}

	conformanceProfiles := suite.ParseConformanceProfiles(*flags.ConformanceProfiles)
	if conformanceProfiles.Len() == 0 {
		t.Fatalf("--conformance-profiles is required (this driver runs the profile suite only)")
	}
	implementation, err := suite.ParseImplementation(
		*flags.ImplementationOrganization,
		*flags.ImplementationProject,
		*flags.ImplementationURL,
		*flags.ImplementationVersion,
		*flags.ImplementationContact,
		*flags.ImplementationAdditionalInformation,
	)
	if err != nil {
		t.Fatalf("Error parsing implementation's details: %v", err)
	}
	t.Logf("Running conformance profile tests with cleanup: %t\n debug: %t\n enable all features: %t \n supported features: [%v]\n exempt features: [%v]\n conformance profiles: [%v]\n manifests: the single-node base (scripts/cluster/go/netpol-api/single-node-base.patch)",
		*flags.CleanupBaseResources, *flags.ShowDebug, *flags.EnableAllSupportedFeatures, *flags.SupportedFeatures, *flags.ExemptFeatures, *flags.ConformanceProfiles)

	cSuite, err := suite.NewConformanceProfileTestSuite(
		suite.ConformanceProfileOptions{
			Options: suite.Options{
				Client:                     c,
				ClientSet:                  clientSet,
				KubeConfig:                 *cfg,
				Debug:                      *flags.ShowDebug,
				CleanupBaseResources:       *flags.CleanupBaseResources,
				SupportedFeatures:          suite.ParseSupportedFeatures(*flags.SupportedFeatures),
				ExemptFeatures:             suite.ParseSupportedFeatures(*flags.ExemptFeatures),
				EnableAllSupportedFeatures: *flags.EnableAllSupportedFeatures,
				FS:                         &manifests,
			},
			Implementation:      *implementation,
			ConformanceProfiles: conformanceProfiles,
		})
	if err != nil {
		t.Fatalf("error creating experimental conformance test suite: %v", err)
	}
	cSuite.Setup(t)
	cSuite.Run(t, tests.ConformanceTests)
	report, err := cSuite.Report()
	if err != nil {
		t.Fatalf("error generating conformance profile report: %v", err)
	}
	if err := writeReport(t.Logf, *report, *flags.ReportOutput); err != nil {
		t.Fatalf("error writing the conformance report: %v", err)
	}
}

func writeReport(logf func(string, ...any), report confv1a1.ConformanceReport, output string) error {
	rawReport, err := yaml.Marshal(report)
	if err != nil {
		return err
	}
	if output != "" {
		if err = os.WriteFile(output, rawReport, 0600); err != nil {
			return err
		}
	}
	logf("Conformance report:\n%s", string(rawReport))
	return nil
}
