//! Local OCI images built from the static busybox, imported without a registry.
//!
//! Each image is an OCI image-layout tar (`oci-layout`, `index.json`, `blobs/sha256/<digest>`)
//! holding one uncompressed layer (a root fs with `/bin/busybox` and its applet links), a config
//! and a manifest. Every tar is built in memory with fixed modes, owners and times, so the same
//! busybox always gives the same digests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::layout::Layout;
use crate::{BUSYBOX_IMAGE, CRI_NAMESPACE, PAUSE_IMAGE};

/// Where the static busybox comes from (Debian's `busybox-static`).
pub const BUSYBOX_PATH: &str = "/usr/bin/busybox";
/// `PATH` in the images' config.
pub const IMAGE_PATH_ENV: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Applets linked when `busybox --list` cannot be run.
const FALLBACK_APPLETS: &[&str] = &[
    "sh", "ash", "sleep", "echo", "cat", "ls", "true", "false", "wget", "nc", "httpd", "env", "ps",
    "kill", "mkdir", "rm", "cp", "mv", "ln", "touch", "grep", "sed", "awk", "head", "tail", "wc",
    "date", "hostname", "id", "ip", "ping", "uname", "printf", "test", "seq", "timeout", "which",
    "yes", "pwd", "stat", "tee",
];

/// Errors building or importing an image, with the path or image concerned.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("building the tar of {what}: {source}")]
    Tar {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("running ctr for {image}: {source}")]
    Ctr {
        image: String,
        #[source]
        source: crate::setup::Error,
    },
    #[error("{image} is not listed by `ctr images ls` after its import")]
    NotListed { image: String },
}

/// The two images swiftlet's demo and tests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Image {
    /// `localhost/swiftlet/pause:v1`: sleeps forever (the sandbox container).
    Pause,
    /// `localhost/swiftlet/busybox:v1`: a busybox root fs, default command `sh`.
    Busybox,
}

impl Image {
    /// Both images.
    pub const ALL: [Image; 2] = [Image::Pause, Image::Busybox];

    /// The image reference it is tagged with.
    pub fn reference(self) -> &'static str {
        match self {
            Image::Pause => PAUSE_IMAGE,
            Image::Busybox => BUSYBOX_IMAGE,
        }
    }

    fn file_name(self) -> &'static str {
        match self {
            Image::Pause => "swiftlet-pause-v1.tar",
            Image::Busybox => "swiftlet-busybox-v1.tar",
        }
    }

    fn process_config(self) -> serde_json::Value {
        match self {
            Image::Pause => json!({
                "Env": [IMAGE_PATH_ENV],
                "Entrypoint": ["/bin/sleep", "2147483647"],
                "WorkingDir": "/",
            }),
            Image::Busybox => json!({
                "Env": [IMAGE_PATH_ENV],
                "Cmd": ["sh"],
                "WorkingDir": "/",
            }),
        }
    }
}

/// The OCI architecture name of this machine.
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    let hash = Sha256::digest(data);
    let mut s = String::with_capacity(7 + 64);
    s.push_str("sha256:");
    for b in hash {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(size);
    h
}

/// An in-memory tar builder with fixed metadata.
struct TarBuf {
    what: String,
    builder: tar::Builder<Vec<u8>>,
}

impl TarBuf {
    fn new(what: &str) -> Self {
        let mut builder = tar::Builder::new(Vec::new());
        builder.mode(tar::HeaderMode::Deterministic);
        Self {
            what: what.to_owned(),
            builder,
        }
    }

    fn err(&self, source: std::io::Error) -> Error {
        Error::Tar {
            what: self.what.clone(),
            source,
        }
    }

    fn dir(&mut self, path: &str, mode: u32) -> Result<(), Error> {
        let mut h = header(tar::EntryType::Directory, mode, 0);
        self.builder
            .append_data(&mut h, path, std::io::empty())
            .map_err(|e| self.err(e))
    }

    fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<(), Error> {
        let mut h = header(tar::EntryType::Regular, mode, data.len() as u64);
        self.builder
            .append_data(&mut h, path, data)
            .map_err(|e| self.err(e))
    }

    fn symlink(&mut self, path: &str, target: &str) -> Result<(), Error> {
        let mut h = header(tar::EntryType::Symlink, 0o777, 0);
        self.builder
            .append_link(&mut h, path, target)
            .map_err(|e| self.err(e))
    }

