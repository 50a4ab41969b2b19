use std::path::Path;

use cri_proto::v1::security_profile::ProfileType;

use super::*;

fn pod(yaml: &str) -> Pod {
    serde_saphyr::from_str(yaml).unwrap()
}

fn node() -> NodeSecurity<'static> {
    NodeSecurity {
        seccomp_root: Path::new("/var/lib/skiff-agent/seccomp"),
        apparmor: true,
    }
}

fn sc_of(yaml: &str) -> v1::LinuxContainerSecurityContext {
    let p = pod(yaml);
    let c = p.spec.as_ref().unwrap().containers[0].clone();
    container_security(&p, &c, None, &node())
}

#[test]
fn container_fields_override_the_pods() {
    let sc = sc_of("metadata: {name: p}\nspec:\n  securityContext: {runAsUser: 1000, runAsGroup: 2000, supplementalGroups: [3000], fsGroup: 4000, seccompProfile: {type: RuntimeDefault}}\n  containers:\n  - name: c\n    securityContext: {runAsUser: 1001, allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL], add: [NET_ADMIN]}}\n");
    assert_eq!(sc.run_as_user.unwrap().value, 1001);
    assert_eq!(sc.run_as_group.unwrap().value, 2000);
    assert_eq!(sc.supplemental_groups, vec![3000, 4000]);
    assert!(sc.no_new_privs && sc.readonly_rootfs && !sc.privileged);
    let caps = sc.capabilities.unwrap();
    assert_eq!(
        (caps.add_capabilities, caps.drop_capabilities),
        (vec!["NET_ADMIN".to_string()], vec!["ALL".to_string()])
    );
    assert_eq!(
        sc.seccomp.unwrap().profile_type,
        ProfileType::RuntimeDefault as i32
    );
}

#[test]
fn defaults_are_the_kubelets() {
    let sc = sc_of("metadata: {name: p}\nspec:\n  containers: [{name: c}]\n");
    // Unset allowPrivilegeEscalation allows it; no profile is Unconfined
    // (sent explicitly: CRI's zero value would mean RuntimeDefault).
    assert!(!sc.no_new_privs);
    assert_eq!(
        sc.seccomp.unwrap().profile_type,
        ProfileType::Unconfined as i32
    );
    assert!(sc.apparmor.is_none() && sc.run_as_user.is_none());
}

#[test]
fn seccomp_and_apparmor_profiles() {
    let sc = sc_of("metadata: {name: p}\nspec:\n  securityContext: {seccompProfile: {type: RuntimeDefault}}\n  containers:\n  - name: c\n    securityContext: {seccompProfile: {type: Localhost, localhostProfile: prof/a.json}, appArmorProfile: {type: Localhost, localhostProfile: k8s-x}}\n");
    let s = sc.seccomp.unwrap();
    assert_eq!(s.profile_type, ProfileType::Localhost as i32);
    assert_eq!(s.localhost_ref, "/var/lib/skiff-agent/seccomp/prof/a.json");
    let a = sc.apparmor.unwrap();
    assert_eq!(
        (a.profile_type, a.localhost_ref.as_str()),
        (ProfileType::Localhost as i32, "k8s-x")
    );
    assert_eq!(sc.apparmor_profile, "localhost/k8s-x");
    // The deprecated annotation, when no field says otherwise.
    let sc = sc_of("metadata: {name: p, annotations: {container.apparmor.security.beta.kubernetes.io/c: runtime/default}}\nspec:\n  containers: [{name: c}]\n");
    assert_eq!(
        sc.apparmor.unwrap().profile_type,
        ProfileType::RuntimeDefault as i32
    );
    // A node without AppArmor sends none (admission refused what needs one).
    let p = pod("metadata: {name: p}\nspec:\n  containers: [{name: c, securityContext: {appArmorProfile: {type: Unconfined}}}]\n");
    let node = NodeSecurity {
        apparmor: false,
        ..node()
    };
    let sc = container_security(&p, &p.spec.as_ref().unwrap().containers[0], None, &node);
    assert!(sc.apparmor.is_none() && sc.apparmor_profile.is_empty());
}

