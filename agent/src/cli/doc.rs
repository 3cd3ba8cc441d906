//! docs/configuration.md, generated from the flags' own help and the table of `--config` file
//! fields below, so the document cannot drift from what swiftlet reads.
use super::Flags;
use clap::CommandFactory;

/// One field of the `--config` file that swiftlet reads.
pub struct ConfigField {
    /// Path of the field in the KubeletConfiguration (nested fields joined by `.`).
    pub field: &'static str,
    /// The flag that overrides it, when there is one; its default is the flag's.
    pub flag: Option<&'static str>,
    /// The default of a field that no flag overrides.
    pub default: &'static str,
}

const fn flag(field: &'static str, flag: &'static str) -> ConfigField {
    ConfigField {
        field,
        flag: Some(flag),
        default: "",
    }
}

const fn file_only(field: &'static str, default: &'static str) -> ConfigField {
    ConfigField {
        field,
        flag: None,
        default,
    }
}

/// Every KubeletConfiguration field swiftlet reads, in the order of [`super::KubeletConfiguration`].
pub const CONFIG_FIELDS: &[ConfigField] = &[
    file_only(
        "apiVersion",
        "required: kubelet.config.k8s.io/v1beta1 or kubelet.config.k8s.io/v1",
    ),
    file_only("kind", "required: KubeletConfiguration"),
    flag("staticPodPath", "pod-manifest-path"),
    flag("containerRuntimeEndpoint", "container-runtime-endpoint"),
    flag("runtimeRequestTimeout", "runtime-request-timeout"),
    flag("cgroupRoot", "cgroup-root"),
    flag("cgroupsPerQOS", "cgroups-per-qos"),
    flag("cgroupDriver", "cgroup-driver"),
    flag("podPidsLimit", "pod-max-pids"),
    flag("healthzBindAddress", "healthz-bind-address"),
    flag("healthzPort", "healthz-port"),
    flag("readOnlyPort", "read-only-port"),
    flag("fileCheckFrequency", "file-check-frequency"),
    flag("syncFrequency", "sync-frequency"),
    flag("podLogsDir", "pod-logs-dir"),
    flag("staticPodURL", "manifest-url"),
    flag("staticPodURLHeader", "manifest-url-header"),
    flag("httpCheckFrequency", "http-check-frequency"),
    flag("allowedUnsafeSysctls", "allowed-unsafe-sysctls"),
    flag("seccompDefault", "seccomp-default"),
    flag("maxPods", "max-pods"),
    flag("clusterDNS", "cluster-dns"),
    flag("clusterDomain", "cluster-domain"),
    flag("resolvConf", "resolv-conf"),
    flag("containerLogMaxSize", "container-log-max-size"),
    flag("containerLogMaxFiles", "container-log-max-files"),
    flag(
        "containerLogMonitorInterval",
        "container-log-monitor-interval",
    ),
    flag("containerLogMaxWorkers", "container-log-max-workers"),
    flag("imageGCHighThresholdPercent", "image-gc-high-threshold"),
    flag("imageGCLowThresholdPercent", "image-gc-low-threshold"),
    flag("imageMinimumGCAge", "image-minimum-gc-age"),
    flag("serializeImagePulls", "serialize-image-pulls"),
    flag("maxParallelImagePulls", "max-parallel-image-pulls"),
    flag("imageMaximumGCAge", "image-maximum-gc-age"),
    flag("port", "port"),
    flag("address", "address"),
    flag("tlsCertFile", "tls-cert-file"),
    flag("tlsPrivateKeyFile", "tls-private-key-file"),
    flag("authentication.x509.clientCAFile", "client-ca-file"),
    flag("authentication.anonymous.enabled", "anonymous-auth"),
    flag(
        "authentication.webhook.enabled",
        "authentication-token-webhook",
    ),
    flag(
        "authentication.webhook.cacheTTL",
        "authentication-token-webhook-cache-ttl",
    ),
    flag("authorization.mode", "authorization-mode"),
    flag(
        "authorization.webhook.cacheAuthorizedTTL",
        "authorization-webhook-cache-authorized-ttl",
    ),
    flag(
        "authorization.webhook.cacheUnauthorizedTTL",
        "authorization-webhook-cache-unauthorized-ttl",
    ),
    flag("registerNode", "register-node"),
    flag("nodeLabels", "node-labels"),
    flag("registerWithTaints", "register-with-taints"),
    flag("nodeStatusUpdateFrequency", "node-status-update-frequency"),
    file_only("nodeStatusReportFrequency", "5m"),
    flag("nodeStatusMaxImages", "node-status-max-images"),
    file_only("nodeLeaseDurationSeconds", "40"),
    flag("systemReserved", "system-reserved"),
    flag("kubeReserved", "kube-reserved"),
    flag("evictionHard", "eviction-hard"),
    flag("evictionSoft", "eviction-soft"),
    flag("evictionSoftGracePeriod", "eviction-soft-grace-period"),
    flag("evictionMaxPodGracePeriod", "eviction-max-pod-grace-period"),
    flag("evictionMinimumReclaim", "eviction-minimum-reclaim"),
    flag(
        "evictionPressureTransitionPeriod",
        "eviction-pressure-transition-period",
    ),
    flag("enforceNodeAllocatable", "enforce-node-allocatable"),
];

