//! Test images built locally as OCI image layouts (no registry), and
//! side-loading them into a fixture's containerd.
//!
//! Two images exist by default:
//! - [`PAUSE_IMAGE`]: one static binary, `/pause`, compiled at test time from
//!   `tests/images/pause.c` with `gcc -static -Os` (cached under
//!   [`CACHE_DIR`] by source hash).
//! - [`TOOLBOX_IMAGE`]: `/bin/busybox` from busybox-static plus a symlink for
//!   every applet, `PATH` set, default command `sh`. [`toolbox_tag`] makes more
//!   tags of it whose config differs by one label, so each tag has its own
//!   digest (rolling-update tests need two distinct images).
//!
//! Images are built deterministically (fixed mtimes, gzip without a
//! timestamp), so the same inputs always give the same digests.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use cri_proto::v1;
use flate2::write::GzEncoder;
use flate2::Compression;
use oci_spec::image::{
    Arch, ConfigBuilder, Descriptor, DescriptorBuilder, Digest, ImageConfigurationBuilder,
    ImageIndexBuilder, ImageManifestBuilder, MediaType, Os, PlatformBuilder, RootFsBuilder,
};
use sha2::{Digest as _, Sha256};

/// The sandbox ("pause") image every fixture side-loads and configures as
/// containerd's `sandbox_image`.
pub const PAUSE_IMAGE: &str = "skiff.test/pause:3.9";
/// The busybox toolbox image every fixture side-loads.
pub const TOOLBOX_IMAGE: &str = "skiff.test/toolbox:1.0";
/// Repository of [`TOOLBOX_IMAGE`], for [`toolbox_tag`].
pub const TOOLBOX_REPOSITORY: &str = "skiff.test/toolbox";
/// Where compiled helpers are cached across runs (never swept).
pub const CACHE_DIR: &str = "/tmp/skiff-test/cache";
/// Label that tells toolbox tags apart (so each has its own digest).
pub const TOOLBOX_TAG_LABEL: &str = "test.skiff.toolbox.tag";

/// `PATH` of the toolbox image.
const TOOLBOX_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Source of the pause binary, compiled at test time.
const PAUSE_SOURCE: &str = include_str!("../images/pause.c");
/// busybox-static's binary on the host.
const BUSYBOX: &str = "/bin/busybox";
/// Fixed mtime for every layer entry (reproducible digests).
const LAYER_MTIME: u64 = 1_700_000_000;
/// Fixed creation date of every image config.
const CREATED: &str = "2023-11-14T22:13:20Z";

/// A built image: manifest, config and layers in memory, addressed by digest.
///
/// Cloning is cheap (blobs are shared).
#[derive(Clone, Debug)]
pub struct OciImage {
    name: String,
    manifest_digest: String,
    config_digest: String,
    layer_digests: Vec<String>,
    blobs: Arc<BTreeMap<String, Arc<Vec<u8>>>>,
}

impl OciImage {
    /// Full reference, for example `skiff.test/toolbox:1.0`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tag part of [`name`](Self::name) (`latest` when there is none).
    pub fn tag(&self) -> &str {
        split_reference(&self.name).1
    }

    /// The repository part of [`name`](Self::name), with its domain.
    pub fn repository(&self) -> &str {
        split_reference(&self.name).0
    }

    /// `sha256:...` of the manifest (what `repo@digest` refers to).
    pub fn manifest_digest(&self) -> &str {
        &self.manifest_digest
    }

    /// `sha256:...` of the config: the image id CRI reports.
    pub fn config_digest(&self) -> &str {
        &self.config_digest
    }

    /// `sha256:...` of each layer blob (compressed), first to last.
    pub fn layer_digests(&self) -> &[String] {
        &self.layer_digests
    }

    /// The manifest JSON.
    pub fn manifest(&self) -> &[u8] {
        self.blob(&self.manifest_digest)
            .expect("manifest blob is always present")
    }

