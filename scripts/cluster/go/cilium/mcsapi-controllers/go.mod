// Stand-in for sigs.k8s.io/mcs-api/controllers v0.5.2, which Cilium v1.20.2's go.mod requires
// but the Go module proxy here does not serve (403 "This module version is not available"; no
// version of that nested module is served). Cilium uses one constant of it, in its MCS-API
// (ClusterMesh) controllers and the Gateway API's ServiceImport helper, neither of which the
// test cluster enables. Written here, not copied; the value is the MCS-API KEP's annotation.
module sigs.k8s.io/mcs-api/controllers

go 1.24
