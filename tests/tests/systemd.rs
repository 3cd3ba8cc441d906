//! The agent under systemd's readiness protocol: with `$NOTIFY_SOCKET` set (as systemd sets it
//! for a `Type=notify` unit) it says `READY=1` once it runs and `STOPPING=1` on SIGTERM. The
//! test plays systemd's part with a datagram socket of its own.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use swiftlet_tests::{Agent, AgentOptions, Runtime};

#[test]
fn the_agent_tells_systemd_when_it_is_ready_and_when_it_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(90)))
        .expect("a timeout");
    // SAFETY: the one test of this binary sets it before any other thread of the test could read
    // the environment (the runtime fixture starts after); the agent process inherits it.
    unsafe { std::env::set_var(swiftlet::systemd::NOTIFY_SOCKET, &path) };
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let mut agent = Agent::start(rt, AgentOptions::new("sd-notify"));
    let mut buf = [0u8; 256];
    let n = socket.recv(&mut buf).expect("READY=1 within 90 s");
    assert_eq!(String::from_utf8_lossy(&buf[..n]), "READY=1");
    assert!(
        agent.log().contains("swiftlet started"),
        "ready is said once the agent runs"
    );
    agent.stop(Duration::from_secs(30));
    let n = socket.recv(&mut buf).expect("STOPPING=1 after SIGTERM");
    assert_eq!(String::from_utf8_lossy(&buf[..n]), "STOPPING=1");
}