    /// Any blob of this image (manifest, config or layer) by digest.
    pub fn blob(&self, digest: &str) -> Option<&[u8]> {
        self.blobs.get(digest).map(|b| b.as_slice())
    }

    /// Every blob, by digest.
    pub fn blobs(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.blobs.iter().map(|(d, b)| (d.as_str(), b.as_slice()))
    }

    /// The same content under another reference (same digests).
    pub fn with_name(&self, name: impl Into<String>) -> OciImage {
        OciImage {
            name: name.into(),
            ..self.clone()
        }
    }

    /// `index.json` of an OCI layout holding this image, with both the
    /// `org.opencontainers.image.ref.name` (tag) and `io.containerd.image.name`
    /// (full name, what `ctr images import` uses) annotations.
    pub fn index_json(&self) -> Result<Vec<u8>> {
        let manifest = self.manifest();
        let mut annotations = HashMap::new();
        annotations.insert(
            "org.opencontainers.image.ref.name".to_string(),
            self.tag().to_string(),
        );
        annotations.insert("io.containerd.image.name".to_string(), self.name.clone());
        let platform = PlatformBuilder::default()
            .architecture(host_arch())
            .os(Os::Linux)
            .build()?;
        let desc = DescriptorBuilder::default()
            .media_type(MediaType::ImageManifest)
            .digest(parse_digest(&self.manifest_digest)?)
            .size(manifest.len() as u64)
            .annotations(annotations)
            .platform(platform)
            .build()?;
        let index = ImageIndexBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageIndex)
            .manifests(vec![desc])
            .build()?;
        Ok(index.to_string()?.into_bytes())
    }

    /// Writes an OCI image layout directory (`oci-layout`, `index.json`,
    /// `blobs/sha256/*`) at `dir`.
    ///
    /// # Errors
    /// Fails when the directory cannot be written.
    pub fn write_layout_dir(&self, dir: &Path) -> Result<()> {
        let blob_dir = dir.join("blobs/sha256");
        fs::create_dir_all(&blob_dir)
            .with_context(|| format!("creating {}", blob_dir.display()))?;
        for (digest, data) in self.blobs() {
            fs::write(blob_dir.join(digest_hex(digest)), data)?;
        }
        fs::write(dir.join("oci-layout"), OCI_LAYOUT)?;
        fs::write(dir.join("index.json"), self.index_json()?)?;
        Ok(())
    }

    /// Writes the OCI image layout as an uncompressed tar archive, the input
    /// format of `ctr images import`.
    ///
    /// # Errors
    /// Fails when the file cannot be written.
    pub fn write_layout_tar(&self, path: &Path) -> Result<()> {
        let file =
            fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
        let mut add = |name: &str, data: &[u8]| -> Result<()> {
            let mut header = file_header(data.len() as u64, 0o644);
            tar.append_data(&mut header, name, data)?;
            Ok(())
        };
        add("oci-layout", OCI_LAYOUT.as_bytes())?;
        add("index.json", &self.index_json()?)?;
        for (digest, data) in self.blobs.iter() {
            add(&format!("blobs/sha256/{}", digest_hex(digest)), data)?;
        }
        tar.into_inner()?.flush()?;
        Ok(())
    }
}

const OCI_LAYOUT: &str = r#"{"imageLayoutVersion":"1.0.0"}"#;

/// One compressed layer.
#[derive(Clone, Debug)]
pub struct Layer {
    /// The gzip-compressed tar.
    pub blob: Arc<Vec<u8>>,
    /// `sha256:` of [`blob`](Self::blob).
    pub digest: String,
    /// `sha256:` of the uncompressed tar (what the config's rootfs lists).
    pub diff_id: String,
}

enum Entry {
    Dir { mode: u32 },
    File { data: Vec<u8>, mode: u32 },
    Symlink { target: String },
}

