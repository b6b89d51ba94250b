//! Running work on several threads with the standard library only.

/// Runs `f` over `items` on up to `threads` threads, keeping the order. Items are
/// handed out one at a time, so uneven work (a tree pack next to a full data pack)
/// still keeps every thread busy.
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let threads = threads.min(items.len()).max(1);
    let next = AtomicUsize::new(0);
    let mut slots: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    let done: Vec<Vec<(usize, R)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        out.push((i, f(item)));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    for (i, r) in done.into_iter().flatten() {
        slots[i] = Some(r);
    }
    slots.into_iter().flatten().collect()
}

/// The thread count set by [`set_cores`] (0: not set).
static CORES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Sizes every pool of worker threads as if the machine had `n` cores (`--threads`,
/// `--priority low`): 0 goes back to the machine's own count. Set it before an
/// operation starts; pools are sized when they start.
pub fn set_cores(n: usize) {
    CORES.store(n, std::sync::atomic::Ordering::Relaxed);
}

/// The cores the engine's thread pools are sized for: the machine's, unless
/// [`set_cores`] said otherwise.
pub fn cores() -> usize {
    match CORES.load(std::sync::atomic::Ordering::Relaxed) {
        0 => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2),
        n => n,
    }
}

/// Slots for work that keeps a core busy (hashing, compressing, sealing), when
/// [`set_cores`] asked for fewer cores than the machine has (`--threads N`,
/// `--priority low`). The pools keep their size, since many of their threads wait
/// on reads, so the limit is on how many compute at once: without it, sixteen
/// backup workers used every core whatever `--threads` said.
struct Gate {
    busy: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
}

static GATE: Gate = Gate {
    busy: std::sync::Mutex::new(0),
    freed: std::sync::Condvar::new(),
};

/// A compute slot, given back on drop.
pub struct CpuSlot(());

impl Drop for CpuSlot {
    fn drop(&mut self) {
        *GATE.busy.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        GATE.freed.notify_one();
    }
}

/// Waits for a compute slot when the cores are limited ([`Gate`]); `None`, at once,
/// when they are not.
pub fn cpu_slot() -> Option<CpuSlot> {
    // Called per chunk: nothing but a load when the cores are not limited, and the
    // machine's count (a walk through /proc and cgroup files) asked once.
    static MACHINE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let set = CORES.load(std::sync::atomic::Ordering::Relaxed);
    if set == 0 {
        return None;
    }
    let machine =
        *MACHINE.get_or_init(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    if set >= machine {
        return None;
    }
    let mut busy = GATE.busy.lock().unwrap_or_else(|e| e.into_inner());
    while *busy >= set {
        busy = GATE.freed.wait(busy).unwrap_or_else(|e| e.into_inner());
    }
    *busy += 1;
    Some(CpuSlot(()))
}
