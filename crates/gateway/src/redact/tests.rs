//! Tests of the redactor, the stream redactor and the credential shapes,
//! with the old implementation (`reference.rs`) as the oracle.

use mcpbox_policy::Reason;
use serde_json::Value;

use super::shapes::SHAPES;
use super::*;
use crate::test_rng::Rng;
use serde_json::json;

fn r() -> Redactor {
    Redactor::new([("TOKEN", "s3cr3t-VALUE/with+chars".as_bytes())])
}

#[test]
fn base64_matches_known_vectors() {
    assert_eq!(base64(b"foobar", B64_STD, true), "Zm9vYmFy");
    assert_eq!(base64(b"fo", B64_STD, true), "Zm8=");
    assert_eq!(base64(b"f", B64_STD, false), "Zg");
    assert_eq!(base64(&[0xfb, 0xff], B64_URL, false), "-_8");
}

#[test]
fn every_encoding_is_redacted() {
    let v = b"s3cr3t-VALUE/with+chars";
    let red = r();
    let encodings = [
        String::from_utf8(v.to_vec()).unwrap(),
        base64(v, B64_STD, true),
        base64(v, B64_URL, false),
        url_encode(v, true),
        url_encode(v, false),
        mcpbox_policy::hex::encode(v),
        mcpbox_policy::hex::encode(v).to_uppercase(),
    ];
    for e in encodings {
        let text = format!("before {e} after");
        let mut counts = vec![0];
        let out = red.redact_str(&text, &mut counts);
        assert!(!out.contains(&e), "{e} survived: {out}");
        assert!(out.contains("[REDACTED:TOKEN]"));
    }
}

#[test]
fn value_inside_longer_base64_stream_is_caught_at_every_alignment() {
    let v = b"s3cr3t-VALUE/with+chars";
    let red = r();
    for prefix in ["", "x", "xy", "xyz"] {
        let mut data = prefix.as_bytes().to_vec();
        data.extend_from_slice(v);
        data.extend_from_slice(b" and more text");
        let enc = base64(&data, B64_STD, true);
        let out = red.redact_str(&enc, &mut [0]);
        assert!(out.contains("[REDACTED:TOKEN]"), "prefix {prefix:?}: {out}");
    }
}

#[test]
fn value_split_across_pieces_is_caught() {
    let red = r();
    let mut a = "first s3cr3t-VAL".to_string();
    let mut b = "UE/with+chars second".to_string();
    let mut counts = vec![0];
    assert!(red.redact_across(&mut [&mut a, &mut b], &mut counts));
    assert_eq!(a, "first [REDACTED:TOKEN]");
    assert_eq!(b, " second");
    assert_eq!(counts, vec![1]);
}

#[test]
fn cut_secret_prefix_is_removed() {
    let red = r();
    let out = red
        .strip_partial_tail("result: s3cr3t-VA", &mut [0])
        .unwrap();
    assert_eq!(out, "result: [REDACTED:TOKEN]");
    assert!(red.strip_partial_tail("result: fine", &mut [0]).is_none());
}

#[test]
fn stream_split_value_is_caught() {
    let red = r();
    let mut s = StreamRedactor::new(red, 64);
    let mut lines = Vec::new();
    s.push(b"leak: s3cr3t-VA", |l| {
        lines.push(String::from_utf8_lossy(l).into_owned())
    });
    s.push(b"LUE/with+chars done\n", |l| {
        lines.push(String::from_utf8_lossy(l).into_owned())
    });
    assert_eq!(lines, vec!["leak: [REDACTED:TOKEN] done"]);
}

#[test]
fn stream_long_line_without_newline_keeps_carry_over() {
    let red = r();
    let mut s = StreamRedactor::new(red, 64);
    let mut out = Vec::new();
    let filler = "a".repeat(100);
    s.push(filler.as_bytes(), |l| out.extend_from_slice(l));
    s.push(b"s3cr3t-VALUE/wi", |l| out.extend_from_slice(l));
    s.push(&[b'x'; 10], |l| out.extend_from_slice(l));
    s.push(b"th+chars", |l| out.extend_from_slice(l));
    // a split value with junk in between is not the value
    s.push(b" s3cr3t-VALUE/with+chars", |l| out.extend_from_slice(l));
    s.push(&[b'y'; 200], |l| out.extend_from_slice(l));
    s.finish(|l| out.extend_from_slice(l));
    let text = String::from_utf8(out).unwrap();
    assert!(!text.contains("s3cr3t-VALUE/with+chars"));
    assert!(text.contains("[REDACTED:TOKEN]"));
}

