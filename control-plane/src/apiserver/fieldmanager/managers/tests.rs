use serde_json::{json, Value};

use super::*;

const T1: &str = "2026-01-01T00:00:00Z";
const T2: &str = "2026-01-02T00:00:00Z";

type Applied = Result<(Value, ManagedFields), ApplyError>;

fn none() -> ManagedFields {
    ManagedFields::default()
}

fn deploy(meta: Value, spec: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec})
}

fn web(replicas: i64, image: &str) -> Value {
    let c = json!([{"name": "nginx", "image": image}]);
    let spec = json!({"replicas": replicas, "template": {"spec": {"containers": c}}});
    deploy(json!({"name": "web"}), spec)
}

fn run(live: &Value, config: &Value, m: ManagedFields, who: &str) -> Applied {
    apply_as(live, config, m, who, false)
}

fn force(live: &Value, config: &Value, m: ManagedFields, who: &str) -> Applied {
    apply_as(live, config, m, who, true)
}

fn apply_as(live: &Value, config: &Value, m: ManagedFields, who: &str, force: bool) -> Applied {
    let writer = Writer::new(who, "apps/v1");
    apply(
        live,
        config,
        Shape::builtin("Deployment"),
        m,
        &writer,
        force,
        T2,
    )
}

/// The paths `who` owns through `op`, as text.
fn owned(m: &ManagedFields, who: &str, op: Operation) -> Vec<String> {
    let e = m.get(&Writer::new(who, "apps/v1").id(op));
    let paths = e.map(|e| e.fields.paths()).unwrap_or_default();
    paths.iter().map(|p| p.to_string()).collect()
}

#[test]
fn managed_fields_round_trip() {
    let entry = |who: &str, op: &str, time: &str, fields: Value| json!({"manager": who, "operation": op, "apiVersion": "v", "time": time, "fieldsType": "FieldsV1", "fieldsV1": fields});
    let mut status = entry("kcm", "Update", T1, json!({"f:status": {}}));
    status["subresource"] = json!("status");
    let update = entry("kubectl", "Update", T2, json!({"f:spec": {"f:a": {}}}));
    let labels = json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}}});
    let applied = entry("kubectl", "Apply", T2, labels);
    let m = ManagedFields::decode(&json!([update, status, applied])).unwrap();
    // Apply entries first, then updates oldest first.
    assert_eq!(m.encode(), json!([applied, status, update]));
    let mut obj = json!({"metadata": {"name": "x"}});
    m.write_to(&mut obj);
    let back = ManagedFields::decode(&obj["metadata"]["managedFields"]);
    assert_eq!(back.unwrap(), m);
    none().write_to(&mut obj);
    assert_eq!(obj, json!({"metadata": {"name": "x"}}));

    let ok = json!({"operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1"});
    assert!(ManagedFields::decode(&json!([ok])).is_ok());
    let bad = [
        json!({"operation": "Patch"}),
        json!({"apiVersion": ""}),
        json!({"fieldsType": null}),
        json!({"fieldsType": "FieldsV2"}),
        json!({"fieldsV1": {"f:a": 1}}),
        json!({"manager": 3}),
    ];
    for change in bad {
        let mut e = ok.clone();
        e.as_object_mut()
            .unwrap()
            .extend(change.as_object().unwrap().clone());
        assert!(ManagedFields::decode(&json!([e])).is_err(), "{e}");
    }
    assert!(ManagedFields::decode(&json!({})).is_err());
}

#[test]
fn appliers_share_an_object() {
    let (obj, m) = run(&json!({}), &web(2, "nginx:1"), none(), "a").unwrap();
    assert_eq!(obj, web(2, "nginx:1"));
    let labels = json!({"name": "web", "labels": {"team": "x"}});
    let cfg = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": labels});
    let (obj, m) = run(&obj, &cfg, m, "b").unwrap();
    assert_eq!(obj["metadata"]["labels"]["team"], "x");
    let c = r#".spec.template.spec.containers[name="nginx"]"#;
    let a: [&str; 4] = [
        ".spec.replicas",
        c,
        &format!("{c}.image"),
        &format!("{c}.name"),
    ];
    assert_eq!(owned(&m, "a", Operation::Apply), a);
    assert_eq!(owned(&m, "b", Operation::Apply), [".metadata.labels.team"]);
    let b = m.get(&Writer::new("b", "").id(Operation::Apply));
    assert_eq!(b.unwrap().time.as_deref(), Some(T2));
}