#[test]
fn run_as_non_root_as_the_kubelet() {
    let p = pod("metadata: {name: web, namespace: ns, uid: u1}\nspec:\n  securityContext: {runAsNonRoot: true}\n  containers: [{name: c}]\n");
    let c = &p.spec.as_ref().unwrap().containers[0];
    let root = ImageUser {
        uid: Some(0),
        username: String::new(),
    };
    assert_eq!(
        verify_run_as_non_root(&p, c, Ok(&root)).unwrap_err(),
        "container has runAsNonRoot and image will run as root (pod: \"web_ns(u1)\", container: c)"
    );
    let named = ImageUser {
        uid: None,
        username: "x".into(),
    };
    assert_eq!(
        verify_run_as_non_root(&p, c, Ok(&named)).unwrap_err(),
        "container has runAsNonRoot and image has non-numeric user (x), cannot verify user is non-root (pod: \"web_ns(u1)\", container: c)"
    );
    let user = ImageUser {
        uid: Some(1000),
        username: String::new(),
    };
    assert_eq!(verify_run_as_non_root(&p, c, Ok(&user)), Ok(()));
    assert!(verify_run_as_non_root(&p, c, Err("failed to get image user: x")).is_err());
    // An explicit runAsUser decides alone.
    let p = pod("metadata: {name: web, namespace: ns, uid: u1}\nspec:\n  securityContext: {runAsNonRoot: true, runAsUser: 0}\n  containers: [{name: c, securityContext: {runAsUser: 5}}, {name: d}]\n");
    let cs = &p.spec.as_ref().unwrap().containers;
    assert_eq!(verify_run_as_non_root(&p, &cs[0], Ok(&root)), Ok(()));
    assert_eq!(
        verify_run_as_non_root(&p, &cs[1], Ok(&user)).unwrap_err(),
        "container's runAsUser breaks non-root policy (pod: \"web_ns(u1)\", container: d)"
    );
    // Without runAsNonRoot nothing is checked.
    let p = pod("metadata: {name: p}\nspec:\n  containers: [{name: c}]\n");
    assert_eq!(
        verify_run_as_non_root(&p, &p.spec.as_ref().unwrap().containers[0], Ok(&root)),
        Ok(())
    );
}

#[test]
fn image_username_is_passed_when_nothing_overrides_it() {
    let p = pod("metadata: {name: p}\nspec:\n  containers: [{name: c}]\n");
    let named = ImageUser {
        uid: None,
        username: "www".into(),
    };
    let c = &p.spec.as_ref().unwrap().containers[0];
    assert_eq!(
        container_security(&p, c, Some(&named), &node()).run_as_username,
        "www"
    );
}

#[test]
fn unsupported_fields_are_refused_by_name() {
    let p = pod("metadata: {name: p}\nspec:\n  containers: [{name: c, securityContext: {procMount: Unmasked}}, {name: d, securityContext: {windowsOptions: {runAsUserName: x}}}, {name: e, securityContext: {procMount: Default}}]\n");
    let cs = &p.spec.as_ref().unwrap().containers;
    assert!(refuse_unsupported(&p, &cs[0])
        .unwrap_err()
        .contains("procMount Unmasked"));
    assert!(refuse_unsupported(&p, &cs[1])
        .unwrap_err()
        .contains("windowsOptions"));
    assert_eq!(refuse_unsupported(&p, &cs[2]), Ok(()));
}

#[test]
fn sandbox_takes_the_pod_context() {
    let p = pod("metadata: {name: p}\nspec:\n  securityContext: {runAsUser: 7, supplementalGroups: [8], fsGroup: 9, seccompProfile: {type: RuntimeDefault}, seLinuxOptions: {level: 's0:c1'}}\n  containers: [{name: c, securityContext: {privileged: true}}]\n");
    let s = sandbox_security(&p, &node());
    assert_eq!(s.run_as_user.unwrap().value, 7);
    assert_eq!(s.supplemental_groups, vec![8, 9]);
    assert!(s.privileged);
    assert_eq!(
        s.seccomp.unwrap().profile_type,
        ProfileType::RuntimeDefault as i32
    );
    assert_eq!(s.selinux_options.unwrap().level, "s0:c1");
}

#[test]
fn sysctl_names_take_dots() {
    assert_eq!(
        normalize_sysctl("net/ipv4/conf/eno2.100/rp_filter"),
        "net.ipv4.conf.eno2/100.rp_filter"
    );
    assert_eq!(normalize_sysctl("kernel.msgmax"), "kernel.msgmax");
}
