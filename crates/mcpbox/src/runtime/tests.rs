//! Discovery over made-up host layouts in a temporary directory.

use super::*;

fn spec(argv0: &str) -> Spec {
    Spec {
        argv: vec![argv0.into()],
        env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
        input: None,
        output: None,
        tmp_size: 1 << 20,
        tmp_dir: None,
        mounts: Vec::new(),
        limits: Default::default(),
        allow_exec: None,
        allow_degraded: false,
        stdio: mcpbox_sandbox::Stdio::Inherit,
        egress: None,
        cgroup_parent: None,
    }
}

fn write_exec(p: &Path, body: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, body).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_directory_at_the_top_or_a_home_is_never_chosen() {
    let home = Some(Path::new("/srv/users/me"));
    for d in [
        "/",
        "/opt",
        "/tmp",
        "/home/u",
        "/root",
        "/srv/users",
        "/srv/users/me",
    ] {
        assert!(too_broad(Path::new(d), home), "{d}");
    }
    for d in [
        "/opt/venv",
        "/srv/users/me/proj",
        "/root/.pyenv/versions/3.11.7",
    ] {
        assert!(!too_broad(Path::new(d), home), "{d}");
    }
}

#[test]
fn a_venv_script_mounts_the_venv_and_its_base_interpreter_prefix() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("pyenv/versions/3.99.0");
    std::fs::create_dir_all(base.join("lib/python3.99")).unwrap();
    // the base interpreter: any ELF does; its loader is in /lib64
    std::fs::copy("/usr/bin/true", base.join("bin-tmp")).ok();
    std::fs::create_dir_all(base.join("bin")).unwrap();
    std::fs::rename(base.join("bin-tmp"), base.join("bin/python3.99")).unwrap();
    let venv = t.path().join("proj/.venv");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::os::unix::fs::symlink(base.join("bin/python3.99"), venv.join("bin/python")).unwrap();
    std::fs::write(
        venv.join("pyvenv.cfg"),
        format!("home = {}\n", base.join("bin").display()),
    )
    .unwrap();
    let script = venv.join("bin/server");
    write_exec(
        &script,
        &format!("#!{}\nprint()\n", venv.join("bin/python").display()),
    );
    let mut s = spec(script.to_str().unwrap());
    let found = discover(&mut s, OsStr::new("")).unwrap();
    let paths: Vec<_> = found.mounts.iter().map(|m| m.path.clone()).collect();
    assert_eq!(paths, vec![venv.clone(), base.clone()], "{found:?}");
    assert!(s.mounts.iter().all(|m| !m.writable && m.at == m.host));
}

#[test]
fn a_bare_name_is_found_on_the_callers_path_and_run_by_its_path() {
    let t = tempfile::tempdir().unwrap();
    let tool = t.path().join("tools/bin/my-server");
    write_exec(&tool, "#!/bin/sh\n");
    std::fs::create_dir_all(t.path().join("tools/lib")).unwrap();
    let mut s = spec("my-server");
    let path = format!("/nonexistent:{}", tool.parent().unwrap().display());
    let found = discover(&mut s, OsStr::new(&path)).unwrap();
    assert_eq!(s.argv[0], tool.as_os_str());
    assert_eq!(found.mounts[0].path, t.path().join("tools"));
}

#[test]
fn an_env_shebang_puts_the_interpreters_directory_on_the_sandbox_path() {
    let t = tempfile::tempdir().unwrap();
    let node = t.path().join("nodejs/bin/mynode");
    std::fs::create_dir_all(node.parent().unwrap()).unwrap();
    std::fs::copy("/usr/bin/true", &node).unwrap();
    let app = t.path().join("app/node_modules/pkg/cli.js");
    write_exec(&app, "#!/usr/bin/env mynode\n");
    let mut s = spec(app.to_str().unwrap());
    let path = node.parent().unwrap().display().to_string();
    let found = discover(&mut s, OsStr::new(&path)).unwrap();
    let paths: Vec<_> = found.mounts.iter().map(|m| m.path.clone()).collect();
    assert!(
        paths.contains(&t.path().join("app/node_modules")),
        "{paths:?}"
    );
    assert!(paths.contains(&t.path().join("nodejs/bin")), "{paths:?}");
    let p = s.env.iter().find(|(k, _)| k == "PATH").unwrap();
    assert!(p.1.to_string_lossy().starts_with(&path), "{p:?}");
}

#[test]
fn a_runtime_inside_a_credential_location_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let tool = t.path().join("u/.ssh/bin/server");
    write_exec(&tool, "#!/bin/sh\n");
    let mut s = spec(tool.to_str().unwrap());
    let e = discover(&mut s, OsStr::new("")).unwrap_err();
    assert_eq!(e.kind, ".ssh");
    assert!(s.mounts.is_empty());
}

#[test]
fn system_and_workspace_commands_need_nothing() {
    for cmd in ["/bin/sh", "true", "/workspace/input/x"] {
        let mut s = spec(cmd);
        let found = discover(&mut s, OsStr::new("/usr/bin:/bin")).unwrap();
        assert!(
            found.mounts.is_empty() && s.mounts.is_empty(),
            "{cmd}: {found:?}"
        );
    }
}