#[test]
fn an_update_takes_ownership_so_a_later_apply_conflicts() {
    let (obj, m) = run(&json!({}), &web(2, "nginx:1"), none(), "kubectl").unwrap();
    let csa = Writer::new("kubectl-client-side-apply", "apps/v1");
    let edited = web(5, "nginx:1");
    let shape = Shape::builtin("Deployment");
    let m = update(&obj, &edited, shape, m, &csa, T2).unwrap();
    let replicas = vec![".spec.replicas".to_string()];
    assert_eq!(
        owned(&m, "kubectl-client-side-apply", Operation::Update),
        replicas
    );
    assert!(!owned(&m, "kubectl", Operation::Apply).contains(&replicas[0]));

    let err = run(&edited, &web(2, "nginx:1"), m.clone(), "kubectl");
    let Err(ApplyError::Conflict(conflicts)) = err else {
        panic!("no conflict");
    };
    let who = r#""kubectl-client-side-apply" using apps/v1"#;
    let message = format!("Apply failed with 1 conflict: conflict with {who}: .spec.replicas");
    assert_eq!(conflicts.to_string(), message);
    let cause = &conflicts.causes()[0];
    assert_eq!(
        (cause.reason, cause.field.as_str()),
        ("FieldManagerConflict", ".spec.replicas")
    );
    assert_eq!(cause.message, format!("conflict with {who}"));

    // Applying the value a field has is no conflict: both own it.
    let (same, shared) = run(&edited, &edited, m.clone(), "kubectl").unwrap();
    assert_eq!(same, edited);
    assert!(owned(&shared, "kubectl", Operation::Apply).contains(&replicas[0]));
    assert!(shared.get(&csa.id(Operation::Update)).is_some());

    // Forced, the field moves and the emptied entry goes.
    let (obj, m) = force(&edited, &web(2, "nginx:1"), m, "kubectl").unwrap();
    assert_eq!(obj["spec"]["replicas"], 2);
    assert!(owned(&m, "kubectl", Operation::Apply).contains(&replicas[0]));
    assert!(m.get(&csa.id(Operation::Update)).is_none());
}

#[test]
fn many_conflicts_are_listed_by_manager() {
    let (mut z, mut k) = (FieldSet::default(), FieldSet::default());
    z.insert(&Path::fields(&["spec", "paused"]).0);
    k.insert(&Path::fields(&["spec", "a"]).0);
    k.insert(&Path::fields(&["spec", "b"]).0);
    let mut status = Writer::new("k", "apps/v1");
    status.subresource = "status".into();
    let by_manager = vec![
        (Writer::new("z", "").id(Operation::Apply), z),
        (status.id(Operation::Update), k),
    ];
    assert_eq!(
        Conflicts::new(by_manager).to_string(),
        "Apply failed with 3 conflicts: conflicts with \"k\" with subresource \"status\" using apps/v1:\n\
         - .spec.a\n- .spec.b\nconflicts with \"z\":\n- .spec.paused"
    );
}

#[test]
fn fields_an_applier_drops_go_unless_another_owns_them() {
    let labels = json!({"name": "web", "labels": {"a": "1", "b": "2"}});
    let first = deploy(labels, json!({"replicas": 2, "paused": true}));
    let (obj, m) = run(&json!({}), &first, none(), "one").unwrap();
    let b = json!({"name": "web", "labels": {"b": "2"}});
    let shared = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": b});
    let (obj, m) = run(&obj, &shared, m, "two").unwrap();
    let second = deploy(json!({"name": "web"}), json!({"replicas": 2}));
    let (obj, m) = run(&obj, &second, m, "one").unwrap();
    assert_eq!(obj["metadata"]["labels"], json!({"b": "2"}));
    assert_eq!(obj["spec"], json!({"replicas": 2}));
    assert_eq!(owned(&m, "one", Operation::Apply), [".spec.replicas"]);
    assert_eq!(owned(&m, "two", Operation::Apply), [".metadata.labels.b"]);
}

