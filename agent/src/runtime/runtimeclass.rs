//! The runtime handler of a pod's RuntimeClass (`node.k8s.io/v1`), as the
//! kubelet's runtimeClassManager: the class is read when the pod's sandbox
//! is created, and a class that cannot be read keeps the sandbox from
//! being created (never a silent fall back to the default runtime).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::node::v1::RuntimeClass;

/// Reads RuntimeClasses; without an API connection only pods naming no
/// class have a handler.
#[derive(Clone, Default)]
pub struct Lookup {
    client: Option<kube::Client>,
}

impl Lookup {
    pub fn new(client: Option<kube::Client>) -> Lookup {
        Lookup { client }
    }

    /// The CRI runtime handler for `pod`: "" (the runtime's default) when
    /// it names no class.
    ///
    /// # Errors
    /// Upstream's message when the class does not exist, or why it could
    /// not be read.
    pub async fn handler(&self, pod: &Pod) -> Result<String, String> {
        let Some(name) = pod
            .spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref())
            .filter(|n| !n.is_empty())
        else {
            return Ok(String::new());
        };
        let Some(client) = &self.client else {
            return Err(format!(
                "runtimeclass.node.k8s.io {name:?} cannot be looked up: the agent has no API connection"
            ));
        };
        let api = kube::Api::<RuntimeClass>::all(client.clone());
        match api.get_opt(name).await {
            Ok(Some(class)) => Ok(class.handler),
            Ok(None) => Err(format!("runtimeclass.node.k8s.io {name:?} not found")),
            Err(e) => Err(format!(
                "cannot read runtimeclass.node.k8s.io {name:?}: {e}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_class_is_the_default_handler_and_no_api_refuses_a_class() {
        let lookup = Lookup::default();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"}, "spec": {"containers": []}
        }))
        .unwrap();
        assert_eq!(lookup.handler(&pod).await.unwrap(), "");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"runtimeClassName": "crun", "containers": []}
        }))
        .unwrap();
        let err = lookup.handler(&pod).await.unwrap_err();
        assert!(err.starts_with("runtimeclass.node.k8s.io \"crun\" cannot be looked up"));
    }
}
