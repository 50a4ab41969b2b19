//! The root CA publisher (upstream's `root-ca-cert-publisher`): every
//! active namespace holds the ConfigMap `kube-root-ca.crt` whose `ca.crt`
//! is the cluster CA bundle, so pods (through the projected service
//! account volume) can verify the API server. It is put back when deleted
//! and rewritten when its data drifts from the CA.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use kube_util::informer::{Informer, Scope};

use crate::serviceaccount::{active, benign_create_error, per_namespace};
use crate::{Ctx, Error};

pub const CONFIGMAP_NAME: &str = "kube-root-ca.crt";
pub const KEY: &str = "ca.crt";
pub const DESCRIPTION_ANNOTATION: &str = "kubernetes.io/description";
/// Upstream's wording, so tools that read it see the same text.
pub const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver \
when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other \
usage is guaranteed across distributions of Kubernetes clusters.";

struct State {
    ctx: Ctx,
    ca: String,
    maps: Informer<ConfigMap>,
}

pub async fn run(ctx: Ctx) -> Result<(), Error> {
    let Some(ca) = ctx.config.root_ca_pem.clone() else {
        return Err(Error::Config(
            "root-ca-cert-publisher needs the root CA bundle (--root-ca-file)".into(),
        ));
    };
    // Only the one ConfigMap per namespace, as upstream's informer.
    let scope = Scope::default().with_fields(&format!("metadata.name={CONFIGMAP_NAME}"));
    let maps = ctx.informers.get_scoped::<ConfigMap>(scope);
    let namespaces = ctx.informers.get::<Namespace>();
    let state = Arc::new(State {
        ctx,
        ca,
        maps: maps.clone(),
    });
    per_namespace(
        namespaces,
        &maps,
        state,
        reconcile,
        "root-ca-cert-publisher",
    )
    .await;
    Ok(())
}

/// What the namespace's ConfigMap needs.
#[derive(Debug, PartialEq)]
enum Plan {
    Nothing,
    Create(ConfigMap),
    Update(ConfigMap),
}

fn data(ca: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(KEY.to_string(), ca.to_string())])
}

fn plan(namespace: &Namespace, existing: Option<&ConfigMap>, ca: &str) -> Plan {
    if !active(namespace) {
        return Plan::Nothing;
    }
    let want = data(ca);
    let Some(cm) = existing else {
        return Plan::Create(ConfigMap {
            metadata: ObjectMeta {
                name: Some(CONFIGMAP_NAME.into()),
                namespace: Some(namespace.name_any()),
                annotations: Some(BTreeMap::from([(
                    DESCRIPTION_ANNOTATION.to_string(),
                    DESCRIPTION.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(want),
            ..ConfigMap::default()
        });
    };
    let described = cm
        .annotations()
        .get(DESCRIPTION_ANNOTATION)
        .is_some_and(|d| !d.is_empty());
    // binaryData counts as drift too: the map must hold exactly the CA.
    let same =
        cm.data.as_ref() == Some(&want) && cm.binary_data.as_ref().is_none_or(|b| b.is_empty());
    if same && described {
        return Plan::Nothing;
    }
    let mut cm = cm.clone();
    cm.data = Some(want);
    cm.binary_data = None;
    // A description someone set is kept, as upstream does.
    cm.annotations_mut()
        .entry(DESCRIPTION_ANNOTATION.to_string())
        .or_insert_with(|| DESCRIPTION.to_string());
    Plan::Update(cm)
}

async fn reconcile(ns: Arc<Namespace>, st: Arc<State>) -> Result<Action, Error> {
    let name = ns.name_any();
    let existing = st.maps.get(Some(&name), CONFIGMAP_NAME);
    let api: Api<ConfigMap> = Api::namespaced(st.ctx.client.clone(), &name);
    match plan(&ns, existing.as_deref(), &st.ca) {
        Plan::Nothing => {}
        Plan::Create(cm) => match api.create(&PostParams::default(), &cm).await {
            Ok(_) => tracing::debug!(namespace = %name, "published the root CA"),
            Err(e) if benign_create_error(&e) => {}
            Err(e) => return Err(e.into()),
        },
        Plan::Update(cm) => match api
            .replace(CONFIGMAP_NAME, &PostParams::default(), &cm)
            .await
        {
            Ok(_) => tracing::info!(namespace = %name, "rewrote the root CA ConfigMap"),
            // Changed or deleted meanwhile: the informer brings it back here.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {}
            Err(e) => return Err(e.into()),
        },
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    fn ns(phase: &str) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                name: Some("team".into()),
                ..ObjectMeta::default()
            },
            status: Some(k8s_openapi::api::core::v1::NamespaceStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
            ..Namespace::default()
        }
    }

    fn created() -> ConfigMap {
        match plan(&ns("Active"), None, CA) {
            Plan::Create(cm) => cm,
            other => panic!("expected a create, got {other:?}"),
        }
    }

    #[test]
    fn a_missing_configmap_is_created_with_the_ca_and_description() {
        let cm = created();
        assert_eq!(cm.metadata.name.as_deref(), Some("kube-root-ca.crt"));
        assert_eq!(cm.metadata.namespace.as_deref(), Some("team"));
        assert_eq!(cm.data.as_ref().unwrap()["ca.crt"], CA);
        assert_eq!(cm.annotations()[DESCRIPTION_ANNOTATION], DESCRIPTION);
        assert_eq!(plan(&ns("Terminating"), None, CA), Plan::Nothing);
    }

    #[test]
    fn a_matching_configmap_is_left_alone() {
        assert_eq!(plan(&ns("Active"), Some(&created()), CA), Plan::Nothing);
    }

    #[test]
    fn drifted_data_is_rewritten_keeping_other_metadata() {
        let mut cm = created();
        cm.data
            .as_mut()
            .unwrap()
            .insert("ca.crt".into(), "tampered".into());
        cm.data.as_mut().unwrap().insert("extra".into(), "x".into());
        cm.annotations_mut()
            .insert(DESCRIPTION_ANNOTATION.into(), "mine".into());
        cm.labels_mut().insert("keep".into(), "me".into());
        let Plan::Update(fixed) = plan(&ns("Active"), Some(&cm), CA) else {
            panic!("expected an update");
        };
        assert_eq!(fixed.data, Some(data(CA)));
        assert_eq!(fixed.annotations()[DESCRIPTION_ANNOTATION], "mine");
        assert_eq!(fixed.labels()["keep"], "me");
    }

    #[test]
    fn a_missing_description_is_restored() {
        let mut cm = created();
        cm.metadata.annotations = None;
        let Plan::Update(fixed) = plan(&ns("Active"), Some(&cm), CA) else {
            panic!("expected an update");
        };
        assert_eq!(fixed.annotations()[DESCRIPTION_ANNOTATION], DESCRIPTION);
    }
}
