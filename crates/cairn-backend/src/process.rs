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

/// This boot's id ("" if unknown): pids are only comparable within one boot.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Our pid namespace ("" if unknown): pids are only comparable within one.
pub fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A short tag for "this machine, this boot, this pid namespace": processes with
/// the same tag can compare pids. 16 hex digits of FNV-1a over host name, boot id
/// and pid namespace.
pub fn machine_tag() -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [hostname(), boot_id(), pid_namespace()] {
        for b in part.trim().bytes().chain([0u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}")
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

/// When the process `pid` started, in clock ticks since boot (`/proc/PID/stat`,
/// field 22): with the pid and the boot id, it names one process, also where pids
/// repeat from one start to the next (a server that is pid 1 in its container).
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // Fields from the third on, after the parenthesised name: field 22 is the 20th.
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_process_start_time_names_it() {
        let me = std::process::id();
        let t = super::start_ticks(me).unwrap();
        assert_eq!(super::start_ticks(me), Some(t));
        let mut child = std::process::Command::new("sleep")
            .arg("1")
            .spawn()
            .unwrap();
        let other = super::start_ticks(child.id()).unwrap();
        assert!(other >= t);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(super::start_ticks(child.id()), None);
    }
}
