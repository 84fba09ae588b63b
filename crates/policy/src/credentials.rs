//! Credential locations: host paths that must not be mounted into a sandbox
//! unless a mount says `dangerously_allow_credentials = true`.
//!
//! The check is lexical: the binary canonicalizes the path first (resolving
//! symlinks), then asks here. It catches a path inside a credential location,
//! the location itself, and an ancestor that would expose one (a home directory,
//! `/home`, `/root`, `/`, or a `.config` / `snap` directory).

use std::path::{Component, Path};

/// Credential locations as component sequences, relative to a home directory
/// (they are matched anywhere in a path).
pub const CREDENTIAL_LOCATIONS: &[&str] = &[
    ".ssh",
    ".aws",
    ".config/gcloud",
    ".docker",
    ".kube",
    ".npmrc",
    ".netrc",
    ".pypirc",
    ".git-credentials",
    ".gnupg",
    ".azure",
    ".config/gh",
    ".password-store",
    ".vault-token",
    ".local/share/keyrings",
    // browser profiles (cookies, saved passwords, session tokens)
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
    ".config/BraveSoftware",
    ".config/microsoft-edge",
    ".config/vivaldi",
    ".config/opera",
    "snap/firefox",
    "snap/chromium",
    ".var/app/org.mozilla.firefox",
    ".var/app/com.google.Chrome",
    ".var/app/org.chromium.Chromium",
];

/// Directories that are, or contain, home directories: mounting one exposes
/// every credential location of its users.
fn is_home_or_above(parts: &[&str]) -> bool {
    matches!(
        parts,
        [] | ["home"]
            | ["home", _]
            | ["root"]
            | ["Users"]
            | ["Users", _]
            | ["var"]
            | ["var", "home"]
            | ["var", "home", _]
    )
}

/// Says whether `path` names a credential location, lies inside one, or is an
/// ancestor of one (so that mounting it would expose it). Returns the location,
/// e.g. `Some(".ssh")`. Only normal components count; the path should already
/// be canonical.
pub fn credential_kind(path: &Path) -> Option<&'static str> {
    let parts: Vec<&str> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    // inside or equal to a credential location
    for loc in CREDENTIAL_LOCATIONS {
        let seq: Vec<&str> = loc.split('/').collect();
        if parts.windows(seq.len()).any(|w| w == seq.as_slice()) {
            return Some(loc);
        }
    }
    // an ancestor: a home directory or above
    if path.has_root() && is_home_or_above(&parts) {
        return Some(".ssh");
    }
    // an ancestor: a proper prefix of a multi-component location ends the path
    // (`~/.config` holds `.config/gcloud`, `~/snap` holds `snap/firefox`)
    for loc in CREDENTIAL_LOCATIONS {
        let seq: Vec<&str> = loc.split('/').collect();
        for k in 1..seq.len() {
            if parts.ends_with(&seq[..k]) {
                return Some(loc);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(p: &str) -> Option<&'static str> {
        credential_kind(Path::new(p))
    }

    #[test]
    fn credential_folders_are_recognized() {
        assert_eq!(kind("/home/u/.ssh"), Some(".ssh"));
        assert_eq!(kind("/home/u/.ssh/id_ed25519"), Some(".ssh"));
        assert_eq!(kind("/root/.aws/credentials"), Some(".aws"));
        assert_eq!(kind("/home/u/.config/gcloud"), Some(".config/gcloud"));
        assert_eq!(kind("/home/u/.docker/config.json"), Some(".docker"));
        assert_eq!(kind("/home/u/.kube"), Some(".kube"));
        assert_eq!(kind("/home/u/.npmrc"), Some(".npmrc"));
        assert_eq!(kind("/home/u/.netrc"), Some(".netrc"));
        assert_eq!(kind("/home/u/.pypirc"), Some(".pypirc"));
        assert_eq!(kind("/home/u/.git-credentials"), Some(".git-credentials"));
        assert_eq!(kind("/home/u/.gnupg"), Some(".gnupg"));
        assert_eq!(kind("/home/u/.mozilla/firefox/x.default"), Some(".mozilla"));
        assert_eq!(
            kind("/home/u/.config/google-chrome/Default"),
            Some(".config/google-chrome")
        );
        assert_eq!(kind("/home/u/.config/chromium"), Some(".config/chromium"));
        assert_eq!(
            kind("/home/u/.config/BraveSoftware"),
            Some(".config/BraveSoftware")
        );
        assert_eq!(kind("/home/u/snap/firefox/common"), Some("snap/firefox"));
        // anywhere, not just under /home
        assert_eq!(kind("/srv/backup/.ssh"), Some(".ssh"));
    }

    #[test]
    fn ancestors_of_credential_folders_are_refused() {
        assert_eq!(kind("/home/u"), Some(".ssh"));
        assert_eq!(kind("/home"), Some(".ssh"));
        assert_eq!(kind("/root"), Some(".ssh"));
        assert_eq!(kind("/"), Some(".ssh"));
        assert_eq!(kind("/Users/alice"), Some(".ssh"));
        assert_eq!(kind("/home/u/.config"), Some(".config/gcloud"));
        assert_eq!(kind("/home/u/snap"), Some("snap/firefox"));
        assert_eq!(kind("/home/u/.local/share"), Some(".local/share/keyrings"));
    }

    #[test]
    fn ordinary_directories_pass() {
        assert_eq!(kind("/home/u/src/repo"), None);
        assert_eq!(kind("/opt/data"), None);
        assert_eq!(kind("/usr/share"), None);
        assert_eq!(kind("/home/u/.sshd"), None);
        assert_eq!(kind("/home/u/my.ssh"), None);
        assert_eq!(kind("/home/u/.config/nvim"), None);
        assert_eq!(kind("/root/project"), None);
    }
}
