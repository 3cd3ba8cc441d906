//! systemd's readiness protocol (`Type=notify` units): a datagram naming the new state sent to the
//! socket in `$NOTIFY_SOCKET` (a path, or an abstract socket name when it starts with `@`).
//! swiftlet says `READY=1` once its sync loop runs and `STOPPING=1` when it begins to shut down;
//! without `$NOTIFY_SOCKET` (not started by systemd) nothing is sent.
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::net::UnixDatagram;

/// The environment variable systemd sets for a `Type=notify` service.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Tells systemd `state` (`READY=1`, `STOPPING=1`, `STATUS=...`) when it is listening; a failure
/// is logged, never fatal.
pub fn notify(state: &str) {
    let Some(socket) = std::env::var_os(NOTIFY_SOCKET) else {
        return;
    };
    match notify_to(&socket, state) {
        Ok(()) => tracing::debug!(state, "told systemd"),
        Err(error) => tracing::warn!(%error, state, socket = ?socket, "telling systemd"),
    }
}

/// Sends `state` to the notification socket `socket`.
pub fn notify_to(socket: &OsStr, state: &str) -> std::io::Result<()> {
    let sender = UnixDatagram::unbound()?;
    let bytes = socket.as_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt as _;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sender.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sender.send_to(state.as_bytes(), socket)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_reach_a_path_socket_and_an_abstract_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        notify_to(path.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("swiftlet-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let abstract_listener = UnixDatagram::bind_addr(&addr).unwrap();
        notify_to(OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        let n = abstract_listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");

        assert!(notify_to(dir.path().join("absent").as_os_str(), "READY=1").is_err());
    }
}
