//! A JSON (and, for VS Code, JSONC: comments and trailing commas) reader
//! that keeps the byte span of every value, so `wrap` can replace one
//! server entry and leave every other byte of the host's file as it was.
//! serde_json cannot: without its `preserve_order` feature (off in this
//! workspace, and global to the build if turned on) it reorders keys, and it
//! drops formatting and comments.

/// A value and where it is in the text (`start..end`, bytes).
#[derive(Debug, Clone)]
pub struct Node {
    pub start: usize,
    pub end: usize,
    pub kind: Kind,
}

#[derive(Debug, Clone)]
pub enum Kind {
    Object(Vec<Member>),
    Array(Vec<Node>),
    Str(String),
    /// A number, `true`, `false` or `null`: kept as the text it is.
    Scalar,
}

#[derive(Debug, Clone)]
pub struct Member {
    /// Where the key's opening quote is.
    pub key_start: usize,
    pub key: String,
    pub value: Node,
}

impl Node {
    pub fn members(&self) -> Option<&[Member]> {
        match &self.kind {
            Kind::Object(m) => Some(m),
            _ => None,
        }
    }
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.members()?
            .iter()
            .find(|m| m.key == key)
            .map(|m| &m.value)
    }
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            Kind::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// Where and why the text is not JSON: 1-based line and column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Parses `text` as one JSON value; `comments` allows `//` and `/* */`
/// comments and trailing commas (VS Code's `mcp.json` is JSONC).
pub fn parse(text: &str, comments: bool) -> Result<Node, SyntaxError> {
    let mut p = Parser {
        b: text.as_bytes(),
        i: 0,
        comments,
        depth: 0,
    };
    let node = p.value()?;
    p.space()?;
    if p.i < p.b.len() {
        return Err(p.error("unexpected text after the end of the document"));
    }
    Ok(node)
}

/// The 1-based line and column (in characters) of byte `offset`.
pub fn line_col(text: &[u8], offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.iter().filter(|&&c| c == b'\n').count() + 1;
    let start = before
        .iter()
        .rposition(|&c| c == b'\n')
        .map_or(0, |p| p + 1);
    let column = String::from_utf8_lossy(&before[start..]).chars().count() + 1;
    (line, column)
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
    comments: bool,
    depth: usize,
}

/// Deeper than any host config; bounds the recursion on hostile input.
const MAX_DEPTH: usize = 128;

