use super::*;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;

fn spec(spec: serde_json::Value) -> PodSpec {
    let mut spec = spec;
    spec.as_object_mut()
        .expect("an object")
        .entry("containers")
        .or_insert_with(|| json!([{"name": "c", "image": "x"}]));
    let pod: Pod =
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).expect("a pod");
    pod.spec.expect("spec")
}

fn container(mounts: serde_json::Value, privileged: bool) -> Container {
    serde_json::from_value(json!({
        "name": "c", "image": "x", "volumeMounts": mounts,
        "securityContext": {"privileged": privileged},
    }))
    .expect("a container")
}

fn invalid(r: Result<impl std::fmt::Debug>) -> String {
    match r {
        Err(Error::Invalid(why)) => why,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

/// A pods dir for a test that mounts, `None` (skipped, loudly) when not root.
fn pods_dir_for_mounts() -> Option<tempfile::TempDir> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: mounting needs root");
        return None;
    }
    Some(tempfile::tempdir().expect("tempdir"))
}

#[test]
fn volumes_are_planned_with_their_sources() {
    let s = spec(json!({"volumes": [
        {"name": "scratch", "emptyDir": {}},
        {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        {"name": "host", "hostPath": {"path": "/var/log", "type": "DirectoryOrCreate"}},
        {"name": "plain", "hostPath": {"path": "/etc/hostname"}},
    ]}));
    let v = plan(&s).expect("plan");
    assert_eq!(
        v.iter().map(|v| v.source.clone()).collect::<Vec<_>>(),
        [
            Source::EmptyDir {
                memory: false,
                size_limit: None
            },
            Source::EmptyDir {
                memory: true,
                size_limit: Some(64 << 20)
            },
            Source::HostPath {
                path: "/var/log".into(),
                kind: HostPathType::DirectoryOrCreate
            },
            Source::HostPath {
                path: "/etc/hostname".into(),
                kind: HostPathType::Unset
            },
        ]
    );
    let pods = Path::new("/r/pods");
    assert_eq!(
        v[0].host_path(pods, "u1"),
        Path::new("/r/pods/u1/volumes/kubernetes.io~empty-dir/scratch")
    );
    assert_eq!(v[2].host_path(pods, "u1"), Path::new("/var/log"));

    // A claim is planned unresolved; once resolved to a local PersistentVolume it lives below
    // the local plugin's directory, named after the volume, as the kubelet names it.
    let s = spec(json!({"volumes": [
        {"name": "data", "persistentVolumeClaim": {"claimName": "db-data", "readOnly": true}},
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
    ]}));
    let v = plan(&s).expect("plan");
    assert_eq!(
        v[1].source,
        Source::Claim {
            claim: None,
            read_only: false
        }
    );
    assert_eq!(claim_name("web", "scratch", None), "web-scratch");
    assert_eq!(claim_name("web", "data", Some("db-data")), "db-data");
    assert_eq!(
        v[0].source,
        Source::Claim {
            claim: Some("db-data".into()),
            read_only: true
        }
    );
    let local = Volume {
        name: "data".into(),
        source: Source::Persistent {
            pv: "pv-1".into(),
            read_only: true,
            backing: Backing::Local("/mnt/disks/one".into()),
        },
    };
    assert_eq!(
        local.host_path(pods, "u1"),
        Path::new("/r/pods/u1/volumes/kubernetes.io~local-volume/pv-1")
    );
    // The kubelet's plugin names, as the storage operation metric labels them.
    assert_eq!(local.plugin(), "kubernetes.io/local-volume");
    let planned = plan(&spec(json!({"volumes": [
        {"name": "e", "emptyDir": {}},
        {"name": "h", "hostPath": {"path": "/x"}},
        {"name": "c", "configMap": {"name": "m"}},
    ]})))
    .expect("plan");
    let plugins: Vec<&str> = planned.iter().map(Volume::plugin).collect();
    assert_eq!(
        plugins,
        [
            "kubernetes.io/empty-dir",
            "kubernetes.io/host-path",
            "kubernetes.io/configmap"
        ]
    );
}

#[test]
fn a_local_volume_is_bound_read_only_when_asked_and_unbound_leaving_its_data() {
    let Some(pods) = pods_dir_for_mounts() else {
        return;
    };
    let disk = tempfile::tempdir().expect("tempdir");
    std::fs::write(disk.path().join("kept"), "data").expect("write");
    let volume = |read_only| Volume {
        name: "data".into(),
        source: Source::Persistent {
            pv: "pv-1".into(),
            read_only,
            backing: Backing::Local(disk.path().to_owned()),
        },
    };
    let binds = |dir: &Path| {
        let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
        mount_points()
            .expect("mountinfo")
            .into_iter()
            .filter(|m| m.path == dir)
            .count()
    };
    use std::os::unix::fs::MetadataExt;
    let group = |p: &Path| std::fs::metadata(p).expect("stat").gid();
    for read_only in [true, false] {
        let vols = [volume(read_only)];
        // The fsGroup reaches every file of a writable volume, none of a read-only one.
        let ctx = Context {
            fs_group: Some(4321),
            ..Context::default()
        };
        set_up(pods.path(), "u1", &vols, ctx, &Default::default()).expect("set up");
        let want = if read_only { 0 } else { 4321 };
        assert_eq!(group(&disk.path().join("kept")), want);
        assert_eq!(group(disk.path()), want);
        let dir = vols[0].host_path(pods.path(), "u1");
        assert_eq!(binds(&dir), 1);
        assert_eq!(
            std::fs::read_to_string(dir.join("kept")).expect("seen"),
            "data"
        );
        let write = std::fs::write(dir.join("new"), "x");
        assert_eq!(write.is_err(), read_only, "{write:?}");
        // Set up again (a restarted agent): not bound twice.
        set_up(pods.path(), "u1", &vols, ctx, &Default::default()).expect("set up again");
        assert_eq!(binds(&dir), 1);
        let c = container(json!([{"name": "data", "mountPath": "/data"}]), false);
        let m = container_mounts(pods.path(), "u1", &vols, &c).expect("mounts");
        assert_eq!(m[0].host_path, dir.to_string_lossy());
        assert_eq!(m[0].readonly, read_only);
        remove_pod_dir(pods.path(), "u1").expect("torn down");
        assert_eq!(binds(&dir), 0);
        assert!(!pods.path().join("u1").exists());
        assert!(disk.path().join("kept").exists(), "the volume's data stays");
        let _ = std::fs::remove_file(disk.path().join("new"));
    }
    // A volume on a tmpfs (a node's /tmp often is one): set up again, it is the bind already
    // there, not a stray tmpfs.
    let memory = tempfile::tempdir().expect("tempdir");
    setup::mount_tmpfs(memory.path(), 1 << 20).expect("a tmpfs");
    let on_tmpfs = [Volume {
        name: "data".into(),
        source: Source::Persistent {
            pv: "pv-mem".into(),
            read_only: false,
            backing: Backing::Local(memory.path().to_owned()),
        },
    }];
    let ctx = Context::default();
    set_up(pods.path(), "u4", &on_tmpfs, ctx, &Default::default()).expect("set up");
    set_up(pods.path(), "u4", &on_tmpfs, ctx, &Default::default()).expect("set up again");
    assert_eq!(binds(&on_tmpfs[0].host_path(pods.path(), "u4")), 1);
    remove_pod_dir(pods.path(), "u4").expect("torn down");
    remove::unmount(memory.path()).expect("unmount the tmpfs");

    // A path that is not a directory is refused, naming it.
    std::fs::write(disk.path().join("file"), "x").expect("write");
    let file = Volume {
        name: "data".into(),
        source: Source::Persistent {
            pv: "pv-2".into(),
            read_only: false,
            backing: Backing::Local(disk.path().join("file")),
        },
    };
    let e = set_up(
        pods.path(),
        "u2",
        &[file],
        Context::default(),
        &Default::default(),
    )
    .expect_err("refused");
    assert!(e.to_string().contains("is not a directory"), "{e}");
    // An unresolved claim is never set up.
    let claim = Volume {
        name: "data".into(),
        source: Source::Claim {
            claim: Some("c".into()),
            read_only: false,
        },
    };
    let e = set_up(
        pods.path(),
        "u3",
        &[claim],
        Context::default(),
        &Default::default(),
    )
    .expect_err("refused");
    assert!(e.to_string().contains("not resolved"), "{e}");
}

#[test]
fn bad_volumes_are_clear_errors_naming_them() {
    let cases = [
        (json!({"name": "../x", "emptyDir": {}}), "DNS label"),
        (json!({"name": "Big", "emptyDir": {}}), "DNS label"),
        (
            json!({"name": "h", "hostPath": {"path": "/a/../etc"}}),
            "must not contain '..'",
        ),
        (
            json!({"name": "h", "hostPath": {"path": "relative"}}),
            "not an absolute path",
        ),
        (
            json!({"name": "h", "hostPath": {"path": "/x", "type": "Dir"}}),
            "is not a type",
        ),
        (
            json!({"name": "e", "emptyDir": {"medium": "Memory", "sizeLimit": "lots"}}),
            "not a quantity",
        ),
        (json!({"name": "n"}), "no volume type"),
        (
            json!({"name": "c", "persistentVolumeClaim": {"claimName": "../etc"}}),
            "is not an object name",
        ),
        (
            json!({"name": "c", "persistentVolumeClaim": {"claimName": "c"}, "emptyDir": {}}),
            "more than one volume type",
        ),
        (
            json!({"name": "s", "nfs": {"server": "s", "path": "/"}}),
            "nfs volumes are not supported yet",
        ),
        (
            json!({"name": "s", "secret": {"secretName": "s"}, "emptyDir": {}}),
            "more than one volume type",
        ),
        (
            json!({"name": "s", "secret": {"secretName": "s", "items": [{"key": "k", "path": "../k"}]}}),
            "must not contain '..'",
        ),
    ];
    for (v, want) in cases {
        let why = invalid(plan(&spec(json!({ "volumes": [v.clone()] }))));
        assert!(
            why.contains(want) && why.starts_with("spec.volumes"),
            "{v}: {why}"
        );
    }
    let twice =
        spec(json!({"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]}));
    assert!(invalid(plan(&twice)).contains("used twice"));
}

#[test]
fn a_memory_volume_is_sized_as_the_kubelet_sizes_it() {
    const G: u64 = 1 << 30;
    assert_eq!(memory_size(8 * G, None, None), 8 * G, "the node's memory");
    assert_eq!(memory_size(8 * G, Some(G), None), G, "the pod's limit");
    assert_eq!(memory_size(8 * G, Some(G), Some(G / 2)), G / 2, "sizeLimit");
    assert_eq!(
        memory_size(8 * G, Some(G), Some(2 * G)),
        G,
        "sizeLimit above the limit"
    );
    assert_eq!(memory_size(8 * G, None, Some(16 * G)), 8 * G);
    assert_eq!(memory_size(8 * G, Some(0), Some(0)), 8 * G, "zero is unset");
}

fn two_volumes(dir: &Path) -> Vec<Volume> {
    vec![
        Volume {
            name: "scratch".into(),
            source: Source::EmptyDir {
                memory: false,
                size_limit: None,
            },
        },
        Volume {
            name: "host".into(),
            source: Source::HostPath {
                path: dir.to_owned(),
                kind: HostPathType::Directory,
            },
        },
    ]
}

#[test]
fn mounts_are_checked_against_the_volumes() {
    let vols = two_volumes(Path::new("/h"));
    let c = container(json!([{"name": "nope", "mountPath": "/x"}]), false);
    assert_eq!(
        invalid(check_mounts(&vols, &c)),
        "cannot find volume \"nope\" to mount into container \"c\""
    );
    let cases = [
        (
            json!({"name": "scratch", "mountPath": ""}),
            "mountPath is empty",
        ),
        (
            json!({"name": "scratch", "mountPath": "/x", "subPath": "/abs"}),
            "must be a relative path",
        ),
        (
            json!({"name": "scratch", "mountPath": "/x", "subPath": "a/../../b"}),
            "must not contain '..'",
        ),
        (
            json!({"name": "scratch", "mountPath": "/x", "mountPropagation": "Bidirectional"}),
            "only to privileged containers",
        ),
        (
            json!({"name": "scratch", "mountPath": "/x", "mountPropagation": "Shared"}),
            "invalid mountPropagation",
        ),
    ];
    for (m, want) in cases {
        let why = invalid(check_mounts(&vols, &container(json!([m.clone()]), false)));
        assert!(why.contains(want), "{m}: {why}");
    }
    let twice = container(
        json!([{"name": "scratch", "mountPath": "/x"}, {"name": "host", "mountPath": "/x/"}]),
        false,
    );
    assert!(invalid(check_mounts(&vols, &twice)).contains("used twice"));
    let bidi = json!([{"name": "scratch", "mountPath": "/x", "mountPropagation": "Bidirectional"}]);
    check_mounts(&vols, &container(bidi, true)).expect("privileged may");
}

#[test]
fn the_mount_list_maps_read_only_sub_paths_and_propagation() {
    let Some(pods) = pods_dir_for_mounts() else {
        return;
    };
    let host = tempfile::tempdir().expect("tempdir");
    let vols = two_volumes(host.path());
    set_up(
        pods.path(),
        "u1",
        &vols,
        Context::default(),
        &Default::default(),
    )
    .expect("set up");
    let c = container(
        json!([
            {"name": "scratch", "mountPath": "/data"},
            {"name": "host", "mountPath": "/ro", "readOnly": true, "mountPropagation": "HostToContainer"},
            {"name": "scratch", "mountPath": "/sub", "subPath": "a/b"},
            {"name": "host", "mountPath": "/bidi", "mountPropagation": "Bidirectional"},
        ]),
        true,
    );
    let mounts = container_mounts(pods.path(), "u1", &vols, &c).expect("mounts");
    let scratch = pods
        .path()
        .join("u1/volumes/kubernetes.io~empty-dir/scratch");
    let host_c = host.path().canonicalize().expect("canonical");
    let scratch_c = scratch.canonicalize().expect("canonical");
    let got: Vec<(&str, String, bool, i32, bool)> = mounts
        .iter()
        .map(|m| {
            (
                m.container_path.as_str(),
                m.host_path.clone(),
                m.readonly,
                m.propagation,
                m.selinux_relabel,
            )
        })
        .collect();
    use api::MountPropagation as P;
    let s = |p: &Path| p.to_string_lossy().into_owned();
    assert_eq!(
        got,
        [
            (
                "/data",
                s(&scratch),
                false,
                P::PropagationPrivate as i32,
                true
            ),
            (
                "/ro",
                s(host.path()),
                true,
                P::PropagationHostToContainer as i32,
                false
            ),
            (
                "/sub",
                s(&pods.path().join("u1/volume-subpaths/scratch/c/2")),
                false,
                P::PropagationPrivate as i32,
                true
            ),
            (
                "/bidi",
                s(host.path()),
                false,
                P::PropagationBidirectional as i32,
                false
            ),
        ]
    );
    // The subPath was made with the volume's mode (0777).
    let mode = std::fs::metadata(scratch.join("a/b"))
        .expect("made")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o777);
    assert!(host_c.exists());
    // The subPath is bound where the runtime is told to look: what is written there is in the
    // volume.
    let bound = pods.path().join("u1/volume-subpaths/scratch/c/2");
    std::fs::write(bound.join("f"), "through the bind").expect("write");
    assert_eq!(
        std::fs::read_to_string(scratch_c.join("a/b/f")).expect("in the volume"),
        "through the bind"
    );
    // A second start of the container replaces its bind rather than stacking one more.
    container_mounts(pods.path(), "u1", &vols, &c).expect("mounts again");
    let bound_c = bound.canonicalize().expect("canonical");
    let binds = || mountinfo::below(&mount_points().expect("mountinfo"), &bound_c).len();
    assert_eq!(binds(), 1);
    // Tear-down unmounts the bind before removing anything; the hostPath is left alone.
    std::fs::write(host.path().join("keep"), "x").expect("write");
    remove_pod_dir(pods.path(), "u1").expect("torn down");
    assert_eq!(binds(), 0);
    assert!(!pods.path().join("u1").exists());
    assert!(host.path().join("keep").exists());
}

#[test]
fn a_sub_path_never_leaves_its_volume() {
    let vol = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("tempdir");
    let root = vol.path().canonicalize().expect("canonical");
    std::fs::create_dir(vol.path().join("real")).expect("mkdir");
    std::os::unix::fs::symlink(outside.path(), vol.path().join("out")).expect("symlink");
    std::os::unix::fs::symlink("real", vol.path().join("in")).expect("symlink");
    std::os::unix::fs::symlink("../../..", vol.path().join("real/up")).expect("symlink");
    // A symlink inside the volume is followed.
    assert_eq!(
        setup::sub_path(vol.path(), "in/x").expect("inside"),
        root.join("real/x")
    );
    assert!(root.join("real/x").is_dir(), "created");
    for escape in ["out", "out/x", "real/up", "real/up/etc"] {
        let why = setup::sub_path(vol.path(), escape)
            .expect_err(escape)
            .to_string();
        assert!(why.contains("outside the volume"), "{escape}: {why}");
    }
    // Nothing was created outside.
    assert_eq!(std::fs::read_dir(outside.path()).expect("ls").count(), 0);
    let why = setup::sub_path(vol.path(), "../x")
        .expect_err("..")
        .to_string();
    assert!(why.contains(".."), "{why}");
    // A file in the way of a directory.
    std::fs::write(vol.path().join("f"), "x").expect("write");
    assert!(setup::sub_path(vol.path(), "f/y").is_err());
    // A symlink swapped in between the check and the bind: the bind opens the path without
    // following any symlink, and refuses.
    std::fs::create_dir_all(vol.path().join("swap/x")).expect("mkdir");
    let resolved = setup::sub_path(vol.path(), "swap/x").expect("inside");
    std::fs::rename(vol.path().join("swap"), vol.path().join("swapped")).expect("mv");
    std::os::unix::fs::symlink(outside.path(), vol.path().join("swap")).expect("symlink");
    std::fs::create_dir(outside.path().join("x")).expect("mkdir");
    let target = vol.path().join("never-bound");
    let why = setup::bind_sub_path(vol.path(), &resolved, &target)
        .expect_err("swapped")
        .to_string();
    assert!(why.contains("without following symlinks"), "{why}");
    assert!(!target.exists(), "nothing was prepared");
}

/// A container swaps a directory the agent just made for a symlink before the agent sets its
/// mode: the agent refuses the symlink and changes nothing outside the volume.
#[test]
fn a_sub_path_directory_swapped_for_a_symlink_is_never_chmodded_through() {
    let vol = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("tempdir");
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777;
    std::fs::set_permissions(vol.path(), std::fs::Permissions::from_mode(0o2777)).expect("chmod");
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o700))
        .expect("chmod");
    let mut swaps = 0;
    let mut swap = |made: &Path| {
        swaps += 1;
        std::fs::rename(made, made.with_extension("moved")).expect("mv");
        std::os::unix::fs::symlink(outside.path(), made).expect("symlink");
    };
    let why = setup::sub_path_watched(vol.path(), "a/b", &mut swap)
        .expect_err("swapped")
        .to_string();
    assert_eq!(swaps, 1, "refused at the first directory");
    assert!(why.contains("without following symlinks"), "{why}");
    assert_eq!(
        mode(outside.path()),
        0o700,
        "the symlink's target keeps its mode"
    );
    assert_eq!(std::fs::read_dir(outside.path()).expect("ls").count(), 0);
    // The same walk without a swap makes each directory with the volume's whole mode.
    let made = setup::sub_path(vol.path(), "c/d").expect("made");
    assert_eq!(mode(&made), 0o2777);
    assert_eq!(mode(&vol.path().join("c")), 0o2777);
}

#[test]
fn host_path_types_are_checked_as_the_kubelet_checks_them() {
    use HostPathType as T;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::write(d.join("file"), "x").expect("write");
    let _sock = std::os::unix::net::UnixListener::bind(d.join("sock")).expect("bind");
    let check = |p: &Path, t| setup::check_host_path(p, t).map_err(|e| e.to_string());
    check(&d.join("anything-missing"), T::Unset).expect("unset checks nothing");
    check(d, T::Directory).expect("a directory");
    check(&d.join("file"), T::File).expect("a file");
    check(&d.join("sock"), T::Socket).expect("a socket");
    check(Path::new("/dev/null"), T::CharDevice).expect("a char device");
    let shown = d.join("file").display().to_string();
    assert_eq!(
        check(&d.join("file"), T::Directory).expect_err("mismatch"),
        format!("hostPath type check failed: {shown} is not a directory, it's a File")
    );
    assert_eq!(
        check(&d.join("file"), T::DirectoryOrCreate).expect_err("mismatch"),
        format!("hostPath type check failed: {shown} is not a directory, it's a File")
    );
    let why = check(d, T::FileOrCreate).expect_err("mismatch");
    assert!(why.ends_with("is not a file, it's a Directory"), "{why}");
    let why = check(Path::new("/dev/null"), T::BlockDevice).expect_err("mismatch");
    assert!(
        why.ends_with("is not a block device, it's a CharDevice"),
        "{why}"
    );
    let why = check(&d.join("file"), T::Socket).expect_err("mismatch");
    assert!(why.ends_with("is not a socket file, it's a File"), "{why}");
    let why = check(&d.join("nothing"), T::File).expect_err("missing");
    assert_eq!(
        why,
        format!("hostPath {} doesn't exist", d.join("nothing").display())
    );
    // The ...OrCreate types make what is missing, with the kubelet's modes.
    let made = d.join("made/deep");
    check(&made, T::DirectoryOrCreate).expect("created");
    let mode = |p: &Path| std::fs::metadata(p).expect("made").permissions().mode() & 0o777;
    assert!(made.is_dir());
    assert_eq!(mode(&made) & !0o022, 0o755 & !0o022);
    check(&d.join("new-file"), T::FileOrCreate).expect("created");
    assert!(d.join("new-file").is_file());
    assert_eq!(mode(&d.join("new-file")) & !0o022, 0o644 & !0o022);
    // An existing file keeps its content.
    check(&d.join("file"), T::FileOrCreate).expect("exists");
    assert_eq!(std::fs::read_to_string(d.join("file")).expect("read"), "x");
    assert!(check(&d.join("no/parent"), T::FileOrCreate).is_err());
    // A mismatch is a SetUp error naming the volume, waiting with ContainerCreating.
    let pods = tempfile::tempdir().expect("tempdir");
    let vols = [Volume {
        name: "logs".into(),
        source: Source::HostPath {
            path: d.join("file"),
            kind: T::Directory,
        },
    }];
    let e = set_up(
        pods.path(),
        "u",
        &vols,
        Context::default(),
        &Default::default(),
    )
    .expect_err("mismatch");
    assert_eq!(e.reason(), "ContainerCreating");
    assert!(
        e.to_string().starts_with(
            "MountVolume.SetUp failed for volume \"logs\" : hostPath type check failed"
        ),
        "{e}"
    );
}

#[test]
fn mountinfo_lines_are_parsed_with_their_escapes() {
    let text = "36 35 98:0 /mnt1 /mnt/a\\040b rw,noatime master:1 - ext3 /dev/root rw\n\
                37 35 0:40 / /var/lib/x/pods/u/volumes/kubernetes.io~empty-dir/m rw - tmpfs tmpfs rw,size=1024k\n\
                garbage\n";
    let m = mountinfo::parse(text);
    assert_eq!(m.len(), 2);
    assert_eq!(m[0].path, Path::new("/mnt/a b"));
    assert_eq!(m[0].fs_type, "ext3");
    assert_eq!(m[1].fs_type, "tmpfs");
    let below = mountinfo::below(&m, Path::new("/var/lib/x/pods/u"));
    assert_eq!(below.len(), 1);
    assert!(mountinfo::below(&m, Path::new("/var/lib/x/pods/u2")).is_empty());
}

#[test]
fn tear_down_removes_disk_volumes_and_never_follows_symlinks() {
    let pods = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("tempdir");
    std::fs::write(outside.path().join("keep"), "user data").expect("write");
    let host = tempfile::tempdir().expect("tempdir");
    std::fs::write(host.path().join("host-data"), "host data").expect("write");
    let vols = two_volumes(host.path());
    // Only root may give a file to another group.
    let root = rustix::process::geteuid().is_root();
    let ctx = Context {
        fs_group: root.then_some(4321),
        ..Context::default()
    };
    set_up(pods.path(), "u1", &vols, ctx, &Default::default()).expect("set up");
    let scratch = vols[0].host_path(pods.path(), "u1");
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&scratch).expect("stat");
    if root {
        assert_eq!((meta.gid(), meta.mode() & 0o7777), (4321, 0o2777));
        // The hostPath is not given to the fsGroup.
        assert_ne!(std::fs::metadata(host.path()).expect("stat").gid(), 4321);
    } else {
        assert_eq!(meta.mode() & 0o7777, 0o777);
    }
    std::fs::create_dir_all(scratch.join("a/b")).expect("mkdir");
    std::fs::write(scratch.join("a/b/f"), "x").expect("write");
    std::os::unix::fs::symlink(outside.path(), scratch.join("a/link")).expect("symlink");
    std::os::unix::fs::symlink(host.path(), scratch.join("host")).expect("symlink");
    std::fs::create_dir_all(pods.path().join("u1/containers/c")).expect("mkdir");
    remove_pod_dir(pods.path(), "u1").expect("removed");
    assert!(!pods.path().join("u1").exists());
    assert_eq!(
        std::fs::read_to_string(outside.path().join("keep")).expect("kept"),
        "user data"
    );
    assert_eq!(
        std::fs::read_to_string(host.path().join("host-data")).expect("kept"),
        "host data"
    );
    // Nothing there is success.
    remove_pod_dir(pods.path(), "u1").expect("nothing to do");
    tear_down(pods.path(), "u2").expect("nothing to do");
}

