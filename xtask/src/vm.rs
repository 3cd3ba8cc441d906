//! A throw-away Debian VM with systemd as PID 1 and a cgroup layout of our choosing, for what
//! this machine's own kernel cannot show: the pure cgroup v2 hierarchy (here every v1
//! controller is pinned by the machine's init, see docs/machine.md) and, later, a real systemd.
//!
//! - [`image`]: debootstraps Debian with containerd, runc and the CNI plugins into a raw ext4
//!   disk image under [`CACHE`] (once; the image is keyed by what goes into it);
//! - [`run`]: boots the image (copy-on-write: every run starts from the same disk), mounts the
//!   host directories the job needs at their own paths, runs one shell command as root, streams
//!   its output and returns its exit code. The VM powers itself off when the command ends.
//!
//! The guest runs under QEMU's TCG (software emulation): `/dev/kvm` opens on this machine but a
//! guest under it hangs in early boot (nested virtualization is not offered); `--kvm` asks for
//! it where it works.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::progress::{Progress, note};

/// Where built images are kept, one directory per image key.
pub const CACHE: &str = "/var/cache/swiftlet-vm";
/// The Debian release and mirror of the guest (the host's own).
const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";
/// What the guest needs beyond debootstrap's minimal base: systemd as init, the kernel, and what
/// the test fixture's private containerd uses.
const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "dbus",
    "udev",
    "kmod",
    "linux-image-amd64",
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "iproute2",
    "busybox-static",
    "ca-certificates",
    "procps",
];

/// The guest's job runner: mounts the job share, runs `run.sh`, keeps its output and exit code
/// in the share and powers the VM off.
const JOB_RUNNER: &str = r#"#!/bin/sh
mkdir -p /mnt/job
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 job /mnt/job; then
    echo "swiftlet-vm: the job share did not mount"
    systemctl poweroff
    exit 1
fi
echo "swiftlet-vm: job starts"
sh /mnt/job/run.sh > /mnt/job/out 2>&1
echo $? > /mnt/job/rc.tmp && mv /mnt/job/rc.tmp /mnt/job/rc
sync
echo "swiftlet-vm: job done"
systemctl poweroff
"#;

const JOB_UNIT: &str = "[Unit]
Description=swiftlet VM job
After=local-fs.target systemd-modules-load.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/swiftlet-vm-job
StandardOutput=tty
StandardError=inherit
TTYPath=/dev/ttyS0

[Install]
WantedBy=multi-user.target
";

