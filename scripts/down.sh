#!/usr/bin/env bash
# Stops what scripts/up.sh started: the agent first tears its pods down (the
# workloads are deleted, static pod manifests moved aside), then the agent, skiff-server and containerd
# stop. With --purge, their state is removed too. Safe to re-run.
set -euo pipefail
STATE=/var/lib/skiff
RUN=/run/skiff
ETC=/etc/skiff

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if running "$RUN/agent.pid" && command -v skiff-agent >/dev/null; then
    if running "$RUN/server.pid" && [ -f "$STATE/server/admin.kubeconfig" ]; then
        # Workloads first, so their controllers do not recreate the pods.
        KUBECONFIG=$STATE/server/admin.kubeconfig kubectl delete \
            deployments,daemonsets,jobs,replicasets,pods --all --all-namespaces \
            --wait=false >/dev/null 2>&1 || true
    fi
    mkdir -p "$ETC/manifests.down"
    find "$ETC/manifests" -maxdepth 1 -type f -exec mv -t "$ETC/manifests.down" {} +
    echo "== waiting for the agent to stop its pods"
    for _ in $(seq 120); do
        [ "$(skiff-agent pods -o json 2>/dev/null | grep -c '"uid"')" = 0 ] && break
        sleep 0.5
    done
fi
stop() {
    if running "$RUN/$1.pid"; then
        kill "$(cat "$RUN/$1.pid")"
        for _ in $(seq 50); do running "$RUN/$1.pid" || break; sleep 0.1; done
    fi
    rm -f "$RUN/$1.pid"
}
stop agent
stop server
# Whatever the agent did not tear down (it was not running, or its pods
# outlived the wait) goes through CRI while containerd is still up: a
# sandbox left behind keeps its cni-* network namespace.
if running "$RUN/containerd.pid" && command -v skiff-agent >/dev/null; then
    skiff-agent remove-pods --container-runtime-endpoint "unix://$RUN/containerd/containerd.sock" \
        --pod-log-dir /var/log/pods || true
fi
stop containerd
# The proxy's rules outlive the agent by design (a restart must not cut
# connections); stopping the cluster removes them.
command -v skiff-agent >/dev/null && skiff-agent --cleanup >/dev/null 2>&1 || true
nft delete table ip skiff-network 2>/dev/null || true
ip route show proto 88 | while read -r route; do ip route del $route proto 88 || true; done
ip link del skiff0 2>/dev/null || true
if [ "${1:-}" = "--purge" ]; then
    # The node kubeconfig is signed by the CA that goes with the state.
    rm -rf "$STATE" "$RUN" "$ETC/manifests.down" "$ETC/node.kubeconfig" "$ETC/cni" "$ETC/certs.d"
fi
echo "skiff stopped"