#[test]
fn credential_shapes_are_found() {
    let aws = format!("AKIA{}", "ABCDEFGHIJKLMNOP");
    let gh = format!("ghp_{}", "a".repeat(36));
    let text = format!("key {aws} and {gh} and -----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY----- done");
    let hits = find_credentials(&text);
    let rules: Vec<_> = hits.iter().map(|h| h.2).collect();
    assert_eq!(
        rules,
        vec![
            Reason::CredentialAwsAccessKey,
            Reason::CredentialGithub,
            Reason::CredentialPrivateKey
        ]
    );
    let out = redact_credentials(&text, &hits);
    assert!(!out.contains("AKIA") && !out.contains("ghp_") && !out.contains("abc"));
    assert!(out.ends_with(" done"));
    assert!(find_credentials("task-list and risk-assessment AKIAshort").is_empty());
}
// ---- equivalence with the reference (the pre-automaton code) ----------

/// A secret value of a kind that stresses one thing or another.
fn gen_secret(rng: &mut Rng) -> String {
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    match rng.below(8) {
        // token-like
        0 | 1 => (0..8 + rng.below(30))
            .map(|_| char::from(*rng.pick(ALNUM)))
            .collect(),
        // with characters every encoding treats differently
        2 => (0..4 + rng.below(20))
            .map(|_| *rng.pick(&['a', 'Z', '9', '/', '+', '-', '_', ' ', '%', '=', '.', '~']))
            .collect(),
        // self-overlapping: chains of overlapping occurrences
        3 => {
            let unit: String = (0..1 + rng.below(3))
                .map(|_| *rng.pick(&['a', 'b', 'c']))
                .collect();
            let mut v = unit.repeat(2 + rng.below(4));
            if rng.below(2) == 0 {
                v.push_str(&unit[..1]);
            }
            v
        }
        // non-ASCII: matches and labels next to UTF-8 boundaries
        4 => (0..2 + rng.below(8))
            .map(|_| *rng.pick(&['é', 'a', '😀', 'ß', '-']))
            .collect(),
        // very short (only the plain form is a pattern)
        5 => (0..1 + rng.below(3))
            .map(|_| *rng.pick(&['a', 'b', 'é', 'Z']))
            .collect(),
        // what the filler is made of, so accidental matches happen
        6 => (0..3 + rng.below(6))
            .map(|_| *rng.pick(&['a', 'b', 'Y', 'W', 'F', 'h', '6', '1']))
            .collect(),
        _ => "s3cr3t-VALUE/with+chars".to_string(),
    }
}

fn gen_secrets(rng: &mut Rng) -> Vec<(String, String)> {
    let n = 1 + rng.below(3);
    let mut out: Vec<(String, String)> = Vec::new();
    for i in 0..n {
        let value = match rng.below(6) {
            // a duplicate of an earlier value (same patterns, two secrets)
            0 if !out.is_empty() => out[rng.below(out.len())].1.clone(),
            // a value inside another
            1 if out.iter().any(|(_, v)| !v.is_empty()) => {
                let full: Vec<&String> = out
                    .iter()
                    .map(|(_, v)| v)
                    .filter(|v| !v.is_empty())
                    .collect();
                let cs: Vec<char> = rng.pick(&full).chars().collect();
                let a = rng.below(cs.len());
                let b = a + 1 + rng.below(cs.len() - a);
                cs[a..b].iter().collect()
            }
            2 => String::new(), // ignored
            _ => gen_secret(rng),
        };
        out.push((format!("S{i}"), value));
    }
    out
}

/// Every form a value can take in a haystack, and base64 of it inside
/// a longer stream at each alignment.
fn encodings(value: &str, rng: &mut Rng) -> Vec<String> {
    let v = value.as_bytes();
    let mut out = vec![
        value.to_string(),
        mcpbox_policy::hex::encode(v),
        mcpbox_policy::hex::encode(v).to_ascii_uppercase(),
        url_encode(v, true),
        url_encode(v, false),
        url_encode(v, true).replace("%20", "+"),
    ];
    for alphabet in [B64_STD, B64_URL] {
        out.push(base64(v, alphabet, true));
        out.push(base64(v, alphabet, false));
        let mut data = b"xyz"[..rng.below(4)].to_vec();
        data.extend_from_slice(v);
        data.extend_from_slice(&b"tail!"[..rng.below(6)]);
        out.push(base64(&data, alphabet, rng.below(2) == 0));
    }
    out
}

