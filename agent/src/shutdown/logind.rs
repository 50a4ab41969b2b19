//! systemd-logind as the shutdown signal source, over the system bus
//! (`DBUS_SYSTEM_BUS_ADDRESS` when set, as every D-Bus client honours):
//! `Inhibit("shutdown", ..., "delay")` for the lock (a file descriptor:
//! closing it releases the lock) and the `PrepareForShutdown` signal.
//!
//! logind holds a shutdown for delay locks at most `InhibitDelayMaxSec`
//! (5 s by default). When that is shorter than the grace period, a
//! drop-in raising it is written and logind is told to reload (upstream's
//! kubelet does the same); if logind still allows less, the agent warns
//! and works within what it gets.

use std::path::Path;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use zbus::zvariant::OwnedFd;

use super::{Error, Signals};

const LOGIND: &str = "org.freedesktop.login1";
const LOGIND_PATH: &str = "/org/freedesktop/login1";
const LOGIND_MANAGER: &str = "org.freedesktop.login1.Manager";
/// The drop-in that raises logind's limit.
pub const DROP_IN: &str = "/etc/systemd/logind.conf.d/99-skiff-agent.conf";

/// A connection to logind with the lock (when held) and its signals.
pub struct Logind {
    proxy: zbus::Proxy<'static>,
    signals: zbus::proxy::SignalStream<'static>,
    /// The inhibitor lock; dropping it releases the lock.
    lock: Option<OwnedFd>,
}

impl Logind {
    /// Connect, and make sure logind waits `grace` for delay locks.
    ///
    /// # Errors
    /// No system bus or no logind on it.
    pub async fn connect(grace: Duration) -> Result<Logind, Error> {
        let conn = zbus::Connection::system().await?;
        let proxy = zbus::Proxy::new(&conn, LOGIND, LOGIND_PATH, LOGIND_MANAGER).await?;
        let max = Duration::from_micros(proxy.get_property::<u64>("InhibitDelayMaxUSec").await?);
        if max < grace {
            raise_delay(&conn, grace).await;
            let now =
                Duration::from_micros(proxy.get_property::<u64>("InhibitDelayMaxUSec").await?);
            if now < grace {
                tracing::warn!(logind_max = ?now, grace = ?grace, "systemd-logind delays a shutdown for less than shutdownGracePeriod; pods get only what it allows");
            }
        }
        let signals = proxy.receive_signal("PrepareForShutdown").await?;
        Ok(Logind {
            proxy,
            signals,
            lock: None,
        })
    }
}

/// Write the drop-in and make logind reload it (SIGHUP through systemd).
async fn raise_delay(conn: &zbus::Connection, grace: Duration) {
    let text = format!(
        "# Written by skiff-agent: shutdownGracePeriod needs this long.\n[Login]\nInhibitDelayMaxSec={}\n",
        grace.as_secs().max(1)
    );
    let path = Path::new(DROP_IN);
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(path, text));
    if let Err(e) = written {
        tracing::warn!(
            path = DROP_IN,
            "cannot raise logind's InhibitDelayMaxSec: {e}"
        );
        return;
    }
    let systemd = zbus::Proxy::new(
        conn,
        "org.freedesktop.systemd1",
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
    )
    .await;
    let reloaded = match systemd {
        Ok(p) => p
            .call_method("KillUnit", &("systemd-logind.service", "main", 1i32))
            .await
            .map(drop),
        Err(e) => Err(e),
    };
    match reloaded {
        // logind re-reads its configuration on SIGHUP; give it a moment.
        Ok(()) => tokio::time::sleep(Duration::from_millis(500)).await,
        Err(e) => tracing::warn!("asking systemd to reload systemd-logind failed: {e}"),
    }
}

impl Signals for Logind {
    fn inhibit(&mut self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let fd: OwnedFd = self
                .proxy
                .call(
                    "Inhibit",
                    &(
                        "shutdown",
                        "skiff-agent",
                        "skiff-agent stops this node's pods before it shuts down",
                        "delay",
                    ),
                )
                .await?;
            self.lock = Some(fd);
            Ok(())
        })
    }

    fn release(&mut self) {
        self.lock = None;
    }

    fn next(&mut self) -> BoxFuture<'_, Option<bool>> {
        Box::pin(async move {
            loop {
                let msg = self.signals.next().await?;
                match msg.body().deserialize::<bool>() {
                    Ok(active) => return Some(active),
                    Err(e) => tracing::warn!("malformed PrepareForShutdown signal: {e}"),
                }
            }
        })
    }
}
