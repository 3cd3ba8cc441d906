use super::*;
use k8s_openapi::ByteString;
use serde_json::json;

fn auth(u: &str, p: &str) -> Auth {
    Auth {
        username: u.to_owned(),
        password: p.to_owned(),
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn keyring(locations: &[(&str, &str)]) -> Keyring {
    let mut k = Keyring::default();
    k.add(
        locations
            .iter()
            .map(|(loc, user)| ((*loc).to_owned(), auth(user, "pw"))),
    );
    k
}

fn users(found: &[Auth]) -> Vec<&str> {
    found.iter().map(|a| a.username.as_str()).collect()
}

#[test]
fn images_are_looked_up_by_their_normalized_repository() {
    for (image, repo) in [
        ("busybox", "docker.io/library/busybox"),
        ("busybox:1.36", "docker.io/library/busybox"),
        ("library/busybox@sha256:abc", "docker.io/library/busybox"),
        ("user/app:v1", "docker.io/user/app"),
        ("index.docker.io/user/app", "docker.io/user/app"),
        (
            "127.0.0.1:5000/private/busybox:v1",
            "127.0.0.1:5000/private/busybox",
        ),
        ("localhost/app", "localhost/app"),
        ("quay.io/coreos/etcd:v3@sha256:0", "quay.io/coreos/etcd"),
    ] {
        assert_eq!(repository(image), repo, "{image}");
    }
}

#[test]
fn keyring_matches_host_port_path_prefix_and_globs_most_specific_first() {
    let k = keyring(&[
        ("quay.io", "host"),
        ("https://quay.io/coreos", "path"),
        ("http://quay.io/v1/", "v1-is-the-host"),
        ("*.gcr.io", "glob"),
        ("registry.local:5000", "port"),
        ("reg-[0-9].example.com", "class"),
    ]);
    // The path entry first (reverse order), then both host entries.
    assert_eq!(
        users(&k.lookup("quay.io/coreos/etcd")),
        ["path", "host", "v1-is-the-host"]
    );
    assert_eq!(
        users(&k.lookup("quay.io/other/x")),
        ["host", "v1-is-the-host"]
    );
    // The path is a string prefix, as the kubelet compares it.
    assert_eq!(users(&k.lookup("quay.io/coreosx/y"))[0], "path");
    assert_eq!(users(&k.lookup("eu.gcr.io/p/img")), ["glob"]);
    // A glob stands for one host part: the number of parts must agree.
    assert!(k.lookup("gcr.io/p/img").is_empty());
    assert!(k.lookup("a.b.gcr.io/p/img").is_empty());
    // The port must be the same.
    assert_eq!(users(&k.lookup("registry.local:5000/x")), ["port"]);
    assert!(k.lookup("registry.local/x").is_empty());
    assert!(k.lookup("registry.local:5001/x").is_empty());
    assert_eq!(users(&k.lookup("reg-7.example.com/x")), ["class"]);
    assert!(k.lookup("reg-x.example.com/x").is_empty());
    assert!(k.lookup("docker.io/library/busybox").is_empty());
}

#[test]
fn several_credentials_for_one_location_are_all_tried_in_order() {
    let mut k = Keyring::default();
    k.add([("reg.io".to_owned(), auth("first", "a"))]);
    k.add([("https://reg.io/".to_owned(), auth("second", "b"))]);
    assert_eq!(users(&k.lookup("reg.io/app")), ["first", "second"]);
}

#[test]
fn docker_hub_images_fall_back_to_the_index_credentials() {
    let k = keyring(&[("https://index.docker.io/v1/", "hub")]);
    for repo in [
        "docker.io/library/busybox",
        "docker.io/user/app",
        "index.docker.io/user/app",
    ] {
        assert_eq!(users(&k.lookup(repo)), ["hub"], "{repo}");
    }
    assert!(k.lookup("quay.io/user/app").is_empty());
    assert!(k.lookup("127.0.0.1:5000/app").is_empty());
}

#[test]
fn glob_matching_follows_shell_patterns() {
    let m = |p: &str, t: &str| glob_match(p.as_bytes(), t.as_bytes());
    assert_eq!(m("*", "anything"), Some(true));
    assert_eq!(m("a*c", "abbbc"), Some(true));
    assert_eq!(m("a?c", "abc"), Some(true));
    assert_eq!(m("a?c", "ac"), Some(false));
    assert_eq!(m("[^a-c]x", "dx"), Some(true));
    assert_eq!(m("[^a-c]x", "bx"), Some(false));
    assert_eq!(m("\\*", "*"), Some(true));
    assert_eq!(m("\\*", "a"), Some(false));
    // Malformed patterns match nothing.
    assert_eq!(m("[a-", "a"), None);
    assert_eq!(m("[z-a]", "b"), None);
}

#[test]
fn config_json_entries_take_auth_or_username_and_password() {
    let data = json!({"auths": {
        "reg.io": {"auth": b64("alice:s3cr:et")},
        "other.io": {"username": "bob", "password": "pw"},
        "nopad.io": {"auth": b64("carol:x").trim_end_matches('=')},
        "both.io": {"username": "ignored", "password": "ignored", "auth": b64("dave:y")},
    }, "HttpHeaders": {"X": "y"}})
    .to_string();
    let entries: HashMap<String, Auth> = parse_config_json("f", data.as_bytes())
        .expect("valid")
        .into_iter()
        .collect();
    // The password may contain colons: the first one separates.
    assert_eq!(entries["reg.io"], auth("alice", "s3cr:et"));
    assert_eq!(entries["other.io"], auth("bob", "pw"));
    assert_eq!(entries["nopad.io"], auth("carol", "x"));
    assert_eq!(entries["both.io"], auth("dave", "y"));
    // No auths: valid and empty.
    assert!(parse_config_json("f", b"{}").expect("valid").is_empty());
}

#[test]
fn bad_configs_are_errors_that_never_quote_their_content() {
    let e =
        parse_config_json("f", br#"{"auths": {"reg.io": {"auth": "!!notbase64"}}}"#).unwrap_err();
    assert!(e.to_string().contains("\"reg.io\""), "{e}");
    assert!(!e.to_string().contains("notbase64"), "{e}");
    let no_colon = format!(
        r#"{{"auths": {{"reg.io": {{"auth": "{}"}}}}}}"#,
        b64("nocolon")
    );
    assert!(parse_config_json("f", no_colon.as_bytes()).is_err());
    let e = parse_config_json("f", br#"{"auths": {"reg.io": {"password": 12345}}}"#).unwrap_err();
    assert!(e.to_string().contains("wrong type"), "{e}");
    assert!(!e.to_string().contains("12345"), "{e}");
    let e = parse_dockercfg("f", br#"{"reg.io": "hunter2"}"#).unwrap_err();
    assert!(!e.to_string().contains("hunter2"), "{e}");
    assert!(
        format!("{:?}", auth("alice", "hunter2"))
            .find("hunter2")
            .is_none()
    );
    assert!(
        format!("{:?}", auth("alice", "hunter2"))
            .find("alice")
            .is_none()
    );
}

fn secret(name: &str, type_: &str, key: &str, data: &str) -> Secret {
    Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("ns".to_owned()),
            ..Default::default()
        },
        type_: Some(type_.to_owned()),
        data: Some(BTreeMap::from([(
            key.to_owned(),
            ByteString(data.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

#[test]
fn both_secret_formats_fill_the_keyring_and_other_types_are_ignored() {
    let json = json!({"auths": {"reg.io": {"auth": b64("json:a")}}}).to_string();
    let cfg = json!({"https://reg.io/team": {"username": "cfg", "password": "b"}}).to_string();
    let secrets = [
        secret("j", DOCKER_CONFIG_JSON_TYPE, DOCKER_CONFIG_JSON_KEY, &json),
        secret("c", DOCKERCFG_TYPE, DOCKERCFG_KEY, &cfg),
        // The right key under the wrong type, and an opaque secret: ignored.
        secret("o", "Opaque", DOCKER_CONFIG_JSON_KEY, &json),
        secret("w", DOCKERCFG_TYPE, DOCKER_CONFIG_JSON_KEY, &json),
        secret("e", DOCKER_CONFIG_JSON_TYPE, DOCKER_CONFIG_JSON_KEY, ""),
    ];
    let k = Keyring::from_secrets(&secrets).expect("valid");
    assert_eq!(users(&k.lookup("reg.io/team/app")), ["cfg", "json"]);
    assert_eq!(users(&k.lookup("reg.io/other")), ["json"]);
    // The older format in the config.json type is a type error naming the secret.
    let bad = secret(
        "bad",
        DOCKER_CONFIG_JSON_TYPE,
        DOCKER_CONFIG_JSON_KEY,
        "[1]",
    );
    let e = Keyring::from_secrets(&[bad]).unwrap_err();
    assert!(
        e.to_string().contains("secret ns/bad (.dockerconfigjson)"),
        "{e}"
    );
}

#[test]
fn node_files_are_searched_in_order_config_json_before_dockercfg() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("tmp")).collect();
    let files = NodeFiles {
        config_json_dirs: vec![dirs[0].path().into(), dirs[1].path().into()],
        dockercfg_dirs: vec![dirs[0].path().into(), dirs[2].path().into()],
    };
    let write = |dir: usize, name: &str, body: serde_json::Value| {
        std::fs::write(dirs[dir].path().join(name), body.to_string()).expect("write")
    };
    assert!(files.read().is_empty());
    write(2, DOCKERCFG, json!({"reg.io": {"auth": b64("cfg:x")}}));
    assert_eq!(users(&files.read().lookup("reg.io/a")), ["cfg"]);
    write(
        1,
        CONFIG_JSON,
        json!({"auths": {"reg.io": {"auth": b64("second:x")}}}),
    );
    assert_eq!(users(&files.read().lookup("reg.io/a")), ["second"]);
    // An invalid file earlier in the order is skipped.
    std::fs::write(dirs[0].path().join(CONFIG_JSON), "{not json").expect("write");
    assert_eq!(users(&files.read().lookup("reg.io/a")), ["second"]);
    write(
        0,
        CONFIG_JSON,
        json!({"auths": {"reg.io": {"auth": b64("first:x")}}}),
    );
    assert_eq!(users(&files.read().lookup("reg.io/a")), ["first"]);
    // A valid config.json without auths still ends the search.
    write(0, CONFIG_JSON, json!({}));
    assert!(files.read().is_empty());
}

#[test]
fn the_kubelet_search_starts_at_the_root_dir() {
    let f = NodeFiles::kubelet_search(Path::new("/var/lib/swiftlet"));
    assert_eq!(f.config_json_dirs[0], Path::new("/var/lib/swiftlet"));
    assert_eq!(f.config_json_dirs[1], Path::new(""));
    assert_eq!(
        f.config_json_dirs.last().map(PathBuf::as_path),
        Some(Path::new("/.docker"))
    );
    assert_eq!(f.dockercfg_dirs[0], Path::new("/var/lib/swiftlet"));
    assert_eq!(
        f.dockercfg_dirs.last().map(PathBuf::as_path),
        Some(Path::new("/"))
    );
}
