//! The checks' messages against upstream's wording, and their versions.

use serde_json::json;

use super::*;

fn lv(level: Level, version: Version) -> LevelVersion {
    LevelVersion { level, version }
}

fn check(level: Level, version: Version, spec: Value) -> String {
    describe(&evaluate(lv(level, version), &json!({}), &spec))
}

const RESTRICTED: Level = Level::Restricted;
const BASELINE: Level = Level::Baseline;
const LATEST: Version = Version::Latest;

#[test]
fn a_bare_pod_against_restricted() {
    let spec = json!({"containers": [{"name": "c", "image": "busybox"}]});
    assert_eq!(
        check(RESTRICTED, LATEST, spec.clone()),
        r#"allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#
    );
    assert_eq!(check(BASELINE, LATEST, spec.clone()), "");
    assert_eq!(check(Level::Privileged, LATEST, spec), "");
}

#[test]
fn a_compliant_pod_passes_restricted() {
    let spec = json!({
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "securityContext": {
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
        }}],
        "volumes": [{"name": "v", "configMap": {"name": "x"}}]
    });
    assert_eq!(check(RESTRICTED, LATEST, spec), "");
}

#[test]
fn baseline_violations_in_order() {
    let spec = json!({
        "hostNetwork": true, "hostPID": true,
        "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}, {"name": "net.ipv4.tcp_rmem", "value": "1"}]},
        "containers": [
            {"name": "a", "securityContext": {"privileged": true, "capabilities": {"add": ["SYS_ADMIN", "NET_ADMIN", "CHOWN"]}},
             "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81, "hostPort": 80}]},
            {"name": "b", "securityContext": {"privileged": true, "seLinuxOptions": {"type": "spc_t", "user": "u"}}}
        ],
        "volumes": [{"name": "h", "hostPath": {"path": "/"}}]
    });
    assert_eq!(
        check(BASELINE, LATEST, spec.clone()),
        concat!(
            r#"non-default capabilities (container "a" must not include "NET_ADMIN", "SYS_ADMIN" in securityContext.capabilities.add), "#,
            r#"host namespaces (hostNetwork=true, hostPID=true), "#,
            r#"hostPath volumes (volume "h"), "#,
            r#"hostPort (container "a" uses hostPorts 80, 8080), "#,
            r#"privileged (containers "a", "b" must not set securityContext.privileged=true), "#,
            r#"seLinuxOptions (container "b" set forbidden securityContext.seLinuxOptions: type "spc_t"; user may not be set), "#,
            r#"forbidden sysctls (kernel.msgmax)"#
        )
    );
    // tcp_rmem became safe in 1.32.
    assert!(check(BASELINE, Version::Minor(31), spec)
        .contains("forbidden sysctls (kernel.msgmax, net.ipv4.tcp_rmem)"));
}

#[test]
fn restricted_overrides_baseline_checks() {
    let spec = json!({
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "Unconfined"}},
        "containers": [{"name": "c", "securityContext": {
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"], "add": ["SYS_TIME"]}
        }}],
        "volumes": [{"name": "h", "hostPath": {"path": "/"}}, {"name": "n", "nfs": {"server": "x", "path": "/"}}]
    });
    // One message per concern: restricted's versions replace baseline's.
    assert_eq!(
        check(RESTRICTED, LATEST, spec),
        concat!(
            r#"unrestricted capabilities (container "c" must not include "SYS_TIME" in securityContext.capabilities.add), "#,
            r#"restricted volume types (volumes "h", "n" use restricted volume types "hostPath", "nfs"), "#,
            r#"seccompProfile (pod must not set securityContext.seccompProfile.type to "Unconfined")"#
        )
    );
}

#[test]
fn versions_choose_the_checks() {
    let spec = json!({"containers": [{"name": "c", "securityContext": {"runAsUser": 0}}], "os": {"name": "windows"}});
    // runAsUser is checked from 1.23; allowPrivilegeEscalation,
    // capabilities and seccomp skip Windows pods from 1.25.
    let at = |m| check(RESTRICTED, Version::Minor(m), spec.clone());
    assert!(!at(22).contains("runAsUser=0"));
    assert!(at(23).contains(r#"runAsUser=0 (container "c" must not set runAsUser=0)"#));
    assert!(at(24).contains("allowPrivilegeEscalation"));
    assert!(!at(25).contains("allowPrivilegeEscalation"));
    assert!(!at(25).contains("seccompProfile"));
    // Versions past the newest check are the newest.
    assert_eq!(at(99), check(RESTRICTED, LATEST, spec));
}

#[test]
fn user_namespaces_relax_root_checks_from_1_35() {
    let spec = json!({"hostUsers": false, "securityContext": {"runAsUser": 0, "runAsNonRoot": false, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "procMount": "Unmasked"}}]});
    // Baseline relaxes procMount for them; restricted (from 1.35 its own
    // procMount check) does not.
    assert_eq!(check(BASELINE, LATEST, spec.clone()), "");
    assert_eq!(
        check(RESTRICTED, LATEST, spec.clone()),
        r#"procMount (container "c" must not set securityContext.procMount to "Unmasked")"#
    );
    assert_eq!(
        check(RESTRICTED, Version::Minor(34), spec),
        concat!(
            r#"procMount (container "c" must not set securityContext.procMount to "Unmasked"), "#,
            r#"runAsNonRoot != true (pod must not set securityContext.runAsNonRoot=false), "#,
            r#"runAsUser=0 (pod must not set runAsUser=0)"#
        )
    );
}

#[test]
fn annotations_and_probes() {
    let meta = json!({"annotations": {
        "container.apparmor.security.beta.kubernetes.io/c": "unconfined",
        "seccomp.security.alpha.kubernetes.io/pod": "unconfined"
    }});
    let spec = json!({"containers": [{"name": "c", "livenessProbe": {"httpGet": {"host": "10.0.0.1", "port": 80}}}]});
    let v = describe(&evaluate(lv(BASELINE, LATEST), &meta, &spec));
    assert_eq!(
        v,
        concat!(
            r#"forbidden AppArmor profile (annotation must not set AppArmor profile type to "container.apparmor.security.beta.kubernetes.io/c="unconfined""), "#,
            r#"probe or lifecycle host (container "c" uses probe or lifecycle host "10.0.0.1")"#
        )
    );
    // The seccomp annotations were the check before 1.19; probe hosts are checked from 1.34.
    let old = describe(&evaluate(lv(BASELINE, Version::Minor(18)), &meta, &spec));
    assert!(old.contains(r#"seccompProfile (forbidden annotation seccomp.security.alpha.kubernetes.io/pod="unconfined")"#), "{old}");
    assert!(!old.contains("probe"));
}

#[test]
fn windows_host_process_and_reasons() {
    let spec = json!({"securityContext": {"windowsOptions": {"hostProcess": true}}, "containers": [{"name": "w"}]});
    let v = evaluate(lv(BASELINE, LATEST), &json!({}), &spec);
    assert_eq!(
        describe(&v),
        "hostProcess (pod must not set securityContext.windowsOptions.hostProcess=true)"
    );
    assert_eq!(reasons(&v), "hostProcess");
}
