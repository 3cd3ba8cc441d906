//! A private image registry for the pull-credential tests: Debian's `docker-registry`
//! (distribution 2.8) on 127.0.0.1 and a free port, serving TLS with a certificate of a test CA
//! (both made with `openssl`) and asking for htpasswd (bcrypt) basic auth. The busybox test image
//! is pushed into it with `skopeo`, and the private containerd trusts the CA through a host
//! config (`<registry_hosts_dir>/127.0.0.1:<port>/hosts.toml`, read on every pull).
//!
//! One registry per test process, started on first use with its own storage directory. It dies
//! with the process (parent-death signal), and an exit handler removes its files.

use std::collections::HashSet;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::certs::{run, write};
use crate::{Runtime, on_path, shared_or_skip};

/// The registry's binary, as the Debian package installs it.
pub const REGISTRY_BINARY: &str = "/usr/bin/docker-registry";
/// The tag every pushed repository gets.
pub const TAG: &str = "v1";

/// The running registry.
#[derive(Debug)]
pub struct Registry {
    /// `127.0.0.1:<port>`.
    pub host: String,
    /// The one htpasswd user.
    pub username: String,
    pub password: String,
    dir: PathBuf,
    /// The repositories pushed so far.
    pushed: Mutex<HashSet<String>>,
    /// Other `host:port`s it is reached at ([`Registry::add_alias`]).
    aliases: Mutex<Vec<String>>,
    /// The busybox archive [`Registry::push`] pushes, once written.
    busybox: OnceLock<PathBuf>,
}

/// What the exit handler cleans up.
struct Cleanup {
    pid: i32,
    dirs: Mutex<Vec<PathBuf>>,
}

static CLEANUP: OnceLock<Cleanup> = OnceLock::new();

