use crate::args::{ExportArgs, Global};
use anyhow::{Context, Result, bail};
use cairn_backend::direct::SequentialWriter;
use cairn_core::export::{self, ExportReport, Format};
use cairn_core::session::{IndexLoad, Read};
use std::io::{IsTerminal, Write};

pub fn run(g: &Global, a: &ExportArgs) -> Result<i32> {
    // `-o -` is standard output, as for tar.
    let output = a
        .output
        .as_deref()
        .filter(|o| *o != std::path::Path::new("-"));
    // As the file is named, unless said (QA: `-o out.zip` wrote a tar; QA r29:
    // `-o x.tar.zst` wrote a plain tar).
    let format_name = match a.format.as_deref() {
        Some(f) => f,
        None => named_format(output)?,
    };
    // tar.zst: the tar stream through zstd, as `tar --zstd` reads it.
    let zstd = format_name == "tar.zst";
    let format: Format = if zstd { "tar" } else { format_name }.parse()?;
    if output.is_none() && std::io::stdout().is_terminal() {
        bail!(
            "refusing to write a {format_name} archive to the terminal: redirect standard \
             output (> file, | tape) or give --output FILE"
        );
    }
    let mut p = super::progress(g);
    let session = super::session::<Read>(g, "export", IndexLoad::Placement, &p.progress)?;
    let (id, snap) = session.find_snapshot_matching(&a.snapshot, &a.filter.engine())?;
    let root = snap.tree_id()?;
    let path = a.path.as_deref().unwrap_or("/");
    let (r, aside) = write_output(
        g,
        session.repo(),
        output,
        format == Format::Tar && !zstd,
        false,
        ExportReport::is_whole,
        |out| {
            if !zstd {
                return export::export(&session, &root, path, format, out);
            }
            let io = |e: std::io::Error| cairn_core::Error::Io {
                path: "the archive".into(),
                source: e,
            };
            let mut z = zstd::stream::Encoder::new(out, 3).map_err(io)?;
            let r = export::export(&session, &root, path, format, &mut z)?;
            z.finish().map_err(io)?;
            Ok(r)
        },
    )?;
    let written = aside.as_deref().or(output);
    // The last phase ends before the report, which comes last.
    p.finish();
    if g.json {
        // The archive is on standard output unless --output: the report goes to
        // standard error then.
        // Which snapshot, what and where, beside the counts (QA: a script had
        // none of them).
        let mut v = serde_json::to_value(&r)?;
        if let Some(m) = v.as_object_mut() {
            m.insert("snapshot_id".into(), id.to_hex().into());
            m.insert("path".into(), path.into());
            m.insert("format".into(), format_name.into());
            m.insert(
                "output".into(),
                written
                    .map_or("-".into(), |o| o.to_string_lossy().into_owned())
                    .into(),
            );
        }
        if let Some(m) = v.as_object_mut() {
            m.insert(
                "resources".into(),
                serde_json::to_value(super::Resources::now())?,
            );
        }
        if output.is_some() {
            super::print_json(&v)?;
        } else if let Some(m) = v.as_object_mut() {
            // Standard error carries one JSON object per line (progress, warnings):
            // the report is one more, a "summary" event (QA r29: a pretty-printed
            // report split that stream).
            m.insert("type".into(), "summary".into());
            let _ = writeln!(std::io::stderr(), "{}", serde_json::to_string(&v)?);
        }
    } else if !g.quiet && output.is_some() {
        println!(
            "exported {}, {}, {} ({}) to {}",
            crate::ui::count(r.files, "file"),
            crate::ui::count(r.dirs, "directory"),
            crate::ui::count(r.other_entries, "other entry"),
            crate::ui::bytes(r.bytes),
            written.unwrap_or(std::path::Path::new("-")).display()
        );
    }
    let code = report(&r, g.json, g.quiet);
    incomplete_note(output, aside.as_deref(), g.json);
    Ok(super::worst(
        code,
        super::image_zeros_warning(
            super::image_unreadable(&snap),
            "the archive",
            cairn_core::repo::is_repaired(&snap),
        ),
    ))
}