/// Builds one layer from files, directories and symlinks. Parent
/// directories are added automatically; entries are written sorted by path.
#[derive(Default)]
pub struct LayerBuilder {
    entries: BTreeMap<String, Entry>,
}

impl LayerBuilder {
    /// An empty layer.
    pub fn new() -> Self {
        Self::default()
    }

    /// A directory with `mode` (for example `0o1777` for `/tmp`).
    pub fn dir(mut self, path: &str, mode: u32) -> Self {
        let path = self.add_parents(path);
        self.entries.insert(path, Entry::Dir { mode });
        self
    }

    /// A regular file.
    pub fn file(mut self, path: &str, data: impl Into<Vec<u8>>, mode: u32) -> Self {
        let path = self.add_parents(path);
        self.entries.insert(
            path,
            Entry::File {
                data: data.into(),
                mode,
            },
        );
        self
    }

    /// A symbolic link `path -> target`.
    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        let path = self.add_parents(path);
        self.entries.insert(
            path,
            Entry::Symlink {
                target: target.to_string(),
            },
        );
        self
    }

    fn add_parents(&mut self, path: &str) -> String {
        let path = path
            .trim_start_matches('/')
            .trim_end_matches('/')
            .to_string();
        let mut parent = Path::new(&path).parent();
        while let Some(p) = parent {
            let s = p.to_string_lossy().to_string();
            if s.is_empty() {
                break;
            }
            self.entries.entry(s).or_insert(Entry::Dir { mode: 0o755 });
            parent = p.parent();
        }
        path
    }

    /// Writes the tar, compresses it and computes digest and diff id.
    ///
    /// # Errors
    /// Fails only on tar or gzip encoding errors.
    pub fn build(self) -> Result<Layer> {
        let mut tar = tar::Builder::new(Vec::new());
        for (path, entry) in &self.entries {
            match entry {
                Entry::Dir { mode } => {
                    let mut h = file_header(0, *mode);
                    h.set_entry_type(tar::EntryType::Directory);
                    tar.append_data(&mut h, format!("{path}/"), std::io::empty())?;
                }
                Entry::File { data, mode } => {
                    let mut h = file_header(data.len() as u64, *mode);
                    tar.append_data(&mut h, path, data.as_slice())?;
                }
                Entry::Symlink { target } => {
                    let mut h = file_header(0, 0o777);
                    h.set_entry_type(tar::EntryType::Symlink);
                    tar.append_link(&mut h, path, target)?;
                }
            }
        }
        let raw = tar.into_inner()?;
        let diff_id = sha256_digest(&raw);
        let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
        gz.write_all(&raw)?;
        let blob = gz.finish()?;
        Ok(Layer {
            digest: sha256_digest(&blob),
            diff_id,
            blob: Arc::new(blob),
        })
    }
}

fn file_header(size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(LAYER_MTIME);
    h.set_entry_type(tar::EntryType::Regular);
    h
}

/// Assembles config, manifest and layers into an [`OciImage`].
#[derive(Default)]
pub struct ImageBuilder {
    name: String,
    layers: Vec<Layer>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    env: Vec<String>,
    labels: HashMap<String, String>,
    working_dir: Option<String>,
}

impl ImageBuilder {
    /// An image that will be called `name` (a full reference with a tag).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }

    /// Appends a layer.
    pub fn layer(mut self, layer: Layer) -> Self {
        self.layers.push(layer);
        self
    }

