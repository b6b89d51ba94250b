//! `--image-fs PATH` on ls, dump and restore: files inside an image snapshot's
//! filesystem, read in place.

use crate::args::{Global, ImageFsArgs};
use crate::ui;
use anyhow::{Context, Result};
use cairn_core::ops::image::fs::ImageFs;
use cairn_format::snapshot::Snapshot;

fn open(
    session: &cairn_core::Session<cairn_core::session::Read>,
    snap: &Snapshot,
    a: &ImageFsArgs,
) -> Result<ImageFs> {
    // Ctrl-C stops a dump or restore between pieces of a file.
    Ok(
        ImageFs::open(session.repo(), snap, a.image_file.as_deref(), a.partition)
            .context("reading the image's filesystem")?
            .with_cancel(session.progress().cancel_token().clone()),
    )
}

pub fn ls(
    g: &Global,
    session: &cairn_core::Session<cairn_core::session::Read>,
    (id, snap): (cairn_format::SnapshotId, &Snapshot),
    a: &ImageFsArgs,
    long: bool,
    recursive: bool,
) -> Result<i32> {
    let path = a.image_fs.as_deref().unwrap_or("/");
    let fs = open(session, snap, a)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    // As a file snapshot's `ls --json`: written as the walk goes.
    let mut doc = super::JsonStream::new(format!(
        "{{\"snapshot\": {}, \"entries\": [",
        serde_json::to_string(&id)?
    ));
    // Entries that cannot be read are named on stderr as they are met, and
    // listed in the JSON document's "errors"; the listing goes on, and fails at
    // the end (exit 1). A path not in the image fails before any entry and
    // writes nothing.
    let mut errors: Vec<serde_json::Value> = Vec::new();
    let listed = fs.list(
        path,
        recursive,
        &mut |e| {
            if g.json {
                let line = serde_json::to_string(&e)
                    .map_err(|e| cairn_core::Error::Invalid(format!("writing JSON: {e}")))?;
                doc.item(&mut out, &line);
            } else if long {
                super::out_line(&mut out, &super::ls::long_line(&e));
            } else {
                super::out_line(&mut out, &e.path);
            }
            Ok(())
        },
        &mut |entry, e| {
            let message = e.to_string();
            ui::entry_error(&message);
            errors.push(serde_json::json!({ "path": entry, "message": message }));
        },
    );
    let unread = errors.len();
    if g.json && (listed.is_ok() || doc.started()) {
        let mut errors = errors;
        if let Err(e) = &listed {
            errors.push(serde_json::json!({ "path": path, "message": e.to_string() }));
        }
        let errors = serde_json::to_string(&errors)?;
        doc.finish(&mut out, &format!("], \"errors\": {errors}}}"));
    }
    super::flush_output(&mut out)?;
    failed(&fs, "the listing", listed.map_err(anyhow::Error::from))?;
    if unread > 0 {
        return failed(
            &fs,
            "the listing",
            Err(anyhow::anyhow!(
                "{} could not be read (named above; the rest was listed)",
                ui::count(unread as u64, "entry")
            )),
        );
    }
    Ok(zeros(&fs, "the listing"))
}

/// The warning and exit code when what was read lay where the source could not be
/// read at backup time.
fn zeros(fs: &ImageFs, what: &str) -> i32 {
    super::image_zeros_warning(fs.read_unreadable().unwrap_or(&[]), what, fs.repaired)
}

/// A failure, with the warning about unreadable ranges first when what was read
/// lay in one: the zeros there are likely why the filesystem looks corrupt (QA:
/// "corrupt filesystem" alone, the ranges not named).
fn failed<T>(fs: &ImageFs, what: &str, r: Result<T>) -> Result<T> {
    r.map_err(|e| {
        if zeros(fs, what) != 0 {
            e.context(format!(
                "the filesystem was read where the image {} (zeros there, see the warning)",
                super::unreadable_why(fs.repaired)
            ))
        } else {
            e
        }
    })
}

pub fn dump(
    session: &cairn_core::Session<cairn_core::session::Read>,
    snap: &Snapshot,
    a: &ImageFsArgs,
) -> Result<i32> {
    let path = a.image_fs.as_deref().unwrap_or("/");
    let fs = open(session, snap, a)?;
    let mut out = std::io::stdout().lock();
    failed(
        &fs,
        path,
        fs.dump(path, &mut out).map_err(anyhow::Error::from),
    )?;
    Ok(zeros(&fs, path))
}

