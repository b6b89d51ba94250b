//! Adds N synthetic entries to a repository's index, for benchmarks only: the
//! packs they name do not exist, so `check` reports the repository damaged
//! afterwards. What grows with the index (a mount's memory, the time to open a
//! session) can then be measured at a size whose data would not fit here.
//!
//! `CAIRN_PASSWORD=... cargo run --release -p cairn-plan --example synthetic-index -- REPO N`

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, location, n] = &args[..] else {
        eprintln!("usage: synthetic-index REPO N   (CAIRN_PASSWORD in the environment)");
        std::process::exit(2);
    };
    let Ok(n) = n.parse::<u64>() else {
        eprintln!("synthetic-index: N must be a number of entries, not {n:?}");
        std::process::exit(2);
    };
    let password = std::env::var("CAIRN_PASSWORD").unwrap_or_default();
    let added = cairn_core::Repository::open_at(
        location,
        &Default::default(),
        || Ok(password),
        &cairn_core::progress::Progress::none(),
    )
    .and_then(|repo| cairn_plan::machine::add_synthetic_index(&repo, n, 200_000));
    if let Err(e) = added {
        eprintln!("synthetic-index: {e}");
        std::process::exit(1);
    }
}
