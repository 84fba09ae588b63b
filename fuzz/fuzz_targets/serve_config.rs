//! The `mcpbox serve` config parser: `ServeConfig::from_str` on arbitrary
//! UTF-8, and the `/mcp` names of what parses.
//!
//! Input layout: the config text, optionally followed by a NUL and tool
//! names separated by NULs.
//!
//! Invariants:
//! - nothing panics (convention 4: the policy crate never panics on input);
//! - the effective config (`to_toml`, what `mcpbox check` prints) parses
//!   again, to the same config;
//! - for every configured server and every non-empty tool name,
//!   `<server>__<tool>` splits back into exactly that server and tool: no
//!   name of one server can pass for another's on the aggregated endpoint
//!   (an empty name splits into nothing, so it reaches no server).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use mcpbox_policy::serve::{split_tool_name, tool_name, ServeConfig};

const FILE: &str = "/fuzz/serve.toml";

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    let (text, tools) = text.split_once('\0').unwrap_or((text, ""));
    let Ok(config) = ServeConfig::from_str(text, Path::new(FILE)) else {
        return;
    };
    let printed = config.to_toml();
    let again = match ServeConfig::from_str(&printed, Path::new(FILE)) {
        Ok(c) => c,
        Err(e) => panic!("the effective config does not parse again: {e}\n{printed}"),
    };
    assert_eq!(again, config, "the effective config is another config");
    for server in &config.servers {
        for tool in tools.split('\0') {
            let name = tool_name(&server.name, tool);
            if tool.is_empty() {
                assert_eq!(split_tool_name(&name), None, "{name:?} names a tool");
                continue;
            }
            assert_eq!(
                split_tool_name(&name),
                Some((server.name.as_str(), tool)),
                "{name:?} does not split back"
            );
        }
    }
});