/// A haystack: filler, encodings, their halves, overlapping repeats.
fn gen_hay(rng: &mut Rng, secrets: &[(String, String)]) -> String {
    let filler = [
        'a', 'b', 'x', 'Y', 'W', '0', '=', '%', '+', '/', ' ', 'é', '😀', '\n',
    ];
    let mut hay = String::new();
    for _ in 0..rng.below(12) {
        match rng.below(6) {
            0 | 1 => {
                for _ in 0..rng.below(20) {
                    hay.push(*rng.pick(&filler));
                }
            }
            _ => {
                let (_, value) = rng.pick(secrets);
                if value.is_empty() {
                    continue;
                }
                let encs = encodings(value, rng);
                let e = rng.pick(&encs).clone();
                let cs: Vec<char> = e.chars().collect();
                match rng.below(5) {
                    // a prefix or suffix only
                    0 => hay.extend(&cs[..rng.below(cs.len() + 1)]),
                    1 => hay.extend(&cs[rng.below(cs.len() + 1)..]),
                    // overlapping repeats: e then e without its head
                    2 => {
                        hay.push_str(&e);
                        hay.extend(&cs[rng.below(cs.len())..]);
                        hay.push_str(&e);
                    }
                    _ => hay.push_str(&e),
                }
            }
        }
    }
    hay
}

fn pair(secrets: &[(String, String)]) -> (Redactor, reference::Redactor) {
    let it = || secrets.iter().map(|(n, v)| (n.as_str(), v.as_bytes()));
    (Redactor::new(it()), reference::Redactor::new(it()))
}

/// Every search path the redactor can take (Teddy, the automaton
/// fallback, memmem) against the reference.
#[test]
fn fallback_searches_equal_the_reference() {
    let mut rng = Rng(0xFA11_BAC4_0000_0005);
    for round in 0..1500 {
        let secrets = gen_secrets(&mut rng);
        let (mut new, old) = pair(&secrets);
        new.force_fallback(1 + (round % 2) as u8);
        for _ in 0..4 {
            let hay = gen_hay(&mut rng, &secrets);
            let b = hay.as_bytes();
            assert_eq!(
                new.find(b),
                old.find(b),
                "round {round} {secrets:?} {hay:?}"
            );
            assert_eq!(new.occurs_in(b), !old.find(b).is_empty());
        }
    }
}

/// Splits `s` at `n` random char boundaries.
fn split(rng: &mut Rng, s: &str, n: usize) -> Vec<String> {
    let bounds: Vec<usize> = (0..=s.len()).filter(|&i| s.is_char_boundary(i)).collect();
    let mut cuts: Vec<usize> = (0..n).map(|_| *rng.pick(&bounds)).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut prev = 0;
    for c in cuts {
        out.push(s[prev..c].to_string());
        prev = c;
    }
    out.push(s[prev..].to_string());
    out
}

/// The relay's `redact_secrets` (a walk with `redact_str`, then
/// `redact_across` on the content texts), on the reference redactor.
fn relay_redact_secrets(r: &reference::Redactor, v: &mut Value, counts: &mut [usize]) -> bool {
    if r.is_empty() {
        return false;
    }
    let mut changed = walk_strings(v, &mut |s| match r.redact_str(s, counts) {
        Cow::Borrowed(_) => None,
        Cow::Owned(o) => Some(o),
    });
    // numbers, as their decimal text, become the redacted string
    fn numbers(r: &reference::Redactor, v: &mut Value, counts: &mut [usize]) -> bool {
        match v {
            Value::Number(n) => match r.redact_str(&n.to_string(), counts) {
                Cow::Owned(o) => {
                    *v = Value::String(o);
                    true
                }
                Cow::Borrowed(_) => false,
            },
            Value::Array(a) => a.iter_mut().fold(false, |c, x| numbers(r, x, counts) | c),
            Value::Object(m) => m.values_mut().fold(false, |c, x| numbers(r, x, counts) | c),
            _ => false,
        }
    }
    changed |= numbers(r, v, counts);
    if let Some(Value::Array(items)) = v.pointer_mut("/result/content") {
        let mut texts: Vec<&mut String> = items
            .iter_mut()
            .filter_map(|item| match item.get_mut("text") {
                Some(Value::String(t)) => Some(t),
                _ => None,
            })
            .collect();
        changed |= r.redact_across(&mut texts, counts);
    }
    changed
}

