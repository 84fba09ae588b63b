//! `extends`: a policy built on a preset (`extends = "preset:git"`) or on
//! another policy file (`extends = "base.toml"`, relative to the file).
//!
//! The merge works on the TOML tables, before the policy is validated, so that
//! the result is validated once, as a whole, and every error in the extending
//! file still points at its line:
//!
//! - tables merge key by key, recursively (`[tools]` gains or overrides
//!   patterns, `[env.set]` variables, `[network.hosts]` names);
//! - arrays and values replace (`network.allow`, `filesystem.mounts`,
//!   `tools.arguments`): a list is one decision, and a longer list inherited
//!   behind the reader's back would widen what a file seems to allow;
//! - a secret (`[secrets] NAME = {...}`) is replaced whole: its keys are
//!   alternatives (`from_env` or `from_file`), not additions;
//! - not inherited: `[[tests]]` (they are the examples of the file that
//!   writes them, checked when that file loads) and `server.name` (two
//!   policies on one preset are two servers, each named by its own file).
//!
//! Relative paths of a base file stay relative to that file; those of a preset
//! are relative to the extending file. The crate does no I/O: the caller
//! passes the function that reads a base file.

use std::path::{Path, PathBuf};

use toml::{Table, Value};

use crate::diagnostic::Diagnostic;
use crate::locate::Locations;
use crate::preset;
use crate::validate::resolve as resolve_path;
use crate::{serde_diagnostic, syntax_diagnostic, Policy, Result};

/// How many files deep `extends` may go; a longer chain is refused.
pub const MAX_DEPTH: usize = 8;

/// Reads a policy file that `extends` names.
pub type ReadFile<'a> = dyn FnMut(&Path) -> std::io::Result<String> + 'a;

/// One policy file, checked on its own, with its bases merged under it.
pub(crate) struct Layered {
    /// The file alone (no base), as deserialized; used when nothing is extended.
    pub(crate) own: Policy,
    /// Where the file's keys are.
    pub(crate) locs: Locations,
    /// With `extends`: the merged table, and what was extended.
    pub(crate) merged: Option<(Table, String)>,
}

/// Checks `text` alone (syntax, keys, types: errors point at its lines), then
/// merges the table it extends, recursively, under it.
pub(crate) fn layer(
    text: &str,
    file: &Path,
    base_dir: &Path,
    read: &mut ReadFile,
    chain: &mut Vec<PathBuf>,
) -> Result<Layered> {
    let locs = Locations::build(text).map_err(|e| syntax_diagnostic(text, file, &e))?;
    let own: Policy = toml::from_str(text).map_err(|e| serde_diagnostic(text, file, &locs, &e))?;
    let Some(extends) = own.extends.clone() else {
        return Ok(Layered {
            own,
            locs,
            merged: None,
        });
    };
    let at = |message: String, hint: String| {
        Diagnostic::new(file, locs.get("extends"), "extends", message).with_hint(hint)
    };
    let mut base = if let Some(name) = extends.strip_prefix(preset::PREFIX) {
        let Some(p) = preset::get(name) else {
            return Err(at(
                format!("unknown preset \"{}\"", name.escape_debug()),
                format!(
                    "known presets: {} (`mcpbox init --list` describes them)",
                    preset::names()
                ),
            ));
        };
        toml::from_str::<Table>(p.text).map_err(|e| syntax_diagnostic(p.text, &p.label(), &e))?
    } else {
        if extends.trim().is_empty() {
            return Err(at(
                "extends is empty".into(),
                "name a preset (\"preset:git\") or a policy file, or remove the key".into(),
            ));
        }
        let path = resolve_path(base_dir, Path::new(&extends));
        if let Some(i) = chain.iter().position(|p| p == &path) {
            let cycle: Vec<String> = chain[i..]
                .iter()
                .chain(std::iter::once(&path))
                .map(|p| p.display().to_string())
                .collect();
            return Err(at(
                format!("extends makes a cycle: {}", cycle.join(" -> ")),
                "a policy cannot build on itself: remove one of the extends".into(),
            ));
        }
        if chain.len() >= MAX_DEPTH {
            return Err(at(
                format!("extends goes more than {MAX_DEPTH} files deep"),
                "merge some of the base policies into one file".into(),
            ));
        }
        let base_text = read(&path).map_err(|e| {
            at(
                format!("cannot read {}: {e}", path.display()),
                "fix the path (relative to this policy file), or name a preset as \"preset:NAME\""
                    .into(),
            )
        })?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        chain.push(path.clone());
        let layered = layer(&base_text, &path, &dir, read, chain)?;
        chain.pop();
        let mut table = match layered.merged {
            Some((table, _)) => table,
            None => toml::from_str::<Table>(&base_text)
                .map_err(|e| syntax_diagnostic(&base_text, &path, &e))?,
        };
        table.remove("extends");
        rebase_paths(&mut table, &dir);
        table
    };
    base.remove("tests");
    if let Some(Value::Table(server)) = base.get_mut("server") {
        server.remove("name");
    }
    let mut own_table: Table =
        toml::from_str(text).map_err(|e| syntax_diagnostic(text, file, &e))?;
    own_table.remove("extends");
    merge(&mut base, own_table, "");
    Ok(Layered {
        own,
        locs,
        merged: Some((base, extends)),
    })
}