pub fn restore(
    g: &Global,
    session: &cairn_core::Session<cairn_core::session::Read>,
    (id, snap): &(cairn_format::SnapshotId, Snapshot),
    args: &crate::args::RestoreArgs,
    overwrite: cairn_core::restore::Overwrite,
    write_limit: Option<u64>,
    xattrs: &cairn_core::restore::XattrSelect,
) -> Result<i32> {
    let (a, target) = (&args.image_fs, args.target.as_path());
    let path = a.image_fs.as_deref().unwrap_or("/");
    let fs = open(session, snap, a)?;
    let start = std::time::Instant::now();
    let r = failed(
        &fs,
        path,
        fs.restore(
            path,
            target,
            &cairn_core::ops::image::fs::FsRestoreOptions {
                overwrite,
                write_limit,
                xattrs,
                list: args.verbose.then(|| session.progress()),
                verify: args.verify,
                dry_run: args.dry_run,
            },
        )
        .with_context(|| format!("restoring {path} from the image")),
    )?;
    // Names from the image's file system: written out (`ui::printable`).
    for n in &r.notes {
        crate::ui::note(n);
    }
    for w in r.warnings.iter().chain(&r.kept_in_place_of_dirs) {
        crate::ui::warn(w);
    }
    for f in &r.failed {
        ui::entry_error(&f.error);
    }
    if g.json {
        // What a file restore's report says of the run too (QA r37: the
        // snapshot, the target, the mode and the ranges read as zeros were
        // missing).
        let mut j = serde_json::to_value(&r)?;
        if let Some(m) = j.as_object_mut() {
            m.insert("snapshot_id".into(), serde_json::to_value(id)?);
            m.insert("target".into(), target.to_string_lossy().into());
            m.insert("overwrite".into(), serde_json::to_value(overwrite)?);
            m.insert("duration_secs".into(), start.elapsed().as_secs_f64().into());
            m.insert("dry_run".into(), args.dry_run.into());
            m.insert(
                "unreadable_at_backup".into(),
                serde_json::to_value(fs.read_unreadable().unwrap_or(&[]))?,
            );
        }
        super::print_json_report(&j)?;
    } else if !g.quiet {
        let dry = args.dry_run;
        println!(
            "{} {path} from the image's filesystem to {}: {}, {}, {}, {}, {}{}{}",
            if dry { "would restore" } else { "restored" },
            target.display(),
            ui::count(r.files, "file"),
            ui::count(r.dirs, "directory"),
            ui::count(r.symlinks, "symlink"),
            ui::count(r.specials, "special file"),
            ui::bytes(r.bytes),
            if dry {
                String::new()
            } else {
                format!(" in {:.2}s", start.elapsed().as_secs_f64())
            },
            match (r.skipped, dry) {
                (0, _) => String::new(),
                (n, false) => format!(" ({} not restored)", ui::count(n, "socket")),
                (n, true) => format!(" ({} would not be restored)", ui::count(n, "socket")),
            }
        );
        if r.hardlinks > 0 || (r.xattrs > 0 && !dry) {
            if dry {
                println!("with {}", ui::count(r.hardlinks, "hard link"));
            } else {
                println!(
                    "with {} and {}",
                    ui::count(r.hardlinks, "hard link"),
                    ui::count(r.xattrs, "extended attribute")
                );
            }
        }
        if r.kept > 0 {
            println!(
                "{} {} in the target as {} (--overwrite {})",
                if dry { "would leave" } else { "left" },
                ui::count(r.kept, "existing entry"),
                if r.kept == 1 { "it was" } else { "they were" },
                args.overwrite
            );
        }
        if let Some(v) = r.verified {
            // Every problem counts, not only a read-back that differs: an entry
            // not restored was not verified either (QA r40: "all match" beside
            // a damaged blob).
            let outcome = match r.failed.len() {
                0 if v == 0 => "nothing to compare".to_string(),
                0 => "all match".to_string(),
                n => format!("{} (listed above)", ui::count(n as u64, "problem")),
            };
            let unread = if r.not_verified > 0 {
                format!(
                    "; {} not compared (left in place by --overwrite {}, or holding \
                     zeros where the image could not be read)",
                    ui::count(r.not_verified, "file"),
                    args.overwrite
                )
            } else {
                String::new()
            };
            println!(
                "verified {} against the image (read back, or compared before they \
                 were left in place): {outcome}{unread}",
                ui::count(v, "file"),
            );
        }
    }
    if !r.failed.is_empty() {
        return failed(
            &fs,
            path,
            Err(anyhow::anyhow!(
                "{} {} (listed above; the rest {})",
                ui::count(r.failed.len() as u64, "entry"),
                if args.dry_run {
                    "would not be restored"
                } else {
                    "could not be restored"
                },
                if args.dry_run {
                    "would be restored"
                } else {
                    "was restored"
                }
            )),
        );
    }
    let code = zeros(&fs, path);
    // The image could not give everything back as it was: done in part.
    Ok(if r.warnings.is_empty() {
        code
    } else {
        super::worst(code, crate::EXIT_INCOMPLETE)
    })
}