fn argv_spec(words: &[&str]) -> Spec {
    let mut s = spec(words[0]);
    s.argv = words.iter().map(OsString::from).collect();
    s
}

fn mounted(found: &Found) -> Vec<PathBuf> {
    found.mounts.iter().map(|m| m.path.clone()).collect()
}

#[test]
fn node_file_mounts_the_scripts_package_tree_not_only_its_directory() {
    let t = tempfile::tempdir().unwrap();
    let pkg = t.path().join("proj");
    std::fs::create_dir_all(pkg.join("build")).unwrap();
    std::fs::create_dir_all(pkg.join("node_modules/dep")).unwrap();
    std::fs::write(pkg.join("package.json"), "{}").unwrap();
    std::fs::write(pkg.join("build/index.js"), "").unwrap();
    let script = pkg.join("build/index.js");
    let mut s = argv_spec(&["/usr/bin/node", "--no-warnings", script.to_str().unwrap()]);
    let found = discover(&mut s, OsStr::new("/usr/bin:/bin")).unwrap();
    assert_eq!(mounted(&found), vec![pkg.clone()], "{found:?}");
    assert!(found.mounts[0].reason.contains("package directory"));
    let mut s = argv_spec(&["python3", "-m", "srv"]);
    s.env.push(("PYTHONPATH".into(), pkg.join("build").into()));
    let found = discover(&mut s, OsStr::new("/usr/bin:/bin")).unwrap();
    assert_eq!(mounted(&found), vec![pkg.join("build")], "{found:?}");
}

#[test]
fn a_global_npm_command_is_followed_through_its_link_into_the_package() {
    let t = tempfile::tempdir().unwrap();
    let prefix = t.path().join("npm-global");
    let pkg = prefix.join("lib/node_modules/pkg");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(pkg.join("package.json"), "{}").unwrap();
    write_exec(&pkg.join("server.js"), "#!/usr/bin/env node\n");
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::os::unix::fs::symlink("../lib/node_modules/pkg/server.js", prefix.join("bin/pkg"))
        .unwrap();
    let mut s = spec(prefix.join("bin/pkg").to_str().unwrap());
    let found = discover(&mut s, OsStr::new("/usr/bin:/bin")).unwrap();
    // the link's directory (a link cannot be mounted alone) and the
    // package's node_modules tree; not the whole prefix beside them
    assert_eq!(
        mounted(&found),
        vec![prefix.join("bin"), prefix.join("lib/node_modules")],
        "{found:?}"
    );
}

#[test]
fn a_venv_the_policy_mounts_still_gets_the_interpreter_its_python_links_to() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("pyenv/versions/3.99.0");
    std::fs::create_dir_all(base.join("lib/python3.99")).unwrap();
    std::fs::create_dir_all(base.join("bin")).unwrap();
    std::fs::copy("/usr/bin/true", base.join("bin/python3.99")).unwrap();
    let venv = t.path().join("proj/.venv");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::os::unix::fs::symlink(base.join("bin/python3.99"), venv.join("bin/python")).unwrap();
    std::fs::write(venv.join("pyvenv.cfg"), "home = /nonexistent\n").unwrap();
    let mut s = argv_spec(&[venv.join("bin/python").to_str().unwrap(), "-m", "srv"]);
    // the policy shows the venv (as `wrap`'s policies did)
    s.mounts.push(BindMount {
        host: venv.clone(),
        at: venv.clone(),
        writable: false,
    });
    let found = discover(&mut s, OsStr::new("/usr/bin:/bin")).unwrap();
    assert_eq!(mounted(&found), vec![base.clone()], "{found:?}");
}

#[test]
fn a_script_kept_directly_in_a_home_mounts_the_file_alone_and_says_so() {
    let t = tempfile::tempdir().unwrap();
    // /home/NAME is a home whatever $HOME says
    let home = Path::new("/home").join(format!("mcpbox-test-{}", std::process::id()));
    if std::fs::create_dir_all(&home).is_err() {
        // only root may make one; the rule itself is too_broad's, above
        assert!(
            !mcpbox_sandbox::is_host_root(),
            "root cannot make {}",
            home.display()
        );
        return;
    }
    let script = home.join("server.py");
    std::fs::write(&script, "").unwrap();
    std::fs::write(home.join("pyproject.toml"), "").unwrap();
    let mut s = argv_spec(&["python3", script.to_str().unwrap()]);
    let found = discover(&mut s, OsStr::new("/usr/bin:/bin"));
    let _ = std::fs::remove_dir_all(&home);
    drop(t);
    let found = found.unwrap();
    assert_eq!(mounted(&found), vec![script.clone()], "{found:?}");
    assert!(
        found.notes.iter().any(|n| n
            .contains(&format!("{} (the package directory", home.display()))
            && n.contains("not mounted whole")),
        "{found:?}"
    );
}
