//! The aggregated API server of the API server tests
//! (`control-plane/tests/support/aggregated_server.rs`), run inside a test
//! container: `aggregated-api PORT CERT KEY CLIENT_CA` serves HTTPS on
//! every address with the certificate and key in those PEM files, to
//! clients with a certificate of CLIENT_CA.

use anyhow::{Context, Result};
use skiff_tests::aggregation::server;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: aggregated-api PORT CERT KEY CLIENT_CA";
    let port: u16 = args
        .next()
        .context(usage)?
        .parse()
        .context("PORT must be a number")?;
    let mut read = |what: &str| -> Result<String> {
        let path = args.next().context(usage)?;
        std::fs::read_to_string(&path).with_context(|| format!("reading {what} {path}"))
    };
    let (cert, key, client_ca) = (read("CERT")?, read("KEY")?, read("CLIENT_CA")?);
    let tls = server::server_config(&cert, &key, &client_ca);
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port))
        .await
        .with_context(|| format!("listening on port {port}"))?;
    println!("serving {}/v1 on port {port}", server::GROUP);
    server::spawn(listener, tls).await;
    Ok(())
}
