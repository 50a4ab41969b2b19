//! The Service and EndpointSlice watchers. Each feeds a kube-rs reflector
//! store (read by the cluster DNS) and the proxy's [`State`], and wakes
//! the sync loop. One watch per kind serves both.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, store::Writer, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio::sync::Notify;

use super::state::State;

/// What readers get: the reflector stores, the proxy state, and the
/// wake-up the watchers send after every change (receiver: the proxy's
/// sync loop).
#[derive(Clone)]
pub struct Stores {
    pub services: Store<Service>,
    pub slices: Store<EndpointSlice>,
    pub state: Arc<Mutex<State>>,
    pub notify: Arc<Notify>,
}

/// The watchers' side: consumed by [`Source::run`].
pub struct Source {
    services: Writer<Service>,
    slices: Writer<EndpointSlice>,
    state: Arc<Mutex<State>>,
    notify: Arc<Notify>,
}

/// A source and the stores it fills.
pub fn new(node_name: &str) -> (Source, Stores) {
    let (services_r, services_w) = reflector::store();
    let (slices_r, slices_w) = reflector::store();
    let state = Arc::new(Mutex::new(State::new(node_name)));
    let notify = Arc::new(Notify::new());
    (
        Source {
            services: services_w,
            slices: slices_w,
            state: state.clone(),
            notify: notify.clone(),
        },
        Stores {
            services: services_r,
            slices: slices_r,
            state,
            notify,
        },
    )
}

impl Source {
    /// Watch until `stop` resolves. API errors are retried with back-off
    /// (the watcher re-lists after a 410), and logged once per outage.
    pub async fn run(self, client: kube::Client, stop: impl std::future::Future<Output = ()>) {
        let services = reflector::reflector(
            self.services,
            watcher::watcher(
                Api::<Service>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff(),
        );
        let slices = reflector::reflector(
            self.slices,
            watcher::watcher(
                Api::<EndpointSlice>::all(client),
                watcher::Config::default(),
            )
            .default_backoff(),
        );
        let (state, notify) = (&*self.state, &*self.notify);
        let svc_loop = follow(services, "services", state, notify, |st, ev| match ev {
            Event::Init => st.services_relist(),
            Event::InitApply(s) => st.services_relist_item(s),
            Event::InitDone => st.services_relisted(),
            Event::Apply(s) => st.apply_service(s),
            Event::Delete(s) => st.delete_service(&s),
        });
        let slice_loop = follow(slices, "endpointslices", state, notify, |st, ev| match ev {
            Event::Init => st.slices_relist(),
            Event::InitApply(s) => st.slices_relist_item(s),
            Event::InitDone => st.slices_relisted(),
            Event::Apply(s) => st.apply_slice(s),
            Event::Delete(s) => st.delete_slice(&s),
        });
        tokio::select! {
            () = stop => {}
            () = svc_loop => {}
            () = slice_loop => {}
        }
    }
}

/// Apply each event to the state and wake the sync loop.
async fn follow<K>(
    events: impl futures::Stream<Item = Result<Event<K>, watcher::Error>>,
    what: &str,
    state: &Mutex<State>,
    notify: &Notify,
    apply: fn(&mut State, Event<K>),
) {
    let mut failing = false;
    let mut events = std::pin::pin!(events);
    while let Some(ev) = events.next().await {
        match ev {
            Ok(ev) => {
                failing = false;
                apply(&mut state.lock().unwrap_or_else(|p| p.into_inner()), ev);
                notify.notify_one();
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("watching {what} failed, retrying: {e}");
                }
                failing = true;
            }
        }
    }
}