/// Merges `over` into `base`: tables key by key, everything else replaced.
fn merge(base: &mut Table, over: Table, path: &str) {
    for (key, value) in over {
        // a secret's keys are alternatives: replaced whole
        let whole = path == "secrets";
        match (base.get_mut(&key), value) {
            (Some(Value::Table(b)), Value::Table(o)) if !whole => {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                merge(b, o, &child);
            }
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Makes the relative host paths of a base file absolute (relative to its
/// own directory), so they keep meaning what they meant there.
fn rebase_paths(table: &mut Table, dir: &Path) {
    let rebase = |v: &mut Value| {
        if let Value::String(s) = v {
            if !Path::new(s.as_str()).is_absolute() {
                *s = resolve_path(dir, Path::new(s.as_str()))
                    .display()
                    .to_string();
            }
        }
    };
    if let Some(Value::Table(fs)) = table.get_mut("filesystem") {
        for key in ["input", "output"] {
            if let Some(v) = fs.get_mut(key) {
                rebase(v);
            }
        }
        if let Some(Value::Array(mounts)) = fs.get_mut("mounts") {
            for m in mounts {
                if let Some(v) = m.get_mut("host") {
                    rebase(v);
                }
            }
        }
    }
    if let Some(Value::Table(secrets)) = table.get_mut("secrets") {
        for (_, s) in secrets.iter_mut() {
            if let Some(v) = s.get_mut("from_file") {
                rebase(v);
            }
        }
    }
    if let Some(Value::Table(audit)) = table.get_mut("audit") {
        if let Some(v) = audit.get_mut("path") {
            rebase(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::{parse, parse_with, Verdict};

    use super::*;

    /// Parses `text` as `/p/top.toml`, with `files` as the other files on disk.
    fn parse_files(text: &str, files: &[(&str, &str)]) -> Result<Policy> {
        let files: BTreeMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect();
        parse_with(text, Path::new("/p/top.toml"), &mut |path: &Path| {
            files
                .get(path)
                .cloned()
                .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
        })
    }

    #[test]
    fn a_preset_is_the_base_and_the_files_keys_override_and_extend_it() {
        let p = parse(
            "extends = \"preset:filesystem\"\n[filesystem]\noutput = \"out\"\n\
             [tools]\nwrite_file = \"allow\"\n\"custom_*\" = \"approve\"\n",
            Path::new("/p/fs.toml"),
        )
        .unwrap();
        // inherited: input (relative to the extending file), limits, other rules
        assert_eq!(p.filesystem.input.as_deref(), Some(Path::new("/p")));
        assert_eq!(p.filesystem.output.as_deref(), Some(Path::new("/p/out")));
        assert_eq!(p.process.pids, 128);
        assert_eq!(p.extends.as_deref(), Some("preset:filesystem"));
        let decide = |t: &str| p.tools.decide(t, &crate::ToolHints::default()).verdict;
        assert_eq!(decide("read_text_file"), Verdict::Allow);
        assert_eq!(
            decide("edit_file"),
            Verdict::Deny,
            "a key not overridden stays"
        );
        // overridden key by key, and added
        assert_eq!(decide("write_file"), Verdict::Allow);
        assert_eq!(decide("custom_x"), Verdict::Approve);
        // not inherited: the name (the file's stem) and the preset's examples
        assert_eq!(p.name(), "fs");
        assert!(p.tests.is_empty());
    }

    #[test]
    fn arrays_replace_and_secrets_are_replaced_whole() {
        let p = parse(
            "extends = \"preset:github\"\n[network]\nallow = [\"api.github.com\"]\n\
             [secrets]\nGITHUB_PERSONAL_ACCESS_TOKEN = { from_file = \"token\" }\n",
            Path::new("/p/gh.toml"),
        )
        .unwrap();
        assert_eq!(
            p.network.allow.len(),
            1,
            "the registry is no longer allowed"
        );
        let s = &p.secrets["GITHUB_PERSONAL_ACCESS_TOKEN"];
        assert!(
            matches!(&s.source, crate::SecretSource::File(f) if f == Path::new("/p/token")),
            "{s:?}"
        );
    }

    #[test]
    fn an_unknown_preset_is_named_with_the_known_ones() {
        let e = parse("# mine\nextends = \"preset:gti\"\n", Path::new("/p/x.toml")).unwrap_err();
        assert_eq!(e.key, "extends");
        assert_eq!(e.location.map(|l| l.line), Some(2));
        assert!(e.message.contains("unknown preset \"gti\""), "{e}");
        let hint = e.hint.unwrap();
        for name in ["filesystem", "git", "time", "fetch"] {
            assert!(hint.contains(name), "{hint}");
        }
    }

    #[test]
    fn an_error_in_the_extending_file_points_at_its_own_line() {
        let e = parse(
            "extends = \"preset:time\"\n\n[process]\npids = 0\n",
            Path::new("/p/t.toml"),
        )
        .unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.location.map(|l| l.line)),
            ("process.pids", Some(4)),
            "{e}"
        );
        let e = parse(
            "extends = \"preset:time\"\n[netwrk]\n",
            Path::new("/p/t.toml"),
        )
        .unwrap_err();
        assert!(e.message.contains("unknown key `netwrk`"), "{e}");
        let e = parse("extends = 3\n", Path::new("/p/t.toml")).unwrap_err();
        assert_eq!(e.key, "extends", "{e}");
    }

    #[test]
    fn the_extending_files_own_tests_check_the_merged_policy() {
        let e = parse(
            "extends = \"preset:git\"\n[[tests]]\ntool = \"git_reset\"\nexpect = \"allow\"\n",
            Path::new("/p/g.toml"),
        )
        .unwrap_err();
        assert!(e.key.starts_with("tests[0]"), "{e}");
        parse(
            "extends = \"preset:git\"\n[tools]\ngit_reset = \"approve\"\n[[tests]]\ntool = \"git_reset\"\nexpect = \"approve\"\n",
            Path::new("/p/g.toml"),
        )
        .unwrap();
    }

    #[test]
    fn a_file_base_keeps_its_relative_paths_and_chains_to_a_preset() {
        let p = parse_files(
            "extends = \"base/common.toml\"\n[process]\npids = 32\n",
            &[(
                "/p/base/common.toml",
                "extends = \"preset:filesystem\"\n[server]\nname = \"base\"\n[filesystem]\ninput = \"data\"\n",
            )],
        )
        .unwrap();
        assert_eq!(
            p.filesystem.input.as_deref(),
            Some(Path::new("/p/base/data"))
        );
        assert_eq!(p.process.pids, 32);
        assert_eq!(p.name(), "top", "the base's name is not inherited");
        assert_eq!(
            p.filesystem.tmp,
            256 << 20,
            "from the preset, through the base"
        );
    }

    #[test]
    fn an_extends_cycle_is_refused_with_the_chain() {
        let e = parse_files(
            "extends = \"a.toml\"\n",
            &[
                ("/p/a.toml", "extends = \"b.toml\"\n"),
                ("/p/b.toml", "extends = \"./top.toml\"\n"),
            ],
        )
        .unwrap_err();
        assert!(
            e.message
                .contains("cycle: /p/top.toml -> /p/a.toml -> /p/b.toml -> /p/top.toml"),
            "{e}"
        );
        assert_eq!(e.file, Path::new("/p/b.toml"));
        let e = parse_files("extends = \"top.toml\"\n", &[]).unwrap_err();
        assert!(e.message.contains("cycle"), "a file extending itself: {e}");
    }

    #[test]
    fn a_missing_base_file_and_a_too_deep_chain_are_refused() {
        let e = parse_files("extends = \"nope.toml\"\n", &[]).unwrap_err();
        assert!(e.message.contains("cannot read /p/nope.toml"), "{e}");
        let files: Vec<(String, String)> = (0..20)
            .map(|i| {
                (
                    format!("/p/{i}.toml"),
                    format!("extends = \"{}.toml\"\n", i + 1),
                )
            })
            .collect();
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let e = parse_files("extends = \"0.toml\"\n", &refs).unwrap_err();
        assert!(e.message.contains("more than 8 files deep"), "{e}");
        // parse without a reader says files are not read there
        let e = parse("extends = \"x.toml\"\n", Path::new("/p/t.toml")).unwrap_err();
        assert!(e.message.contains("cannot read /p/x.toml"), "{e}");
    }

    #[test]
    fn an_invalid_inherited_value_names_where_it_came_from() {
        // the base sets an output equal to the input the top sets: the error is
        // on a key the top file does not have
        let e = parse_files(
            "extends = \"b.toml\"\n[filesystem]\ninput = \"/srv/x\"\n",
            &[("/p/b.toml", "[filesystem]\noutput = \"/srv/x\"\n")],
        )
        .unwrap_err();
        assert!(
            e.message.contains("inherited from extends = \"b.toml\""),
            "{e}"
        );
    }

    #[test]
    fn the_documented_extends_example_parses_as_documented() {
        let doc = include_str!("../../../docs/policy.md");
        let head = "```toml\nextends = \"preset:filesystem\"";
        let start = doc.find(head).expect("the example") + "```toml\n".len();
        let end = start + doc[start..].find("```").expect("block end");
        let p =
            parse(&doc[start..end], Path::new("/srv/fs.toml")).unwrap_or_else(|d| panic!("{d}"));
        assert_eq!(p.filesystem.input.as_deref(), Some(Path::new("/srv")));
        assert_eq!(p.filesystem.output.as_deref(), Some(Path::new("/srv/out")));
        let write = p.tools.decide("write_file", &crate::ToolHints::default());
        assert_eq!(write.verdict, Verdict::Allow);
    }
}
