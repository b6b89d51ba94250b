use crate::args::{Global, RestoreArgs};
use crate::ui;
use anyhow::{Context, Result};
use cairn_core::restore::{self, RestoreOptions};
use cairn_core::session::{IndexLoad, Read};

/// Whether the restore is of some entries only (an include or exclude option,
/// or a file of them, given).
fn selects(a: &RestoreArgs) -> bool {
    !(a.includes.is_empty()
        && a.include_files.is_empty()
        && a.iincludes.is_empty()
        && a.iinclude_files.is_empty()
        && a.excludes.is_empty()
        && a.exclude_files.is_empty()
        && a.iexcludes.is_empty()
        && a.iexclude_files.is_empty())
}

pub fn run(g: &Global, a: &RestoreArgs) -> Result<i32> {
    // A bad --overwrite is refused before the password is asked for.
    let overwrite: restore::Overwrite = a
        .overwrite
        .parse()
        .map_err(|e: cairn_core::Error| super::bad_argument(e))?;
    let write_limit = super::rate_flag(&a.write_limit, "--write-limit")?;
    let xattrs = restore::XattrSelect::new(&a.include_xattrs, &a.exclude_xattrs)
        .map_err(super::bad_argument)?;
    let mut includes = a.includes.clone();
    includes.extend(read_path_files(&a.include_files, "--include-file")?);
    let mut iincludes = a.iincludes.clone();
    iincludes.extend(read_path_files(&a.iinclude_files, "--iinclude-file")?);
    let mut excludes = a.excludes.clone();
    excludes.extend(super::backup::read_exclude_files(&a.exclude_files)?);
    let mut iexcludes = a.iexcludes.clone();
    iexcludes.extend(super::backup::read_exclude_files(&a.iexclude_files)?);
    if a.image_fs.image_fs.is_some() && (selects(a) || a.delete) {
        return Err(super::bad_argument(
            "--image-fs restores the path it names: --include, --exclude and --delete do not apply",
        ));
    }
    // clap's `requires` lets --zeroed through beside --image-fs (it conflicts
    // with --image): refused here rather than ignored.
    if a.zeroed && !a.image {
        return Err(super::bad_argument(
            "--zeroed goes with --image onto a block device known to hold zeros",
        ));
    }
    let mut p = crate::events::CliProgress::listing(g, a.verbose);
    if a.dry_run {
        p.would();
    }
    let session = super::session::<Read>(g, "restore", IndexLoad::Placement, &p.progress)?;
    // `SNAP:PATH`: a directory of the snapshot as the target (ids and `latest`
    // hold no colon).
    let (spec, subfolder) = match a.snapshot.split_once(':') {
        Some((spec, path)) => (spec, Some(path.to_string())),
        None => (a.snapshot.as_str(), None),
    };
    let image_asked = a.image || a.image_fs.image_fs.is_some();
    if subfolder.is_some() && image_asked {
        return Err(super::bad_argument(
            "SNAP:PATH restores a directory of a file snapshot; an image is restored whole \
             (--image) or its files with --image-fs",
        ));
    }
    let snap = session.find_snapshot_matching(spec, &a.filter.engine())?;
    if subfolder.is_some() && snap.1.image.is_some() {
        return Err(super::bad_argument(format!(
            "snapshot {} is an image: SNAP:PATH restores a directory of a file snapshot \
             (an image's files: --image-fs)",
            snap.0.short()
        )));
    }
    if a.image_fs.image_fs.is_some() {
        p.start();
        let r = super::imagefs::restore(g, &session, &snap, a, overwrite, write_limit, &xattrs);
        p.finish();
        return r;
    }
    // An image is written block by block: there is no file to list (its files
    // are, with --image-fs).
    if a.verbose && (a.image || snap.1.image.is_some()) {
        return Err(super::bad_argument(
            "--verbose lists the files a restore writes; an image restore writes blocks \
             (--image-fs with -v lists the files it restores from the image)",
        ));
    }
    if a.image || snap.1.image.is_some() && is_device_or_image_target(&a.target) {
        return restore_image(g, a, &session, &snap, overwrite, write_limit, &mut p);
    }
    let opts = RestoreOptions {
        includes,
        iincludes,
        excludes,
        iexcludes,
        overwrite,
        delete: a.delete,
        verify: a.verify,
        dry_run: a.dry_run,
        write_limit,
        xattrs,
        list_files: a.verbose,
        subfolder,
        ..RestoreOptions::new(without_trailing_slashes(&a.target))
    };
    p.start();
    let r = restore::restore_snapshot(&session, &snap, &opts);
    p.finish();
    let r = r?;
    if p.progress.is_cancelled() && (!r.errors.is_empty() || r.cancelled_files > 0) {
        // What was waiting is marked as not restored in full (mode 0600): the files
        // in flight counted, other entries listed above. A restore run again
        // finishes the job.
        let mut what = Vec::new();
        if r.cancelled_files > 0 {
            what.push(format!(
                "{} being written left with the restore's time and mode 0600",
                ui::count(r.cancelled_files, "file")
            ));
        }
        if !r.errors.is_empty() {
            what.push(format!(
                "{} not restored, or not in full (listed above)",
                ui::count(r.errors.len() as u64, "entry")
            ));
        }
        return Err(
            anyhow::Error::from(cairn_core::Error::Cancelled).context(format!(
                "restore cancelled: {}; run it again to finish",
                what.join(", ")
            )),
        );
    }
    if g.json {
        super::print_json_report(&r)?;
    } else if !g.quiet {
        for p in &r.would_delete {
            // Escaped as listings are: a name with a newline cannot fake a line.
            println!("would delete {}", ui::printable(p));
        }
        let (verb, wrote) = if r.dry_run {
            ("would restore", "would write")
        } else {
            ("restored", "wrote")
        };
        // Files written in part are not in the counts: said on the same line
        // (QA r33: "wrote 0 files, 0 B" after writing into 202 files).
        let partly = if r.errors.is_empty() || r.dry_run {
            String::new()
        } else {
            // By path, as the last line counts them (one entry may have more
            // than one said of it).
            let paths: std::collections::HashSet<_> = r.errors.iter().map(|e| &e.path).collect();
            format!(
                "; {} not restored in full (below)",
                ui::count(paths.len() as u64, "more entry")
            )
        };
        println!(
            "{verb} snapshot {}{} to {}: {wrote} {}, {}, {} other, {}{}{partly}",
            r.snapshot_id.short(),
            r.subfolder
                .as_ref()
                .map(|p| format!(":{}", ui::printable(p)))
                .unwrap_or_default(),
            a.target.display(),
            ui::count(r.files, "file"),
            ui::count(r.dirs, "directory"),
            r.other_entries,
            ui::bytes(r.bytes),
            if r.dry_run {
                String::new()
            } else {
                format!(
                    " in {:.2}s ({})",
                    r.duration_secs,
                    ui::rate(r.bytes, r.duration_secs)
                )
            }
        );
        if r.kept > 0 || r.metadata_only > 0 || r.deleted > 0 || a.delete {
            let (keep, only, del) = if r.dry_run {
                ("would leave", "would set", "would delete")
            } else {
                ("left", "set", "deleted")
            };
            let mut parts = vec![format!(
                "{keep} {} ({}) as {} (--overwrite {})",
                ui::count(r.kept, "existing entry"),
                ui::bytes(r.kept_bytes),
                if r.kept == 1 { "it was" } else { "they were" },
                a.overwrite
            )];
            if r.metadata_only > 0 {
                parts.push(format!(
                    "{only} only the metadata of {} whose content was unchanged",
                    ui::count(r.metadata_only, "file")
                ));
            }
            if a.delete {
                parts.push(format!(
                    "{del} {} not in the snapshot",
                    ui::count(r.deleted, "entry")
                ));
            }
            if r.mounts_left > 0 {
                parts.push(format!(
                    "{} with another file system mounted left alone",
                    ui::count(r.mounts_left, "directory")
                ));
            }
            println!("{}", parts.join("; "));
        }
        // A dry run reads nothing back: what it would keep was compared, no more.
        if let Some(v) = r.verified.filter(|_| !r.dry_run) {
            // What this restore wrote is read back. What it left in place was
            // compared before it was kept under `if-changed` (bytes, not only size
            // and time, when verifying); `never` and `if-newer` keep entries
            // unread: say so.
            let in_place = r.kept + r.metadata_only;
            let compared = overwrite == restore::Overwrite::IfChanged;
            let outcome = if !r.errors.is_empty() {
                format!(
                    "{} (listed above)",
                    ui::count(r.errors.len() as u64, "problem")
                )
            } else if v == 0 && !(compared && in_place > 0) {
                "nothing was written to read back".to_string()
            } else {
                "all match".to_string()
            };
            if in_place == 0 {
                println!(
                    "verified {} against the snapshot: {outcome}",
                    ui::count(v, "file")
                );
            } else if compared {
                println!(
                    "verified {} written (read back) and {} left in place (compared \
                     before they were kept) against the snapshot: {outcome}",
                    ui::count(v, "file"),
                    ui::count(in_place, "entry")
                );
            } else {
                println!(
                    "verified {} written against the snapshot ({} left in place not \
                     read again; --overwrite always rewrites and verifies all): {outcome}",
                    ui::count(v, "file"),
                    ui::count(in_place, "entry")
                );
            }
        }
    }
    if r.sockets_skipped > 0 && !g.quiet && !g.json {
        crate::ui::note(format!(
            "{} {} (a socket is created by the program that listens on it)",
            ui::count(r.sockets_skipped, "socket"),
            match (r.dry_run, r.sockets_skipped == 1) {
                (true, _) => "would not be restored",
                (false, true) => "was not restored",
                (false, false) => "were not restored",
            }
        ));
    }
    super::warn_index_repaired(&p.progress, r.index_repaired.as_deref());
    if let Some(f) = &r.index_lookup_failures {
        p.progress.warning_msg(format!(
            "{} lookups in the local SSD index failed ({}); it was marked and is rebuilt \
             from the repository at the next run, which restores what this one could not",
            f.count, f.error
        ));
    }
    if !r.errors.is_empty() {
        // Entries, not messages: one entry may have more than one said of it.
        let entries = r
            .errors
            .iter()
            .map(|e| e.path.as_str())
            .collect::<std::collections::HashSet<_>>()
            .len() as u64;
        // Where the repository lacks what they need, what to do about it (QA:
        // the error alone, while `check` knew the index files were lost).
        let lost = r.errors.iter().any(|e| e.lost_data);
        let unreadable = session.repo().index_errors().len() as u64;
        let next = if unreadable > 0 {
            format!(
                "; {} could not be read: `cairn repair index` reads the packs back into \
                 the index, then restore again",
                ui::count(unreadable, "index file")
            )
        } else if lost {
            "; `cairn check --read-data` says what the repository lacks or holds damaged, \
             and what repairs it (`cairn repair index` when index files were lost)"
                .to_string()
        } else {
            String::new()
        };
        let message = if r.dry_run {
            format!(
                "{} could not be restored (listed above); nothing was written (dry run){next}",
                ui::count(entries, "entry")
            )
        } else {
            format!(
                "{} could not be restored completely (listed above); everything else was \
                 restored{next}",
                ui::count(entries, "entry")
            )
        };
        crate::report_error(g.json, &message, 1);
        return Ok(1);
    }
    // An image snapshot restored as a file: its zeros where the source failed.
    if r.files > 0 && !r.dry_run {
        return Ok(super::image_zeros_warning(
            super::image_unreadable(&snap.1),
            "the restored image file",
            cairn_core::repo::is_repaired(&snap.1),
        ));
    }
    Ok(0)
}