#[test]
fn a_memory_volume_is_a_tmpfs_of_its_size_unmounted_before_removal() {
    let Some(pods) = pods_dir_for_mounts() else {
        return;
    };
    let vols = [Volume {
        name: "mem".into(),
        source: Source::EmptyDir {
            memory: true,
            size_limit: Some(8 << 20),
        },
    }];
    let ctx = Context {
        node_memory: 1 << 30,
        pod_memory_limit: Some(16 << 20),
        fs_group: Some(1234),
        ..Context::default()
    };
    set_up(pods.path(), "u1", &vols, ctx, &Default::default()).expect("set up");
    let dir = vols[0]
        .host_path(pods.path(), "u1")
        .canonicalize()
        .expect("canonical");
    let tmpfs = |dir: &Path| {
        mount_points()
            .expect("mountinfo")
            .into_iter()
            .filter(|m| m.path == dir && m.fs_type == "tmpfs")
            .count()
    };
    assert_eq!(tmpfs(&dir), 1);
    let st = rustix::fs::statvfs(&dir).expect("statvfs");
    assert_eq!(st.f_blocks * st.f_frsize, 8 << 20, "sizeLimit is the size");
    // The tmpfs root (not the directory below it) belongs to the fsGroup, setgid, group rwx.
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&dir).expect("stat");
    assert_eq!(meta.gid(), 1234);
    assert_eq!(meta.mode() & 0o2070, 0o2070, "{:o}", meta.mode());
    std::fs::write(dir.join("f"), "in memory").expect("write");
    // Set up again (a restarted agent): not mounted twice, the data stays.
    set_up(pods.path(), "u1", &vols, ctx, &Default::default()).expect("set up again");
    assert_eq!(tmpfs(&dir), 1);
    assert_eq!(
        std::fs::read_to_string(dir.join("f")).expect("kept"),
        "in memory"
    );
    remove_pod_dir(pods.path(), "u1").expect("torn down");
    assert_eq!(tmpfs(&dir), 0);
    assert!(!pods.path().join("u1").exists());
}

