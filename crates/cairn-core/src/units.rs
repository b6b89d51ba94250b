//! Sizes for people: the one formatter behind the engine's messages and the CLI.

/// `n` bytes in binary units with `decimals` places ("1.5 GiB"; plain bytes below
/// 1 KiB).
pub fn bytes(n: u64, decimals: usize) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.decimals$} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn binary_units() {
        assert_eq!(super::bytes(512, 2), "512 B");
        assert_eq!(super::bytes(1536, 1), "1.5 KiB");
        assert_eq!(super::bytes(3 << 30, 2), "3.00 GiB");
    }
}
