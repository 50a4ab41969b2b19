//! A private D-Bus system bus (a real `dbus-daemon` on a socket in a test
//! directory) with a fake `org.freedesktop.login1` on it: enough of
//! systemd-logind for an agent's graceful shutdown (`Inhibit`,
//! `InhibitDelayMaxUSec`, the `PrepareForShutdown` signal), with the test
//! deciding when the "machine" shuts down. Processes reach it through
//! `DBUS_SYSTEM_BUS_ADDRESS`.
//!
//! An inhibitor lock is a pipe: the agent holds the write end, the fake
//! reads the other, and end of file means the lock was released.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// One `Inhibit` call: (what, who, why, mode), and whether it was released.
#[derive(Debug, Clone)]
pub struct Lock {
    pub what: String,
    pub who: String,
    pub why: String,
    pub mode: String,
    pub released: Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Default)]
struct State {
    locks: Mutex<Vec<Lock>>,
}

struct Manager {
    state: Arc<State>,
}

#[zbus::interface(name = "org.freedesktop.login1.Manager")]
impl Manager {
    async fn inhibit(
        &self,
        what: String,
        who: String,
        why: String,
        mode: String,
    ) -> zbus::fdo::Result<zbus::zvariant::OwnedFd> {
        let (read, write) =
            nix::unistd::pipe().map_err(|e| zbus::fdo::Error::Failed(e.to_string()))?;
        let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = released.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::File::from(read);
            let mut buf = [0u8; 16];
            // Blocks until every copy of the write end is closed.
            while matches!(f.read(&mut buf), Ok(n) if n > 0) {}
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        self.state.locks.lock().unwrap().push(Lock {
            what,
            who,
            why,
            mode,
            released,
        });
        Ok(zbus::zvariant::OwnedFd::from(write))
    }

    /// Long enough for any test's grace period.
    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> u64 {
        120_000_000
    }

    #[zbus(signal)]
    async fn prepare_for_shutdown(
        emitter: &zbus::object_server::SignalEmitter<'_>,
        start: bool,
    ) -> zbus::Result<()>;
}

/// The bus and the fake logind; both go when it is dropped.
pub struct FakeLogind {
    daemon: Child,
    dir: PathBuf,
    address: String,
    conn: zbus::Connection,
    state: Arc<State>,
}

const PATH: &str = "/org/freedesktop/login1";

impl FakeLogind {
    /// Start `dbus-daemon` on `dir/bus.sock` and serve logind on it.
    ///
    /// # Errors
    /// dbus-daemon is missing or does not come up.
    pub async fn start(dir: &Path) -> Result<FakeLogind> {
        std::fs::create_dir_all(dir)?;
        let socket = dir.join("bus.sock");
        let config = dir.join("bus.conf");
        std::fs::write(
            &config,
            format!(
                r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"#,
                socket.display()
            ),
        )?;
        let daemon = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .args(["--nofork", "--nopidfile"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("dbus.log"))?)
            .spawn()
            .context("starting dbus-daemon (package dbus-daemon)")?;
        let address = format!("unix:path={}", socket.display());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if Instant::now() > deadline {
                bail!("dbus-daemon did not create {}", socket.display());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let state = Arc::new(State::default());
        let conn = zbus::connection::Builder::address(address.as_str())?
            .name("org.freedesktop.login1")?
            .serve_at(
                PATH,
                Manager {
                    state: state.clone(),
                },
            )?
            .build()
            .await
            .context("serving the fake logind")?;
        Ok(FakeLogind {
            daemon,
            dir: dir.to_owned(),
            address,
            conn,
            state,
        })
    }

    /// `DBUS_SYSTEM_BUS_ADDRESS` for processes that should use it.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Every `Inhibit` call so far.
    pub fn locks(&self) -> Vec<Lock> {
        self.state.locks.lock().unwrap().clone()
    }

    /// Announce a shutdown (`true`) or its cancellation (`false`).
    ///
    /// # Errors
    /// The signal could not be sent.
    pub async fn prepare_for_shutdown(&self, start: bool) -> Result<()> {
        let iface = self
            .conn
            .object_server()
            .interface::<_, Manager>(PATH)
            .await?;
        Manager::prepare_for_shutdown(iface.signal_emitter(), start).await?;
        Ok(())
    }

    /// The bus daemon's log (for diagnostics).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("dbus.log")).unwrap_or_default()
    }
}

impl Drop for FakeLogind {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
