//! A test that keeps ARCHITECTURE.md's list of crate arrows true: each
//! line `crate -> deps` must be exactly the `mcpbox-*` entries of that
//! crate's `[dependencies]` (dev-dependencies are not arrows).

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// `short name -> its mcpbox crates`, from the Cargo.toml files.
    fn from_cargo(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
        let mut out = BTreeMap::new();
        for entry in std::fs::read_dir(root.join("crates")).unwrap() {
            let manifest = entry.unwrap().path().join("Cargo.toml");
            let Ok(text) = std::fs::read_to_string(&manifest) else {
                continue;
            };
            let doc: toml::Table = text.parse().unwrap();
            let name = doc["package"]["name"].as_str().unwrap();
            let short = name.strip_prefix("mcpbox-").unwrap_or(name).to_string();
            let deps = doc
                .get("dependencies")
                .and_then(|d| d.as_table())
                .map(|t| {
                    t.keys()
                        .filter_map(|k| k.strip_prefix("mcpbox-"))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            out.insert(short, deps);
        }
        out
    }

    /// The same, from the first `text` block after the heading.
    fn from_doc(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
        let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
        let section = text
            .split("### The crates and their arrows")
            .nth(1)
            .expect("ARCHITECTURE.md has the arrows section");
        let block = section
            .split("```text\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("a text block of arrows");
        block
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let (name, deps) = l.split_once("->").expect("crate -> deps");
                (
                    name.trim().to_string(),
                    deps.split_whitespace().map(str::to_string).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn crate_arrows_are_the_cargo_files() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        assert_eq!(
            from_doc(&root),
            from_cargo(&root),
            "ARCHITECTURE.md's crate arrows differ from the Cargo.toml files"
        );
    }
}
