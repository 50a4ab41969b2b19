//! Leader election through a real API server's Leases: of two candidates
//! exactly one works at a time; when the leader dies without giving the
//! Lease up, the other takes over once the lease duration has passed;
//! one that stops gives it up at once.

use crate::api;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::{eventually, ok, TestServer};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use skiff_control_plane::leader::{Elector, Timing, NAMESPACE};
use tokio::sync::watch;

const TIMING: Timing = Timing {
    lease: Duration::from_secs(3),
    renew_deadline: Duration::from_secs(2),
    retry: Duration::from_millis(300),
};

/// How many candidates work now, the most ever at once, and who started.
#[derive(Default)]
struct Work {
    now: AtomicUsize,
    most: AtomicUsize,
    started: Mutex<Vec<String>>,
}

/// Counts down when the work ends, however it ends (stopped or aborted).
struct Running(Arc<Work>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

fn candidate(
    client: kube::Client,
    who: &'static str,
    work: Arc<Work>,
) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = watch::channel(false);
    let elector = Elector::new(client, "test-component", who.to_string(), TIMING);
    let task = tokio::spawn(elector.run(stopped, move |mut lost| {
        let work = work.clone();
        async move {
            let n = work.now.fetch_add(1, Ordering::SeqCst) + 1;
            work.most.fetch_max(n, Ordering::SeqCst);
            work.started.lock().unwrap().push(who.to_string());
            let _running = Running(work.clone());
            let _ = lost.wait_for(|l| *l).await;
        }
    }));
    (stop, task)
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("test-component")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test(flavor = "multi_thread")]
async fn one_leader_at_a_time_and_takeover() {
    let s = TestServer::start().await;
    let client = s.client().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let work = Arc::new(Work::default());
    let (stop_a, task_a) = candidate(client.clone(), "a", work.clone());
    let (stop_b, task_b) = candidate(client.clone(), "b", work.clone());

    assert!(
        eventually(Duration::from_secs(10), || async {
            holder(&leases).await.is_some() && work.now.load(Ordering::SeqCst) == 1
        })
        .await,
        "nobody leads"
    );
    // Several renewals later, still one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(work.most.load(Ordering::SeqCst), 1);
    let first = holder(&leases).await.unwrap();
    let second = if first == "a" { "b" } else { "a" };

    // The leader dies without giving the Lease up: the other takes over.
    let (dead, alive_stop, alive_task) = if first == "a" {
        (task_a, stop_b, task_b)
    } else {
        (task_b, stop_a, task_a)
    };
    dead.abort();
    assert!(
        eventually(Duration::from_secs(15), || async {
            holder(&leases).await.as_deref() == Some(second) && work.now.load(Ordering::SeqCst) == 1
        })
        .await,
        "no takeover: {:?}",
        holder(&leases).await
    );
    assert_eq!(work.most.load(Ordering::SeqCst), 1);
    assert_eq!(
        *work.started.lock().unwrap(),
        vec![first.clone(), second.to_string()]
    );
    let lease = leases.get("test-component").await.unwrap();
    assert_eq!(lease.spec.unwrap().lease_transitions, Some(1));
    let events = ok(s.kubectl(&[
        "get",
        "events",
        "-n",
        NAMESPACE,
        "--field-selector",
        "reason=LeaderElection",
    ]));
    assert!(
        events.contains(&format!("{second} became leader")),
        "{events}"
    );

    // Stopping gives the Lease up.
    let _ = alive_stop.send(true);
    alive_task.await.unwrap();
    assert_eq!(holder(&leases).await, None);
    assert_eq!(work.now.load(Ordering::SeqCst), 0);
}
