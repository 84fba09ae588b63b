//! A map from key paths (`filesystem.mounts[1].host`) to their positions in the
//! source, built by deserializing the document once more into a tree of
//! spanned nodes. Used for diagnostics and for [`crate::Policy::location`].

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::diagnostic::{offset_to_location, Location};

/// One value of the document, with the spans of its children.
enum Node {
    Table(Vec<(SpannedKey, SpannedNode)>),
    Array(Vec<SpannedNode>),
    Scalar,
}

// The names `toml::Spanned` uses to ask the deserializer for a span. `Spanned`
// itself cannot be used here: toml has no span for some implicit keys and
// tables (`[[a.b]]` creates `a` without one) and `Spanned` then fails, while
// these types fall back to "no span".
const SPANNED_NAME: &str = "$__serde_spanned_private_Spanned";
const SPANNED_START: &str = "$__serde_spanned_private_start";
const SPANNED_END: &str = "$__serde_spanned_private_end";
const SPANNED_VALUE: &str = "$__serde_spanned_private_value";
const SPANNED_FIELDS: &[&str] = &[SPANNED_START, SPANNED_END, SPANNED_VALUE];

/// A value and its span, when toml knows it.
struct SpannedNode {
    span: Option<Range<usize>>,
    node: Node,
}

/// A key and its span, when toml knows it.
struct SpannedKey {
    span: Option<Range<usize>>,
    key: String,
}

/// Reads the rest of a spanned map whose first key (the start field) was consumed.
fn read_span<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    map: &mut A,
) -> Result<(Range<usize>, T), A::Error> {
    let start: usize = map.next_value()?;
    let mut end = start;
    let mut value = None;
    while let Some(k) = map.next_key::<String>()? {
        if k == SPANNED_END {
            end = map.next_value()?;
        } else if k == SPANNED_VALUE {
            value = Some(map.next_value::<T>()?);
        } else {
            map.next_value::<de::IgnoredAny>()?;
        }
    }
    let value = value.ok_or_else(|| de::Error::custom("spanned value without a value"))?;
    Ok((start..end.max(start), value))
}