impl Parser<'_> {
    fn error(&self, message: &str) -> SyntaxError {
        let (line, column) = line_col(self.b, self.i);
        SyntaxError {
            line,
            column,
            message: message.to_string(),
        }
    }

    fn space(&mut self) -> Result<(), SyntaxError> {
        loop {
            match self.b.get(self.i) {
                Some(b' ' | b'\t' | b'\n' | b'\r') => self.i += 1,
                Some(b'/') if self.comments => match self.b.get(self.i + 1) {
                    Some(b'/') => {
                        while self.i < self.b.len() && self.b[self.i] != b'\n' {
                            self.i += 1;
                        }
                    }
                    Some(b'*') => {
                        let from = self.i;
                        self.i += 2;
                        loop {
                            if self.i + 1 >= self.b.len() {
                                self.i = from;
                                return Err(self.error("unterminated comment"));
                            }
                            if &self.b[self.i..self.i + 2] == b"*/" {
                                self.i += 2;
                                break;
                            }
                            self.i += 1;
                        }
                    }
                    _ => return Err(self.error("unexpected `/`")),
                },
                _ => return Ok(()),
            }
        }
    }

    fn value(&mut self) -> Result<Node, SyntaxError> {
        self.space()?;
        let start = self.i;
        let kind = match self.b.get(self.i) {
            None => return Err(self.error("unexpected end of the document")),
            Some(b'{') => self.nested(Self::object)?,
            Some(b'[') => self.nested(Self::array)?,
            Some(b'"') => Kind::Str(self.string()?),
            Some(b't') => self.word("true")?,
            Some(b'f') => self.word("false")?,
            Some(b'n') => self.word("null")?,
            Some(b'-' | b'0'..=b'9') => self.number()?,
            Some(_) => return Err(self.error("expected a value")),
        };
        Ok(Node {
            start,
            end: self.i,
            kind,
        })
    }

    fn nested(
        &mut self,
        f: fn(&mut Self) -> Result<Kind, SyntaxError>,
    ) -> Result<Kind, SyntaxError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error("nested too deeply"));
        }
        let kind = f(self)?;
        self.depth -= 1;
        Ok(kind)
    }

    fn word(&mut self, w: &str) -> Result<Kind, SyntaxError> {
        if self.b[self.i..].starts_with(w.as_bytes()) {
            self.i += w.len();
            Ok(Kind::Scalar)
        } else {
            Err(self.error("expected a value"))
        }
    }

    fn number(&mut self) -> Result<Kind, SyntaxError> {
        let start = self.i;
        while let Some(c) = self.b.get(self.i) {
            if c.is_ascii_digit() || b"+-.eE".contains(c) {
                self.i += 1;
            } else {
                break;
            }
        }
        let text = std::str::from_utf8(&self.b[start..self.i]).unwrap_or("");
        if serde_json::from_str::<serde_json::Number>(text).is_err() {
            self.i = start;
            return Err(self.error("invalid number"));
        }
        Ok(Kind::Scalar)
    }

    fn string(&mut self) -> Result<String, SyntaxError> {
        let start = self.i;
        self.i += 1;
        loop {
            match self.b.get(self.i) {
                None => {
                    self.i = start;
                    return Err(self.error("unterminated string"));
                }
                Some(b'"') => break,
                Some(b'\\') => self.i += 2,
                Some(c) if *c < 0x20 => return Err(self.error("control character in a string")),
                Some(_) => self.i += 1,
            }
        }
        self.i += 1;
        // the escapes are JSON's: let serde_json decode the literal
        let raw = std::str::from_utf8(&self.b[start..self.i]).unwrap_or("\"\u{0}");
        serde_json::from_str::<String>(raw).map_err(|_| {
            self.i = start;
            self.error("invalid escape in a string")
        })
    }

    fn object(&mut self) -> Result<Kind, SyntaxError> {
        self.i += 1;
        let mut members: Vec<Member> = Vec::new();
        loop {
            self.space()?;
            match self.b.get(self.i) {
                Some(b'}') if members.is_empty() || self.comments => {
                    self.i += 1;
                    return Ok(Kind::Object(members));
                }
                Some(b'"') => {}
                _ => return Err(self.error("expected a key in double quotes")),
            }
            let key_start = self.i;
            let key = self.string()?;
            if members.iter().any(|m| m.key == key) {
                return Err(self.error(&format!("duplicate key {key:?}")));
            }
            self.space()?;
            if self.b.get(self.i) != Some(&b':') {
                return Err(self.error("expected `:`"));
            }
            self.i += 1;
            let value = self.value()?;
            members.push(Member {
                key_start,
                key,
                value,
            });
            self.space()?;
            match self.b.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(Kind::Object(members));
                }
                _ => return Err(self.error("expected `,` or `}`")),
            }
        }
    }

    fn array(&mut self) -> Result<Kind, SyntaxError> {
        self.i += 1;
        let mut items = Vec::new();
        loop {
            self.space()?;
            if self.b.get(self.i) == Some(&b']') && (items.is_empty() || self.comments) {
                self.i += 1;
                return Ok(Kind::Array(items));
            }
            items.push(self.value()?);
            self.space()?;
            match self.b.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(Kind::Array(items));
                }
                _ => return Err(self.error("expected `,` or `]`")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_the_value_text() {
        let text = "{ \"a\": [1, \"x\\n\"], \"b\": {\"c\": null} }";
        let n = parse(text, false).unwrap();
        let a = n.get("a").unwrap();
        assert_eq!(&text[a.start..a.end], "[1, \"x\\n\"]");
        let c = n.get("b").unwrap().get("c").unwrap();
        assert_eq!(&text[c.start..c.end], "null");
    }

    #[test]
    fn errors_name_line_and_column() {
        let e = parse("{\n  \"a\": 1\n  \"b\": 2\n}", false).unwrap_err();
        assert_eq!((e.line, e.column), (3, 3));
        assert!(parse("{\"a\": 1,}", false).is_err());
        assert!(parse("{\"a\": 1, \"a\": 2}", false).is_err());
        assert!(parse("// c\n{\"a\": 1,}", false).is_err());
    }

    #[test]
    fn jsonc_takes_comments_and_trailing_commas() {
        let n = parse("// c\n{\"a\": [1,], /* x */ \"b\": 2,}", true).unwrap();
        assert!(n.get("b").is_some());
        assert!(parse("{\"a\": 1 /* open", true).is_err());
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let text = "[".repeat(100_000);
        assert!(parse(&text, false).is_err());
    }
}