#[test]
fn applying_the_same_config_twice_changes_nothing() {
    let mut cfg = web(2, "nginx:1");
    let container = &mut cfg["spec"]["template"]["spec"]["containers"][0];
    container["ports"] = json!([{"containerPort": 80}]);
    let (mut obj, m) = run(&json!({}), &cfg, none(), "a").unwrap();
    // What the server adds: defaults (a key field among them), managedFields.
    obj["spec"]["template"]["spec"]["containers"][0]["ports"][0]["protocol"] = json!("TCP");
    obj["spec"]["strategy"] = json!({"type": "RollingUpdate"});
    m.write_to(&mut obj);
    let (again, m2) = run(&obj, &cfg, m.clone(), "a").unwrap();
    assert_eq!((again, m2), (obj, m));

    let mut bad = cfg.clone();
    bad["metadata"]["managedFields"] = json!([]);
    let err = run(&json!({}), &bad, none(), "a").unwrap_err();
    assert_eq!(err.to_string(), "metadata.managedFields must be nil");
    cfg["spec"]["template"]["spec"]["containers"][0] = json!({"image": "x"});
    let err = run(&json!({}), &cfg, none(), "a");
    assert!(matches!(err, Err(ApplyError::Merge(_))));
}

#[test]
fn update_managers_are_capped() {
    let (mut m, mut obj) = (none(), json!({"data": {}}));
    for i in 0..12 {
        let mut new = obj.clone();
        new["data"][format!("k{i}")] = json!(i);
        let who = Writer::new(format!("m{i}"), "v1");
        let now = format!("2026-01-01T00:00:{i:02}Z");
        m = update(&obj, &new, Shape::builtin("ConfigMap"), m, &who, &now).unwrap();
        obj = new;
    }
    let names: Vec<&str> = m.iter().map(|(id, _)| id.manager.as_str()).collect();
    assert_eq!(names.len(), MAX_UPDATE_MANAGERS);
    assert!(names.contains(&ANCIENT_CHANGES) && names.contains(&"m3") && !names.contains(&"m2"));
    let bucket = Writer::new(ANCIENT_CHANGES, "v1").id(Operation::Update);
    let ancient = m.get(&bucket).unwrap();
    let paths: Vec<String> = ancient
        .fields
        .paths()
        .iter()
        .map(|p| p.to_string())
        .collect();
    assert_eq!(paths, [".data.k0", ".data.k1", ".data.k2"]);
    assert_eq!(ancient.time.as_deref(), Some("2026-01-01T00:00:02Z"));
}

#[test]
fn custom_resource_map_lists() {
    let schema = json!({"properties": {"spec": {"properties": {"items": {
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
        "items": {"properties": {"name": {}, "size": {}}},
    }}}}});
    let shape = Shape::from_openapi(&schema);
    let run = |live: &Value, items: Value, m: ManagedFields, who: &str| {
        let meta = json!({"name": "f"});
        let cr = json!({"apiVersion": "x/v1", "kind": "Foo", "metadata": meta, "spec": {"items": items}});
        apply(live, &cr, shape, m, &Writer::new(who, "x/v1"), false, T1)
    };
    let a = json!([{"name": "a", "size": 1}]);
    let (obj, m) = run(&json!({}), a, none(), "one").unwrap();
    let (obj, m) = run(&obj, json!([{"name": "b", "size": 2}]), m, "two").unwrap();
    let both = json!([{"name": "a", "size": 1}, {"name": "b", "size": 2}]);
    assert_eq!(obj["spec"]["items"], both);
    let err = run(&obj, json!([{"name": "a", "size": 5}]), m.clone(), "two");
    let text = r#"Apply failed with 1 conflict: conflict with "one": .spec.items[name="a"].size"#;
    assert_eq!(err.unwrap_err().to_string(), text);
    // "two" drops its item: it goes, and so does "two", owning nothing.
    let (obj, m) = run(&obj, json!([]), m, "two").unwrap();
    assert_eq!(obj["spec"]["items"], json!([{"name": "a", "size": 1}]));
    assert_eq!(m.iter().count(), 1);
}