#[test]
fn redactor_equals_the_reference_on_generated_inputs() {
    let mut rng = Rng(0x0DDB_1A5E_5BAD_5EED);
    for round in 0..3000 {
        let secrets = gen_secrets(&mut rng);
        let (new, old) = pair(&secrets);
        assert_eq!(new.names(), old.names());
        assert_eq!(new.max_len(), old.max_len());
        assert_eq!(new.is_empty(), old.is_empty());
        let n = new.names().len();
        for _ in 0..8 {
            let hay = gen_hay(&mut rng, &secrets);
            let ctx = format!("round {round} secrets {secrets:?} hay {hay:?}");
            let b = hay.as_bytes();
            assert_eq!(new.find(b), old.find(b), "find: {ctx}");
            assert_eq!(
                new.occurs_in(b),
                !old.find(b).is_empty(),
                "occurs_in: {ctx}"
            );
            let (mut c1, mut c2) = (vec![0; n], vec![0; n]);
            let (r1, r2) = (new.redact_str(&hay, &mut c1), old.redact_str(&hay, &mut c2));
            assert_eq!(r1, r2, "redact_str: {ctx}");
            assert_eq!(
                matches!(r1, Cow::Owned(_)),
                matches!(r2, Cow::Owned(_)),
                "{ctx}"
            );
            assert_eq!(c1, c2, "redact_str counts: {ctx}");
            assert_eq!(
                new.redact_bytes(b, &mut c1),
                old.redact_bytes(b, &mut c2),
                "redact_bytes: {ctx}"
            );
            assert_eq!(new.safe_prefix(b), old.safe_prefix(b), "safe_prefix: {ctx}");
            assert_eq!(
                new.strip_partial_tail(&hay, &mut c1),
                old.strip_partial_tail(&hay, &mut c2),
                "strip_partial_tail: {ctx}"
            );
            // raw bytes cut anywhere, even inside a character
            let cut = rng.below(b.len() + 1);
            assert_eq!(new.find(&b[cut..]), old.find(&b[cut..]), "find tail: {ctx}");
            // split into pieces at char boundaries (some empty)
            let k = 1 + rng.below(5);
            let mut p1 = split(&mut rng, &hay, k);
            let mut p2 = p1.clone();
            let ch1 = new.redact_across(&mut p1.iter_mut().collect::<Vec<_>>(), &mut c1);
            let ch2 = old.redact_across(&mut p2.iter_mut().collect::<Vec<_>>(), &mut c2);
            assert_eq!((ch1, &p1), (ch2, &p2), "redact_across: {ctx}");
            assert_eq!(c1, c2, "counts: {ctx}");
        }
    }
}

#[test]
fn redact_json_equals_the_relay_walk_on_generated_messages() {
    let mut rng = Rng(0x5EC2_E7A1_1CE5_0001);
    for round in 0..2000 {
        let secrets = gen_secrets(&mut rng);
        let (new, old) = pair(&secrets);
        let n = new.names().len();
        let hay = gen_hay(&mut rng, &secrets);
        let k = rng.below(5);
        let pieces = split(&mut rng, &hay, k);
        let mut content: Vec<Value> = Vec::new();
        for p in &pieces {
            match rng.below(6) {
                0 => content.push(json!({"type": "image", "data": p})),
                1 => content.push(json!({"type": "text", "text": p, p.clone(): p})),
                2 => content.push(json!([p])),
                _ => content.push(json!({"type": "text", "text": p})),
            }
        }
        let key = gen_hay(&mut rng, &secrets);
        let mut msg = match rng.below(4) {
            0 => json!({"jsonrpc": "2.0", "method": "notifications/message",
                        "params": {"data": hay, key.clone(): [key, 1, null]}}),
            1 => json!({"jsonrpc": "2.0", "id": 1, "result": {"content": {"text": hay}}}),
            _ => json!({"jsonrpc": "2.0", "id": 1, "result": {"content": content,
                        "structuredContent": {key.clone(): key, "n": [pieces]}}}),
        };
        // (and lines::parse_json reads what serde_json writes, as serde_json does)
        let line = serde_json::to_vec(&msg).unwrap();
        assert_eq!(crate::lines::parse_json(&line).unwrap(), msg);
        let mut want = msg.clone();
        let (mut c1, mut c2) = (vec![0; n], vec![0; n]);
        let ch1 = new.redact_json(&mut msg, &mut c1);
        let ch2 = relay_redact_secrets(&old, &mut want, &mut c2);
        let ctx = format!("round {round} secrets {secrets:?} message {want}");
        assert_eq!(msg, want, "{ctx}");
        assert_eq!((ch1, &c1), (ch2, &c2), "{ctx}");
    }
}

