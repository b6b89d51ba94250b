//! Facts about processes on this machine, used to tell whether the writer of a
//! temporary object or the holder of a lock still runs.

/// The machine's host name ("unknown" if it cannot be read).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Whether a process with this pid exists (in our pid namespace) and is not a
/// zombie: a killed job whose parent has not reaped it yet holds nothing.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X'))
        }
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}
