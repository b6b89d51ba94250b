use crate::args::{Global, KeyCommand};
use anyhow::Result;
use cairn_core::repo::info::KeyChange;

pub fn run(g: &Global, k: KeyCommand) -> Result<i32> {
    let p = super::progress(g);
    // The password that opened it, kept for `passwd` (which warns of other keys
    // it still opens).
    let mut used = None;
    let mut repo = super::open_at(
        g,
        &super::repo_location(g)?,
        || {
            let pw = crate::ui::password(g)?;
            used = Some(pw.clone());
            Ok(pw)
        },
        &p.progress,
    )?;
    match k {
        KeyCommand::List => {
            let keys = repo.key_infos()?;
            if g.json {
                super::print_json(&keys)?;
            } else if keys.is_empty()
                && repo.config().encryption == cairn_format::envelope::Encryption::None
            {
                // An empty table would read as keys lost.
                println!("this repository is not encrypted: it has no keys (no passwords)");
            } else {
                println!(" {:<10} {:<25} {:<16} user", "id", "created", "host");
                for k in &keys {
                    let cur = if k.current { "*" } else { " " };
                    match &k.error {
                        None => println!(
                            "{cur}{:<10} {:<25} {:<16} {}",
                            k.id.short(),
                            // In local time, as every other listing shows times
                            // (QA r29: UTC here); --json keeps the stored form.
                            k.created
                                .as_deref()
                                .map(cairn_core::time::local_display)
                                .unwrap_or_default(),
                            k.hostname.as_deref().unwrap_or(""),
                            k.username.as_deref().unwrap_or("")
                        ),
                        Some(e) => println!("{cur}{:<10} damaged: {e}", k.id.short()),
                    }
                }
            }
        }
        KeyCommand::Add(np) => {
            let pw = crate::ui::new_password(np.new_password_file.as_ref())?;
            let id = repo.add_key(&pw)?;
            if g.json {
                super::print_json(&KeyChange {
                    id: Some(id),
                    removed: None,
                })?;
            } else if !g.quiet {
                println!("added key {}", id.short());
            }
        }
        KeyCommand::Passwd(np) => {
            let pw = crate::ui::new_password(np.new_password_file.as_ref())?;
            let id = repo.change_password(&pw)?;
            // Keys made with the same password still open the repository with it.
            // The change is made: a failure to look is said, not an error.
            let still = match &used {
                Some(old) => repo.other_keys_opening_with(old).unwrap_or_else(|e| {
                    crate::ui::warn(format!(
                        "could not check whether other keys open with the old \
                         password: {e}"
                    ));
                    Vec::new()
                }),
                None => Vec::new(),
            };
            for k in &still {
                crate::ui::warn(format!(
                    "key {} also opens the repository with the old password, and \
                     still does: change it too, or remove it (cairn key remove {})",
                    k.short(),
                    k.short()
                ));
            }
            if g.json {
                super::print_json(&KeyChange {
                    id: Some(id),
                    removed: None,
                })?;
            } else if !g.quiet {
                println!(
                    "password changed (new key {}); no data was re-encrypted",
                    id.short()
                );
            }
        }
        KeyCommand::Remove { id } => {
            let kid = repo.find_key(&id)?;
            repo.remove_key(kid)?;
            if g.json {
                super::print_json(&KeyChange {
                    id: None,
                    removed: Some(kid),
                })?;
            } else if !g.quiet {
                println!("removed key {}", kid.short());
            }
        }
    }
    Ok(0)
}
