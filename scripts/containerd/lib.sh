# containerd driving Weft over CRI, for e2e scripts and benchmarks. Source after scripts/lib.sh.
#
# containerd runs inside the run's private "node" netns (nsenter --net, beside weft-manager), so
# the CNI plugins it execs plumb that netns, never the host's. It has its own root, state dir,
# gRPC socket, CNI bin/conf dirs and sandbox image (built from pause.c and imported), and every
# sandbox's cgroups live under one cgroup parent of this run. What it writes outside those dirs
# (libcni's /var/lib/cni/results cache, shim sockets in /run/containerd/s) is removed by exact
# name at exit, with whatever containerd, its shims and pause processes left running.

CTRD_DIR=$WEFT_TMP/containerd
CTRD_SOCK=$CTRD_DIR/containerd.sock
CTRD_PID=
CTRD_NET=weft-$WEFT_P                # network name: libcni's cache files are named after it
CTRD_CGROUP=/$WEFT_P-pods            # cgroup parent of every sandbox
CTRD_IMAGE=weft.local/pause:1
CTRD_IDS=$CTRD_DIR/sandbox-ids       # every sandbox id this run created
CTRD_BIN=$CTRD_DIR/cni/bin
CTRD_CONF=$CTRD_DIR/cni/net.d

for tool in containerd containerd-shim-runc-v2 ctr runc gcc iptables; do
  command -v "$tool" >/dev/null || die "$tool is missing: run scripts/setup"
done
[ -x "$WEFT_BIN/weft-cri" ] || die "$WEFT_BIN/weft-cri is missing: run cargo build --release"

cri() { "$WEFT_BIN/weft-cri" --socket "$CTRD_SOCK" "$@"; }

# ctrd_conflist [cniVersion] [extra plugin JSON objects...]: Weft first, then the given plugins.
ctrd_conflist() {
  local v=${1:-1.0.0}; shift || true
  local extra=("$@")
  jq -n --arg v "$v" --arg name "$CTRD_NET" --arg sock "$WEFT_SOCK" --arg log "$WEFT_TMP/cni.log" \
    --argjson extra "$(printf '%s\n' "${extra[@]}" | jq -s .)" \
    '{cniVersion: $v, name: $name, plugins: ([{type: "weft", socket: $sock, logFile: $log,
       logLevel: "debug", capabilities: {"io.kubernetes.cri.pod-annotations": true, bandwidth: true}}] + $extra)}' \
    >"$CTRD_CONF/10-weft.conflist"
}

