//! The environment that points programs inside the sandbox at the proxy.

/// Environment variables for a sandbox whose bridge listens on
/// `127.0.0.1:port`: the usual proxy variables in both cases, npm's, pip's,
/// global-agent's, Node's (`NODE_USE_ENV_PROXY`, honoured by Node 24+), and
/// git's `http.proxy` through `GIT_CONFIG_COUNT`. A program that ignores all
/// of them simply has no network.
///
/// No `NO_PROXY`: loopback names go to the proxy like any other, so that a
/// request for a service on the user's machine (`http://localhost:8080`)
/// reaches the proxy, which connects it when `[network] local` opens the
/// port and otherwise refuses it with a reason and a record. Sent direct, it
/// would meet the sandbox's own empty loopback and fail with a bare
/// "connection refused" that nobody sees. A server that talks to a service
/// of its own on the sandbox's loopback through a proxy-honouring client
/// sets `NO_PROXY` in its policy (`[env] set`), which cannot widen anything:
/// a direct connection from the sandbox reaches only the sandbox.
///
/// The git entries use index 0: a caller that sets its own `GIT_CONFIG_*`
/// must renumber ([`merge_git_config`]).
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let mut env: Vec<(&str, String)> = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.push((name, url.clone()));
    }
    for name in ["http_proxy", "https_proxy", "all_proxy"] {
        env.push((name, url.clone()));
    }
    env.push(("npm_config_proxy", url.clone()));
    env.push(("npm_config_https_proxy", url.clone()));
    env.push(("PIP_PROXY", url.clone()));
    env.push(("GLOBAL_AGENT_HTTP_PROXY", url.clone()));
    env.push(("NODE_USE_ENV_PROXY", "1".into()));
    env.push(("GIT_CONFIG_COUNT", "1".into()));
    env.push(("GIT_CONFIG_KEY_0", "http.proxy".into()));
    env.push(("GIT_CONFIG_VALUE_0", url));
    env.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Adds the proxy's git entry after the ones `env` already has: with
/// `GIT_CONFIG_COUNT=n` there (a policy's own git settings), `http.proxy`
/// becomes entry `n` and the count `n + 1`; otherwise entry 0, count 1
/// (git-config(1), "GIT_CONFIG_COUNT"). The other proxy variables are set
/// as given (a policy may not set them: `mcpbox check` refuses it).
pub fn merge_git_config(env: &mut Vec<(String, String)>, port: u16) {
    let url = format!("http://127.0.0.1:{port}");
    let count = env
        .iter()
        .rev()
        .find(|(k, _)| k == "GIT_CONFIG_COUNT")
        .and_then(|(_, v)| v.parse::<u32>().ok())
        .unwrap_or(0);
    env.retain(|(k, _)| k != "GIT_CONFIG_COUNT");
    env.push((format!("GIT_CONFIG_KEY_{count}"), "http.proxy".into()));
    env.push((format!("GIT_CONFIG_VALUE_{count}"), url));
    env.push(("GIT_CONFIG_COUNT".into(), (count + 1).to_string()));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_is_pointed_at_the_bridge() {
        let env = proxy_env(3128);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        for k in [
            "HTTP_PROXY",
            "https_proxy",
            "ALL_PROXY",
            "npm_config_https_proxy",
            "PIP_PROXY",
            "GLOBAL_AGENT_HTTP_PROXY",
            "GIT_CONFIG_VALUE_0",
        ] {
            assert_eq!(get(k), Some("http://127.0.0.1:3128"), "{k}");
        }
        // loopback names go through the proxy too (see proxy_env)
        for k in [
            "NO_PROXY",
            "no_proxy",
            "npm_config_noproxy",
            "GLOBAL_AGENT_NO_PROXY",
        ] {
            assert_eq!(get(k), None, "{k}");
        }
        assert_eq!(get("GIT_CONFIG_KEY_0"), Some("http.proxy"));
        assert_eq!(get("NODE_USE_ENV_PROXY"), Some("1"));
    }

    #[test]
    fn the_policy_refuses_exactly_the_variables_set_here_but_gits() {
        let mut ours: Vec<&str> = Vec::new();
        let env = proxy_env(1);
        for (k, _) in &env {
            if !k.starts_with("GIT_CONFIG_") {
                ours.push(k);
            }
        }
        let mut policy: Vec<&str> = mcpbox_policy::PROXY_VARIABLES.to_vec();
        ours.sort();
        policy.sort();
        assert_eq!(ours, policy);
    }

    #[test]
    fn a_policys_git_config_is_kept_and_the_proxy_entry_follows_it() {
        let mut env = vec![
            ("GIT_CONFIG_COUNT".to_string(), "2".to_string()),
            ("GIT_CONFIG_KEY_0".into(), "user.name".into()),
            ("GIT_CONFIG_VALUE_0".into(), "agent".into()),
            ("GIT_CONFIG_KEY_1".into(), "safe.directory".into()),
            ("GIT_CONFIG_VALUE_1".into(), "*".into()),
        ];
        merge_git_config(&mut env, 3128);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("GIT_CONFIG_COUNT"), Some("3"));
        assert_eq!(get("GIT_CONFIG_KEY_0"), Some("user.name"));
        assert_eq!(get("GIT_CONFIG_KEY_2"), Some("http.proxy"));
        assert_eq!(get("GIT_CONFIG_VALUE_2"), Some("http://127.0.0.1:3128"));
        assert_eq!(
            env.iter().filter(|(k, _)| k == "GIT_CONFIG_COUNT").count(),
            1
        );
        let mut none = Vec::new();
        merge_git_config(&mut none, 1);
        assert_eq!(none.len(), 3);
    }
}
