//! Finding (and if needed mounting) tracefs, and reading the cgroup tracepoints' record layout from
//! their `format` files.

use std::{
    ffi::CString,
    path::{Path, PathBuf},
};

/// Where tracefs lives on current kernels, and where older set-ups expose it under debugfs.
const TRACEFS_MOUNT: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "tracefs is not mounted at {TRACEFS_MOUNT} or {DEBUGFS_TRACING}, and mounting it needs root"
    )]
    NotMountedNotRoot,
    #[error("mounting tracefs at {path}: {source}")]
    Mount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tracepoint {category}:{name} not found in tracefs ({path} missing)")]
    NoTracepoint {
        category: &'static str,
        name: &'static str,
        path: PathBuf,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: field {field:?} {problem}")]
    Field {
        path: PathBuf,
        field: &'static str,
        problem: &'static str,
    },
}

/// Byte offsets of the fields of a `cgroup:cgroup_mkdir`/`cgroup_rmdir` record the probes read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupLayout {
    pub root: u32,
    pub level: u32,
    pub id: u32,
    pub path: u32,
}

/// Returns the tracefs directory holding `events/cgroup/...`, mounting tracefs at
/// `/sys/kernel/tracing` when neither place has it and we are root.
pub fn ensure_mounted() -> Result<PathBuf, Error> {
    if let Some(found) = find() {
        return Ok(found);
    }
    if !rustix::process::geteuid().is_root() {
        return Err(Error::NotMountedNotRoot);
    }
    let target = PathBuf::from(TRACEFS_MOUNT);
    let mount_err = mount_tracefs(&target).err();
    // Another thread or process may have mounted it concurrently: look again either way.
    match (find(), mount_err) {
        (Some(found), _) => {
            tracing::info!(path = %found.display(), "mounted tracefs");
            Ok(found)
        }
        (None, Some(source)) => Err(Error::Mount {
            path: target,
            source,
        }),
        (None, None) => Err(Error::NoTracepoint {
            category: "cgroup",
            name: "cgroup_mkdir",
            path: target.join("events/cgroup/cgroup_mkdir"),
        }),
    }
}

/// A tracefs directory is usable when it has the `events` tree (an unmounted
/// `/sys/kernel/tracing` is an empty directory).
fn find() -> Option<PathBuf> {
    [TRACEFS_MOUNT, DEBUGFS_TRACING]
        .into_iter()
        .map(PathBuf::from)
        .find(|dir| dir.join("events").is_dir())
}

/// mount("tracefs", target, "tracefs", 0, NULL).
fn mount_tracefs(target: &Path) -> Result<(), std::io::Error> {
    let target_c =
        CString::new(target.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?;
    rustix::mount::mount(
        c"tracefs",
        target_c.as_c_str(),
        c"tracefs",
        rustix::mount::MountFlags::empty(),
        None,
    )?;
    Ok(())
}

/// Reads `events/cgroup/<name>/format` under `tracefs`.
pub(crate) fn cgroup_layout(tracefs: &Path, name: &'static str) -> Result<CgroupLayout, Error> {
    let dir = tracefs.join("events/cgroup").join(name);
    let path = dir.join("format");
    if !path.is_file() {
        return Err(Error::NoTracepoint {
            category: "cgroup",
            name,
            path,
        });
    }
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Read {
        path: path.clone(),
        source,
    })?;
    parse_cgroup_format(&text, &path)
}

/// One `field:<decl>; offset:<n>; size:<n>; ...` line of a tracepoint format.
#[derive(Debug, PartialEq, Eq)]
struct Field<'a> {
    decl: &'a str,
    name: &'a str,
    offset: u32,
    size: u32,
}