/// A target that only makes sense for an image: a block device, or a path that is
/// not a directory (restoring a file snapshot there would make a directory).
fn is_device_or_image_target(target: &std::path::Path) -> bool {
    cairn_core::ops::image::restore::is_block_device(target)
}

fn restore_image(
    g: &Global,
    a: &RestoreArgs,
    session: &cairn_core::Session<Read>,
    snap: &(cairn_format::SnapshotId, cairn_format::snapshot::Snapshot),
    overwrite: restore::Overwrite,
    write_limit: Option<u64>,
    p: &mut super::CliProgress,
) -> Result<i32> {
    use cairn_core::ops::image::restore::{ImageRestoreOptions, restore_image_snapshot};
    if selects(a) || a.delete || a.dry_run {
        return Err(super::bad_argument(
            "--include, --exclude, --delete and --dry-run do not apply to an image restore",
        ));
    }
    // Not standard output (QA: a file named `-` was written, and the summary went
    // down the pipe): the image is written at offsets, in parallel.
    if a.target.as_os_str() == "-" {
        return Err(super::bad_argument(format!(
            "--target - is not standard output for an image: give a file or block device \
             (`cairn dump {} NAME`, NAME as `cairn ls` shows it, writes the image to \
             standard output)",
            snap.0.short()
        )));
    }
    if a.zeroed && !is_device_or_image_target(&a.target) {
        // Said, not refused: the result is the same without it.
        crate::ui::note(format!(
            "--zeroed changes nothing on a file: {} gets the image's zero blocks as \
             holes either way",
            a.target.display()
        ));
    }
    let opts = ImageRestoreOptions {
        target: a.target.clone(),
        zeroed: a.zeroed,
        replace: overwrite == restore::Overwrite::Always,
        verify: a.verify,
        write_limit,
    };
    p.start();
    let r = restore_image_snapshot(session, snap, &opts);
    p.finish();
    let r = r.with_context(|| format!("image restore of snapshot {} failed", snap.0.short()))?;
    if g.json {
        super::print_json_report(&r)?;
    } else if !g.quiet {
        // What became of the zero blocks depends on the target (QA: "N blocks zero
        // left as holes" on a device, where they are zeroed or, with --zeroed,
        // not written).
        let zeros = if r.target_kind == "device" && !a.zeroed {
            format!("{} zero blocks zeroed", r.blocks_zeroed)
        } else if r.target_kind == "device" {
            format!(
                "{} zero blocks not written (--zeroed)",
                r.blocks_skipped_zero
            )
        } else {
            format!("{} zero blocks left as holes", r.blocks_skipped_zero)
        };
        println!(
            "restored image of snapshot {} to {} ({}): {} in {}: {} written ({}), {zeros}, in {:.2}s ({}){}",
            snap.0.short(),
            r.target.display(),
            r.target_kind,
            ui::bytes(r.size),
            ui::count(r.blocks, "block"),
            r.blocks_written,
            ui::bytes(r.bytes_written),
            r.duration_secs,
            ui::rate(r.size, r.duration_secs),
            if a.verify {
                format!("; verified {}", ui::count(r.blocks_verified, "block"))
            } else {
                String::new()
            }
        );
    }
    if r.device_bytes_left > 0 {
        crate::ui::note(format!(
            "{} is {} larger than the image: its last {} keep what they held (an old \
             backup partition table there, for one)",
            r.target.display(),
            ui::bytes(r.device_bytes_left),
            ui::bytes(r.device_bytes_left)
        ));
    }
    if !r.unreadable_at_backup.is_empty() {
        crate::ui::warn(format!(
            "{} of the image {} and hold zeros: {}",
            ui::count(r.unreadable_at_backup.len() as u64, "range"),
            super::unreadable_why(cairn_core::repo::is_repaired(&snap.1)),
            r.unreadable_at_backup
                .iter()
                .map(|(o, l)| format!("{o}..{}", o.saturating_add(*l)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        return Ok(crate::EXIT_INCOMPLETE);
    }
    Ok(0)
}

/// The snapshot paths and patterns that `--include-file` (`option`) lists, a line
/// each (`#` comments and empty lines skipped), as `--include` takes them: bytes
/// that are not UTF-8 kept as they are ([`cairn_core::ls::escape_arg`]).
fn read_path_files(files: &[std::path::PathBuf], option: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for f in files {
        out.extend(super::backup::listed_lines(f, "include")?);
    }
    if out.is_empty() && !files.is_empty() {
        anyhow::bail!("nothing to restore: the {option} list holds only comments and empty lines");
    }
    Ok(out)
}

/// `t/` names what `t` points to when `t` is a symlink: taken as `t`, so that a
/// target that is a symlink is refused however it is written (QA: `-t link/`
/// restored through the link, and a dangling one said "File exists").
fn without_trailing_slashes(target: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let bytes = target.as_os_str().as_bytes();
    let mut end = bytes.len();
    while end > 1 && bytes[end - 1] == b'/' {
        end -= 1;
    }
    std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&bytes[..end]))
}
