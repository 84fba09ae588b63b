//! Streaming compaction of an over-long JSON line from the server: string
//! values longer than a limit are cut (at a UTF-8 and escape boundary)
//! while the bytes stream by, so a huge tool result becomes a small,
//! still-valid message without ever being held in memory.

/// The marker appended (inside the JSON string) where bytes were dropped.
/// The count is of raw (escaped) JSON bytes.
pub const MARKER_PREFIX: &str = "[mcpbox: truncated ";

/// Copies JSON bytes, cutting long string values.
#[derive(Debug)]
pub struct Compactor {
    keep: usize,
    limit: usize,
    out: Vec<u8>,
    in_str: bool,
    /// 0: no escape; 255: after a backslash; 1..=4: hex digits to go.
    esc: u8,
    esc_start: usize,
    kept: usize,
    dropped: usize,
    dropping: bool,
    overflow: bool,
    total: usize,
}

impl Compactor {
    /// Keeps at most about `keep` bytes of each string; gives up (overflow)
    /// when the compacted output would exceed `limit`.
    pub fn new(keep: usize, limit: usize) -> Compactor {
        Compactor {
            keep,
            limit,
            out: Vec::new(),
            in_str: false,
            esc: 0,
            esc_start: 0,
            kept: 0,
            dropped: 0,
            dropping: false,
            overflow: false,
            total: 0,
        }
    }

    /// Bytes fed so far.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The compacted line, or `None` when even that was over the limit.
    pub fn finish(self) -> Option<Vec<u8>> {
        (!self.overflow).then_some(self.out)
    }

    fn close_dropped(&mut self) {
        let marker = format!("\\n{MARKER_PREFIX}{} bytes]\"", self.dropped);
        self.out.extend_from_slice(marker.as_bytes());
        self.in_str = false;
        self.dropping = false;
    }

    /// Feeds the next bytes of the line (without the newline).
    pub fn feed(&mut self, data: &[u8]) {
        self.total += data.len();
        if self.overflow {
            return;
        }
        let mut i = 0;
        while i < data.len() {
            let b = data[i];
            if !self.in_str {
                self.out.push(b);
                if b == b'"' {
                    self.in_str = true;
                    self.kept = 0;
                    self.dropped = 0;
                    self.dropping = false;
                    self.esc = 0;
                }
                i += 1;
            } else if self.dropping {
                if self.esc == 0 {
                    // skip fast to the next quote or backslash
                    match memchr::memchr2(b'"', b'\\', &data[i..]) {
                        None => {
                            self.dropped += data.len() - i;
                            i = data.len();
                        }
                        Some(off) => {
                            self.dropped += off;
                            i += off;
                            if data[i] == b'"' {
                                self.close_dropped();
                            } else {
                                self.dropped += 1;
                                self.esc = 255;
                            }
                            i += 1;
                        }
                    }
                } else {
                    self.dropped += 1;
                    self.esc = match self.esc {
                        255 if b == b'u' => 4,
                        255 => 0,
                        n => n - 1,
                    };
                    i += 1;
                }
            } else {
                let boundary = self.esc == 0 && (b & 0xC0) != 0x80 && b != b'"';
                if boundary && self.kept >= self.keep {
                    self.dropping = true;
                    // never leave half a surrogate pair behind
                    if self.esc_start + 6 == self.out.len() && self.ends_with_high_surrogate() {
                        self.out.truncate(self.esc_start);
                        self.dropped += 6;
                    }
                    continue; // reprocess b in dropping mode
                }
                self.out.push(b);
                self.kept += 1;
                match self.esc {
                    0 if b == b'\\' => {
                        self.esc = 255;
                        self.esc_start = self.out.len() - 1;
                    }
                    0 if b == b'"' => self.in_str = false,
                    0 => {}
                    255 if b == b'u' => self.esc = 4,
                    255 => self.esc = 0,
                    n => self.esc = n - 1,
                }
                i += 1;
            }
            if self.out.len() > self.limit {
                self.overflow = true;
                self.out = Vec::new();
                return;
            }
        }
    }

    fn ends_with_high_surrogate(&self) -> bool {
        let Some(hex) = self.out.get(self.esc_start + 2..self.esc_start + 6) else {
            return false;
        };
        let Ok(text) = std::str::from_utf8(hex) else {
            return false;
        };
        u16::from_str_radix(text, 16).is_ok_and(|v| (0xD800..=0xDBFF).contains(&v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn compact(input: &str, keep: usize, step: usize) -> Value {
        let mut c = Compactor::new(keep, 1 << 20);
        for chunk in input.as_bytes().chunks(step) {
            c.feed(chunk);
        }
        let out = c.finish().unwrap();
        serde_json::from_slice(&out)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out)))
    }

    #[test]
    fn long_strings_are_cut_and_the_rest_survives() {
        let big = "é".repeat(1000);
        let input = format!(
            r#"{{"id":5,"result":{{"content":[{{"type":"text","text":"{big}"}}],"isError":false}}}}"#
        );
        for step in [1, 7, 4096] {
            let v = compact(&input, 101, step);
            assert_eq!(v["id"], 5);
            assert_eq!(v["result"]["isError"], false);
            let t = v["result"]["content"][0]["text"].as_str().unwrap();
            let (kept, marker) = t.split_once('\n').unwrap();
            assert!(kept.len() <= 102 && kept.chars().all(|c| c == 'é'));
            assert!(marker.starts_with(MARKER_PREFIX));
        }
    }

    #[test]
    fn escapes_and_surrogate_pairs_are_never_split() {
        let unit = r#"\ud83d\ude00\n\"\\"#;
        let input = format!(r#"{{"s":"{}","t":"ok"}}"#, unit.repeat(200));
        for keep in 2..40 {
            let v = compact(&input, keep, 3);
            assert_eq!(v["t"], "ok");
            assert!(v["s"].as_str().unwrap().contains(MARKER_PREFIX));
        }
    }

    #[test]
    fn output_over_limit_gives_up() {
        let mut c = Compactor::new(10, 100);
        c.feed(format!("[{}]", r#""short","#.repeat(100)).as_bytes());
        assert!(c.finish().is_none());
    }
}