#[test]
fn a_mount_point_that_is_not_ours_stops_the_removal() {
    let Some(pods) = pods_dir_for_mounts() else {
        return;
    };
    let vols = two_volumes(Path::new("/nonexistent"));
    set_up(
        pods.path(),
        "u1",
        &vols[..1],
        Context::default(),
        &Default::default(),
    )
    .expect("set up");
    // What a Bidirectional container could leave: a mount inside an emptyDir.
    let inner = vols[0].host_path(pods.path(), "u1").join("inner");
    std::fs::create_dir(&inner).expect("mkdir");
    setup::mount_tmpfs(&inner, 0).expect("mount");
    std::fs::write(inner.join("precious"), "x").expect("write");
    let e = remove_pod_dir(pods.path(), "u1").expect_err("refused");
    assert!(e.to_string().contains("did not make"), "{e}");
    assert!(inner.join("precious").exists(), "nothing removed");
    remove::unmount(&inner).expect("unmount");
    remove_pod_dir(pods.path(), "u1").expect("removed once unmounted");
}

#[test]
fn a_secret_volume_is_a_tmpfs_written_atomically_refreshed_and_torn_down() {
    let Some(pods) = pods_dir_for_mounts() else {
        return;
    };
    let s = spec(json!({"volumes": [
        {"name": "creds", "secret": {"secretName": "s", "defaultMode": 0o400}},
        {"name": "cfg", "configMap": {"name": "m"}},
    ]}));
    let vols = plan(&s).expect("plan");
    let file = |data: &str, mode: u32| atomic::FileProjection {
        data: data.as_bytes().to_vec(),
        mode,
        owner: None,
    };
    let mut payloads = std::collections::HashMap::new();
    payloads.insert(
        "creds".to_owned(),
        atomic::Payload::from([("password".to_owned(), file("hunter2", 0o400))]),
    );
    payloads.insert(
        "cfg".to_owned(),
        atomic::Payload::from([("a".to_owned(), file("1", 0o644))]),
    );
    let ctx = Context {
        node_memory: 1 << 30,
        fs_group: Some(4321),
        ..Context::default()
    };
    set_up(pods.path(), "u1", &vols, ctx, &payloads).expect("set up");
    let creds = vols[0].host_path(pods.path(), "u1");
    assert!(creds.ends_with("volumes/kubernetes.io~secret/creds"));
    let canonical = creds.canonicalize().expect("canonical");
    let tmpfs = |p: &Path| {
        mount_points()
            .expect("mounts")
            .iter()
            .any(|m| m.path == p && m.fs_type == "tmpfs")
    };
    assert!(tmpfs(&canonical), "a secret is never on disk");
    let cfg = vols[1].host_path(pods.path(), "u1");
    assert!(
        !tmpfs(&cfg.canonicalize().expect("canonical")),
        "a configMap is on disk"
    );
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(creds.join("password")).expect("stat");
    // fsGroup: the group gets read, as the kubelet's ownership gives it.
    assert_eq!((meta.gid(), meta.mode() & 0o777), (4321, 0o440));
    assert_eq!(
        std::fs::read_to_string(creds.join("password")).expect("read"),
        "hunter2"
    );
    // A rewrite with the same files changes nothing; a new value is swapped in.
    let changed = refresh(pods.path(), "u1", &vols, Some(4321), &payloads).expect("refresh");
    assert!(changed.is_empty(), "{changed:?}");
    payloads.insert(
        "cfg".to_owned(),
        atomic::Payload::from([("a".to_owned(), file("2", 0o644))]),
    );
    let changed = refresh(pods.path(), "u1", &vols, Some(4321), &payloads).expect("refresh");
    assert_eq!(changed, ["cfg"]);
    assert_eq!(std::fs::read_to_string(cfg.join("a")).expect("read"), "2");
    // A volume not set up is never made by a refresh.
    assert!(
        refresh(pods.path(), "u2", &vols, None, &payloads)
            .expect("refresh")
            .is_empty()
    );
    assert!(!pods.path().join("u2").exists());
    // An object that cannot be read any more: a volume written before keeps its files (the
    // containers can still start), one never written is an error.
    let none = std::collections::HashMap::new();
    set_up(pods.path(), "u1", &vols, ctx, &none).expect("kept");
    assert_eq!(std::fs::read_to_string(cfg.join("a")).expect("read"), "2");
    assert!(is_written(pods.path(), "u1", &vols, "cfg"));
    assert!(!is_written(pods.path(), "u3", &vols, "cfg"));
    let e = set_up(pods.path(), "u3", &vols, ctx, &none).expect_err("never written");
    assert!(e.to_string().contains("not computed"), "{e}");
    remove_pod_dir(pods.path(), "u3").expect("removed");
    remove_pod_dir(pods.path(), "u1").expect("removed");
    assert!(!tmpfs(&canonical), "the tmpfs is unmounted");
    assert!(!pods.path().join("u1").exists());
}