/// A built image: the disk and the kernel and initrd to boot it with.
#[derive(Debug, Clone)]
pub struct Image {
    pub disk: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

/// The image key: changes whenever what goes into the image does.
fn key() -> String {
    let inputs = [SUITE, &PACKAGES.join(","), JOB_RUNNER, JOB_UNIT].join("\0");
    let digest = crate::images::sha256_digest(inputs.as_bytes());
    let hex = digest.trim_start_matches("sha256:");
    format!("{SUITE}-{}", &hex[..16])
}

fn image_at(dir: &Path) -> Image {
    Image {
        disk: dir.join("disk.img"),
        kernel: dir.join("vmlinuz"),
        initrd: dir.join("initrd.img"),
    }
}

fn sh(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The image, built first when missing (needs root, debootstrap, mkfs.ext4 and the mirror;
/// several minutes).
pub fn image() -> anyhow::Result<Image> {
    let dir = Path::new(CACHE).join(key());
    let img = image_at(&dir);
    if img.disk.is_file() && img.kernel.is_file() && img.initrd.is_file() {
        return Ok(img);
    }
    let mut p = Progress::new(3);
    let root = dir.with_extension("root");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    p.step("debootstrap the guest (Debian with containerd)", || {
        sh(Command::new("debootstrap")
            .arg("--variant=minbase")
            .arg(format!("--include={}", PACKAGES.join(",")))
            .args([SUITE, &root.to_string_lossy(), MIRROR]))
    })?;
    p.step("configure the guest", || configure(&root, &img))?;
    p.step("write the disk image", || {
        let tmp = dir.join("disk.img.tmp");
        let _ = std::fs::remove_file(&tmp);
        sh(Command::new("truncate").args(["-s", "8G"]).arg(&tmp))?;
        sh(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-d"])
            .arg(&root)
            .arg(&tmp))?;
        std::fs::rename(&tmp, &img.disk).context("placing the disk image")?;
        std::fs::remove_dir_all(&root).context("removing the guest tree")
    })?;
    Ok(img)
}

/// The guest's files: fstab, hostname, the job unit; containerd off (the tests start their own);
/// the kernel and initrd copied out to boot with.
fn configure(root: &Path, img: &Image) -> anyhow::Result<()> {
    let write = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
    };
    write("etc/fstab", "/dev/vda / ext4 rw,relatime 0 1\n")?;
    write("etc/hostname", "swiftlet-vm\n")?;
    write("etc/systemd/system/swiftlet-vm-job.service", JOB_UNIT)?;
    write("usr/local/sbin/swiftlet-vm-job", JOB_RUNNER)?;
    sh(Command::new("chmod")
        .arg("755")
        .arg(root.join("usr/local/sbin/swiftlet-vm-job")))?;
    sh(Command::new("chroot")
        .arg(root)
        .args(["systemctl", "enable", "swiftlet-vm-job.service"]))?;
    sh(Command::new("chroot")
        .arg(root)
        .args(["systemctl", "disable", "containerd.service"]))?;
    let boot = root.join("boot");
    let find = |prefix: &str| -> anyhow::Result<PathBuf> {
        std::fs::read_dir(&boot)?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            })
            .with_context(|| format!("no {prefix}* in {}", boot.display()))
    };
    std::fs::copy(find("vmlinuz-")?, &img.kernel).context("copying the kernel")?;
    std::fs::copy(find("initrd.img-")?, &img.initrd).context("copying the initrd")?;
    Ok(())
}

/// The cgroup layout the guest boots with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Cgroups {
    /// The unified hierarchy only (systemd's default).
    V2,
    /// The legacy per-controller hierarchies.
    V1,
}

/// What to run in the VM.
#[derive(Debug, Clone)]
pub struct Job {
    /// A shell command line (run by `sh` as root, in `cwd`).
    pub command: String,
    /// The working directory, shared from the host like `shares`.
    pub cwd: PathBuf,
    /// Host directories mounted at the same paths in the guest (read-write).
    pub shares: Vec<PathBuf>,
    /// Environment variables passed to the command.
    pub env: Vec<(String, String)>,
    pub cgroups: Cgroups,
    pub kvm: bool,
    pub timeout: Duration,
    /// Guest memory in MiB and virtual CPUs.
    pub memory_mib: u32,
    pub cpus: u32,
}

/// The job's directory on the host (shared into the guest as `job`), removed afterwards.
struct JobDir(PathBuf);

