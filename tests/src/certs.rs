//! Test certificates made with `openssl`: a CA and leaf certificates it signs (a server's for
//! 127.0.0.1, a client's naming a user). P-256 keys, valid two days.
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs `cmd`; its stderr in the error when it fails.
pub fn run(cmd: &mut Command) -> Result<Vec<u8>, String> {
    let what = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(out.stdout)
}

pub fn write(path: &Path, contents: impl AsRef<[u8]>) -> Result<(), String> {
    std::fs::write(path, contents).map_err(|e| format!("writing {}: {e}", path.display()))
}

const EC: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// A self-signed CA in `dir`: `<name>.pem` and `<name>.key`.
pub fn make_ca(dir: &Path, name: &str, subject: &str) -> Result<(), String> {
    run(Command::new("openssl")
        .args(["req", "-x509"])
        .args(EC)
        .args(["-days", "2", "-subj", subject])
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        .args([
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
        ])
        .current_dir(dir))
    .map(drop)
}

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy)]
pub enum Usage {
    /// A server at 127.0.0.1.
    Server,
    /// A client (its user is the subject's CN, its groups the O's).
    Client,
}

/// A leaf certificate signed by the CA `ca` (made by [`make_ca`] in `dir`): `<name>.pem` and
/// `<name>.key`.
pub fn make_leaf(
    dir: &Path,
    ca: &str,
    name: &str,
    subject: &str,
    usage: Usage,
) -> Result<(), String> {
    run(Command::new("openssl")
        .arg("req")
        .args(EC)
        .args(["-subj", subject])
        .args([
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ])
        .current_dir(dir))?;
    let ext = match usage {
        Usage::Server => {
            "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
        }
        Usage::Client => "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    };
    write(&dir.join(format!("{name}.ext")), ext)?;
    run(Command::new("openssl")
        .args(["x509", "-req", "-in", &format!("{name}.csr")])
        .args(["-CA", &format!("{ca}.pem"), "-CAkey", &format!("{ca}.key")])
        .args([
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
        ])
        .args(["-out", &format!("{name}.pem")])
        .current_dir(dir))
    .map(drop)
}
