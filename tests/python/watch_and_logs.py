"""A watch from a resourceVersion with bookmarks, and a followed log, read
with the official client: the events after that version arrive in order
and decode into the client's models, a BOOKMARK carries a newer version,
and `follow` streams a container's lines until it exits.

Usage: watch_and_logs.py NAMESPACE TICKER_POD TICKS."""
import sys
import threading
import time

from kubernetes import client, config, watch


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


def main(ns, ticker, ticks):
    config.load_kube_config()
    api = client.CoreV1Api()

    start = api.create_namespaced_config_map(
        ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="w-start")))
    rv = start.metadata.resource_version

    def writes():
        time.sleep(1)
        api.create_namespaced_config_map(
            ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="w-1"), data={"n": "1"}))
        api.patch_namespaced_config_map("w-1", ns, {"data": {"n": "2"}})

    threading.Thread(target=writes).start()
    seen, bookmark = [], None
    w = watch.Watch()
    # Idle watches that allow bookmarks get one within seconds.
    for ev in w.stream(api.list_namespaced_config_map, ns, resource_version=rv,
                       allow_watch_bookmarks=True, timeout_seconds=15):
        if ev["type"] == "BOOKMARK":
            bookmark = ev["raw_object"]["metadata"]["resourceVersion"]
            w.stop()
            continue
        obj = ev["object"]
        if not isinstance(obj, client.V1ConfigMap):
            fail(f"watch: {ev['type']} decoded as {type(obj).__name__}")
        seen.append((ev["type"], obj.metadata.name, (obj.data or {}).get("n")))
    want = [("ADDED", "w-1", "1"), ("MODIFIED", "w-1", "2")]
    if seen != want:
        fail(f"watch from {rv}: {seen}, want {want}")
    if bookmark is None or int(bookmark) < int(rv):
        fail(f"watch: bookmark {bookmark!r} (started at {rv})")

    resp = api.read_namespaced_pod_log(ticker, ns, follow=True, _preload_content=False)
    lines = b"".join(resp.stream()).decode().splitlines()
    want = [f"tick {i}" for i in range(1, int(ticks) + 1)]
    if lines != want:
        fail(f"logs -f: {lines}, want {want}")
    print("watch and logs ok")


if __name__ == "__main__":
    main(*sys.argv[1:4])