fn parse_field(line: &str) -> Option<Field<'_>> {
    let mut decl = None;
    let mut offset = None;
    let mut size = None;
    for part in line.split(';').map(str::trim) {
        if let Some(d) = part.strip_prefix("field:") {
            decl = Some(d.trim());
        } else if let Some(o) = part.strip_prefix("offset:") {
            offset = o.trim().parse().ok();
        } else if let Some(s) = part.strip_prefix("size:") {
            size = s.trim().parse().ok();
        }
    }
    let decl = decl?;
    // The name is the last word of the declaration, without any array suffix: `char name[16]`.
    let last = decl.rsplit(char::is_whitespace).next()?;
    let name = last.split('[').next()?;
    Some(Field {
        decl,
        name,
        offset: offset?,
        size: size?,
    })
}

fn parse_cgroup_format(text: &str, path: &Path) -> Result<CgroupLayout, Error> {
    let fields: Vec<Field<'_>> = text.lines().filter_map(parse_field).collect();
    let find = |field: &'static str, size: u32| -> Result<&Field<'_>, Error> {
        let found = fields
            .iter()
            .find(|f| f.name == field)
            .ok_or(Error::Field {
                path: path.to_path_buf(),
                field,
                problem: "is missing",
            })?;
        if found.size != size {
            return Err(Error::Field {
                path: path.to_path_buf(),
                field,
                problem: "has an unsupported size",
            });
        }
        Ok(found)
    };
    let root = find("root", 4)?;
    let level = find("level", 4)?;
    let id = find("id", 8)?;
    let path_field = find("path", 4)?;
    if !path_field.decl.starts_with("__data_loc") {
        return Err(Error::Field {
            path: path.to_path_buf(),
            field: "path",
            problem: "is not a __data_loc string",
        });
    }
    Ok(CgroupLayout {
        root: root.offset,
        level: level.offset,
        id: id.offset,
        path: path_field.offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT_6_18: &str = "name: cgroup_mkdir
ID: 544
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int root;\toffset:8;\tsize:4;\tsigned:1;
\tfield:int level;\toffset:12;\tsize:4;\tsigned:1;
\tfield:u64 id;\toffset:16;\tsize:8;\tsigned:0;
\tfield:__data_loc char[] path;\toffset:24;\tsize:4;\tsigned:0;

print fmt: \"root=%d id=%llu level=%d path=%s\", REC->root, REC->id, REC->level, __get_str(path)
";

    #[test]
    fn parses_the_current_layout() {
        let layout = parse_cgroup_format(FORMAT_6_18, Path::new("f")).expect("valid format");
        assert_eq!(
            layout,
            CgroupLayout {
                root: 8,
                level: 12,
                id: 16,
                path: 24
            }
        );
    }

    #[test]
    fn follows_moved_fields() {
        let moved = FORMAT_6_18
            .replace("offset:12;", "offset:28;")
            .replace("offset:24;", "offset:32;");
        let layout = parse_cgroup_format(&moved, Path::new("f")).expect("valid format");
        assert_eq!((layout.level, layout.path), (28, 32));
    }

    #[test]
    fn rejects_missing_or_odd_fields() {
        let old_id = FORMAT_6_18.replace(
            "field:u64 id;\toffset:16;\tsize:8;",
            "field:int id;\toffset:16;\tsize:4;",
        );
        let err = parse_cgroup_format(&old_id, Path::new("f")).expect_err("id is 4 bytes");
        assert!(matches!(err, Error::Field { field: "id", .. }), "{err}");

        let no_path = FORMAT_6_18.replace("__data_loc char[] path", "__data_loc char[] other");
        let err = parse_cgroup_format(&no_path, Path::new("f")).expect_err("path is missing");
        assert!(matches!(
            err,
            Error::Field {
                field: "path",
                problem: "is missing",
                ..
            }
        ));

        let fixed = FORMAT_6_18.replace("__data_loc char[] path", "char path[4]");
        let err = parse_cgroup_format(&fixed, Path::new("f")).expect_err("not data_loc");
        assert!(matches!(err, Error::Field { field: "path", .. }));

        assert!(parse_cgroup_format("garbage", Path::new("f")).is_err());
    }
}
