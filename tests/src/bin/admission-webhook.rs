//! The admission webhook server of the API server tests
//! (`control-plane/tests/support/webhook_server.rs`), run inside a test
//! container: `admission-webhook PORT CERT KEY` serves HTTPS on every
//! address with the certificate and key in those PEM files.

use anyhow::{Context, Result};
use skiff_tests::webhooks::server as webhook_server;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: admission-webhook PORT CERT KEY";
    let port: u16 = args
        .next()
        .context(usage)?
        .parse()
        .context("PORT must be a number")?;
    let cert = std::fs::read_to_string(args.next().context(usage)?).context("reading CERT")?;
    let key = std::fs::read_to_string(args.next().context(usage)?).context("reading KEY")?;
    let tls = webhook_server::server_config(&cert, &key);
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port))
        .await
        .with_context(|| format!("listening on port {port}"))?;
    println!("serving admission reviews on port {port}");
    webhook_server::spawn(listener, tls, Default::default()).await;
    Ok(())
}
