//! What `/proc` tells about a process: its start time (to recognise a reused pid) and command
//! line.

/// Field 22 of `/proc/PID/stat` (`starttime`, clock ticks after boot); `None` when the process
/// does not exist or the file cannot be parsed.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// Field 22 of a `/proc/PID/stat` line. The command (field 2) is in parentheses and may hold
/// spaces and parentheses itself, so fields are counted after its last `)`: field 3 is the
/// first there.
pub(crate) fn parse_start_time(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// This process's command line, arguments joined by spaces (empty when unreadable).
pub(crate) fn command_line() -> String {
    std::fs::read("/proc/self/cmdline")
        .map(|b| {
            String::from_utf8_lossy(&b)
                .split('\0')
                .filter(|a| !a.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_field_22_counted_after_the_command() {
        let line =
            "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(line), Some(987_654));
        assert_eq!(parse_start_time("garbage"), None);
        assert_eq!(parse_start_time("1 (x) S 1"), None);
        assert!(start_time(std::process::id()).is_some());
        assert!(command_line().contains("runtime"));
    }
}