/// The format an `--output` file's name asks for: zip for `*.zip`, tar.zst
/// for `*.tar.zst` and `*.tzst`, tar otherwise; a name of another compressor
/// (`.gz`, `.xz`, ...) is refused, not written as a plain tar under it.
fn named_format(output: Option<&std::path::Path>) -> Result<&'static str> {
    let Some(name) = output.and_then(|o| o.file_name()) else {
        return Ok("tar");
    };
    let name = name.to_string_lossy().to_ascii_lowercase();
    if name.ends_with(".zip") {
        return Ok("zip");
    }
    if name.ends_with(".tar.zst") || name.ends_with(".tzst") {
        return Ok("tar.zst");
    }
    for ext in [
        ".gz", ".tgz", ".bz2", ".tbz", ".tbz2", ".xz", ".txz", ".lz4", ".lz", ".lzma", ".z",
    ] {
        if name.ends_with(ext) {
            return Err(super::bad_argument(format!(
                "--output {name}: cairn writes tar, tar.zst and zip archives, not {}: name \
                 the file .tar, .tar.zst or .zip, or give --format, or pipe a tar through \
                 the compressor (cairn export SNAP | gzip > {name})",
                &ext[1..]
            )));
        }
    }
    Ok("tar")
}

/// The file `path` names once its symlinks are followed (a dangling link: the
/// name it would create), each of them root's or this user's
/// ([`cairn_core::restore::foreign_symlink_owner`]).
fn follow_links(path: &std::path::Path) -> Result<std::path::PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Some(uid) = cairn_core::restore::foreign_symlink_owner(&m) {
                    bail!(
                        "{} is a symlink of another user's (uid {uid}): name the file itself",
                        p.display()
                    );
                }
                let to = std::fs::read_link(&p)
                    .with_context(|| format!("reading the symlink {}", p.display()))?;
                p = match p.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            _ => return Ok(p),
        }
    }
    bail!("{}: too many levels of symbolic links", path.display())
}