    fn finish(self) -> Result<Vec<u8>, Error> {
        let what = self.what;
        self.builder
            .into_inner()
            .map_err(|source| Error::Tar { what, source })
    }
}

/// The applets the static busybox offers (`busybox --list`), sorted, without `busybox` itself.
pub fn applets(busybox: &Path) -> Vec<String> {
    let listed = crate::setup::output(Command::new(busybox).arg("--list"));
    let mut names: Vec<String> = match listed {
        Some(out) => out
            .lines()
            .map(str::trim)
            .filter(|n| !n.is_empty() && *n != "busybox" && !n.contains('/'))
            .map(str::to_owned)
            .collect(),
        None => FALLBACK_APPLETS.iter().map(|s| s.to_string()).collect(),
    };
    names.sort();
    names.dedup();
    names
}

/// Builds the root-fs layer tar: `/bin/busybox`, a link per applet, and a minimal `/etc`.
pub fn build_layer(busybox_binary: &[u8], applets: &[String]) -> Result<Vec<u8>, Error> {
    let mut tar = TarBuf::new("the busybox layer");
    for (dir, mode) in [
        ("bin", 0o755),
        ("dev", 0o755),
        ("etc", 0o755),
        ("proc", 0o555),
        ("root", 0o700),
        ("sys", 0o555),
        ("tmp", 0o1777),
        ("usr", 0o755),
        ("usr/bin", 0o755),
        ("var", 0o755),
        ("var/www", 0o755),
    ] {
        tar.dir(dir, mode)?;
    }
    tar.file("bin/busybox", 0o755, busybox_binary)?;
    for applet in applets {
        tar.symlink(&format!("bin/{applet}"), "busybox")?;
    }
    tar.file(
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    )?;
    tar.file("etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n")?;
    tar.file(
        "var/www/index.html",
        0o644,
        b"<html><body>swiftlet busybox image</body></html>\n",
    )?;
    tar.finish()
}

/// Builds the OCI image-layout tar of `image` from `layer` (an uncompressed layer tar).
pub fn build_archive(image: Image, layer: &[u8]) -> Result<Vec<u8>, Error> {
    let history = "cargo xtask images (busybox-static)";
    archive_of(image.reference(), image.process_config(), history, &[layer])
}

/// The archive of an image `reference` whose one layer holds only `path` (a file of mode
/// 0644 with `content`, below directories of mode 0755): an image no container can run, for
/// tests that need images of distinct content (image garbage collection).
pub fn build_file_archive(reference: &str, path: &str, content: &[u8]) -> Result<Vec<u8>, Error> {
    let mut layer = TarBuf::new(reference);
    let mut dir = String::new();
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    for part in &parts[..parts.len().saturating_sub(1)] {
        dir = if dir.is_empty() {
            (*part).to_owned()
        } else {
            format!("{dir}/{part}")
        };
        layer.dir(&dir, 0o755)?;
    }
    layer.file(&parts.join("/"), 0o644, content)?;
    let layer = layer.finish()?;
    let config = json!({ "Env": [IMAGE_PATH_ENV] });
    archive_of(reference, config, "a test image of one file", &[&layer])
}

/// One mebibyte.
const MIB: usize = 1 << 20;
/// The most a generated layer puts in one file.
const GENERATED_FILE_MAX: usize = 4 * MIB;

/// An image of the cold-start benchmark: the busybox layer, then layers of generated content,
/// some of them shared with other images of the set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedImage {
    /// The repository it is pushed as.
    pub repository: String,
    /// Its layers after the busybox one, as (label, size in bytes); one label is one layer,
    /// byte for byte, in every image that has it.
    pub layers: Vec<(String, usize)>,
}

impl GeneratedImage {
    /// The bytes its generated layers hold.
    pub fn generated_bytes(&self) -> usize {
        self.layers.iter().map(|(_, size)| size).sum()
    }
}

