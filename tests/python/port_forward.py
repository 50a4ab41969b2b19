"""port-forward through the official client (WebSocket, channel protocol,
several ports in one request): 10 MB each way through an echo server on
one port, a second port working beside it, and a refused port reported
on its own error channel while the others keep working.

Usage: port_forward.py NAMESPACE POD ECHO_PORT OTHER_ECHO_PORT CLOSED_PORT."""
import hashlib
import os
import sys
import threading
import time

from kubernetes import client, config
from kubernetes.stream import portforward

SIZE = 10 * 1024 * 1024


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


def echo_round_trip(sock, size):
    """Send `size` random bytes while reading the echo; both hashes."""
    data = os.urandom(size)
    sent = hashlib.sha256(data).hexdigest()

    def writer():
        sock.sendall(data)

    t = threading.Thread(target=writer)
    t.start()
    got, n = hashlib.sha256(), 0
    sock.settimeout(60)
    while n < size:
        chunk = sock.recv(1024 * 1024)
        if not chunk:
            break
        got.update(chunk)
        n += len(chunk)
    t.join()
    return sent, got.hexdigest(), n


def main(ns, pod, echo, other, closed):
    config.load_kube_config()
    api = client.CoreV1Api()
    echo, other, closed = int(echo), int(other), int(closed)
    pf = portforward(api.connect_get_namespaced_pod_portforward, pod, ns,
                     ports=f"{echo},{other},{closed}")

    deadline = time.monotonic() + 30
    while pf.error(closed) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    err = pf.error(closed)
    if not err or str(closed) not in err or "refused" not in err:
        fail(f"port-forward: the closed port's error channel says {err!r}")

    sent, got, n = echo_round_trip(pf.socket(echo), SIZE)
    if n != SIZE or sent != got:
        fail(f"port-forward: {n} of {SIZE} bytes came back, sha256 {got} (sent {sent})")
    sent, got, n = echo_round_trip(pf.socket(other), 4096)
    if sent != got:
        fail(f"port-forward: the second port echoed {n} bytes, not what was sent")
    for port in (echo, other):
        if pf.error(port) is not None:
            fail(f"port-forward: port {port} reported {pf.error(port)!r}")
    pf.close()
    print("port-forward ok")


if __name__ == "__main__":
    main(*sys.argv[1:6])
