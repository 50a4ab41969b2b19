#!/usr/bin/env bash
# Brings up a single-node skiff cluster on this machine: installs what is
# missing, builds skiff, starts a containerd configured for it (its own
# socket and state, so a system containerd is left alone), side-loads the
# demo images, starts the control plane and the node agent, and runs a demo
# pod. Safe to re-run: running pieces are kept (the agent re-adopts its pods).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"

STATE=/var/lib/skiff
RUN=/run/skiff
ETC=/etc/skiff
POD_CIDR=${SKIFF_POD_CIDR:-198.18.0.0/24}
SOCK=$RUN/containerd/containerd.sock
mkdir -p "$STATE" "$RUN/containerd" "$ETC/cni" "$ETC/manifests" /var/log/skiff

echo "== building skiff (release)"
cargo build --release --quiet -p skiff-agent -p skiff-control-plane -p skiff-tests \
    --bin skiff-agent --bin skiff-server --bin skiff-load-images
install -m 0755 target/release/skiff-agent target/release/skiff-server /usr/local/bin/

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# containerd lacks CAP_SYS_RESOURCE on some machines (containers, some VMs):
# then runc cannot lower oom_score_adj and CRI must be told not to try.
capeff=$(awk '/^CapEff/ {print $2}' /proc/self/status)
if (( (0x$capeff >> 24) & 1 )); then RESTRICT_OOM=false; else RESTRICT_OOM=true; fi

if ! running "$RUN/containerd.pid"; then
    echo "== starting containerd (socket $SOCK, restrict_oom_score_adj=$RESTRICT_OOM)"
    cat > "$ETC/containerd.toml" <<TOML
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
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
TOML
    cat > "$ETC/cni/10-skiff.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "skiff",
  "plugins": [
    {"type": "bridge", "bridge": "skiff0", "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]],
              "dataDir": "$STATE/cni/networks"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
    setsid nohup containerd --config "$ETC/containerd.toml" >/var/log/skiff/containerd.log 2>&1 &
    echo $! > "$RUN/containerd.pid"
    for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
fi
target/release/skiff-load-images "$SOCK" "$STATE/images"

if ! running "$RUN/server.pid"; then
    echo "== starting skiff-server"
    setsid nohup skiff-server --data-dir "$STATE/server" >/var/log/skiff/server.log 2>&1 &
    echo $! > "$RUN/server.pid"
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

if ! running "$RUN/agent.pid"; then
    echo "== starting skiff-agent"
    setsid nohup skiff-agent --container-runtime-endpoint "unix://$SOCK" --root-dir "$STATE/agent" \
        --static-pod-path "$ETC/manifests" >/var/log/skiff/agent.log 2>&1 &
    echo $! > "$RUN/agent.pid"
fi

echo "== waiting for the demo pod"
for _ in $(seq 120); do
    skiff-agent pods 2>/dev/null | grep -q "demo-.*Running" && break
    sleep 0.5
done
skiff-agent pods
for _ in $(seq 40); do [ -f "$STATE/server/admin.kubeconfig" ] && break; sleep 0.25; done
echo
echo "skiff is up. Logs: /var/log/skiff/. The node's pods: skiff-agent pods"
if [ -f "$STATE/server/admin.kubeconfig" ]; then
    echo "Point kubectl at the control plane:"
    echo "  export KUBECONFIG=$STATE/server/admin.kubeconfig"
    echo "  kubectl get namespaces"
else
    echo "skiff-server did not write its kubeconfig yet: see /var/log/skiff/server.log" >&2
fi