ctrd_setup() {
  mkdir -p "$CTRD_DIR"/{root,state} "$CTRD_BIN" "$CTRD_CONF"
  : >"$CTRD_IDS"
  # The standard plugins (containerd's own loopback ADD, portmap, bandwidth) beside Weft.
  local p
  for p in /usr/lib/cni/*; do ln -s "$p" "$CTRD_BIN/"; done
  ln -s "$WEFT_BIN/weft-cni" "$CTRD_BIN/weft"
  bash "$WEFT_ROOT/scripts/containerd/pause-image.sh" "$CTRD_DIR/pause.tar" "$CTRD_IMAGE" ||
    die "building the pause image failed"
  cat >"$CTRD_DIR/config.toml" <<EOF
version = 2
root = "$CTRD_DIR/root"
state = "$CTRD_DIR/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$CTRD_SOCK"
[ttrpc]
  address = "$CTRD_DIR/containerd.sock.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$CTRD_DIR/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$CTRD_IMAGE"
  # No CAP_SYS_RESOURCE here: without this runc fails with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  disable_apparmor = true
  disable_hugetlb_controller = true
  systemd_cgroup = false
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CTRD_BIN"
    conf_dir = "$CTRD_CONF"
    max_conf_num = 1
EOF
  trap 'rc=$?; ctrd_cleanup; (exit $rc); weft_cleanup' EXIT
}

ctrd_start() {
  nsenter --net="/run/netns/$WEFT_NODE" containerd --config "$CTRD_DIR/config.toml" \
    >>"$CTRD_DIR/containerd.log" 2>&1 &
  CTRD_PID=$!
  local i
  for i in $(seq 100); do
    cri list >/dev/null 2>&1 && break
    kill -0 "$CTRD_PID" 2>/dev/null || die "containerd exited (log: $CTRD_DIR/containerd.log)"
    sleep 0.1
  done
  cri list >/dev/null || die "containerd's CRI did not come up (log: $CTRD_DIR/containerd.log)"
  if ! ctr --address "$CTRD_SOCK" -n k8s.io images ls -q | matches -x "$CTRD_IMAGE"; then
    ctr --address "$CTRD_SOCK" -n k8s.io images import --snapshotter overlayfs "$CTRD_DIR/pause.tar" \
      >/dev/null || die "importing the pause image failed"
  fi
}

ctrd_stop() {
  if [ -n "$CTRD_PID" ]; then
    kill "$CTRD_PID" 2>/dev/null
    wait "$CTRD_PID" 2>/dev/null
    CTRD_PID=
  fi
}

# pod_run NAME NAMESPACE [weft-cri run flags...] → prints the sandbox id and records it.
pod_run() {
  local name=$1 ns=$2 id; shift 2
  id=$(cri run --name "$name" --namespace "$ns" --cgroup-parent "$CTRD_CGROUP" "$@") || return 1
  echo "$id" >>"$CTRD_IDS"
  echo "$id"
}
pod_status() { cri status "$1"; }
pod_netns() { cri status "$1" | jq -r .netns; }
pod_sip() { cri status "$1" | jq -r .ip; }
pod_gone() { cri stop "$1" && cri remove "$1"; }
in_sandbox() { local id=$1 ns; shift; ns=$(pod_netns "$id") && nsenter --net="$ns" "$@"; }

# Processes in this run's sandbox cgroups (the pause processes).
ctrd_cgroup_pids() {
  cat /sys/fs/cgroup/pids"$CTRD_CGROUP"/*/cgroup.procs 2>/dev/null
}

# Shims serving this run's containerd: their command line names its unique socket path.
ctrd_shim_pids() {
  local p
  for p in /proc/[0-9]*; do
    { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | matches -- "-address $CTRD_SOCK " && basename "$p"
  done
}

ctrd_cleanup() {
  [ -d "$CTRD_DIR" ] || return 0
  local id pid m d
  # Through CRI first, while the manager still answers: the CNI DELs free Weft's state.
  if [ -n "$CTRD_PID" ] && kill -0 "$CTRD_PID" 2>/dev/null; then
    for id in $(cri list 2>/dev/null | jq -r '.[].id' 2>/dev/null | tee -a "$CTRD_IDS"); do
      timeout 20 "$WEFT_BIN/weft-cri" --socket "$CTRD_SOCK" stop "$id" >/dev/null 2>&1
      timeout 20 "$WEFT_BIN/weft-cri" --socket "$CTRD_SOCK" remove "$id" >/dev/null 2>&1
    done
  fi
  ctrd_stop
  for pid in $(ctrd_cgroup_pids) $(ctrd_shim_pids); do kill -9 "$pid" 2>/dev/null; done
  sleep 0.2
  # Rootfs overlays and netns bind mounts left by a killed containerd, deepest first.
  awk -v d="$CTRD_DIR/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null
  done
  for d in /sys/fs/cgroup/*"$CTRD_CGROUP"; do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  rm -f /var/lib/cni/results/"$CTRD_NET"-*
  while read -r id; do
    [ -n "$id" ] || continue
    rm -f "/var/lib/cni/results/cni-loopback-$id-lo"
    for m in "$CTRD_SOCK/k8s.io/$id" "$CTRD_DIR/containerd.sock.ttrpc/k8s.io/$id"; do
      rm -f "/run/containerd/s/$(printf '%s' "$m" | sha256sum | cut -d' ' -f1)"
    done
  done <"$CTRD_IDS"
  if [ "${WEFT_FAILED:-0}" != 0 ] && [ -f "$CTRD_DIR/containerd.log" ]; then
    echo "--- containerd log (last 20 lines) ---" >&2
    tail -20 "$CTRD_DIR/containerd.log" >&2
  fi
}
