//! Keeps host paths out of what other users read (issue 13 item 7). With
//! `--allow-other`, every local user can read `.stagefs/status`; its stall
//! reasons name the files being waited for, with the operator's absolute
//! source, change-management, events and state paths. [`Redactor`] rewrites
//! every string of the rendered status: a path under one of those roots
//! becomes `<source-root>/…`, `<cm-root>/…`, `<events>/…` or `<state>/…`
//! (the part inside the root stays, it is warehouse data readers see
//! anyway), and any other absolute path left becomes `<path>`.
//!
//! Only the copy served through the mount is redacted, and only with
//! `--allow-other`; `<state>/status.json` and `stagefs status --state` are
//! the operator's and keep every path. Called by the daemon's status source.

use std::path::Path;

/// Rewrites host paths in text; built once per mount from its roots.
#[derive(Debug, Clone)]
pub struct Redactor {
    /// (root as text without a trailing `/`, its label), longest first so a
    /// root inside another is matched before it.
    roots: Vec<(String, &'static str)>,
}

/// Characters after which a `/` starts a path (rather than separating the
/// components of a relative one).
const PATH_START_AFTER: &[char] = &[' ', '\t', '\n', '(', '[', '=', ':', '"', '\'', ','];
/// Characters that end a path token.
const PATH_END: &[char] = &[' ', '\t', '\n', ')', ']', ',', ';', '"', '\''];

impl Redactor {
    /// `roots`: each root with its label. Both the path as given and its
    /// canonical form are matched (messages may carry either).
    pub fn new<'a>(roots: impl IntoIterator<Item = (&'a Path, &'static str)>) -> Redactor {
        let mut out: Vec<(String, &'static str)> = Vec::new();
        for (root, label) in roots {
            let forms = [Some(root.to_owned()), root.canonicalize().ok()];
            for form in forms.into_iter().flatten() {
                let text = form.to_string_lossy().trim_end_matches('/').to_owned();
                // "/" or "" would match everything: leave those to the
                // generic rule.
                if text.len() > 1 && !out.iter().any(|(t, _)| *t == text) {
                    out.push((text, label));
                }
            }
        }
        out.sort_by_key(|(t, _)| std::cmp::Reverse(t.len()));
        Redactor { roots: out }
    }

    /// `text` with every root replaced by its label and every other
    /// absolute path by `<path>`.
    pub fn redact(&self, text: &str) -> String {
        let mut s = text.to_owned();
        for (root, label) in &self.roots {
            s = replace_root(&s, root, label);
        }
        replace_other_paths(&s)
    }

    /// Redacts every string inside a JSON value, keys included.
    pub fn redact_json(&self, value: &mut serde_json::Value) {
        use serde_json::Value;
        match value {
            Value::String(s) => *s = self.redact(s),
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_json(v)),
            Value::Object(map) => {
                let old = std::mem::take(map);
                for (k, mut v) in old {
                    self.redact_json(&mut v);
                    map.insert(self.redact(&k), v);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
}

/// Replaces `root` where it is a whole path prefix (followed by `/`, the end,
/// or a character that ends a path).
fn replace_root(s: &str, root: &str, label: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(root) {
        let after = &rest[at + root.len()..];
        let whole = after.is_empty()
            || after.starts_with('/')
            || after.starts_with(|c: char| PATH_END.contains(&c));
        out.push_str(&rest[..at]);
        if whole {
            out.push_str(label);
        } else {
            out.push_str(root);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

fn replace_other_paths(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev: Option<char> = None;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let starts_path = c == '/' && prev.is_none_or(|p| PATH_START_AFTER.contains(&p));
        if !starts_path {
            out.push(c);
            prev = Some(c);
            continue;
        }
        let end = s[i..]
            .find(|c: char| PATH_END.contains(&c))
            .map_or(s.len(), |n| i + n);
        // A trailing ':' or '.' is punctuation, not part of the path.
        let token = s[i..end].trim_end_matches([':', '.']);
        let stop = i + token.len();
        out.push_str("<path>");
        while chars.peek().is_some_and(|(j, _)| *j < stop) {
            chars.next();
        }
        prev = Some('>');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redactor() -> Redactor {
        Redactor::new([
            (Path::new("/srv/warehouse"), "<source-root>"),
            (Path::new("/srv/warehouse/cm/"), "<cm-root>"),
            (Path::new("/var/lib/stagefs"), "<state>"),
        ])
    }

    #[test]
    fn roots_become_labels_and_keep_the_path_inside() {
        let r = redactor();
        assert_eq!(
            r.redact("waiting for db/t/f: /srv/warehouse/db/t/f: missing; /srv/warehouse/cm/f_ab: missing"),
            "waiting for db/t/f: <source-root>/db/t/f: missing; <cm-root>/f_ab: missing"
        );
        assert_eq!(r.redact("journal: /var/lib/stagefs"), "journal: <state>");
    }

    #[test]
    fn a_root_that_is_only_a_prefix_of_a_name_is_not_a_root() {
        let r = redactor();
        assert_eq!(r.redact("at /srv/warehouse2/x"), "at <path>");
    }

    #[test]
    fn other_absolute_paths_are_hidden_and_relative_ones_kept() {
        let r = redactor();
        assert_eq!(
            r.redact("reading /etc/shadow: denied (see /home/op/x.log), db/t/p=a/f kept"),
            "reading <path>: denied (see <path>), db/t/p=a/f kept"
        );
        assert_eq!(r.redact("/a/b"), "<path>");
        assert_eq!(r.redact("ratio 1/2 stays"), "ratio 1/2 stays");
    }

    #[test]
    fn every_string_of_a_json_document_is_redacted() {
        let r = redactor();
        let mut v = serde_json::json!({
            "stalled": {"reason": "x: /srv/warehouse/db/f: missing", "file": "/var/lib/stagefs/e.jsonl", "line": 3},
            "list": ["/opt/x", 1],
        });
        r.redact_json(&mut v);
        assert_eq!(v["stalled"]["reason"], "x: <source-root>/db/f: missing");
        assert_eq!(v["stalled"]["file"], "<state>/e.jsonl");
        assert_eq!(v["stalled"]["line"], 3);
        assert_eq!(v["list"][0], "<path>");
    }
}
