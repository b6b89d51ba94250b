//! Fills a repository with N distinct 16-byte chunks in S snapshots, stored as a
//! backup stores them (see `cairn_plan::scale`): the scale table's repository.
//!
//! `CAIRN_PASSWORD=... cargo run --release -p cairn-plan --example scale-repo -- REPO N [S]`

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = || -> ! {
        eprintln!("usage: scale-repo REPO N [SNAPSHOTS]   (CAIRN_PASSWORD in the environment)");
        std::process::exit(2);
    };
    let (location, n, snaps) = match &args[..] {
        [_, l, n] => (l, n, "20"),
        [_, l, n, s] => (l, n, s.as_str()),
        _ => usage(),
    };
    let (Ok(blobs), Ok(snapshots)) = (n.parse::<u64>(), snaps.parse::<u64>()) else {
        usage()
    };
    let opts = cairn_plan::scale::ScaleOptions {
        blobs,
        snapshots,
        ..Default::default()
    };
    let password = std::env::var("CAIRN_PASSWORD").unwrap_or_default();
    let start = std::time::Instant::now();
    // Called once a snapshot's chunks are written.
    let report = |done: u64| {
        eprintln!(
            "scale-repo: {done} chunks in {:.0} s",
            start.elapsed().as_secs_f64()
        );
    };
    let built = cairn_core::Repository::open_at(
        location,
        &Default::default(),
        || Ok(password),
        &cairn_core::progress::Progress::none(),
    )
    .and_then(|repo| cairn_plan::scale::build(&repo, &opts, &report));
    match built {
        Ok(ids) => {
            for id in ids {
                println!("{}", id.to_hex());
            }
        }
        Err(e) => {
            eprintln!("scale-repo: {e}");
            std::process::exit(1);
        }
    }
}
