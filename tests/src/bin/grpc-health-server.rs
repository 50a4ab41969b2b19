//! A gRPC health server (grpc.health.v1) for probe tests, run inside a
//! test container: `grpc-health-server PORT [SERVICE...]`. The server
//! ("") and each named service report SERVING, and NOT_SERVING while the
//! file `/tmp/unhealthy` exists, so a test can flip it from a shell.

use std::time::Duration;

use anyhow::{Context, Result};
use tonic_health::ServingStatus;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args
        .next()
        .context("usage: grpc-health-server PORT [SERVICE...]")?
        .parse()
        .context("PORT must be a number")?;
    let mut services: Vec<String> = args.collect();
    services.push(String::new());
    let (reporter, server) = tonic_health::server::health_reporter();
    let flip = reporter.clone();
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let status = if std::path::Path::new("/tmp/unhealthy").exists() {
                ServingStatus::NotServing
            } else {
                ServingStatus::Serving
            };
            if last != Some(status) {
                for s in &services {
                    flip.set_service_status(s.as_str(), status).await;
                }
                println!("health: {status:?}");
                last = Some(status);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    println!("grpc health server on port {port}");
    tonic::transport::Server::builder()
        .add_service(server)
        .serve(([0, 0, 0, 0], port).into())
        .await?;
    Ok(())
}
