// Package controllers stands in for sigs.k8s.io/mcs-api/controllers (see go.mod): only the
// identifier Cilium v1.20.2 uses.
package controllers

// DerivedServiceAnnotation is set on a ServiceImport to name the Service derived from it
// (KEP-1645, Multi-Cluster Services API).
const DerivedServiceAnnotation = "multicluster.kubernetes.io/derived-service"
