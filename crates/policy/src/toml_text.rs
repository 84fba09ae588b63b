//! TOML text written by hand, for the policies mcpbox generates (`wrap`,
//! `learn`) with a comment beside every rule, which a TOML printer would
//! not keep: keys and strings escaped so that a hostile name can neither
//! end the string nor start a new line (a rule) in a comment.

/// A TOML key: bare when it can be.
pub fn toml_key(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        s.to_string()
    } else {
        toml_str(s)
    }
}

/// A TOML basic string on one line (so it may also stand in a comment):
/// `"` and `\` escaped, and every control character TOML refuses raw
/// (all but tab, and U+007F, which JSON's escaping would leave) as `\uXXXX`.
pub fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\t' => out.push(c),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_names_stay_one_toml_string_on_one_line() {
        for name in [
            "a\nb = true",
            "x\"y",
            "back\\slash",
            "del\u{7f}",
            "tab\tok",
            "",
        ] {
            let text = format!("{} = {}\n", toml_key(name), toml_str(name));
            assert_eq!(text.lines().count(), 1, "{text:?}");
            let table: toml::Table = text.parse().unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(table.get(name).and_then(|v| v.as_str()), Some(name));
        }
        assert_eq!(toml_key("plain-key_1"), "plain-key_1");
    }
}