#[test]
fn strip_cut_json_equals_the_relay_walk() {
    let mut rng = Rng(0xC077_0FF5_0000_0002);
    let marker = format!("\n{}", crate::compact::MARKER_PREFIX);
    for round in 0..2000 {
        let secrets = gen_secrets(&mut rng);
        let (new, old) = pair(&secrets);
        let n = new.names().len();
        let mut texts = Vec::new();
        for _ in 0..3 {
            let mut t = gen_hay(&mut rng, &secrets);
            if rng.below(3) > 0 {
                t.push_str(&format!("{marker}12 bytes]"));
            }
            texts.push(t);
        }
        let mut msg = json!({"id": 1, "result": {"content": [{"type": "text", "text": texts[0]}],
                             texts[1].clone(): texts[2]}});
        let mut want = msg.clone();
        let (mut c1, mut c2) = (vec![0; n], vec![0; n]);
        let ch1 = new.strip_cut_json(&mut msg, &mut c1);
        // relay.rs strip_cut_secrets on the reference
        let ch2 = !old.is_empty()
            && walk_strings(&mut want, &mut |s| {
                let at = s.rfind(&marker)?;
                let fixed = old.strip_partial_tail(&s[..at], &mut c2)?;
                Some(format!("{fixed}{}", &s[at..]))
            });
        assert_eq!(
            (ch1, &msg, &c1),
            (ch2, &want, &c2),
            "round {round} {secrets:?}"
        );
    }
}

#[test]
fn stream_redactor_equals_the_reference_under_any_chunking() {
    let mut rng = Rng(0x57E4_A11E_0000_0003);
    for round in 0..1500 {
        let secrets = gen_secrets(&mut rng);
        let (new, old) = pair(&secrets);
        let max_buf = 1 + rng.below(120);
        let mut a = StreamRedactor::new(new, max_buf);
        let mut b = reference::StreamRedactor::new(old, max_buf);
        let mut data = Vec::new();
        for _ in 0..1 + rng.below(6) {
            data.extend_from_slice(gen_hay(&mut rng, &secrets).as_bytes());
            if rng.below(2) == 0 {
                data.push(b'\n');
            }
        }
        let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
        let mut i = 0;
        while i < data.len() {
            let span = if rng.below(2) == 0 { 8 } else { 200 };
            let step = 1 + rng.below(span);
            let chunk = &data[i..(i + step).min(data.len())];
            a.push(chunk, |l| out_a.push(l.to_vec()));
            b.push(chunk, |l| out_b.push(l.to_vec()));
            i += step;
        }
        a.finish(|l| out_a.push(l.to_vec()));
        b.finish(|l| out_b.push(l.to_vec()));
        assert_eq!(
            out_a,
            out_b,
            "round {round} {secrets:?} {:?}",
            String::from_utf8_lossy(&data)
        );
        assert_eq!(a.counts, b.counts);
    }
}

#[test]
fn find_credentials_equals_the_reference_on_generated_text() {
    let mut rng = Rng(0xC2ED_0000_0000_0004);
    let parts: Vec<String> = SHAPES
        .iter()
        .map(|s| s.prefix.to_string())
        .chain(
            [
                "-----BEGIN ",
                "RSA PRIVATE KEY-----",
                "-----END ",
                "PRIVATE KEY-----",
                "CERTIFICATE-----",
                "\n",
                " ",
                "_",
                "-",
                "x",
                "é",
                "AAAAAAAA",
                "abcdefgh",
                "0123456789",
                "ABCDEFGHIJKLMNOP",
                "QRSTUVWXYZ012345",
            ]
            .iter()
            .map(|s| s.to_string()),
        )
        .collect();
    for round in 0..20_000 {
        let mut s = String::new();
        for _ in 0..rng.below(30) {
            let p = rng.pick(&parts);
            s.push_str(&p.repeat(1 + rng.below(if p.len() > 4 { 2 } else { 12 })));
        }
        let got = find_credentials(&s);
        let want = reference::find_credentials(&s);
        let got_codes: Vec<(usize, usize, &str)> =
            got.iter().map(|h| (h.0, h.1, h.2.as_str())).collect();
        assert_eq!(got_codes, want, "round {round} {s:?}");
        let want_hits: Vec<(usize, usize, Reason)> = want
            .iter()
            .map(|h| (h.0, h.1, Reason::from_code(h.2).unwrap()))
            .collect();
        assert_eq!(
            redact_credentials(&s, &got),
            redact_credentials(&s, &want_hits)
        );
    }
}

