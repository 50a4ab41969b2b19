"""Every listable resource the server advertises, listed with the official
client and decoded into the client's own models (pydantic, strict: a
missing required field or a wrong type fails), as a user's script would
read them. Prints one line per resource; exits 1 if any list fails to
decode or a served kind has no model in the client.

Usage: models.py (KUBECONFIG names the cluster)."""
import json
import sys

from kubernetes import client, config

def model_names(group, version, kind):
    """The client's class names for a list of `kind`, most likely first:
    `V1DaemonSetList`, or with the group's prefix where two groups share a
    kind (`CoreV1EventList`, `EventsV1EventList`)."""
    ver = version[0].upper() + version[1:]
    prefix = "Core" if not group else group.split(".")[0].capitalize()
    return [f"{ver}{kind}List", f"{prefix}{ver}{kind}List"]


def without_core_only_events(prefix, name, text):
    """An event written through core/v1 without `eventTime` (the kubelet's
    recorder writes none) reads through events.k8s.io/v1 with `eventTime:
    null`, as upstream does, and the client's EventsV1Event refuses that
    null against upstream too. Such items are checked for the deprecated
    fields the conversion carries instead, then left out of the decode."""
    if prefix != "/apis/events.k8s.io/v1" or name != "events":
        return text, ""
    body = json.loads(text)
    timed, untimed = [], []
    for item in body["items"]:
        (timed if item.get("eventTime") else untimed).append(item)
    for item in untimed:
        if not item.get("deprecatedFirstTimestamp") and not item.get("deprecatedLastTimestamp"):
            raise ValueError(f"event {item['metadata']['name']} has neither eventTime nor deprecated timestamps")
    body["items"] = timed
    return json.dumps(body), f" ({len(untimed)} core-only events without eventTime checked apart)"


def resources(api):
    """(group, version, path prefix, resource) for each listable resource."""
    out = []
    core = api.call_api("GET", api.configuration.host + "/api/v1")
    core.read()
    for r in api.deserialize(core.data.decode(), "V1APIResourceList", "application/json").resources:
        out.append(("", "v1", "/api/v1", r))
    groups = api.call_api("GET", api.configuration.host + "/apis")
    groups.read()
    for g in api.deserialize(groups.data.decode(), "V1APIGroupList", "application/json").groups:
        gv = g.preferred_version
        rl = api.call_api("GET", f"{api.configuration.host}/apis/{gv.group_version}")
        rl.read()
        resource_list = api.deserialize(rl.data.decode(), "V1APIResourceList", "application/json")
        for r in resource_list.resources:
            out.append((g.name, gv.version, f"/apis/{gv.group_version}", r))
    return out


def main():
    config.load_kube_config()
    api = client.ApiClient()
    failures = []
    for group, version, prefix, r in resources(api):
        if "/" in r.name or "list" not in (r.verbs or []):
            continue
        names = [n for n in model_names(group, version, r.kind) if hasattr(client.models, n)]
        if not names:
            failures.append(f"{prefix}/{r.name}: the client has no model for {r.kind} lists")
            continue
        resp = api.call_api("GET", f"{api.configuration.host}{prefix}/{r.name}",
                            header_params={"Accept": "application/json"})
        resp.read()
        text = resp.data.decode()
        if resp.status != 200:
            failures.append(f"{prefix}/{r.name}: HTTP {resp.status}: {text[:300]}")
            continue
        try:
            text, skipped = without_core_only_events(prefix, r.name, text)
            items = api.deserialize(text, names[0], "application/json").items
            print(f"{prefix}/{r.name}: {len(items)} {names[0]} items decoded{skipped}")
        except Exception as e:  # the model's own validation error
            failures.append(f"{prefix}/{r.name} as {names[0]}: {e}")
    for f in failures:
        print(f, file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