    /// The config's `Entrypoint`.
    pub fn entrypoint<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.entrypoint = Some(args.into_iter().map(Into::into).collect());
        self
    }

    /// The config's `Cmd`.
    pub fn cmd<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.cmd = Some(args.into_iter().map(Into::into).collect());
        self
    }

    /// Adds `KEY=VALUE` to the config's `Env`.
    pub fn env(mut self, kv: impl Into<String>) -> Self {
        self.env.push(kv.into());
        self
    }

    /// Adds a config label (changes the config digest, not the layers).
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The config's `WorkingDir`.
    pub fn working_dir(mut self, dir: impl Into<String>) -> Self {
        self.working_dir = Some(dir.into());
        self
    }

    /// Builds config and manifest.
    ///
    /// # Errors
    /// Fails when oci-spec rejects a field (it should not).
    pub fn build(self) -> Result<OciImage> {
        let mut config = ConfigBuilder::default();
        if !self.env.is_empty() {
            config = config.env(self.env);
        }
        if let Some(e) = self.entrypoint {
            config = config.entrypoint(e);
        }
        if let Some(c) = self.cmd {
            config = config.cmd(c);
        }
        if !self.labels.is_empty() {
            config = config.labels(self.labels);
        }
        if let Some(w) = self.working_dir {
            config = config.working_dir(w);
        }
        let rootfs = RootFsBuilder::default()
            .typ("layers")
            .diff_ids(
                self.layers
                    .iter()
                    .map(|l| l.diff_id.clone())
                    .collect::<Vec<_>>(),
            )
            .build()?;
        let image_config = ImageConfigurationBuilder::default()
            .created(CREATED)
            .architecture(host_arch())
            .os(Os::Linux)
            .config(config.build()?)
            .rootfs(rootfs)
            .build()?;
        let config_json = image_config.to_string()?.into_bytes();
        let config_digest = sha256_digest(&config_json);

        let mut blobs = BTreeMap::new();
        let mut layer_descs = Vec::new();
        for layer in &self.layers {
            layer_descs.push(Descriptor::new(
                MediaType::ImageLayerGzip,
                layer.blob.len() as u64,
                parse_digest(&layer.digest)?,
            ));
            blobs.insert(layer.digest.clone(), layer.blob.clone());
        }
        let manifest = ImageManifestBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageManifest)
            .config(Descriptor::new(
                MediaType::ImageConfig,
                config_json.len() as u64,
                parse_digest(&config_digest)?,
            ))
            .layers(layer_descs)
            .build()?;
        let manifest_json = manifest.to_string()?.into_bytes();
        let manifest_digest = sha256_digest(&manifest_json);
        blobs.insert(config_digest.clone(), Arc::new(config_json));
        blobs.insert(manifest_digest.clone(), Arc::new(manifest_json));
        Ok(OciImage {
            name: self.name,
            manifest_digest,
            config_digest,
            layer_digests: self.layers.iter().map(|l| l.digest.clone()).collect(),
            blobs: Arc::new(blobs),
        })
    }
}

/// The pause image, [`PAUSE_IMAGE`].
///
/// # Errors
/// Fails when gcc cannot build a static binary (libc6-dev missing).
pub fn pause() -> Result<OciImage> {
    static LAYER: OnceLock<Mutex<Option<Layer>>> = OnceLock::new();
    let layer = cached_layer(&LAYER, || {
        let bin = fs::read(pause_binary()?)?;
        LayerBuilder::new().file("pause", bin, 0o755).build()
    })?;
    ImageBuilder::new(PAUSE_IMAGE)
        .layer(layer)
        .entrypoint(["/pause"])
        .working_dir("/")
        .build()
}

/// The toolbox image, [`TOOLBOX_IMAGE`].
///
/// # Errors
/// Fails when `/bin/busybox` (busybox-static) is missing.
pub fn toolbox() -> Result<OciImage> {
    toolbox_tag(split_reference(TOOLBOX_IMAGE).1)
}

/// Another tag of the toolbox, `skiff.test/toolbox:<tag>`: same layer, but the
/// config carries the label [`TOOLBOX_TAG_LABEL`]`=<tag>`, so each tag has its
/// own config and manifest digest.
///
/// # Errors
/// Fails when `/bin/busybox` (busybox-static) is missing.
pub fn toolbox_tag(tag: &str) -> Result<OciImage> {
    static LAYER: OnceLock<Mutex<Option<Layer>>> = OnceLock::new();
    let layer = cached_layer(&LAYER, toolbox_layer)?;
    ImageBuilder::new(format!("{TOOLBOX_REPOSITORY}:{tag}"))
        .layer(layer)
        .env(TOOLBOX_PATH)
        .cmd(["sh"])
        .working_dir("/")
        .label(TOOLBOX_TAG_LABEL, tag)
        .build()
}