#[test]
fn duplicate_secret_values_count_for_the_first_secret() {
    let red = Redactor::new([("A", &b"same-value"[..]), ("B", &b"same-value"[..])]);
    let mut counts = vec![0, 0];
    assert_eq!(
        red.redact_str("x same-value y", &mut counts),
        "x [REDACTED:A] y"
    );
    assert_eq!(counts, vec![1, 0]);
}

#[test]
fn a_secret_of_digits_sent_as_a_number_is_redacted_as_its_text() {
    let r = Redactor::new([("PIN", &b"9071553018"[..])]);
    let mut counts = [0];
    let line = br#"{"jsonrpc":"2.0","id":7,"result":{"structuredContent":{"pin":9071553018,"n":-19071553018123,"ok":3}}}"#;
    let mut v = crate::lines::parse_json(line).unwrap();
    assert_eq!(
        r.redact_message(&mut v, line, &mut counts),
        Redacted::Changed
    );
    assert_eq!(v["result"]["structuredContent"]["pin"], "[REDACTED:PIN]");
    assert_eq!(v["result"]["structuredContent"]["n"], "-1[REDACTED:PIN]123");
    assert_eq!(v["result"]["structuredContent"]["ok"], 3);
    assert_eq!(v["id"], 7);
    assert_eq!(counts, [2]);
}

#[test]
fn a_secret_in_a_number_too_long_to_parse_exactly_refuses_the_message() {
    // 25 digits: past u64, read as an f64 that keeps 17 of them; its bytes
    // cannot be forwarded, nor its rounded value (the leading digits)
    let secret = "4929123456789012345678901";
    let r = Redactor::new([("ACCOUNT", secret.as_bytes())]);
    let mut counts = [0];
    let line = format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"n":{secret},"x":0.5}}}}"#);
    let mut v = crate::lines::parse_json(line.as_bytes()).unwrap();
    assert_eq!(
        r.redact_message(&mut v, line.as_bytes(), &mut counts),
        Redacted::Refused
    );
    // a float elsewhere and the secret only in a string: redacted, not refused
    let line = format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"s":"{secret}","x":0.5}}}}"#);
    let mut v = crate::lines::parse_json(line.as_bytes()).unwrap();
    assert_eq!(
        r.redact_message(&mut v, line.as_bytes(), &mut counts),
        Redacted::Changed
    );
    // a secret in an integer that fits 64 bits is redacted in place,
    // whatever floats the message holds besides
    let r2 = Redactor::new([("PIN", &b"9071553018"[..])]);
    let line = br#"{"jsonrpc":"2.0","id":7,"result":{"pin":9071553018,"x":0.5}}"#;
    let mut v = crate::lines::parse_json(line).unwrap();
    assert_eq!(
        r2.redact_message(&mut v, line, &mut counts[..1]),
        Redacted::Changed
    );
    assert_eq!(v["result"]["pin"], "[REDACTED:PIN]");
    // in a fraction or an exponent, its text is not the literal's: refused
    let line = br#"{"jsonrpc":"2.0","id":7,"result":{"pin":9071553018e0,"x":0.5}}"#;
    let mut v = crate::lines::parse_json(line).unwrap();
    assert_eq!(
        r2.redact_message(&mut v, line, &mut counts[..1]),
        Redacted::Refused
    );
    // digits inside a string next to an escaped quote are not a number
    let line = format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"s":"\"{secret}","x":0.5}}}}"#);
    let mut v = crate::lines::parse_json(line.as_bytes()).unwrap();
    assert_eq!(
        r.redact_message(&mut v, line.as_bytes(), &mut counts),
        Redacted::Changed
    );
}