/// Runs `produce` with where its bytes go: standard output (`None`), a device
/// or FIFO written in place, or a regular file written beside its name and
/// renamed once whole (a failed or killed run never leaves a file that looks
/// complete). `pad`: a tape's last record is padded (tar, not zip, whose end is
/// found from the end of the file). `sparse`: a regular file gets holes where
/// the stream has blocks of zeros (a file's content, as a restore writes it; QA:
/// a 3 GiB sparse file did not fit where its restore did). Shared by `export -o`
/// and `dump --target`. `whole`: whether what was produced is the snapshot's
/// content in full; an archive that is not (entries left out, zeros for what
/// could not be read) is kept beside the file as `FILE.incomplete`, which is
/// returned, and never replaces FILE (QA r23: an earlier, good archive was
/// replaced by one with zeros inside whose checksums held).
pub(super) fn write_output<R>(
    g: &Global,
    repo: &cairn_core::Repository,
    output: Option<&std::path::Path>,
    pad: bool,
    sparse: bool,
    whole: impl FnOnce(&R) -> bool,
    produce: impl FnOnce(&mut dyn Write) -> cairn_core::Result<R>,
) -> Result<(R, Option<std::path::PathBuf>)> {
    // Through symlinks the output goes where they point, as `> FILE` or GNU
    // tar's `-f` writes it (a file renamed over the link would replace the link
    // and leave its file as it was; a device is reached as `/dev/tape` is).
    let resolved = output.map(follow_links).transpose()?;
    // Never among the repository's own files (QA: `-o REPO/config` replaced the
    // config, and every command failed after it), as restore refuses such a target.
    if let (Some(given), Some(file)) = (output, resolved.as_deref())
        && let Some(repo_dir) = cairn_core::restore::inside_repository(repo, file)
    {
        bail!(
            "{} is inside the repository being read{repo_dir}: it would replace the \
             repository's own files; write it outside the repository",
            given.display()
        );
    }
    Ok(match resolved.as_deref() {
        None => {
            let mut out = ArchiveOut::stdout()?;
            // What was produced reaches the output even when the stream is cut
            // short: the error says how much came (QA: into `> FILE` none did).
            let r = produce(out.writer());
            let finished = out.finish(pad && r.is_ok());
            let r = r?;
            finished.context("writing standard output")?;
            (r, None)
        }
        Some(file)
            if std::fs::metadata(file)
                .is_ok_and(|m| !m.file_type().is_file() && !m.file_type().is_dir()) =>
        {
            // A tape or a FIFO: written in place. (Written beside and renamed, as a
            // file is, the archive would replace the device's node.)
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(file)
                .with_context(|| format!("opening {}", file.display()))?;
            let mut out =
                ArchiveOut::new(f).with_context(|| format!("opening {}", file.display()))?;
            let r = produce(out.writer());
            let finished = out.finish(pad && r.is_ok());
            let r = r?;
            finished.with_context(|| format!("writing {}", file.display()))?;
            (r, None)
        }
        Some(file) => {
            if file.is_dir() {
                bail!(
                    "{} is a directory: give the name of the file to write in it (DIR/NAME)",
                    file.display()
                );
            }
            // Written beside the file and renamed when complete: a failed export
            // never leaves a file that looks whole. The name is a fresh one, made
            // with O_EXCL (a fixed name in a directory others can write is one they
            // can put a symlink at), and removed if the export fails; its mode is
            // what `> FILE` would give (0666 less the umask).
            let dir = match file.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => std::path::Path::new("."),
            };
            // `.NAME.XXXXXX.partial` must still be a name (255 bytes): a long NAME is cut.
            use std::os::unix::ffi::OsStrExt;
            let base = file.file_name().unwrap_or_default().as_bytes();
            let mut prefix = std::ffi::OsString::from(".");
            prefix.push(std::ffi::OsStr::from_bytes(&base[..base.len().min(200)]));
            prefix.push(".");
            let (removed, freed) = partial::remove_stale(dir, &prefix);
            if removed > 0 && !g.quiet {
                crate::ui::note(format!(
                    "removed what an earlier export to {} left when it was killed ({})",
                    file.display(),
                    crate::ui::bytes(freed)
                ));
            }
            let create = || {
                tempfile::Builder::new()
                    .prefix(&prefix)
                    .suffix(".partial")
                    .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
                    .tempfile_in(dir)
                    // The OS's reason, without the temporary name tempfile puts in
                    // its message (QA: `.x.tar.pkftdW.partial` shown for a missing
                    // directory).
                    .map_err(|e| {
                        use std::io::ErrorKind as K;
                        let code = match e.kind() {
                            K::NotFound => libc::ENOENT,
                            K::PermissionDenied => libc::EACCES,
                            K::ReadOnlyFilesystem => libc::EROFS,
                            K::StorageFull => libc::ENOSPC,
                            K::QuotaExceeded => libc::EDQUOT,
                            K::NotADirectory => libc::ENOTDIR,
                            _ => return e,
                        };
                        std::io::Error::from_raw_os_error(code)
                    })
                    .with_context(|| format!("creating {}", file.display()))
                    .map(tempfile::NamedTempFile::into_parts)
            };
            // Held while it is written: a later export does not take it for
            // stale. One taken away in the instant between its making and its
            // lock (by an export starting then) is made again.
            let (mut f, mut partial) = create()?;
            for _ in 0..3 {
                partial::lock(&f);
                if f.metadata().is_ok_and(|m| {
                    use std::os::unix::fs::MetadataExt;
                    m.nlink() > 0
                }) {
                    break;
                }
                (f, partial) = create()?;
            }
            partial::remove_on_signals(&partial);
            let mut w = SequentialWriter::new(f)
                .with_context(|| format!("opening {}", partial.display()))?;
            if sparse {
                w = w.sparse();
            }
            let r = produce(&mut w)
                .and_then(|r| {
                    let f = w.finish().map_err(|e| cairn_core::Error::io(&partial, e))?;
                    f.sync_all()
                        .map_err(|e| cairn_core::Error::io(&partial, e))?;
                    Ok(r)
                })
                .inspect_err(|_| partial::forget())
                .map_err(|e| match e {
                    // The engine knows the archive or the output, not the file it
                    // goes to (QA: a full disk was "standard output").
                    cairn_core::Error::Io { path, source }
                        if [export::ARCHIVE, cairn_core::dump::OUTPUT]
                            .iter()
                            .any(|name| path.as_os_str() == *name) =>
                    {
                        anyhow::Error::from(source).context(format!(
                            "writing {} (nothing is left there)",
                            file.display()
                        ))
                    }
                    // A dump cut short: to a file, nothing of it is kept.
                    cairn_core::Error::Incomplete(m) => anyhow::anyhow!(
                        "{m} ({} was not written: nothing is left there)",
                        file.display()
                    ),
                    e => e.into(),
                })?;
            let shown = partial.display().to_string();
            // `NAME.incomplete` must still be a name (255 bytes): a long NAME is
            // cut (review: the rename failed, and the archive went with it).
            let incomplete = {
                let mut name = std::ffi::OsStr::from_bytes(&base[..base.len().min(244)]).to_owned();
                name.push(".incomplete");
                file.with_file_name(name)
            };
            let aside = (!whole(&r)).then(|| incomplete.clone());
            let to = aside.as_deref().unwrap_or(file);
            let persisted = partial.persist(to);
            partial::forget();
            persisted.with_context(|| format!("renaming {shown} to {}", to.display()))?;
            // One an earlier export left is not removed (it may be all there
            // is of what was lost since), but said: it is not this archive.
            if aside.is_none() && !g.quiet && std::fs::symlink_metadata(&incomplete).is_ok() {
                crate::ui::note(format!(
                    "{} is from an earlier export that was not whole; {} is whole",
                    incomplete.display(),
                    file.display()
                ));
            }
            (r, aside)
        }
    })
}

