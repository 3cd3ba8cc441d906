//! How deep a YAML document nests, found before it is decoded.
//!
//! The streaming YAML decoder ([`super::yaml`]) stops at its own recursion limit, but the
//! decoder it falls back to for small manifests (`serde_yaml_ng`, for aliases, tags and several
//! documents) reads a whole document into a list of events before it builds anything, and only
//! then applies its recursion limit: a document nested 100,000 deep (`[[[...]]]`, `- - - x`)
//! is rejected, but after costing tens of MiB of events. This walk runs libyaml's event parser
//! (the same parser both decoders use, through [`super::yaml::Parser`]) with a depth counter
//! and stops at the first collection nested deeper than [`MAX_DEPTH`], having read only the text
//! up to it; libyaml's own look-ahead is bounded (a possible simple key spans at most 1024
//! characters). Syntax errors are left to the decoder, which reports them with their location.
//!
//! JSON needs no such walk: its decoder reads as it goes and stops at its recursion limit.

use unsafe_libyaml as unsafe_yaml;

use super::yaml::Parser;

/// Deepest nesting of collections accepted: the YAML and JSON decoders' recursion limit. A pod's
/// own fields nest about a dozen deep.
pub const MAX_DEPTH: usize = 128;

/// Where (1-based line and column) `text` opens a collection nested deeper than `max`, if it
/// does before its first syntax error.
pub(crate) fn yaml_too_deep(text: &str, max: usize) -> Option<(usize, usize)> {
    let mut parser = Parser::new(text)?;
    let mut depth = 0usize;
    loop {
        let event = parser.next().ok()?;
        match event.kind() {
            unsafe_yaml::YAML_SEQUENCE_START_EVENT | unsafe_yaml::YAML_MAPPING_START_EVENT => {
                depth += 1;
                if depth > max {
                    let at = event.start();
                    return Some((at.line + 1, at.column + 1));
                }
            }
            unsafe_yaml::YAML_SEQUENCE_END_EVENT | unsafe_yaml::YAML_MAPPING_END_EVENT => {
                depth = depth.saturating_sub(1);
            }
            unsafe_yaml::YAML_STREAM_END_EVENT => return None,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested_flow(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn shallow_documents_pass() {
        let pod = crate::config::test_manifest("web", "busybox");
        assert_eq!(yaml_too_deep(&pod, MAX_DEPTH), None);
        assert_eq!(yaml_too_deep(&nested_flow(MAX_DEPTH), MAX_DEPTH), None);
        assert_eq!(yaml_too_deep("", MAX_DEPTH), None);
        // Several documents: each one's depth counts on its own.
        let two = format!("{}\n---\n{}\n", nested_flow(100), nested_flow(100));
        assert_eq!(yaml_too_deep(&two, MAX_DEPTH), None);
    }

    #[test]
    fn the_first_collection_past_the_limit_is_found() {
        assert_eq!(
            yaml_too_deep(&nested_flow(MAX_DEPTH + 1), MAX_DEPTH),
            Some((1, MAX_DEPTH + 1))
        );
        // 100,000 deep: found at the same place, having read only the text up to it.
        assert_eq!(
            yaml_too_deep(&nested_flow(100_000), MAX_DEPTH),
            Some((1, MAX_DEPTH + 1))
        );
        // Block sequences nest without brackets: `- - - x`.
        let block = format!("{}x\n", "- ".repeat(100_000));
        assert_eq!(
            yaml_too_deep(&block, MAX_DEPTH),
            Some((1, 2 * MAX_DEPTH + 1))
        );
        // Block mappings, one level per line.
        let mut mapping = String::new();
        for i in 0..200 {
            mapping.push_str(&" ".repeat(i));
            mapping.push_str("k:\n");
        }
        assert_eq!(yaml_too_deep(&mapping, 3), Some((4, 4)));
    }

    #[test]
    fn a_syntax_error_is_left_to_the_decoder() {
        assert_eq!(yaml_too_deep("kind: Pod\nmetadata: [", MAX_DEPTH), None);
        assert_eq!(yaml_too_deep("a: b: c", MAX_DEPTH), None);
    }
}