extern "C" fn clean_up_at_exit() {
    if let Some(c) = CLEANUP.get() {
        // SAFETY: kill(2) on the registry's pid; no memory is involved.
        unsafe {
            libc::kill(c.pid, libc::SIGTERM);
        }
        let dirs = c
            .dirs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for d in dirs.iter() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn missing_prerequisite() -> Option<String> {
    if !Path::new(REGISTRY_BINARY).is_file() {
        return Some(format!(
            "no {REGISTRY_BINARY} (apt-get install docker-registry)"
        ));
    }
    for (bin, package) in [
        ("skopeo", "skopeo"),
        ("htpasswd", "apache2-utils"),
        ("openssl", "openssl"),
    ] {
        if !on_path(bin) {
            return Some(format!("no `{bin}` on PATH (apt-get install {package})"));
        }
    }
    None
}

/// A test CA (`ca.pem`, also as `certs/ca.crt` for skopeo) and a server certificate for
/// 127.0.0.1 signed by it (`server.pem`, `server.key`), in `dir`.
fn make_certificates(dir: &Path) -> Result<(), String> {
    crate::certs::make_ca(dir, "ca", "/CN=swiftlet test CA")?;
    crate::certs::make_leaf(
        dir,
        "ca",
        "server",
        "/CN=127.0.0.1",
        crate::certs::Usage::Server,
    )?;
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).map_err(|e| format!("creating {}: {e}", certs.display()))?;
    std::fs::copy(dir.join("ca.pem"), certs.join("ca.crt"))
        .map_err(|e| format!("copying the CA: {e}"))?;
    Ok(())
}

/// A host config for `host` in the runtime's registry config directory that trusts the test CA
/// in `dir`; returns its directory.
fn trust(runtime: &Runtime, host: &str, dir: &Path) -> Result<PathBuf, String> {
    let hosts_dir = runtime.layout.registry_hosts_dir.join(host);
    std::fs::create_dir_all(&hosts_dir)
        .map_err(|e| format!("creating {}: {e}", hosts_dir.display()))?;
    let d = dir.display();
    write(
        &hosts_dir.join("hosts.toml"),
        format!(
            "server = \"https://{host}\"\n\n[host.\"https://{host}\"]\n  \
             capabilities = [\"pull\", \"resolve\"]\n  ca = \"{d}/ca.pem\"\n"
        ),
    )?;
    Ok(hosts_dir)
}

/// Starts the registry from a thread that lives as long as the process, so that the child's
/// parent-death signal fires only when the process ends.
fn spawn_registry(config: PathBuf, log: PathBuf) -> Result<i32, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("test-registry".into())
        .spawn(move || {
            let spawned = (|| {
                let out = std::fs::File::create(&log)
                    .map_err(|e| format!("creating {}: {e}", log.display()))?;
                let err = out.try_clone().map_err(|e| format!("{e}"))?;
                let mut cmd = Command::new(REGISTRY_BINARY);
                cmd.arg("serve")
                    .arg(&config)
                    .stdin(Stdio::null())
                    .stdout(out)
                    .stderr(err);
                // SAFETY: prctl(2) is async-signal-safe and touches no memory of the parent.
                unsafe {
                    std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                cmd.spawn()
                    .map_err(|e| format!("starting {REGISTRY_BINARY}: {e}"))
            })();
            match spawned {
                Ok(mut child) => {
                    let _ = tx.send(Ok(i32::try_from(child.id()).unwrap_or(i32::MAX)));
                    // Reaps it if it dies; else parks here until the process exits.
                    let _ = child.wait();
                    loop {
                        std::thread::park();
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        })
        .map_err(|e| format!("spawning the registry thread: {e}"))?;
    rx.recv()
        .map_err(|_| "the registry thread ended".to_owned())?
}

impl Registry {
    /// The registry of this process, started on first use; `None` (after printing `SKIPPED:
    /// <why>`) when a prerequisite is missing and the runtime is not required.
    ///
    /// # Panics
    /// When a prerequisite is missing and `SWIFTLET_REQUIRE_RUNTIME=1`, or when it cannot start.
    pub fn shared(runtime: &Runtime) -> Option<&'static Registry> {
        static REGISTRY: OnceLock<Option<Registry>> = OnceLock::new();
        shared_or_skip(&REGISTRY, "the test registry", missing_prerequisite, || {
            Registry::start(runtime).unwrap_or_else(|e| panic!("test registry: {e}"))
        })
    }

    fn start(runtime: &Runtime) -> Result<Registry, String> {
        let dir = std::env::temp_dir().join(format!("swiftlet-registry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("storage"))
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        make_certificates(&dir)?;
        let username = "swiftlet".to_owned();
        let password = format!(
            "pw-{}-{}",
            std::process::id(),
            crate::unix_nanos() % 1_000_000
        );
        let htpasswd = run(Command::new("htpasswd").args(["-Bbn", &username, &password]))?;
        write(&dir.join("htpasswd"), htpasswd)?;
        let port = xtask::free_loopback_port().map_err(|e| format!("a free port: {e}"))?;
        let host = format!("127.0.0.1:{port}");
        let d = dir.display();
        write(
            &dir.join("config.yml"),
            format!(
                "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n\
                 storage:\n  filesystem:\n    rootdirectory: {d}/storage\n  delete:\n    enabled: true\n\
                 http:\n  addr: {host}\n  tls:\n    certificate: {d}/server.pem\n    key: {d}/server.key\n\
                 auth:\n  htpasswd:\n    realm: swiftlet-test\n    path: {d}/htpasswd\n"
            ),
        )?;
        let hosts_dir = trust(runtime, &host, &dir)?;
        let pid = spawn_registry(dir.join("config.yml"), dir.join("registry.log"))?;
        let _ = CLEANUP.set(Cleanup {
            pid,
            dirs: Mutex::new(vec![dir.clone(), hosts_dir]),
        });
        // SAFETY: registers a plain `extern "C"` function that only reads a static.
        unsafe {
            libc::atexit(clean_up_at_exit);
        }
        let registry = Registry {
            host,
            username,
            password,
            dir,
            pushed: Mutex::default(),
            aliases: Mutex::default(),
            busybox: OnceLock::new(),
        };
        registry.wait_listening(Duration::from_secs(15))?;
        Ok(registry)
    }

    fn wait_listening(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        while TcpStream::connect(&self.host).is_err() {
            if Instant::now() >= deadline {
                return Err(format!(
                    "not listening on {} after {timeout:?}; log:\n{}",
                    self.host,
                    xtask::agent::tail(&self.dir.join("registry.log"), 20)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// `repository` pushed ([`Self::push`]) and absent from the runtime at `endpoint`, so that
    /// a start pulls it.
    ///
    /// # Panics
    /// When the push or the removal fails.
    pub fn fresh_image(&self, endpoint: &str, repository: &str) -> String {
        let image = self.push(repository);
        crate::remove_image(endpoint, &image).expect("RemoveImage");
        assert!(!crate::image_present(endpoint, &image).expect("ImageStatus"));
        image
    }

    /// Lets the runtime reach the registry also at `alias` (the `127.0.0.1:<port>` of a relay
    /// in front of it; the certificate names 127.0.0.1 only): a host config trusting the test CA,
    /// and the login for it in every later [`Self::write_node_config`].
    ///
    /// # Errors
    /// When the host config cannot be written.
    pub fn add_alias(&self, runtime: &Runtime, alias: &str) -> Result<(), String> {
        let hosts_dir = trust(runtime, alias, &self.dir)?;
        if let Some(c) = CLEANUP.get() {
            c.dirs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(hosts_dir);
        }
        self.aliases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(alias.to_owned());
        Ok(())
    }

    /// The registry's login (for its own address and every alias) in `config.json` in
    /// `root_dir` (an agent's `--root-dir`, where it looks for the node's credentials); returns
    /// its `auth` value.
    ///
    /// # Panics
    /// When the file cannot be written.
    pub fn write_node_config(&self, root_dir: &Path) -> String {
        use base64::Engine;
        let auth = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", self.username, self.password));
        let mut auths = serde_json::Map::new();
        auths.insert(
            format!("https://{}", self.host),
            serde_json::json!({"auth": auth}),
        );
        for alias in self
            .aliases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
        {
            auths.insert(
                format!("https://{alias}"),
                serde_json::json!({"auth": auth}),
            );
        }
        let config = serde_json::json!({ "auths": auths });
        std::fs::write(root_dir.join("config.json"), config.to_string())
            .expect("write config.json");
        auth
    }

    /// `<host>/<repository>:v1`, the busybox test image pushed there (once per repository).
    ///
    /// # Panics
    /// When the push fails.
    pub fn push(&self, repository: &str) -> String {
        // Written once, by the first caller; the others (tests run in parallel threads) wait.
        let archive = self.busybox.get_or_init(|| {
            let archive = self.dir.join("busybox.tar");
            let written = xtask::images::write_archive(
                xtask::images::Image::Busybox,
                Path::new(xtask::images::BUSYBOX_PATH),
                &self.dir,
            )
            .unwrap_or_else(|e| panic!("writing the busybox archive: {e}"));
            std::fs::rename(&written, &archive)
                .unwrap_or_else(|e| panic!("renaming {}: {e}", written.display()));
            archive
        });
        self.push_archive(repository, archive)
    }

    /// `<host>/<repository>:v1`, the image of the OCI archive `archive` pushed there with
    /// `skopeo` (once per repository).
    ///
    /// # Panics
    /// When the push fails.
    pub fn push_archive(&self, repository: &str, archive: &Path) -> String {
        let image = format!("{}/{repository}:{TAG}", self.host);
        let mut pushed = self
            .pushed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if pushed.contains(repository) {
            return image;
        }
        run(Command::new("skopeo")
            .args(["--insecure-policy", "copy", "--quiet", "--dest-creds"])
            .arg(format!("{}:{}", self.username, self.password))
            .arg("--dest-cert-dir")
            .arg(self.dir.join("certs"))
            .arg(format!("oci-archive:{}", archive.display()))
            .arg(format!("docker://{image}")))
        .unwrap_or_else(|e| panic!("pushing {image}: {e}"));
        pushed.insert(repository.to_owned());
        image
    }

    /// The directory the registry keeps its files in (its storage, certificates and log);
    /// removed when the process exits.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