impl JobDir {
    fn new() -> anyhow::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("swiftlet-vm-job-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating the job directory {}", dir.display()))?;
        Ok(Self(dir))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for JobDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A single-quoted shell word.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Boots the image, runs the job and returns its exit code and output (streamed to stdout as
/// it comes).
pub fn run(img: &Image, job: &Job) -> anyhow::Result<(i32, String)> {
    let dir = JobDir::new()?;
    let mut shares: Vec<PathBuf> = Vec::new();
    for s in job.shares.iter().chain([&job.cwd]) {
        let s = s
            .canonicalize()
            .with_context(|| format!("sharing {}", s.display()))?;
        // A directory inside another share comes with it.
        if !shares.iter().any(|o| s.starts_with(o)) {
            shares.retain(|o| !o.starts_with(&s));
            shares.push(s);
        }
    }
    let mut script = String::from("set -e\n");
    for (i, s) in shares.iter().enumerate() {
        let p = quote(&s.to_string_lossy());
        script.push_str(&format!(
            "mkdir -p {p}\nmount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share{i} {p}\n"
        ));
    }
    for (k, v) in &job.env {
        script.push_str(&format!("export {k}={}\n", quote(v)));
    }
    script.push_str(&format!(
        "cd {}\nset +e\n{}\n",
        quote(&job.cwd.to_string_lossy()),
        job.command
    ));
    std::fs::write(dir.path().join("run.sh"), script).context("writing run.sh")?;

    let cgroup_arg = match job.cgroups {
        Cgroups::V2 => "systemd.unified_cgroup_hierarchy=1",
        Cgroups::V1 => "systemd.unified_cgroup_hierarchy=0",
    };
    let serial = dir.path().join("serial.log");
    let mut qemu = Command::new("qemu-system-x86_64");
    if job.kvm {
        qemu.args(["-enable-kvm", "-cpu", "host,-arch-capabilities"]);
    } else {
        qemu.args(["-accel", "tcg,thread=multi", "-cpu", "max"]);
    }
    qemu.args(["-smp", &job.cpus.to_string()])
        .args(["-m", &job.memory_mib.to_string()])
        .args(["-display", "none", "-nodefaults", "-no-reboot", "-snapshot"])
        .arg("-serial")
        .arg(format!("file:{}", serial.display()))
        .arg("-kernel")
        .arg(&img.kernel)
        .arg("-initrd")
        .arg(&img.initrd)
        .arg("-append")
        .arg(format!("root=/dev/vda rw console=ttyS0 quiet {cgroup_arg}"))
        .arg("-drive")
        .arg(format!("file={},if=virtio,format=raw", img.disk.display()))
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=job,security_model=none,id=job",
            dir.path().display()
        ));
    for (i, s) in shares.iter().enumerate() {
        qemu.arg("-virtfs").arg(format!(
            "local,path={},mount_tag=share{i},security_model=none,id=share{i}",
            s.display()
        ));
    }
    qemu.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    note(format!(
        "booting the VM ({:?} cgroups, {}): {}",
        job.cgroups,
        if job.kvm { "KVM" } else { "TCG" },
        job.command.lines().collect::<Vec<_>>().join("; ")
    ));
    let mut child = qemu.spawn().context("starting qemu-system-x86_64")?;
    let start = Instant::now();
    let out_path = dir.path().join("out");
    let mut shown = 0u64;
    let mut output = Vec::new();
    let mut stdout = std::io::stdout();
    let status = loop {
        // The job's output as it grows (the share is the host directory itself).
        if let Ok(mut f) = std::fs::File::open(&out_path)
            && f.seek(SeekFrom::Start(shown)).is_ok()
        {
            let mut buf = Vec::new();
            if f.read_to_end(&mut buf).is_ok() && !buf.is_empty() {
                shown += buf.len() as u64;
                let _ = stdout.write_all(&buf);
                let _ = stdout.flush();
                output.extend_from_slice(&buf);
            }
        }
        if let Some(status) = child.try_wait().context("waiting for qemu")? {
            break status;
        }
        if start.elapsed() > job.timeout {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the VM did not finish within {:?}; its console:\n{}",
                job.timeout,
                tail(&serial, 40)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    if let Ok(mut f) = std::fs::File::open(&out_path) {
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(shown)).is_ok() && f.read_to_end(&mut buf).is_ok() {
            let _ = stdout.write_all(&buf);
            output.extend_from_slice(&buf);
        }
    }
    let rc = std::fs::read_to_string(dir.path().join("rc")).ok();
    let Some(rc) = rc.and_then(|s| s.trim().parse::<i32>().ok()) else {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        bail!(
            "the VM ended ({status}) without the job's exit code; qemu: {}; its console:\n{}",
            err.trim(),
            tail(&serial, 40)
        );
    };
    note(format!(
        "the VM ran the job in {:.0} s (exit code {rc})",
        start.elapsed().as_secs_f64()
    ));
    Ok((rc, String::from_utf8_lossy(&output).into_owned()))
}

/// The last `n` lines of a file, for an error message.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_key_follows_its_inputs() {
        assert_eq!(key(), key());
        assert!(key().starts_with("bookworm-"));
    }

    #[test]
    fn shell_words_survive_quotes() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
