//! The one error type of this crate: a diagnostic pointing at a file, a
//! position and a key path, with a hint that says what would be valid.

use std::fmt;
use std::path::PathBuf;

/// A 1-based line and column (columns count characters, not bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location {
    /// 1-based line number.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
}

/// Why a policy was refused: where, which key, what is wrong and what would be valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Diagnostic {
    /// The policy file, as given to [`crate::parse`].
    pub file: PathBuf,
    /// Where in the file, when known.
    pub location: Option<Location>,
    /// The key path, e.g. `filesystem.mounts[1].at` (empty for a syntax error).
    pub key: String,
    /// What is wrong, lowercase, no trailing period.
    pub message: String,
    /// What would be valid.
    pub hint: Option<String>,
}

impl Diagnostic {
    /// Builds a diagnostic without a hint.
    pub fn new(
        file: impl Into<PathBuf>,
        location: Option<Location>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Diagnostic {
            file: file.into(),
            location,
            key: key.into(),
            message: message.into(),
            hint: None,
        }
    }

    /// Adds a hint.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(loc) = self.location {
            write!(f, ":{}:{}", loc.line, loc.column)?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

/// Converts a byte offset into `text` to a 1-based line and column.
/// Offsets past the end or inside a character are clamped, never a panic.
pub(crate) fn offset_to_location(text: &str, offset: usize) -> Location {
    let mut offset = offset.min(text.len());
    while offset > 0 && !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = text.get(..offset).unwrap_or("");
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    let column = before
        .get(line_start..)
        .map(|s| s.chars().count())
        .unwrap_or(0)
        + 1;
    Location { line, column }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_file_line_column_key_and_hint() {
        let d = Diagnostic::new(
            "p.toml",
            Some(Location { line: 3, column: 1 }),
            "filesystem.tmp",
            "invalid size \"x\"",
        )
        .with_hint("write \"64MiB\"");
        assert_eq!(
            d.to_string(),
            "p.toml:3:1: filesystem.tmp: invalid size \"x\"\n  hint: write \"64MiB\""
        );
        let d = Diagnostic::new("p.toml", None, "", "bad");
        assert_eq!(d.to_string(), "p.toml: bad");
    }

    #[test]
    fn offsets_map_to_lines_and_character_columns() {
        let text = "a = 1\nbé = 2\n";
        assert_eq!(offset_to_location(text, 0), Location { line: 1, column: 1 });
        assert_eq!(offset_to_location(text, 6), Location { line: 2, column: 1 });
        // 'é' is two bytes: the '=' after "bé " is column 4
        assert_eq!(
            offset_to_location(text, 10),
            Location { line: 2, column: 4 }
        );
        // inside a character and past the end: clamped
        assert_eq!(offset_to_location(text, 8), Location { line: 2, column: 2 });
        assert_eq!(offset_to_location(text, 999).line, 3);
    }
}