/// The toolbox image as `name` with one more layer, `/blob`: `bytes` of
/// random (incompressible) data, for an image of a chosen size.
///
/// # Errors
/// Fails only on tar or gzip encoding errors.
pub fn toolbox_with_blob(name: &str, bytes: usize) -> Result<OciImage> {
    static LAYER: OnceLock<Mutex<Option<Layer>>> = OnceLock::new();
    let toolbox = cached_layer(&LAYER, toolbox_layer)?;
    let mut data = vec![0u8; bytes];
    rand::Rng::fill(&mut rand::rng(), data.as_mut_slice());
    let blob = LayerBuilder::new().file("/blob", data, 0o644).build()?;
    ImageBuilder::new(name)
        .layer(toolbox)
        .layer(blob)
        .env(TOOLBOX_PATH)
        .cmd(["sh"])
        .working_dir("/")
        .build()
}

/// Name of [`grpc_health`]'s image.
pub const GRPC_HEALTH_IMAGE: &str = "skiff.test/grpc-health:1.0";

/// The toolbox plus `/usr/local/bin/grpc-health-server` (this crate's
/// binary, a tonic gRPC health server).
///
/// # Errors
/// As [`toolbox_with_binary`].
pub fn grpc_health() -> Result<OciImage> {
    toolbox_with_binary(GRPC_HEALTH_IMAGE, "grpc-health-server")
}

/// Name of [`admission_webhook`]'s image.
pub const ADMISSION_WEBHOOK_IMAGE: &str = "skiff.test/admission-webhook:1.0";

/// The toolbox plus `/usr/local/bin/admission-webhook` (this crate's
/// binary: the API server tests' admission webhook server).
///
/// # Errors
/// As [`toolbox_with_binary`].
pub fn admission_webhook() -> Result<OciImage> {
    toolbox_with_binary(ADMISSION_WEBHOOK_IMAGE, "admission-webhook")
}

/// Name of [`aggregated_api`]'s image.
pub const AGGREGATED_API_IMAGE: &str = "skiff.test/aggregated-api:1.0";

/// The toolbox plus `/usr/local/bin/aggregated-api` (this crate's binary:
/// the API server tests' aggregated API server).
///
/// # Errors
/// As [`toolbox_with_binary`].
pub fn aggregated_api() -> Result<OciImage> {
    toolbox_with_binary(AGGREGATED_API_IMAGE, "aggregated-api")
}

