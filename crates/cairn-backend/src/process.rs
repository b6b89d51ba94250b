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
/// `kill(pid, 0)` decides existence (it sees processes `/proc` may hide from us:
/// EPERM means "exists, not ours"); `/proc` only adds the zombie test.
pub fn alive(pid: u32) -> bool {
    use nix::errno::Errno;
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    if raw <= 0 {
        return false;
    }
    if let Err(Errno::ESRCH) = nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X'))
        }
        Err(_) => true,
    }
}