/// Says where an archive that is not whole went instead of `output` (after
/// the errors that say why; with `--json`, an event line).
pub(super) fn incomplete_note(
    output: Option<&std::path::Path>,
    aside: Option<&std::path::Path>,
    json: bool,
) {
    let (Some(file), Some(aside)) = (output, aside) else {
        return;
    };
    let message = format!(
        "the archive is not whole (above): written to {}, and {} was left as it was",
        aside.display(),
        file.display()
    );
    if json {
        let line = serde_json::json!({"type": "error", "message": message, "path": aside.to_string_lossy()});
        eprintln!("{line}");
    } else {
        eprintln!("{}", crate::ui::printable(&format!("error: {message}")));
    }
}

/// Prints what an export left out or changed on standard error (notes not with
/// `--quiet`; errors always); the exit code.
pub(super) fn report(r: &ExportReport, json: bool, quiet: bool) -> i32 {
    // With --json each is an event line, as progress and warnings are.
    let say = |kind: &str, path: Option<&str>, message: &str| {
        if json {
            let mut line = serde_json::json!({"type": kind, "message": message});
            if let Some(p) = path {
                line["path"] = p.into();
            }
            eprintln!("{line}");
        } else {
            let text = match path {
                Some(p) => format!("{kind}: {p}: {message}"),
                None => format!("{kind}: {message}"),
            };
            eprintln!("{}", crate::ui::printable(&text));
        }
    };
    for e in &r.errors {
        say(
            "error",
            Some(&e.path),
            &format!("{} (left out of the archive)", e.error),
        );
    }
    for d in &r.damaged {
        say(
            "error",
            Some(&d.path),
            &format!(
                "{} (in the archive with {} of zeros where it could not be read)",
                d.error,
                cairn_core::units::bytes(d.zeroed_bytes, 1)
            ),
        );
    }
    for n in r.notes.iter().filter(|_| !quiet) {
        say("note", None, n);
    }
    if r.errors.is_empty() && r.damaged.is_empty() {
        return 0;
    }
    // As a restore that could not write some entries: an error, the rest done.
    let mut what = Vec::new();
    if !r.errors.is_empty() {
        what.push(format!(
            "{} left out of the archive",
            crate::ui::count(r.errors.len() as u64, "entry")
        ));
    }
    if !r.damaged.is_empty() {
        what.push(format!(
            "{} in it with zeros where its content could not be read",
            crate::ui::count(r.damaged.len() as u64, "file")
        ));
    }
    crate::report_error(
        json,
        &format!(
            "{} (listed above); everything else is in it as it was saved",
            what.join(", ")
        ),
        1,
    );
    1
}

