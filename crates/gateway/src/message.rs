//! Typed views of JSON-RPC 2.0 messages (MCP over stdio is one message per
//! line). A line is parsed once into a [`serde_json::Value`] and classified;
//! the session reads what it acts on through the view and leaves the rest
//! alone, so unknown methods and fields pass through as they came (the
//! original bytes are forwarded when nothing was changed).

use serde_json::Value;

/// What kind of JSON-RPC message a line holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `method` and a non-null `id`.
    Request,
    /// `method` without an `id` (or with `"id": null`).
    Notification,
    /// `id` and `result`, no `method`.
    Response,
    /// `id` and `error`, no `method`.
    Error,
    /// An `id` and neither `method`, `result` nor `error`; still routed by
    /// its id (JSON-RPC calls it invalid, but passing it on is what the
    /// relay has always done for the host's answers).
    Other,
}

/// Why a line is not a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    /// Starts with `[`: a JSON-RPC batch, which MCP does not use.
    Batch,
    /// Not JSON.
    Json,
    /// JSON, but not an object, or an object with neither method nor id.
    NotMessage,
    /// Only whitespace; ignored.
    Blank,
}

/// One parsed message and its classification.
#[derive(Debug, Clone)]
pub struct Message {
    /// The whole message, as parsed.
    pub value: Value,
    /// Its shape.
    pub shape: Shape,
}

/// The string form of a JSON-RPC id used as a map key: its JSON text, so
/// `1` and `"1"` stay distinct.
pub type IdKey = String;

/// The key of `id`.
pub fn id_key(id: &Value) -> IdKey {
    id.to_string()
}

impl Message {
    /// Parses and classifies one line.
    pub fn parse(line: &[u8]) -> Result<Message, Invalid> {
        let Some(first) = line.iter().position(|b| !b.is_ascii_whitespace()) else {
            return Err(Invalid::Blank);
        };
        if line[first] == b'[' {
            return Err(Invalid::Batch);
        }
        // Duplicate keys are refused: the screened value must hold every
        // byte of the line, since an unchanged line is forwarded as it came
        // (see `lines::parse_json`).
        let value: Value = crate::lines::parse_json(line).map_err(|_| Invalid::Json)?;
        let Value::Object(obj) = &value else {
            return Err(Invalid::NotMessage);
        };
        let method = obj.get("method").is_some_and(Value::is_string);
        let id = obj.get("id").is_some_and(|i| !i.is_null());
        let shape = match (method, id) {
            (true, true) => Shape::Request,
            (true, false) => Shape::Notification,
            (false, true) if obj.contains_key("error") => Shape::Error,
            (false, true) if obj.contains_key("result") => Shape::Response,
            (false, true) => Shape::Other,
            (false, false) => return Err(Invalid::NotMessage),
        };
        Ok(Message { value, shape })
    }

    /// The method of a request or notification.
    pub fn method(&self) -> Option<&str> {
        self.value.get("method").and_then(Value::as_str)
    }

    /// The id (never `null`) of a request, response or error.
    pub fn id(&self) -> Option<&Value> {
        match self.shape {
            Shape::Notification => None,
            _ => self.value.get("id"),
        }
    }

    /// `params`, if any.
    pub fn params(&self) -> Option<&Value> {
        self.value.get("params")
    }

    /// True for a response or error (an answer to a request).
    pub fn is_answer(&self) -> bool {
        matches!(self.shape, Shape::Response | Shape::Error | Shape::Other)
    }

    /// The message as one line, without a newline.
    pub fn to_line(&self) -> Vec<u8> {
        // Serialising a `Value` cannot fail (its keys are strings).
        serde_json::to_vec(&self.value).unwrap_or_default()
    }
}

/// The value at `path` (object keys), like [`Value::pointer`] without
/// its per-segment unescaping, which showed in profiles of the hot path.
pub fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

/// [`at`], mutably.
pub fn at_mut<'a>(v: &'a mut Value, path: &[&str]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, k| v.get_mut(*k))
}

/// True when `line` is printable ASCII (no byte at or above DEL; JSON
/// allows no raw control characters) and holds no JSON escape. Then every
/// string in the parsed message (object keys included) is the very bytes
/// between its quotes, so a search over the whole line finds whatever a
/// search over each decoded string would, and no string holds a control,
/// escape or invisible character. The session uses it to skip walking the
/// parsed message when a search over the line finds nothing.
pub fn is_plain(line: &[u8]) -> bool {
    !line.iter().any(|&b| b >= 0x7F || b == b'\\')
}

/// A JSON-RPC error response, as one line.
pub fn error_line(id: &Value, code: i64, message: &str, data: Option<Value>) -> Vec<u8> {
    let mut err = serde_json::json!({"code": code, "message": message});
    if let Some(d) = data {
        err["data"] = d;
    }
    to_line(&serde_json::json!({"jsonrpc": "2.0", "id": id, "error": err}))
}

/// A value as one line, without a newline.
pub fn to_line(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

/// Finds `"id":<value>` near the start of a (truncated) JSON line. Only used
/// to answer the matching in-flight request, so a wrong guess that matches
/// nothing is harmless.
pub fn sniff_id(prefix: &[u8]) -> Option<IdKey> {
    let text = String::from_utf8_lossy(prefix);
    let at = text.find("\"id\"")?;
    let rest = text[at + 4..].trim_start().strip_prefix(':')?.trim_start();
    let end = if rest.starts_with('"') {
        let mut esc = false;
        let mut end = None;
        for (i, c) in rest.char_indices().skip(1) {
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                end = Some(i + 1);
                break;
            }
        }
        end?
    } else {
        rest.find(|c: char| {
            !(c.is_ascii_digit() || c == '-' || c == '.' || c == 'e' || c == 'E' || c == '+')
        })
        .unwrap_or(rest.len())
    };
    let v: Value = serde_json::from_str(&rest[..end]).ok()?;
    Some(id_key(&v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_told_apart() {
        let shape = |s: &str| Message::parse(s.as_bytes()).map(|m| m.shape);
        assert_eq!(
            shape(r#"{"jsonrpc":"2.0","id":1,"method":"x"}"#),
            Ok(Shape::Request)
        );
        assert_eq!(
            shape(r#"{"jsonrpc":"2.0","id":null,"method":"x"}"#),
            Ok(Shape::Notification)
        );
        assert_eq!(
            shape(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#),
            Ok(Shape::Response)
        );
        assert_eq!(
            shape(r#"{"jsonrpc":"2.0","id":1,"error":{}}"#),
            Ok(Shape::Error)
        );
        assert_eq!(shape(r#" [{"id":1}]"#), Err(Invalid::Batch));
        assert_eq!(shape("{nope"), Err(Invalid::Json));
        assert_eq!(shape("42"), Err(Invalid::NotMessage));
        assert_eq!(shape(r#"{"jsonrpc":"2.0"}"#), Err(Invalid::NotMessage));
        assert_eq!(shape("  "), Err(Invalid::Blank));
    }

    #[test]
    fn sniff_id_finds_number_and_string_ids() {
        assert_eq!(
            sniff_id(br#"{"jsonrpc":"2.0","id":17,"result":{"content":[{"te"#),
            Some("17".into())
        );
        assert_eq!(
            sniff_id(br#"{"id" : "a\"b","result""#),
            Some(r#""a\"b""#.into())
        );
        assert_eq!(sniff_id(br#"{"result":"#), None);
    }
}
