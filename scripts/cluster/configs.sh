# Configuration files of the node's components, sourced by scripts/cluster/up after cluster.sh
# and pki.sh. Everything is written under $CL_CONF; paths inside refer to the node's view of
# the file system (scripts/cluster/node-mounts), which equals the host's for the state dir.

# conf_kubeconfig NAME USER: $CL_CONF/NAME.kubeconfig with USER's client certificate.
conf_kubeconfig() {
  local name=$1 user=$2
  cat >"$CL_CONF/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $CL_NAME
  cluster:
    server: $CL_API
    certificate-authority: $CL_PKI/ca.crt
users:
- name: $user
  user:
    client-certificate: $CL_PKI/$name.crt
    client-key: $CL_PKI/$name.key
contexts:
- name: $user@$CL_NAME
  context: {cluster: $CL_NAME, user: $user}
current-context: $user@$CL_NAME
EOF
}

# conf_containerd SANDBOX_IMAGE: containerd 2.3 (config version 4) with its own root, state and
# sockets, the kubelet's CRI on $CL_CONTAINERD_SOCK, CNI from the node's standard directories.
conf_containerd() {
  local sandbox=$1 runc
  runc=$CLUSTER_BIN/runc
  [ -x "$runc" ] || cl_die "$runc is missing: run scripts/cluster/build"
  mkdir -p "$CL_NSTATE/containerd"
  cat >"$CL_CONF/containerd.toml" <<EOF
version = 4
root = "$CL_NSTATE/containerd/root"
state = "$CL_NSTATE/containerd/state"
# Nothing from the host's /etc/containerd.
imports = []

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = "$CL_CONTAINERD_SOCK"
  [plugins.'io.containerd.server.v1.ttrpc']
    address = "$CL_CONTAINERD_SOCK.ttrpc"
  [plugins.'io.containerd.server.v1.debug']
    address = ""
  [plugins.'io.containerd.server.v1.metrics']
    address = ""
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '$sandbox'
  [plugins.'io.containerd.cri.v1.runtime']
    disable_apparmor = true
    # No CAP_SYS_RESOURCE on these machines: without it runc fails with "can't get final
    # child's PID from pipe" (docs: /work/shared/PLATFORM.md, "Real runtime: containerd").
    restrict_oom_score_adj = true
    disable_hugetlb_controller = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          SystemdCgroup = false
          BinaryName = '$runc'
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['/opt/cni/bin']
      conf_dir = '/etc/cni/net.d'
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
EOF
}

conf_kubelet() {
  cat >"$CL_CONF/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $CL_NODE_IP
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
tlsCertFile: $CL_PKI/kubelet-serving.crt
tlsPrivateKeyFile: $CL_PKI/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $CL_PKI/ca.crt}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$CL_CONTAINERD_SOCK
cgroupDriver: cgroupfs
# Every pod's cgroups under this cluster's own parent, removed by scripts/cluster/down.
cgroupRoot: $CL_CGROUP
# cgroup v1 (hybrid) and swap on these machines.
failCgroupV1: false
failSwapOn: false
memorySwap: {swapBehavior: NoSwap}
clusterDomain: cluster.local
clusterDNS: [$CL_DNS_IP]
resolvConf: $CL_CONF/resolv.conf
# The host's disk is shared with the rest of the machine: evict only when it is really full.
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# The images are imported, never pulled (no registry here).
serializeImagePulls: true
rotateCertificates: false
serverTLSBootstrap: false
EOF
  # Pods resolve through the cluster's DNS address (no DNS server runs: the tests use IPs).
  printf 'nameserver %s\noptions ndots:5\n' "$CL_DNS_IP" >"$CL_CONF/resolv.conf"
}

conf_kube_proxy() {
  cat >"$CL_CONF/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $CL_CONF/kube-proxy.kubeconfig
hostnameOverride: $CL_NODE
mode: iptables
clusterCIDR: $CL_CLUSTER_CIDR
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# nf_conntrack_max and the conntrack hash size are the whole machine's, not this netns's:
# leave them (and the per-netns timeouts) as they are.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}