/// Where an archive or a file's bytes go: standard output, or a device or FIFO
/// named by `--output`. A regular file (`> archive.tar`) gets its bulk written
/// around the page cache ([`SequentialWriter`]); a pipe gets 1 MiB writes; a tape
/// (any other device) gets records of [`RECORD`] bytes, GNU tar's default, so that
/// `tar -xf /dev/nst0` reads it back (std's own standard output writes up to each
/// newline: a 2.3 GB tar took 800,000 writes of random sizes).
pub(super) enum ArchiveOut {
    File(SequentialWriter),
    Pipe(std::io::BufWriter<std::fs::File>),
    Device(Records<std::fs::File>),
}

/// GNU tar's default record: 20 blocks of 512 bytes.
pub(super) const RECORD: usize = 10240;

impl ArchiveOut {
    /// Standard output, through a descriptor of its own, not std's line-buffered
    /// handle (which would cut records at newlines); nothing else is written there.
    pub(super) fn stdout() -> Result<ArchiveOut> {
        use std::os::fd::AsFd;
        let fd = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .context("standard output")?;
        ArchiveOut::new(std::fs::File::from(fd)).context("standard output")
    }

    /// The writer that suits what `f` is.
    pub(super) fn new(f: std::fs::File) -> std::io::Result<ArchiveOut> {
        use std::os::unix::fs::FileTypeExt;
        let kind = f.metadata()?.file_type();
        Ok(if kind.is_file() {
            ArchiveOut::File(SequentialWriter::new(f)?)
        } else if kind.is_fifo() || kind.is_socket() {
            ArchiveOut::Pipe(std::io::BufWriter::with_capacity(1 << 20, f))
        } else {
            ArchiveOut::Device(Records::new(f))
        })
    }

    pub(super) fn writer(&mut self) -> &mut dyn Write {
        match self {
            ArchiveOut::File(w) => w,
            ArchiveOut::Pipe(w) => w,
            ArchiveOut::Device(w) => w,
        }
    }

    /// Writes what is still gathered; a file's position ends after the stream.
    /// An `archive` on a device is padded with zeros to a whole record, as tar pads
    /// its own (readers stop at the archive's end blocks); a file's bytes are not.
    pub(super) fn finish(self, archive: bool) -> std::io::Result<()> {
        match self {
            ArchiveOut::File(w) => w.finish().map(drop),
            ArchiveOut::Pipe(mut w) => w.flush(),
            ArchiveOut::Device(w) => w.finish(archive),
        }
    }
}

/// Writes in records of exactly [`RECORD`] bytes (the last one short unless
/// padded). `flush` passes on whole records only, so that a flush in the middle of
/// a stream does not leave a short block on a tape.
pub(super) struct Records<W: Write> {
    out: W,
    buf: Vec<u8>,
}

impl<W: Write> Records<W> {
    pub(super) fn new(out: W) -> Self {
        Records {
            out,
            buf: Vec::with_capacity(RECORD),
        }
    }

    pub(super) fn finish(mut self, pad: bool) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            if pad {
                self.buf.resize(RECORD, 0);
            }
            self.out.write_all(&self.buf)?;
        }
        self.out.flush()
    }
}

impl<W: Write> Write for Records<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.is_empty() && data.len() >= RECORD {
            // Whole records straight from the caller's buffer, without a copy.
            self.out.write_all(&data[..RECORD])?;
            return Ok(RECORD);
        }
        let n = data.len().min(RECORD - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == RECORD {
            self.out.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the size of every write it gets.
    #[derive(Default)]
    struct Sizes {
        writes: Vec<usize>,
        bytes: Vec<u8>,
    }

    impl Write for &mut Sizes {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.writes.push(data.len());
            self.bytes.extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_device_gets_whole_records_and_an_archive_is_padded() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8 + 1).collect();
        for pad in [true, false] {
            let mut sink = Sizes::default();
            let mut r = Records::new(&mut sink);
            // Small pieces, pieces of several records (written without a copy
            // when nothing is gathered) and a whole record at once.
            let mut rest = &data[..];
            for n in [3000, 25_000, RECORD, 1, 7, 40_000].into_iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (piece, tail) = rest.split_at(n.min(rest.len()));
                r.write_all(piece).unwrap();
                r.flush().unwrap();
                rest = tail;
            }
            r.finish(pad).unwrap();
            let (last, whole) = sink.writes.split_last().unwrap();
            assert!(whole.iter().all(|n| *n == RECORD), "{:?}", sink.writes);
            assert_eq!(sink.bytes[..data.len()], data[..]);
            if pad {
                assert_eq!(*last, RECORD);
                assert!(sink.bytes[data.len()..].iter().all(|b| *b == 0));
            } else {
                assert_eq!(*last, data.len() % RECORD);
                assert_eq!(sink.bytes.len(), data.len());
            }
        }
    }
}

