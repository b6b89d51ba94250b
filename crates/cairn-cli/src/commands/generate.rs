//! `cairn generate`: shell completion scripts and man pages, made from the same
//! argument definitions the parser uses (so they never drift from the options).

use crate::args::GenerateArgs;
use anyhow::{Context, Result, bail};
use clap::CommandFactory;
use std::io::Write;
use std::path::Path;

pub fn run(a: &GenerateArgs) -> Result<i32> {
    use clap_complete::Shell;
    let shells = [
        (&a.bash_completion, Shell::Bash),
        (&a.zsh_completion, Shell::Zsh),
        (&a.fish_completion, Shell::Fish),
        (&a.powershell_completion, Shell::PowerShell),
    ];
    if shells.iter().all(|(f, _)| f.is_none()) && a.man.is_none() {
        bail!(
            "nothing to generate: give --bash-completion FILE, --zsh-completion FILE, \
             --fish-completion FILE, --powershell-completion FILE (- for standard output) \
             or --man DIR"
        );
    }
    let stdout = shells
        .iter()
        .filter(|(f, _)| f.as_deref() == Some(Path::new("-")))
        .count();
    if stdout > 1 {
        bail!("only one completion script can go to standard output (-)");
    }
    for (file, shell) in shells {
        let Some(file) = file else { continue };
        let mut script = Vec::new();
        clap_complete::generate(
            shell,
            &mut crate::args::Cli::command(),
            "cairn",
            &mut script,
        );
        write_out(file, &script)?;
    }
    if let Some(dir) = &a.man {
        if dir == Path::new("-") {
            bail!("--man writes a page per command: give a directory, not -");
        }
        man_pages(dir)?;
    }
    Ok(0)
}

/// `bytes` into `file`, or standard output for `-`. A regular file (or a new
/// one) appears whole: written beside it, then renamed. Anything else there is
/// written through, never replaced: a symlink (`/dev/stdout`, a distribution's
/// link into its completion directory), a device, a FIFO (QA: renaming over
/// them turned /dev/null into a file).
fn write_out(file: &Path, bytes: &[u8]) -> Result<()> {
    if file == Path::new("-") {
        let mut out = std::io::stdout().lock();
        out.write_all(bytes)?;
        out.flush()?;
        return Ok(());
    }
    match std::fs::symlink_metadata(file) {
        Ok(m) if m.is_dir() => bail!("{} is a directory: give a file's name", file.display()),
        Ok(m) if !m.is_file() => {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(file)
                .with_context(|| format!("opening {}", file.display()))?;
            f.write_all(bytes)
                .and_then(|()| f.flush())
                .with_context(|| format!("writing {}", file.display()))?;
            return Ok(());
        }
        _ => {}
    }
    // A fresh name made with O_EXCL (a fixed one, in a directory others can
    // write, is one they can put a symlink at); gone if the write fails.
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".cairn-generate-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .tempfile_in(dir)
        .with_context(|| format!("creating a file in {}", dir.display()))?;
    tmp.write_all(bytes)
        .with_context(|| format!("writing {}", tmp.path().display()))?;
    tmp.persist(file)
        .with_context(|| format!("writing {}", file.display()))?;
    Ok(())
}

/// `cairn.1` and one page per command (`cairn-backup.1`, `cairn-key-add.1`, ...).
fn man_pages(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut cmd = crate::args::Cli::command();
    cmd.build();
    let mut todo = vec![("cairn".to_string(), cmd)];
    while let Some((name, cmd)) = todo.pop() {
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let sub_name = format!("{name}-{}", sub.get_name());
            todo.push((sub_name.clone(), sub.clone().name(sub_name)));
        }
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd.clone().name(name.clone()))
            .render(&mut page)
            .with_context(|| format!("making the man page of {name}"))?;
        write_out(&dir.join(format!("{name}.1")), &page)?;
    }
    Ok(())
}