impl<'de> Deserialize<'de> for SpannedNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_struct(SPANNED_NAME, SPANNED_FIELDS, NodeVisitor)
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor).map(|n| n.node)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = SpannedNode;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any toml value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<SpannedNode, E> {
        Ok(SpannedNode {
            span: None,
            node: Node::Scalar,
        })
    }
    fn visit_i64<E>(self, _: i64) -> Result<SpannedNode, E> {
        Ok(SpannedNode {
            span: None,
            node: Node::Scalar,
        })
    }
    fn visit_u64<E>(self, _: u64) -> Result<SpannedNode, E> {
        Ok(SpannedNode {
            span: None,
            node: Node::Scalar,
        })
    }
    fn visit_f64<E>(self, _: f64) -> Result<SpannedNode, E> {
        Ok(SpannedNode {
            span: None,
            node: Node::Scalar,
        })
    }
    fn visit_str<E>(self, _: &str) -> Result<SpannedNode, E> {
        Ok(SpannedNode {
            span: None,
            node: Node::Scalar,
        })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SpannedNode, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<SpannedNode>()? {
            items.push(item);
        }
        Ok(SpannedNode {
            span: None,
            node: Node::Array(items),
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SpannedNode, A::Error> {
        let mut entries = Vec::new();
        let mut first = true;
        while let Some(key) = map.next_key::<SpannedKey>()? {
            if first && key.span.is_none() && key.key == SPANNED_START {
                let (span, node) = read_span::<A, Node>(&mut map)?;
                return Ok(SpannedNode {
                    span: Some(span),
                    node,
                });
            }
            first = false;
            let value = map.next_value::<SpannedNode>()?;
            entries.push((key, value));
        }
        Ok(SpannedNode {
            span: None,
            node: Node::Table(entries),
        })
    }
}

impl<'de> Deserialize<'de> for SpannedKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_struct(SPANNED_NAME, SPANNED_FIELDS, KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = SpannedKey;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, v: &str) -> Result<SpannedKey, E> {
        Ok(SpannedKey {
            span: None,
            key: v.to_string(),
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SpannedKey, A::Error> {
        match map.next_key::<String>()? {
            Some(k) if k == SPANNED_START => {
                let (span, key) = read_span::<A, String>(&mut map)?;
                Ok(SpannedKey {
                    span: Some(span),
                    key,
                })
            }
            _ => Err(de::Error::custom("expected a spanned key")),
        }
    }
}

/// Quotes a key when it is not a bare TOML key.
pub(crate) fn key_segment(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_string()
    } else {
        format!("\"{}\"", key.escape_debug())
    }
}

/// Joins a parent path and a key.
pub(crate) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key_segment(key)
    } else {
        format!("{parent}.{}", key_segment(key))
    }
}

/// Where each key path of a document sits.
#[derive(Debug, Clone, Default)]
pub(crate) struct Locations {
    /// key path -> (position shown for the key, span of the key or item, span of the value)
    entries: BTreeMap<String, (Location, Range<usize>, Range<usize>)>,
}

impl Locations {
    /// Builds the map; fails with the syntax error when the text is not TOML.
    pub(crate) fn build(text: &str) -> Result<Self, toml::de::Error> {
        let root: Node = toml::from_str(text)?;
        let mut out = Locations::default();
        out.walk(text, "", &root, &(0..0));
        Ok(out)
    }

    fn walk(&mut self, text: &str, path: &str, node: &Node, parent_span: &Range<usize>) {
        match node {
            Node::Table(entries) => {
                for (key, value) in entries {
                    let child = join(path, &key.key);
                    let value_span = value
                        .span
                        .clone()
                        .or(key.span.clone())
                        .unwrap_or(parent_span.clone());
                    let key_span = key.span.clone().unwrap_or(value_span.clone());
                    let loc = offset_to_location(text, key_span.start);
                    self.entries
                        .insert(child.clone(), (loc, key_span, value_span.clone()));
                    self.walk(text, &child, &value.node, &value_span);
                }
            }
            Node::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let child = format!("{path}[{i}]");
                    let span = item.span.clone().unwrap_or(parent_span.clone());
                    let loc = offset_to_location(text, span.start);
                    self.entries
                        .insert(child.clone(), (loc, span.clone(), span.clone()));
                    self.walk(text, &child, &item.node, &span);
                }
            }
            Node::Scalar => {}
        }
    }

    /// The position of a key path, if the document has it.
    pub(crate) fn get(&self, key: &str) -> Option<Location> {
        self.entries.get(key).map(|(loc, _, _)| *loc)
    }

    /// The deepest key path whose key or value span contains `span`.
    pub(crate) fn key_at(&self, span: &Range<usize>) -> Option<String> {
        let contains =
            |r: &Range<usize>| r.start <= span.start && span.end <= r.end.max(r.start + 1);
        self.entries
            .iter()
            .filter(|(_, (_, k, v))| contains(k) || contains(v))
            .max_by_key(|(path, (_, k, v))| {
                // deepest = the smallest enclosing span, then the longest path
                let width = if contains(k) { k.len() } else { v.len() };
                (usize::MAX - width, path.len())
            })
            .map(|(path, _)| path.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_paths_point_at_their_lines() {
        let text = "[server]\nname = \"x\"\n\n[[filesystem.mounts]]\nhost = \"/a\"\nat = \"/b\"\n\n[[filesystem.mounts]]\nhost = \"/c\"\n\n[tools]\n\"write_*\" = \"deny\"\n[network]\nallow = [\"a.com\",\n  \"b.com\"]\n";
        let l = Locations::build(text).expect("valid toml");
        assert_eq!(l.get("server.name"), Some(Location { line: 2, column: 1 }));
        assert_eq!(l.get("filesystem.mounts[0].host").map(|l| l.line), Some(5));
        assert_eq!(l.get("filesystem.mounts[1].host").map(|l| l.line), Some(9));
        assert_eq!(l.get("tools.\"write_*\"").map(|l| l.line), Some(12));
        assert_eq!(
            l.get("network.allow[1]"),
            Some(Location {
                line: 15,
                column: 3
            })
        );
        assert_eq!(l.get("nope"), None);
    }
}