/// The partial file an export to a regular file writes (`.NAME.XXXXXX.partial`,
/// renamed to NAME when complete): removed when the export fails, is interrupted
/// (Ctrl-C, SIGTERM), or, killed outright, by the next export to the same name.
mod partial {
    use std::ffi::{CString, OsStr};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::sync::atomic::{AtomicPtr, Ordering};

    /// The file the signal handler removes (a leaked C string), or null.
    static PATH: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

    /// Takes the partial file's lock: a partial no running export holds is stale.
    /// A failure only means a later export may not clean the file up.
    pub fn lock(f: &std::fs::File) {
        let _ = f.try_lock();
    }

    /// SIGINT, SIGTERM and SIGHUP (a closed terminal) remove `path` and end the
    /// process (exit 130), as the failed export would have removed it.
    pub fn remove_on_signals(path: &Path) {
        use nix::sys::signal::{SaFlags, Signal};
        let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
            return;
        };
        PATH.store(c.into_raw(), Ordering::SeqCst);
        extern "C" fn on_signal(_: libc::c_int) {
            let p = PATH.load(Ordering::SeqCst);
            #[allow(unsafe_code)]
            // SAFETY: unlink, write and _exit are async-signal-safe; `p` is null or a
            // C string leaked for the life of the process.
            unsafe {
                let said: &[u8] = if p.is_null() {
                    b"cairn: error: interrupted\n"
                } else {
                    libc::unlink(p);
                    b"cairn: error: interrupted; the unfinished output was removed\n"
                };
                libc::write(2, said.as_ptr().cast(), said.len());
                libc::_exit(130)
            }
        }
        // The handler only loads an atomic and calls unlink, write and _exit.
        crate::on_signals(
            on_signal,
            SaFlags::empty(),
            &[Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP],
        );
    }

    /// The partial file is renamed or removed: a signal now removes nothing.
    pub fn forget() {
        PATH.store(std::ptr::null_mut(), Ordering::SeqCst);
    }

    /// Removes partial files of earlier exports with this `prefix` (`.NAME.`) in
    /// `dir` that no running export holds (its lock); how many, and the bytes
    /// freed. Only regular files of this user are touched. Whatever their age
    /// (QA r37: an export killed and started again at once left its partial, which
    /// was then a minute old for no later run). An export holds its lock from
    /// the moment after it made the file, and makes it again if it was taken
    /// in that moment. A file system whose locks do not reach other machines
    /// (NFS mounted with `local_lock`) is one where exports to the same name
    /// from two machines at once must not be run (their renames would clash
    /// anyway).
    pub fn remove_stale(dir: &Path, prefix: &OsStr) -> (u64, u64) {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let Ok(entries) = std::fs::read_dir(dir) else {
            return (0, 0);
        };
        let euid = nix::unistd::geteuid().as_raw();
        let (mut removed, mut freed) = (0, 0);
        for ent in entries.flatten() {
            let name = ent.file_name();
            let (n, p) = (name.as_bytes(), prefix.as_bytes());
            // The prefix, tempfile's six random characters, the suffix.
            if n.len() != p.len() + 6 + ".partial".len()
                || !n.starts_with(p)
                || !n.ends_with(b".partial")
            {
                continue;
            }
            let path = ent.path();
            let Ok(f) = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&path)
            else {
                continue;
            };
            let Ok(meta) = f.metadata() else { continue };
            if !meta.is_file() || meta.uid() != euid {
                continue;
            }
            if f.try_lock().is_ok() && std::fs::remove_file(&path).is_ok() {
                removed += 1;
                freed += meta.len();
            }
        }
        (removed, freed)
    }
}
