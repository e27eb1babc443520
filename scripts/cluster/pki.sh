# The cluster's certificates and keys (openssl, EC P-256), sourced by scripts/cluster/up after
# cluster.sh: one CA signs the API server's serving certificate, the kubelet's, and a client
# certificate per component whose subject is the identity RBAC and the Node authorizer expect.

# pki_cert NAME CN O SAN USAGE: $CL_PKI/NAME.key + NAME.crt (the selected node's pki dir) signed
# by the cluster's CA in $CL_CA_PKI ($PKI_CA, default ca). O may be empty, SAN is an openssl
# subjectAltName value or empty, USAGE is serverAuth, clientAuth or both.
pki_cert() {
  local name=$1 cn=$2 o=$3 san=$4 usage=$5 subj ext
  subj="/CN=$cn"
  [ -n "$o" ] && subj="$subj/O=$o"
  ext=$CL_PKI/$name.ext
  {
    echo "basicConstraints = critical, CA:FALSE"
    echo "keyUsage = critical, digitalSignature, keyEncipherment"
    echo "extendedKeyUsage = $usage"
    [ -n "$san" ] && echo "subjectAltName = $san"
  } >"$ext"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$CL_PKI/$name.key" 2>/dev/null &&
    openssl req -new -key "$CL_PKI/$name.key" -subj "$subj" -out "$CL_PKI/$name.csr" &&
    openssl x509 -req -in "$CL_PKI/$name.csr" -CA "$CL_CA_PKI/${PKI_CA:-ca}.crt" -CAkey "$CL_CA_PKI/${PKI_CA:-ca}.key" \
      -set_serial "0x$(openssl rand -hex 16)" -days 3650 -sha256 -extfile "$ext" \
      -out "$CL_PKI/$name.crt" 2>/dev/null ||
    cl_die "openssl could not make the $name certificate"
  rm -f "$CL_PKI/$name.csr" "$ext"
}

pki_all() {
  command -v openssl >/dev/null || cl_die "openssl is missing: run scripts/setup"
  mkdir -p "$CL_PKI"
  chmod 700 "$CL_PKI"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$CL_PKI/ca.key" 2>/dev/null &&
    openssl req -x509 -new -key "$CL_PKI/ca.key" -subj "/CN=weft-cluster-$CL_NAME-ca" -days 3650 \
      -sha256 -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" -out "$CL_PKI/ca.crt" ||
    cl_die "openssl could not make the CA"
  local dns="DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  dns="$dns,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
  pki_cert apiserver kube-apiserver "" "$dns,IP:$CL_API_SVC_IP,IP:$CL_NODE_IP,IP:127.0.0.1" serverAuth
  # The API server's identity towards the kubelet (exec, logs, port-forward).
  pki_cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters "" clientAuth
  pki_cert admin kubernetes-admin system:masters "" clientAuth
  pki_cert controller-manager system:kube-controller-manager "" "" clientAuth
  pki_cert scheduler system:kube-scheduler "" "" clientAuth
  pki_cert kube-proxy system:kube-proxy "" "" clientAuth
  # The Node authorizer knows a kubelet by system:node:<node name> in group system:nodes.
  pki_cert kubelet "system:node:$CL_NODE" system:nodes "" clientAuth
  pki_cert kubelet-serving "$CL_NODE" "" "DNS:$CL_NODE,IP:$CL_NODE_IP" serverAuth
  # The aggregation layer's front proxy: its own CA, as kubeadm does (without it every
  # component logs the missing requestheader CA bundle, and aggregated APIs cannot work).
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$CL_PKI/front-proxy-ca.key" 2>/dev/null &&
    openssl req -x509 -new -key "$CL_PKI/front-proxy-ca.key" -subj "/CN=weft-cluster-$CL_NAME-front-proxy-ca" \
      -days 3650 -sha256 -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" -out "$CL_PKI/front-proxy-ca.crt" ||
    cl_die "openssl could not make the front-proxy CA"
  PKI_CA=front-proxy-ca pki_cert front-proxy-client front-proxy-client "" "" clientAuth
  # Service-account tokens: signed by the API server, verified with the public half.
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$CL_PKI/sa.key" 2>/dev/null &&
    openssl pkey -in "$CL_PKI/sa.key" -pubout -out "$CL_PKI/sa.pub" 2>/dev/null ||
    cl_die "openssl could not make the service-account key"
}

# pki_worker: the selected worker node's certificates in its own pki dir, signed by the
# cluster's CA: its kubelet's client certificate (system:node:<name> in system:nodes, what the
# Node authorizer and NodeRestriction know it by) and serving certificate, kube-proxy's client
# certificate, and the CA's certificate (not its key).
pki_worker() {
  mkdir -p "$CL_PKI"
  chmod 700 "$CL_PKI"
  cp "$CL_CA_PKI/ca.crt" "$CL_PKI/ca.crt" || cl_die "cannot copy the CA certificate to $CL_PKI"
  pki_cert kube-proxy system:kube-proxy "" "" clientAuth
  pki_cert kubelet "system:node:$CL_NODE" system:nodes "" clientAuth
  pki_cert kubelet-serving "$CL_NODE" "" "DNS:$CL_NODE,IP:$CL_NODE_IP" serverAuth
}
