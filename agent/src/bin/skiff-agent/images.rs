//! `skiff-agent images`: the node's images as `crictl images` / `rmi`
//! show and remove them, and archives imported as the import directory
//! does.

use anyhow::{Context, Result};
use cri_proto::{v1, CriClient};
use skiff_agent::images::{archive, runtime_config};

use crate::cli::ImagesCommand;

pub async fn run(endpoint: &str, command: ImagesCommand) -> Result<()> {
    let cri = CriClient::connect_lazy(endpoint.to_string(), std::time::Duration::from_secs(60))
        .with_context(|| format!("invalid container runtime endpoint {endpoint}"))?;
    match command {
        ImagesCommand::List => list(&cri).await,
        ImagesCommand::Rm { references } => {
            for r in references {
                cri.remove_image(v1::RemoveImageRequest {
                    image: Some(v1::ImageSpec {
                        image: r.clone(),
                        ..Default::default()
                    }),
                })
                .await
                .with_context(|| format!("removing image {r}"))?;
                println!("Deleted: {r}");
            }
            Ok(())
        }
        ImagesCommand::Import { files } => {
            let snapshotter = runtime_config(&cri)
                .await
                .and_then(|c| c["containerd"]["snapshotter"].as_str().map(str::to_string));
            for f in files {
                let names = archive::import(endpoint, snapshotter.as_deref(), &f).await?;
                for n in names {
                    println!("Imported: {n}");
                }
            }
            Ok(())
        }
    }
}

async fn list(cri: &CriClient) -> Result<()> {
    let mut images = cri
        .list_images(v1::ListImagesRequest { filter: None })
        .await
        .context("listing images")?
        .images;
    images.sort_by(|a, b| a.repo_tags.cmp(&b.repo_tags));
    let mut rows = vec![[
        "IMAGE".to_string(),
        "TAG".into(),
        "IMAGE ID".into(),
        "SIZE".into(),
    ]];
    for i in &images {
        let id: String =
            i.id.trim_start_matches("sha256:")
                .chars()
                .take(13)
                .collect();
        for (repo, tag) in repo_tags(i) {
            rows.push([repo, tag, id.clone(), human_size(i.size)]);
        }
    }
    print!("{}", table(&rows));
    Ok(())
}

/// (repository, tag) pairs as crictl shows them: one per tag, or the
/// digest's repository with `<none>` for an untagged image.
fn repo_tags(i: &v1::Image) -> Vec<(String, String)> {
    let split = |t: &str| match t.rfind(':') {
        Some(at) if !t[at..].contains('/') => (t[..at].to_string(), t[at + 1..].to_string()),
        _ => (t.to_string(), "<none>".to_string()),
    };
    if !i.repo_tags.is_empty() {
        return i.repo_tags.iter().map(|t| split(t)).collect();
    }
    let repo = i
        .repo_digests
        .first()
        .and_then(|d| d.split('@').next())
        .unwrap_or("<none>");
    vec![(repo.to_string(), "<none>".to_string())]
}

/// crictl's tab writer: columns at least 20 wide, 3 spaces apart.
fn table(rows: &[[String; 4]]) -> String {
    let mut widths = [0; 4];
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.len() + 3).max(20);
        }
    }
    let mut out = String::new();
    for r in rows {
        let (last, cells) = r.split_last().unwrap_or((&r[0], &[]));
        for (w, cell) in widths.iter().zip(cells) {
            out += &format!("{cell:<w$}");
        }
        out += last;
        out.push('\n');
    }
    out
}

/// Docker's `HumanSizeWithPrecision(size, 3)`: decimal units, three
/// significant digits.
fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let mut size = bytes as f64;
    let mut unit = 0;
    while size >= 1000.0 && unit + 1 < UNITS.len() {
        size /= 1000.0;
        unit += 1;
    }
    let digits = match size {
        s if s >= 100.0 => 0,
        s if s >= 10.0 => 1,
        _ => 2,
    };
    let mut text = format!("{size:.digits$}");
    if text.contains('.') {
        text = text.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    format!("{text}{}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_crictl() {
        assert_eq!(human_size(0), "0B");
        assert_eq!(human_size(4_500_000), "4.5MB");
        assert_eq!(human_size(1_234_567), "1.23MB");
        assert_eq!(human_size(123_456_789), "123MB");
        assert_eq!(human_size(999), "999B");
    }

    #[test]
    fn untagged_images_show_their_digest_repository() {
        let i = v1::Image {
            repo_digests: vec!["docker.io/library/a@sha256:1".into()],
            ..Default::default()
        };
        assert_eq!(
            repo_tags(&i),
            [("docker.io/library/a".to_string(), "<none>".to_string())]
        );
        let t = v1::Image {
            repo_tags: vec!["localhost:5000/x:1".into()],
            ..Default::default()
        };
        assert_eq!(
            repo_tags(&t),
            [("localhost:5000/x".to_string(), "1".to_string())]
        );
    }
}
