//! The resources the API server serves, from discovery: what the
//! namespace controller empties and the garbage collector watches.

use kube::discovery::{verbs, ApiCapabilities, ApiResource, Discovery, Scope};

/// One served resource (the preferred version of its group).
#[derive(Debug, Clone)]
pub struct Served {
    pub res: ApiResource,
    pub caps: ApiCapabilities,
}

impl Served {
    pub fn namespaced(&self) -> bool {
        self.caps.scope == Scope::Namespaced
    }

    pub fn supports(&self, verb: &str) -> bool {
        self.caps.supports_operation(verb)
    }

    /// `pods`, `deployments.apps`: upstream's GroupResource spelling.
    pub fn group_resource(&self) -> String {
        if self.res.group.is_empty() {
            self.res.plural.clone()
        } else {
            format!("{}.{}", self.res.plural, self.res.group)
        }
    }

    /// Events: many, short-lived, never owners or dependents (upstream's
    /// garbage collector ignores them too).
    pub fn is_events(&self) -> bool {
        self.res.plural == "events" && matches!(self.res.group.as_str(), "" | "events.k8s.io")
    }
}

/// Every resource that can be listed and deleted, one version per group.
///
/// # Errors
/// Discovery failed (the API server is unreachable or answers badly).
pub async fn discover(client: &kube::Client) -> Result<Vec<Served>, kube::Error> {
    let d = Discovery::new(client.clone()).run().await?;
    let mut out = Vec::new();
    for g in d.groups() {
        for (res, caps) in g.recommended_resources() {
            if caps.supports_operation(verbs::LIST) && caps.supports_operation(verbs::DELETE) {
                out.push(Served { res, caps });
            }
        }
    }
    Ok(out)
}
