"""exec through the official client's WebSocket stream: stdin written as
text and as binary messages reaches the shell, and the v5 close channel
ends the remote stdin, so `cat` exits 0 with everything it read.

Usage: exec_stdin.py NAMESPACE POD (KUBECONFIG names the cluster)."""
import sys

from kubernetes import client, config
from kubernetes.stream import stream


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


def main(ns, pod):
    config.load_kube_config()
    api = client.CoreV1Api()

    shell = stream(api.connect_get_namespaced_pod_exec, pod, ns, command=["sh"],
                   stdin=True, stdout=True, stderr=True, tty=False,
                   _preload_content=False)
    # A str is sent as a text message, bytes as a binary one.
    for data, want in (("echo test string 1\n", "test string 1"),
                       (b"echo test string 2\n", "test string 2")):
        shell.write_stdin(data)
        line = shell.readline_stdout(timeout=5)
        if line != want:
            fail(f"exec: wrote {data!r}, read {line!r} (want {want!r})")
    shell.close()

    cat = stream(api.connect_get_namespaced_pod_exec, pod, ns, command=["cat"],
                 stdin=True, stdout=True, stderr=True, tty=False,
                 _preload_content=False)
    if cat.subprotocol != "v5.channel.k8s.io":
        fail(f"exec: subprotocol {cat.subprotocol!r}, want v5.channel.k8s.io")
    cat.write_stdin("closed by the close channel\n")
    cat.close_channel(0)
    cat.run_forever(timeout=20)
    if cat.is_open():
        fail("exec: cat did not exit after its stdin was closed")
    out = cat.read_stdout()
    if cat.returncode != 0 or out != "closed by the close channel\n":
        fail(f"exec: cat exited {cat.returncode!r} with {out!r}")
    print("exec ok")


if __name__ == "__main__":
    main(*sys.argv[1:3])