#[test]
fn the_kernel_tells_mount_roots_and_tmpfs_without_the_mount_table() {
    let Some(pods) = pods_dir_for_mounts() else {
        return;
    };
    let dir = pods.path().canonicalize().expect("canonical").join("m");
    std::fs::create_dir(&dir).expect("mkdir");
    let root = |p: &Path| mountinfo::is_mount_root(p).expect("statx");
    if root(Path::new("/")).is_none() {
        eprintln!("skipped: this kernel's statx does not report mount roots");
        return;
    }
    assert_eq!(root(Path::new("/")), Some(true));
    assert_eq!(root(&dir), Some(false));
    setup::mount_tmpfs(&dir, 1 << 20).expect("mount");
    std::fs::create_dir(dir.join("below")).expect("mkdir below");
    assert_eq!(root(&dir), Some(true));
    assert!(mountinfo::is_tmpfs(&dir).expect("statfs"));
    assert_eq!(root(&dir.join("below")), Some(false));
    assert!(mountinfo::is_tmpfs(&dir.join("below")).expect("statfs"));
    // The mount table says the same.
    let table = mount_points().expect("mountinfo");
    let last = table
        .iter()
        .rev()
        .find(|m| m.path == dir)
        .expect("in the table");
    assert_eq!(last.fs_type, "tmpfs");
    remove::unmount(&dir).expect("unmount");
    assert_eq!(root(&dir), Some(false));
    assert!(
        mountinfo::is_mount_root(&dir.join("gone")).is_err(),
        "a missing path is an error"
    );
}