/// The `[default: ...]` that a flag's help states, if any.
fn stated_default(help: &str) -> Option<&str> {
    let start = help.rfind("[default: ")? + "[default: ".len();
    let end = help[start..].find(']')? + start;
    Some(&help[start..end])
}

/// The default of a flag as its help states it, or "none".
fn flag_default(command: &clap::Command, name: &str) -> Option<String> {
    let arg = command
        .get_arguments()
        .find(|a| a.get_long() == Some(name))?;
    let help = arg
        .get_long_help()
        .or_else(|| arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    Some(
        stated_default(&help)
            .map(str::to_string)
            .unwrap_or_else(|| "none".to_string()),
    )
}

/// The text of docs/configuration.md.
pub fn configuration_md() -> String {
    let mut command = Flags::command().term_width(100);
    let help = command.render_long_help().to_string();
    let mut out = String::from(
        "# Configuration\n\n\
         Generated from the flags' help and the agent's table of configuration-file fields by \
         `UPDATE_DOCS=1 cargo test -p swiftlet --lib cli::doc`; do not edit it by hand.\n\n\
         swiftlet takes flags and a KubeletConfiguration YAML file (`--config`). A flag given on \
         the command line wins over the file; a field absent from both takes its default. \
         Durations are Go-style (`20s`, `1m30s`, `500ms`).\n\n\
         ## Configuration-file fields\n\n\
         | field | flag | default |\n|---|---|---|\n",
    );
    for f in CONFIG_FIELDS {
        let (flag, default) = match f.flag {
            Some(name) => (
                format!("`--{name}`"),
                flag_default(&command, name).unwrap_or_else(|| "none".to_string()),
            ),
            None => ("(file only)".to_string(), f.default.to_string()),
        };
        out.push_str(&format!("| `{}` | {flag} | {default} |\n", f.field));
    }
    out.push_str("\nFields swiftlet does not read are logged by name at start and ignored.\n\n");
    out.push_str("## Flags (`swiftlet --help`)\n\n```text\n");
    for line in help.lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.push_str("```\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::KubeletConfiguration;
    use std::path::PathBuf;

    fn doc_path() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md")
    }

    #[test]
    fn configuration_doc_is_current() {
        let want = configuration_md();
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(doc_path(), &want).unwrap();
        }
        let have = std::fs::read_to_string(doc_path()).unwrap_or_default();
        assert!(
            have == want,
            "docs/configuration.md is out of date: run UPDATE_DOCS=1 cargo test -p swiftlet --lib cli::doc"
        );
    }

    #[test]
    fn every_listed_field_is_read_and_every_listed_flag_exists() {
        let command = Flags::command();
        for f in CONFIG_FIELDS {
            let top = f.field.split('.').next().unwrap();
            let file: KubeletConfiguration =
                serde_saphyr::from_str(&format!("{top}: null\n")).unwrap();
            assert!(
                file.unknown.is_empty(),
                "{} is not a field swiftlet reads",
                f.field
            );
            if let Some(name) = f.flag {
                assert!(
                    command.get_arguments().any(|a| a.get_long() == Some(name)),
                    "--{name} (for {}) is not a flag",
                    f.field
                );
            }
        }
        let unread: KubeletConfiguration =
            serde_saphyr::from_str("cpuManagerPolicy: static\n").unwrap();
        assert!(unread.unknown.contains_key("cpuManagerPolicy"));
    }

    #[test]
    fn flag_defaults_come_from_their_help() {
        let command = Flags::command();
        for (flag, default) in [("sync-frequency", "1m"), ("cluster-dns", "none")] {
            assert_eq!(
                flag_default(&command, flag).as_deref(),
                Some(default),
                "{flag}"
            );
        }
        assert_eq!(flag_default(&command, "no-such-flag"), None);
    }
}
