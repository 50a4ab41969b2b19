#!/usr/bin/env bash
# Brings up a single-node skiff cluster on this machine: installs what is
# missing, builds skiff, starts a containerd configured for it (its own
# socket and state, so a system containerd is left alone), side-loads the
# demo images, starts the control plane (API server, scheduler, controllers)
# and the node agent joined to it (with its service proxy on nftables and
# the cluster DNS), and runs a demo static pod and a demo Deployment behind
# a Service. Safe to re-run: running pieces are kept (the agent re-adopts
# its pods).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"

STATE=/var/lib/skiff
RUN=/run/skiff
ETC=/etc/skiff
# Node podCIDRs are carved from this (the agent writes the CNI config).
CLUSTER_CIDR=${SKIFF_CLUSTER_CIDR:-10.42.0.0/16}
NODE=$(tr 'A-Z' 'a-z' </proc/sys/kernel/hostname)
SOCK=$RUN/containerd/containerd.sock
mkdir -p "$STATE" "$RUN/containerd" "$ETC/cni" "$ETC/manifests" /var/log/skiff

echo "== building skiff (release)"
cargo build --release --quiet --workspace --bins
install -m 0755 target/release/skiff-agent target/release/skiff-server /usr/local/bin/

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# containerd lacks CAP_SYS_RESOURCE on some machines (containers, some VMs):
# then runc cannot lower oom_score_adj and CRI must be told not to try.
capeff=$(awk '/^CapEff/ {print $2}' /proc/self/status)
if (( (0x$capeff >> 24) & 1 )); then RESTRICT_OOM=false; else RESTRICT_OOM=true; fi

# containerd reads registry host files from $ETC/certs.d at every pull:
# the agent writes them there from $ETC/registries.yaml when that exists.
# crun is a second runtime handler, for RuntimeClasses.
install -m 0755 scripts/crun-hybrid /usr/local/bin/skiff-crun
mkdir -p "$ETC/certs.d"
cat > "$ETC/containerd.toml.new" <<TOML
version = 2
root = "$STATE/containerd"
state = "$RUN/containerd/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "skiff.test/pause:3.9"
  restrict_oom_score_adj = $RESTRICT_OOM
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$ETC/cni"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$ETC/certs.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun.options]
        BinaryName = "/usr/local/bin/skiff-crun"
TOML
# A containerd started with an older config is restarted with this one
# (its containers keep running: their shims outlive it).
if running "$RUN/containerd.pid" && ! cmp -s "$ETC/containerd.toml.new" "$ETC/containerd.toml"; then
    echo "== restarting containerd with the new configuration"
    kill "$(cat "$RUN/containerd.pid")"
    for _ in $(seq 100); do running "$RUN/containerd.pid" || break; sleep 0.1; done
fi
mv "$ETC/containerd.toml.new" "$ETC/containerd.toml"
if ! running "$RUN/containerd.pid"; then
    echo "== starting containerd (socket $SOCK, restrict_oom_score_adj=$RESTRICT_OOM)"
    rm -f "$SOCK"
    setsid nohup containerd --config "$ETC/containerd.toml" >>/var/log/skiff/containerd.log 2>&1 &
    echo $! > "$RUN/containerd.pid"
    for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
fi
target/release/skiff-load-images "$SOCK" "$STATE/images"

if ! running "$RUN/server.pid"; then
    echo "== starting skiff-server"
    setsid nohup skiff-server --data-dir "$STATE/server" --cluster-cidr "$CLUSTER_CIDR" \
        >/var/log/skiff/server.log 2>&1 &
    echo $! > "$RUN/server.pid"
fi
for _ in $(seq 120); do [ -f "$STATE/server/admin.kubeconfig" ] && break; sleep 0.25; done
export KUBECONFIG=$STATE/server/admin.kubeconfig
# The node's own identity (system:node:NAME), signed by the cluster CA.
if [ ! -s "$ETC/node.kubeconfig" ]; then
    skiff-server --data-dir "$STATE/server" kubeconfig --user "system:node:$NODE" \
        --group system:nodes --server https://127.0.0.1:6443 > "$ETC/node.kubeconfig.tmp"
    mv "$ETC/node.kubeconfig.tmp" "$ETC/node.kubeconfig"
fi

cat > "$ETC/manifests/demo.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata:
  name: demo
  labels: {app: demo}
spec:
  containers:
  - name: web
    image: skiff.test/toolbox:1.0
    command: [sh, -c, 'mkdir -p /www && echo "hello from skiff" > /www/index.html && exec httpd -f -p 8080 -h /www']
    ports: [{containerPort: 8080}]
YAML

# A bridge left by an earlier bring-up with another pod range keeps its old
# address, and the CNI bridge plugin refuses to add the new one: clear it.
ip2int() { local IFS=.; set -- $1; echo $(( ($1 << 24) + ($2 << 16) + ($3 << 8) + $4 )); }
in_cidr() {
    local bits=${2#*/} net; net=$(ip2int "${2%/*}")
    local mask=$(( (0xffffffff << (32 - bits)) & 0xffffffff ))
    (( ($(ip2int "$1") & mask) == (net & mask) ))
}
for addr in $(ip -4 -o addr show dev skiff0 2>/dev/null | awk '{print $4}'); do
    in_cidr "${addr%/*}" "$CLUSTER_CIDR" || ip addr del "$addr" dev skiff0
done

if ! running "$RUN/agent.pid"; then
    echo "== starting skiff-agent"
    # As the systemd unit: two heap arenas (see systemd/skiff-agent.service).
    MALLOC_ARENA_MAX=2 setsid nohup skiff-agent --container-runtime-endpoint "unix://$SOCK" --root-dir "$STATE/agent" \
        --static-pod-path "$ETC/manifests" --kubeconfig "$ETC/node.kubeconfig" \
        --node-name "$NODE" --cni-conf-dir "$ETC/cni" --cni-bridge skiff0 \
        >/var/log/skiff/agent.log 2>&1 &
    echo $! > "$RUN/agent.pid"
fi

echo "== starting the demo Deployment"
kubectl apply -f - <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata:
  name: hello
spec:
  replicas: 2
  selector:
    matchLabels: {app: hello}
  template:
    metadata:
      labels: {app: hello}
    spec:
      containers:
      - name: web
        image: skiff.test/toolbox:1.0
        imagePullPolicy: IfNotPresent
        command: [sh, -c, 'mkdir -p /www && echo "hello from $HOSTNAME" > /www/index.html && exec httpd -f -p 8080 -h /www']
        ports: [{containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata:
  name: hello
spec:
  type: NodePort
  selector: {app: hello}
  ports: [{port: 80, targetPort: 8080, nodePort: 30080}]
YAML
kubectl rollout status deployment/hello --timeout=120s
kubectl get pods,services -o wide
CLUSTER_IP=$(kubectl get service hello -o jsonpath='{.spec.clusterIP}')
echo "== the hello Service through the proxy (http://$CLUSTER_IP/)"
for _ in $(seq 60); do curl -fsS --max-time 2 "http://$CLUSTER_IP/" && break; sleep 0.5; done
echo
echo "skiff is up. Logs: /var/log/skiff/. Point kubectl at the control plane:"
echo "  export KUBECONFIG=$STATE/server/admin.kubeconfig"
echo "  kubectl get pods -o wide"
echo "  curl http://$CLUSTER_IP/                 # the hello Service (NodePort 30080 on the node's addresses)"
