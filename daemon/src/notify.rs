//! The service manager protocol (`sd_notify(3)`): tell systemd when the
//! daemon serves and when it stops, and keep its watchdog fed.
//!
//! Every call is a no-op without `NOTIFY_SOCKET` (not started by systemd,
//! or `Type=` other than `notify`), so the daemons call these
//! unconditionally.

use std::time::Duration;

use sd_notify::NotifyState;

/// `READY=1`: start-up is over and the daemon serves. systemd holds back
/// units ordered after this one (and `systemctl start` returns) until then.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// `STOPPING=1`: shutdown began, so a slow drain is not taken for a hang.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// `STATUS=...`: a one-line state shown by `systemctl status`.
pub fn status(text: &str) {
    send(&[NotifyState::Status(text)]);
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "notifying the service manager failed");
    }
}

/// The watchdog interval systemd asked for (`WatchdogSec=` arrives as
/// `WATCHDOG_USEC`, for this process only when `WATCHDOG_PID` matches).
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled().filter(|d| !d.is_zero())
}

/// Ping the watchdog every half interval (as `sd_watchdog_enabled(3)`
/// advises) while `healthy()` says so, from a task of the daemon's own
/// runtime: a wedged runtime, or a failing health check, stops the pings
/// and systemd restarts the daemon. Returns None when no watchdog is set.
///
/// # Caveats
/// Must be called inside a tokio runtime.
pub fn spawn_watchdog(
    healthy: impl Fn() -> bool + Send + 'static,
) -> Option<tokio::task::JoinHandle<()>> {
    let interval = watchdog_interval()?;
    let every = interval / 2;
    tracing::info!(interval = ?interval, "systemd watchdog enabled; pinging every {every:?}");
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut was_healthy = true;
        loop {
            tick.tick().await;
            let ok = healthy();
            if ok {
                send(&[NotifyState::Watchdog]);
            } else if was_healthy {
                // Once per change, not per tick.
                tracing::warn!("health check failing: not pinging the systemd watchdog");
            }
            was_healthy = ok;
        }
    }))
}
