//! How an MCP server's tools are named in Switchyard: `<server>__<tool>`,
//! the tool's own name normalised to seed 000's tool-name rule
//! (`^[a-z][a-z0-9_]{0,63}$`), so MCP tools sit in `ext_agent_tools`,
//! `uses_tools` and the capabilities summary beside every other tool.

/// Separates the server's name from the tool's.
pub const SEPARATOR: &str = "__";

/// Longest registered tool name (seed 000's rule).
pub const MAX_TOOL_NAME: usize = 64;

/// Longest MCP server name: leaves room for the separator and a tool name
/// of at least 32 characters.
pub const MAX_SERVER_NAME: usize = 30;

/// Checks an MCP server name: `^[a-z][a-z0-9_]{0,29}$`, no `__` (it would
/// make namespaced names ambiguous).
pub fn check_server(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let ok = matches!(chars.next(), Some('a'..='z'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        && name.len() <= MAX_SERVER_NAME
        && !name.contains(SEPARATOR)
        && !name.ends_with('_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "MCP server name {name:?} must match ^[a-z][a-z0-9_]{{0,{}}}$ without \"__\" or a trailing \"_\"",
            MAX_SERVER_NAME - 1
        ))
    }
}

/// The registered name of `server`'s tool `tool`: camelCase and kebab-case
/// become snake_case, other characters `_`. `Err` when nothing usable is
/// left or the result is too long.
pub fn tool(server: &str, tool: &str) -> Result<String, String> {
    let mut out = String::with_capacity(tool.len() + 8);
    let mut prev_lower = false;
    for c in tool.chars() {
        if c.is_ascii_uppercase() {
            if prev_lower {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
            prev_lower = false;
        } else if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
            prev_lower = true;
        } else {
            out.push('_');
            prev_lower = false;
        }
    }
    // Collapse runs of `_` and trim them, so the separator stays unique.
    let mut collapsed = String::with_capacity(out.len());
    for part in out.split('_').filter(|p| !p.is_empty()) {
        if !collapsed.is_empty() {
            collapsed.push('_');
        }
        collapsed.push_str(part);
    }
    if collapsed.is_empty() {
        return Err(format!(
            "tool name {tool:?} has no letters or digits to name it by"
        ));
    }
    let name = format!("{server}{SEPARATOR}{collapsed}");
    if name.len() > MAX_TOOL_NAME {
        return Err(format!(
            "tool name {tool:?} makes {name:?}, longer than {MAX_TOOL_NAME} characters"
        ));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcp_tool_names_become_valid_namespaced_tool_names() {
        for (mcp, ours) in [
            ("echo", "everything__echo"),
            ("get-sum", "everything__get_sum"),
            ("longRunningOperation", "everything__long_running_operation"),
            ("read_text_file", "everything__read_text_file"),
            ("Get HTTP.Status", "everything__get_http_status"),
            ("__x__", "everything__x"),
            ("v2Tool", "everything__v2_tool"),
        ] {
            assert_eq!(tool("everything", mcp).as_deref(), Ok(ours), "{mcp}");
        }
    }

    #[test]
    fn names_that_cannot_be_made_valid_are_refused_with_the_reason() {
        assert!(tool("s", "---").unwrap_err().contains("no letters"));
        let long = "a".repeat(70);
        assert!(tool("s", &long).unwrap_err().contains("longer than 64"));
    }

    #[test]
    fn server_names_follow_the_rule_and_cannot_contain_the_separator() {
        for ok in ["fs", "everything", "a1_b2"] {
            assert!(check_server(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Fs", "1fs", "a__b", "fs_", "a-b", &"a".repeat(31)] {
            assert!(check_server(bad).is_err(), "{bad}");
        }
    }
}
