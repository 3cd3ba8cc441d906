//! docs/configuration.md, generated from the flags' own help: each `--config` file field is
//! the clap id of the flag that sets it ([`super::KubeletConfiguration`]), so the document cannot
//! drift from what swiftlet reads.
use super::KubeletConfiguration;
use clap::Args;

/// The fields of the `--config` file that no flag sets, with their defaults.
pub const FILE_ONLY_FIELDS: &[(&str, &str)] = &[
    (
        "apiVersion",
        "required: kubelet.config.k8s.io/v1beta1 or kubelet.config.k8s.io/v1",
    ),
    ("kind", "required: KubeletConfiguration"),
    ("nodeStatusReportFrequency", "5m"),
    ("nodeLeaseDurationSeconds", "40"),
];

/// Every field the `--config` file may set with a flag: (field path, flag name), in the
/// struct's order.
pub fn config_fields() -> Vec<(String, String)> {
    KubeletConfiguration::augment_args(clap::Command::new("fields"))
        .get_arguments()
        .filter_map(|a| Some((a.get_id().to_string(), a.get_long()?.to_string())))
        .collect()
}

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
    let mut command = super::command().term_width(100);
    let help = command.render_long_help().to_string();
    let mut out = String::from(
        "# Configuration\n\n\
         Generated from the agent's configuration struct (each field with the flag that sets it) by \
         `UPDATE_DOCS=1 cargo test -p swiftlet --lib cli::doc`; do not edit it by hand.\n\n\
         swiftlet takes flags and a KubeletConfiguration YAML file (`--config`). A flag given on \
         the command line wins over the file (it replaces the field, a map or list field whole); a \
         field absent from both takes its default. \
         Durations are Go-style (`20s`, `1m30s`, `500ms`).\n\n\
         ## Configuration-file fields\n\n\
         | field | flag | default |\n|---|---|---|\n",
    );
    for (field, default) in FILE_ONLY_FIELDS {
        out.push_str(&format!("| `{field}` | (file only) | {default} |\n"));
    }
    for (field, flag) in config_fields() {
        let default = flag_default(&command, &flag).unwrap_or_else(|| "none".to_string());
        out.push_str(&format!("| `{field}` | `--{flag}` | {default} |\n"));
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
    fn every_listed_field_is_read() {
        let fields = config_fields();
        assert!(fields.len() > 50, "{fields:?}");
        let listed = FILE_ONLY_FIELDS.iter().map(|(f, _)| f.to_string());
        for field in fields.iter().map(|(f, _)| f.clone()).chain(listed) {
            let top = field.split('.').next().unwrap();
            let file: KubeletConfiguration =
                serde_saphyr::from_str(&format!("{top}: null\n")).unwrap();
            assert!(
                file.unknown.is_empty(),
                "{field} is not a field swiftlet reads"
            );
        }
        let unread: KubeletConfiguration =
            serde_saphyr::from_str("cpuManagerPolicy: static\n").unwrap();
        assert!(unread.unknown.contains_key("cpuManagerPolicy"));
    }

    #[test]
    fn flag_defaults_come_from_their_help() {
        let command = super::super::command();
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