/// Image `name`: the toolbox plus this crate's binary `bin` in
/// `/usr/local/bin` and the host's shared libraries it links (as `ldd`
/// lists them), so a glibc binary runs in the image.
///
/// # Errors
/// Fails when the binary cannot be built or `ldd` cannot read it.
fn toolbox_with_binary(name: &str, bin_name: &str) -> Result<OciImage> {
    let bin = crate::agent::workspace_binary("skiff-tests", bin_name)?;
    let mut layer = LayerBuilder::new().file(
        &format!("usr/local/bin/{bin_name}"),
        fs::read(&bin).with_context(|| format!("reading {}", bin.display()))?,
        0o755,
    );
    let out = Command::new("ldd")
        .arg(&bin)
        .output()
        .context("running ldd")?;
    if !out.status.success() {
        bail!(
            "ldd {} failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` and
    // `/lib64/ld-linux-x86-64.so.2 (0x...)`: every absolute path.
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(path) = line.split_whitespace().find(|w| w.starts_with('/')) else {
            continue;
        };
        let data = fs::read(path).with_context(|| format!("reading {path}"))?;
        layer = layer.file(path, data, 0o755);
    }
    let toolbox = cached_layer(
        {
            static LAYER: OnceLock<Mutex<Option<Layer>>> = OnceLock::new();
            &LAYER
        },
        toolbox_layer,
    )?;
    ImageBuilder::new(name)
        .layer(toolbox)
        .layer(layer.build()?)
        .env(TOOLBOX_PATH)
        .cmd(["sh"])
        .working_dir("/")
        .build()
}

fn cached_layer(
    cell: &'static OnceLock<Mutex<Option<Layer>>>,
    build: impl FnOnce() -> Result<Layer>,
) -> Result<Layer> {
    let mut slot = cell
        .get_or_init(|| Mutex::new(None))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(l) = slot.as_ref() {
        return Ok(l.clone());
    }
    let layer = build()?;
    *slot = Some(layer.clone());
    Ok(layer)
}

fn toolbox_layer() -> Result<Layer> {
    let busybox =
        fs::read(BUSYBOX).with_context(|| format!("reading {BUSYBOX} (install busybox-static)"))?;
    let out = Command::new(BUSYBOX)
        .arg("--list-full")
        .output()
        .context("running busybox --list-full")?;
    if !out.status.success() {
        bail!(
            "busybox --list-full failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut layer = LayerBuilder::new()
        .file("bin/busybox", busybox, 0o755)
        .dir("tmp", 0o1777)
        .dir("var/tmp", 0o1777)
        .dir("root", 0o700)
        .dir("proc", 0o555)
        .dir("sys", 0o555)
        .dir("dev", 0o755)
        .dir("home", 0o755)
        .dir("var/www", 0o755)
        .dir("usr/local/bin", 0o755)
        .file(
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
            0o644,
        )
        .file("etc/group", "root:x:0:\nnogroup:x:65534:\n", 0o644);
    for applet in String::from_utf8_lossy(&out.stdout).lines() {
        let applet = applet.trim();
        if applet.is_empty() || applet == "bin/busybox" {
            continue;
        }
        layer = layer.symlink(applet, "/bin/busybox");
    }
    layer.build()
}

/// Path of the static pause binary, compiling `tests/images/pause.c` with
/// `gcc -static -Os` the first time (cached in [`CACHE_DIR`] by source hash).
///
/// # Errors
/// Fails when gcc is missing or the static link fails.
pub fn pause_binary() -> Result<PathBuf> {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let hash = hex::encode(Sha256::digest(PAUSE_SOURCE.as_bytes()));
    let cache = Path::new(CACHE_DIR);
    let bin = cache.join(format!("pause-{}", &hash[..16]));
    if bin.exists() {
        return Ok(bin);
    }
    fs::create_dir_all(cache)?;
    // Unique temporary names: other test processes may compile concurrently;
    // the final rename is atomic.
    let tmp = format!(
        "{}.{}.{}",
        bin.display(),
        std::process::id(),
        rand::random::<u32>()
    );
    let src = format!("{tmp}.c");
    fs::write(&src, PAUSE_SOURCE)?;
    let out = Command::new("gcc")
        .args(["-static", "-Os", "-s", "-Wall", "-o", &tmp, &src])
        .output()
        .context("running gcc (is it installed?)")?;
    let _ = fs::remove_file(&src);
    if !out.status.success() {
        let _ = fs::remove_file(&tmp);
        bail!(
            "gcc -static -Os pause.c failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    fs::rename(&tmp, &bin)?;
    Ok(bin)
}

/// Side-loads images into one containerd's `k8s.io` namespace (the one the
/// CRI plugin serves). Obtained from
/// [`Containerd::images`](crate::Containerd::images).
pub struct Images<'a> {
    pub(crate) socket: &'a Path,
    pub(crate) dir: &'a Path,
    pub(crate) snapshotter: &'a str,
    pub(crate) client: cri_proto::CriClient,
}

impl<'a> Images<'a> {
    /// Side-loading into any containerd (not only a harness one): used by
    /// the bring-up script to load the demo images.
    pub fn new(
        socket: &'a Path,
        work_dir: &'a Path,
        snapshotter: &'a str,
        client: cri_proto::CriClient,
    ) -> Images<'a> {
        Images {
            socket,
            dir: work_dir,
            snapshotter,
            client,
        }
    }

    /// Imports `image` with `ctr images import` (unpacked for the CRI
    /// snapshotter) and waits until CRI `ImageStatus` reports it by name.
    ///
    /// # Errors
    /// Fails when ctr fails or CRI does not see the image within 15 s.
    pub async fn load(&self, image: &OciImage) -> Result<()> {
        let dir = self.dir.join("images");
        tokio::fs::create_dir_all(&dir).await?;
        let tar = dir.join(format!(
            "{}.tar",
            image.name().replace(['/', ':', '@'], "_")
        ));
        {
            let image = image.clone();
            let tar = tar.clone();
            tokio::task::spawn_blocking(move || image.write_layout_tar(&tar)).await??;
        }
        let out = tokio::process::Command::new("ctr")
            .arg("--address")
            .arg(self.socket)
            .args([
                "-n",
                "k8s.io",
                "images",
                "import",
                "--snapshotter",
                self.snapshotter,
            ])
            .arg(&tar)
            .output()
            .await
            .context("running ctr images import")?;
        let _ = tokio::fs::remove_file(&tar).await;
        if !out.status.success() {
            bail!(
                "ctr images import {} failed: {}{}",
                image.name(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.wait_visible(image).await
    }

    /// Builds and loads `skiff.test/toolbox:<tag>` (see [`toolbox_tag`]).
    ///
    /// # Errors
    /// As [`load`](Self::load).
    pub async fn load_toolbox_tag(&self, tag: &str) -> Result<OciImage> {
        let tag = tag.to_string();
        let image = tokio::task::spawn_blocking(move || toolbox_tag(&tag)).await??;
        self.load(&image).await?;
        Ok(image)
    }

    /// Waits until CRI reports `image` under its name with its config
    /// digest as id. containerd's CRI plugin learns about imported images
    /// from image events, asynchronously.
    async fn wait_visible(&self, image: &OciImage) -> Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let req = v1::ImageStatusRequest {
                image: Some(v1::ImageSpec {
                    image: image.name().to_string(),
                    ..Default::default()
                }),
                verbose: false,
            };
            let last = match self.client.image_status(req).await {
                Ok(resp) => match resp.image {
                    Some(img) if img.id == image.config_digest() => return Ok(()),
                    Some(img) => format!(
                        "CRI reports id {} instead of {}",
                        img.id,
                        image.config_digest()
                    ),
                    None => "CRI ImageStatus reports no such image".to_string(),
                },
                Err(e) => format!("CRI ImageStatus failed: {e}"),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(anyhow!(
                    "image {} imported but not visible through CRI: {last}",
                    image.name()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Splits `domain/repo:tag` into (`domain/repo`, `tag`); no tag -> `latest`.
fn split_reference(name: &str) -> (&str, &str) {
    let name = name.split('@').next().unwrap_or(name);
    match name.rfind(':') {
        Some(i) if !name[i + 1..].contains('/') => (&name[..i], &name[i + 1..]),
        _ => (name, "latest"),
    }
}

/// OCI architecture name of this host.
pub fn host_arch() -> Arch {
    match std::env::consts::ARCH {
        "x86_64" => Arch::Amd64,
        "aarch64" => Arch::ARM64,
        other => Arch::from(other),
    }
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

fn digest_hex(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

fn parse_digest(s: &str) -> Result<Digest> {
    s.parse::<Digest>()
        .map_err(|e| anyhow!("invalid digest {s}: {e}"))
}

/// Name of [`kubectl`]'s image.
pub const KUBECTL_IMAGE: &str = "skiff.test/kubectl:1.0";

/// A real static kubectl: `$KUBECTL_IN_IMAGE`, else the first of these
/// that exists (the Cloud SDK's versioned binaries are plain kubectl; its
/// unversioned one is a dispatcher).
const KUBECTL_CANDIDATES: &[&str] = &[
    "/usr/local/bin/kubectl",
    "/usr/lib/google-cloud-sdk/bin/kubectl.1.32",
    "/usr/lib/google-cloud-sdk/bin/kubectl.1.33",
    "/usr/bin/kubectl",
];

/// The toolbox plus `/usr/local/bin/kubectl`, for in-cluster clients
/// (ServiceAccount tokens, KUBERNETES_SERVICE_HOST).
///
/// # Errors
/// Fails when no static kubectl is found (or busybox is missing).
pub fn kubectl() -> Result<OciImage> {
    let from_env = std::env::var("KUBECTL_IN_IMAGE").ok();
    let bin = from_env
        .iter()
        .map(String::as_str)
        .chain(KUBECTL_CANDIDATES.iter().copied())
        .find(|p| Path::new(p).is_file())
        .context("no kubectl binary for the image (set KUBECTL_IN_IMAGE)")?
        .to_string();
    let layer = LayerBuilder::new()
        .file(
            "usr/local/bin/kubectl",
            fs::read(&bin).with_context(|| format!("reading {bin}"))?,
            0o755,
        )
        .build()?;
    let toolbox = cached_layer(
        {
            static LAYER: OnceLock<Mutex<Option<Layer>>> = OnceLock::new();
            &LAYER
        },
        toolbox_layer,
    )?;
    ImageBuilder::new(KUBECTL_IMAGE)
        .layer(toolbox)
        .layer(layer)
        .env(TOOLBOX_PATH)
        .cmd(["sh"])
        .working_dir("/")
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_repository_and_tag() {
        assert_eq!(
            split_reference("skiff.test/toolbox:1.0"),
            ("skiff.test/toolbox", "1.0")
        );
        assert_eq!(
            split_reference("127.0.0.1:5000/skiff/toolbox"),
            ("127.0.0.1:5000/skiff/toolbox", "latest")
        );
        assert_eq!(
            split_reference("127.0.0.1:5000/a:2"),
            ("127.0.0.1:5000/a", "2")
        );
    }

    #[test]
    fn layers_are_reproducible_and_digests_consistent() {
        let build = || {
            LayerBuilder::new()
                .file("a/b/c", "x", 0o644)
                .symlink("bin/sh", "/bin/busybox")
                .build()
                .unwrap()
        };
        let (a, b) = (build(), build());
        assert_eq!(a.digest, b.digest);
        assert_eq!(a.digest, sha256_digest(&a.blob));
        let mut raw = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(a.blob.as_slice()),
            &mut raw,
        )
        .unwrap();
        assert_eq!(a.diff_id, sha256_digest(&raw));
    }

    #[test]
    fn toolbox_tags_differ_only_in_config() {
        let one = toolbox().unwrap();
        let two = toolbox_tag("2.0").unwrap();
        assert_eq!(one.name(), TOOLBOX_IMAGE);
        assert_eq!(two.name(), "skiff.test/toolbox:2.0");
        assert_ne!(one.config_digest(), two.config_digest());
        assert_ne!(one.manifest_digest(), two.manifest_digest());
        assert_eq!(one.layer_digests(), two.layer_digests());
        let manifest: serde_json::Value = serde_json::from_slice(one.manifest()).unwrap();
        assert_eq!(manifest["config"]["digest"], one.config_digest());
        let config: serde_json::Value =
            serde_json::from_slice(one.blob(one.config_digest()).unwrap()).unwrap();
        assert_eq!(config["config"]["Cmd"][0], "sh");
    }
}
