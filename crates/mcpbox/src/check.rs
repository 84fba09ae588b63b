//! `mcpbox check FILE`: validate a policy against the file format and this
//! host, and print the effective policy. Never runs anything.

use std::path::Path;
use std::process::ExitCode;

use crate::preflight;

pub fn run(file: Option<&Path>, schema: bool) -> ExitCode {
    if schema {
        match serde_json::to_string_pretty(&mcpbox_policy::json_schema()) {
            Ok(s) => {
                println!("{s}");
                return ExitCode::SUCCESS;
            }
            Err(e) => {
                eprintln!("mcpbox: cannot render the schema: {e}");
                return ExitCode::from(1);
            }
        }
    }
    let Some(file) = file else {
        eprintln!("mcpbox: check needs a policy file");
        return ExitCode::from(2);
    };
    let loaded = match preflight::load(Some(file)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mcpbox: {e}");
            return ExitCode::from(1);
        }
    };
    // The same host checks `exec` makes, with a placeholder command.
    if let Err(e) = preflight::spec(&loaded, vec!["true".into()], mcpbox_sandbox::Stdio::Inherit) {
        eprintln!("mcpbox: {e}");
        return ExitCode::from(1);
    }
    println!(
        "# effective policy for {} (defaults filled in, paths resolved)",
        file.display()
    );
    print!("{}", loaded.policy.to_toml());
    ExitCode::SUCCESS
}