/// The cold-start set of `count` images, `cold/img-<i>`, four layers each: busybox, a base
/// layer every second image shares (8 MiB), a library layer every fifth image shares (6 MiB)
/// and a layer of its own of 4-22 MiB. With busybox, 19-37 MB an image.
pub fn cold_start_set(count: usize) -> Vec<GeneratedImage> {
    (0..count)
        .map(|i| GeneratedImage {
            repository: format!("cold/img-{i}"),
            layers: vec![
                (format!("base-{}", i % 2), 8 * MIB),
                (format!("lib-{}", i % 5), 6 * MIB),
                (format!("app-{i}"), (4 + 2 * (i % 10)) * MIB),
            ],
        })
        .collect()
}

/// A layer of `size` bytes of pseudo-random content (so that compression cannot shrink it) in
/// files of at most 4 MiB under `/opt/<label>/`; the same label and size give the same bytes.
pub fn generated_layer(label: &str, size: usize) -> Result<Vec<u8>, Error> {
    let hash = Sha256::digest(label.as_bytes());
    let mut seed = [0u8; 8];
    seed.copy_from_slice(&hash[..8]);
    // xorshift64: any non-zero state.
    let mut state = u64::from_le_bytes(seed) | 1;
    let mut tar = TarBuf::new(label);
    tar.dir("opt", 0o755)?;
    tar.dir(&format!("opt/{label}"), 0o755)?;
    let (mut left, mut part) = (size, 0);
    while left > 0 {
        let n = left.min(GENERATED_FILE_MAX);
        let mut data = vec![0u8; n];
        for chunk in data.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
        }
        tar.file(&format!("opt/{label}/part-{part}"), 0o644, &data)?;
        left -= n;
        part += 1;
    }
    tar.finish()
}

/// Writes the OCI archive of `image` (tagged `reference`) to `dir` and returns its path: the
/// busybox layer made from `busybox`, then its generated layers; it runs `sh` as the busybox
/// image does.
pub fn write_generated_archive(
    image: &GeneratedImage,
    reference: &str,
    busybox: &Path,
    dir: &Path,
) -> Result<PathBuf, Error> {
    let binary = std::fs::read(busybox).map_err(|source| Error::Read {
        path: busybox.to_owned(),
        source,
    })?;
    let mut layers = vec![build_layer(&binary, &applets(busybox))?];
    for (label, size) in &image.layers {
        layers.push(generated_layer(label, *size)?);
    }
    let refs: Vec<&[u8]> = layers.iter().map(Vec::as_slice).collect();
    let history = "cargo xtask (a generated cold-start image)";
    let archive = archive_of(reference, Image::Busybox.process_config(), history, &refs)?;
    std::fs::create_dir_all(dir).map_err(|source| Error::Write {
        path: dir.to_owned(),
        source,
    })?;
    let path = dir.join(format!("{}.tar", image.repository.replace('/', "_")));
    std::fs::write(&path, archive).map_err(|source| Error::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// Imports the OCI archive at `archive` into the runtime's CRI namespace.
pub fn import(layout: &Layout, archive: &Path) -> Result<(), Error> {
    crate::setup::run(
        ctr(layout)
            .args(["images", "import"])
            .arg(archive)
            .stdout(std::process::Stdio::null()),
    )
    .map_err(|source| Error::Ctr {
        image: archive.display().to_string(),
        source,
    })
}

fn archive_of(
    reference: &str,
    process_config: serde_json::Value,
    created_by: &str,
    layers: &[&[u8]],
) -> Result<Vec<u8>, Error> {
    let layer_digests: Vec<String> = layers.iter().map(|l| sha256_digest(l)).collect();
    let history: Vec<serde_json::Value> = layers
        .iter()
        .map(|_| json!({ "created_by": created_by }))
        .collect();
    let config = json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": process_config,
        "rootfs": { "type": "layers", "diff_ids": layer_digests },
        "history": history,
    });
    let config = serde_json::to_vec(&config).map_err(|e| Error::Tar {
        what: "the image config".into(),
        source: e.into(),
    })?;
    let config_digest = sha256_digest(&config);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config.len(),
        },
        "layers": layers
            .iter()
            .zip(&layer_digests)
            .map(|(layer, digest)| json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": digest,
                "size": layer.len(),
            }))
            .collect::<Vec<_>>(),
    });
    let manifest = serde_json::to_vec(&manifest).map_err(|e| Error::Tar {
        what: "the image manifest".into(),
        source: e.into(),
    })?;
    let manifest_digest = sha256_digest(&manifest);
    let mut annotations = BTreeMap::new();
    annotations.insert("io.containerd.image.name", reference);
    annotations.insert("org.opencontainers.image.ref.name", reference);
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest.len(),
            "platform": { "architecture": oci_arch(), "os": "linux" },
            "annotations": annotations,
        }],
    });
    let index = serde_json::to_vec(&index).map_err(|e| Error::Tar {
        what: "the image index".into(),
        source: e.into(),
    })?;

    let mut tar = TarBuf::new(reference);
    tar.file("oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    tar.file("index.json", 0o644, &index)?;
    tar.dir("blobs", 0o755)?;
    tar.dir("blobs/sha256", 0o755)?;
    let mut blobs: Vec<(String, &[u8])> = layer_digests
        .iter()
        .cloned()
        .zip(layers.iter().copied())
        .collect();
    blobs.push((config_digest, config.as_slice()));
    blobs.push((manifest_digest, manifest.as_slice()));
    blobs.sort_by(|a, b| a.0.cmp(&b.0));
    // A layer two images share appears once.
    blobs.dedup_by(|a, b| a.0 == b.0);
    for (digest, data) in blobs {
        let hex = digest.trim_start_matches("sha256:");
        tar.file(&format!("blobs/sha256/{hex}"), 0o644, data)?;
    }
    tar.finish()
}

