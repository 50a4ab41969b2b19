//! Exec probes (upstream `probe/exec`): CRI ExecSync with the probe's
//! timeout. Exit code 0 succeeds; any other fails; stdout then stderr (10
//! KiB at most) is the output. A command that outlives its timeout fails
//! with upstream's `command "..." timed out`.

use std::time::Duration;

use cri_proto::{v1, CriClient};
use tonic::Code;

use super::Verdict;

/// Upstream keeps at most this much of an exec probe's output.
const MAX_OUTPUT: usize = 10 * 1024;

/// Run `cmd` in container `id`.
///
/// # Errors
/// The runtime could not run the command at all (the container is gone,
/// the runtime is down): the probe's result is unknown, not failed.
pub async fn probe(
    cri: &CriClient,
    id: &str,
    cmd: &[String],
    timeout: Duration,
) -> Result<Verdict, cri_proto::Error> {
    let req = v1::ExecSyncRequest {
        container_id: id.to_string(),
        cmd: cmd.to_vec(),
        timeout: timeout.as_secs().max(1) as i64,
    };
    match cri.exec_sync(req).await {
        Ok(r) => {
            let mut out = r.stdout;
            out.extend_from_slice(&r.stderr);
            out.truncate(MAX_OUTPUT);
            let out = String::from_utf8_lossy(&out).into_owned();
            Ok(if r.exit_code == 0 {
                Verdict::Success(out)
            } else {
                Verdict::Failure(out)
            })
        }
        Err(e) if e.code() == Some(Code::DeadlineExceeded) => Ok(Verdict::Failure(format!(
            "command {:?} timed out",
            cmd.join(" ")
        ))),
        Err(e) => Err(e),
    }
}
