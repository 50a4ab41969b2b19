//! skiff-agent: thin binary over the `skiff_agent` library.

mod cli;
mod images;
mod install;
mod join;
mod pods;

use anyhow::{Context, Result};
use clap::Parser;
use skiff_agent::config::Config;

fn main() -> Result<()> {
    let cli = cli::Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    match cli.command {
        Some(cli::Command::Pods { address, output }) => rt.block_on(pods::run(&address, &output)),
        None if cli.run.cleanup => {
            init_logging();
            rt.block_on(async {
                use skiff_proxy::{cleanup, Mode};
                cleanup(&[Mode::Nftables, Mode::Iptables])
                    .await
                    .context("removing the service proxy's rules")
            })?;
            tracing::info!("service proxy rules removed");
            Ok(())
        }
        Some(cli::Command::RemovePods {
            container_runtime_endpoint,
            pod_log_dir,
        }) => {
            init_logging();
            rt.block_on(skiff_agent::install::remove_pods(
                &container_runtime_endpoint,
                &pod_log_dir,
            ))?;
            Ok(())
        }
        Some(cli::Command::Images {
            container_runtime_endpoint,
            command,
        }) => rt.block_on(images::run(&container_runtime_endpoint, command)),
        Some(cli::Command::Join(args)) => {
            init_logging();
            rt.block_on(join::run(args))
        }
        Some(cli::Command::Install(args)) => {
            init_logging();
            rt.block_on(install::install(args))
        }
        Some(cli::Command::Uninstall(args)) => {
            init_logging();
            rt.block_on(install::uninstall(args))
        }
        None => {
            init_logging();
            let config = Config::load(cli.run.settings, cli.run.config.as_deref())?;
            rt.block_on(async {
                skiff_agent::run(config, shutdown_signal())
                    .await
                    .context("skiff-agent failed")
            })
        }
    }
}

/// Journald-aware logs; the DNS server's per-query lines held back.
fn init_logging() {
    skiff_daemon::logging::init(&format!("info,{}", skiff_dns::LOG_FILTER));
}

/// SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    skiff_daemon::notify::stopping();
    tracing::info!("shutting down");
}