fn ctr(layout: &Layout) -> Command {
    let mut cmd = Command::new("ctr");
    cmd.arg("--address")
        .arg(&layout.socket)
        .args(["-n", CRI_NAMESPACE]);
    cmd
}

/// The image names `ctr images ls -q` lists in the CRI namespace.
pub fn listed(layout: &Layout) -> Vec<String> {
    crate::setup::output(ctr(layout).args(["images", "ls", "-q"]))
        .map(|o| o.lines().map(|l| l.trim().to_owned()).collect())
        .unwrap_or_default()
}

/// Writes the archive of `image` to `dir` and returns its path.
pub fn write_archive(image: Image, busybox: &Path, dir: &Path) -> Result<PathBuf, Error> {
    let binary = std::fs::read(busybox).map_err(|source| Error::Read {
        path: busybox.to_owned(),
        source,
    })?;
    let applets: Vec<String> = match image {
        Image::Pause => vec!["sh".into(), "sleep".into()],
        Image::Busybox => applets(busybox),
    };
    let layer = build_layer(&binary, &applets)?;
    let archive = build_archive(image, &layer)?;
    std::fs::create_dir_all(dir).map_err(|source| Error::Write {
        path: dir.to_owned(),
        source,
    })?;
    let path = dir.join(image.file_name());
    std::fs::write(&path, archive).map_err(|source| Error::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// Builds and imports every image the runtime does not list yet; returns the ones imported.
///
/// Idempotent: an image already listed by `ctr images ls -q` is left alone.
pub fn ensure(layout: &Layout) -> Result<Vec<Image>, Error> {
    let present = listed(layout);
    let mut imported = Vec::new();
    for image in Image::ALL {
        let name = image.reference();
        if present.iter().any(|p| p == name) {
            crate::progress::note(format!("{name}: present"));
            continue;
        }
        let archive = write_archive(image, Path::new(BUSYBOX_PATH), &layout.images_dir)?;
        import(layout, &archive)?;
        if !listed(layout).iter().any(|p| p == name) {
            return Err(Error::NotListed {
                image: name.to_owned(),
            });
        }
        crate::progress::note(format!("{name}: imported from {}", archive.display()));
        imported.push(image);
    }
    Ok(imported)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(tar_bytes: &[u8]) -> BTreeMap<String, (tar::EntryType, Vec<u8>, Option<String>)> {
        let mut archive = tar::Archive::new(tar_bytes);
        let mut out = BTreeMap::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let kind = entry.header().entry_type();
            let link = entry
                .link_name()
                .unwrap()
                .map(|l| l.to_string_lossy().into_owned());
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
            out.insert(path, (kind, data, link));
        }
        out
    }

    #[test]
    fn layer_holds_busybox_and_applet_links() {
        let layer = build_layer(b"\x7fELF fake", &["sh".into(), "sleep".into()]).unwrap();
        let e = entries(&layer);
        assert_eq!(e["bin/busybox"].1, b"\x7fELF fake");
        assert_eq!(e["bin/sh"].0, tar::EntryType::Symlink);
        assert_eq!(e["bin/sh"].2.as_deref(), Some("busybox"));
        assert!(e.contains_key("tmp"));
        assert!(e.contains_key("etc/passwd"));
    }

    #[test]
    fn archives_are_deterministic_and_self_consistent() {
        let layer = build_layer(b"bb", &["sh".into()]).unwrap();
        let a = build_archive(Image::Busybox, &layer).unwrap();
        let b = build_archive(Image::Busybox, &layer).unwrap();
        assert_eq!(a, b, "same input must give the same bytes");
        let e = entries(&a);
        let index: serde_json::Value = serde_json::from_slice(&e["index.json"].1).unwrap();
        let m = &index["manifests"][0];
        assert_eq!(
            m["annotations"]["org.opencontainers.image.ref.name"],
            BUSYBOX_IMAGE
        );
        // Every digest names a blob whose content hashes to it.
        let manifest_digest = m["digest"].as_str().unwrap();
        let manifest_blob = &e[&format!("blobs/sha256/{}", &manifest_digest[7..])].1;
        assert_eq!(sha256_digest(manifest_blob), manifest_digest);
        let manifest: serde_json::Value = serde_json::from_slice(manifest_blob).unwrap();
        let config_digest = manifest["config"]["digest"].as_str().unwrap();
        let config_blob = &e[&format!("blobs/sha256/{}", &config_digest[7..])].1;
        assert_eq!(sha256_digest(config_blob), config_digest);
        let config: serde_json::Value = serde_json::from_slice(config_blob).unwrap();
        assert_eq!(config["config"]["Cmd"][0], "sh");
        let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], layer_digest);
        assert_eq!(e[&format!("blobs/sha256/{}", &layer_digest[7..])].1, layer);
        // The pause image differs only by its config.
        let pause = build_archive(Image::Pause, &layer).unwrap();
        assert_ne!(pause, a);
    }

    #[test]
    fn the_cold_start_set_shares_layers_and_stays_in_size() {
        let set = cold_start_set(10);
        assert_eq!(set.len(), 10);
        let mut uses: BTreeMap<&str, usize> = BTreeMap::new();
        for image in &set {
            assert_eq!(image.layers.len(), 3, "busybox plus three");
            let mb = image.generated_bytes() / 1_000_000;
            assert!((18..=50).contains(&mb), "{}: {mb} MB", image.repository);
            for (label, _) in &image.layers {
                *uses.entry(label.as_str()).or_default() += 1;
            }
        }
        assert_eq!(uses["base-0"], 5);
        assert_eq!(uses["lib-3"], 2);
        assert_eq!(uses["app-7"], 1);
    }

    #[test]
    fn generated_layers_are_deterministic_and_incompressible_in_parts() {
        let a = generated_layer("lib-1", 9 * MIB + 5).unwrap();
        assert_eq!(a, generated_layer("lib-1", 9 * MIB + 5).unwrap());
        assert_ne!(a, generated_layer("lib-2", 9 * MIB + 5).unwrap());
        let e = entries(&a);
        let sizes: Vec<usize> = (0..3)
            .map(|k| e[&format!("opt/lib-1/part-{k}")].1.len())
            .collect();
        assert_eq!(sizes, vec![4 * MIB, 4 * MIB, MIB + 5]);
        // No run of equal 8-byte words: the content does not repeat.
        let part = &e["opt/lib-1/part-0"].1;
        assert_ne!(part[..8], part[8..16]);
    }

    #[test]
    fn a_layered_archive_lists_every_layer_once() {
        let layers: [&[u8]; 3] = [b"one", b"two", b"one"];
        let a = archive_of("r", json!({}), "t", &layers).unwrap();
        let e = entries(&a);
        let index: serde_json::Value = serde_json::from_slice(&e["index.json"].1).unwrap();
        let digest = index["manifests"][0]["digest"].as_str().unwrap();
        let manifest: serde_json::Value =
            serde_json::from_slice(&e[&format!("blobs/sha256/{}", &digest[7..])].1).unwrap();
        assert_eq!(manifest["layers"].as_array().unwrap().len(), 3);
        let blobs = e.keys().filter(|k| k.starts_with("blobs/sha256/")).count();
        assert_eq!(blobs, 4, "two distinct layers, the config and the manifest");
    }
}
