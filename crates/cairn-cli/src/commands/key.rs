use crate::args::{Global, KeyCommand};
use anyhow::Result;

pub fn run(g: &Global, k: KeyCommand) -> Result<i32> {
    let mut repo = super::open(g)?;
    match k {
        KeyCommand::List => {
            let keys = repo.list_keys()?;
            if g.json {
                let v: Vec<_> = keys
                    .iter()
                    .map(|(id, kf)| match kf {
                        Ok(kf) => serde_json::json!({
                            "id": id.to_hex(), "current": Some(*id) == repo.key_id(),
                            "created": kf.created, "hostname": kf.hostname, "username": kf.username,
                        }),
                        Err(e) => serde_json::json!({"id": id.to_hex(), "error": e.to_string()}),
                    })
                    .collect();
                super::print_json(&v)?;
            } else {
                println!(" {:<10} {:<31} {:<16} user", "id", "created", "host");
                for (id, kf) in &keys {
                    let cur = if Some(*id) == repo.key_id() { "*" } else { " " };
                    match kf {
                        Ok(kf) => println!(
                            "{cur}{:<10} {:<31} {:<16} {}",
                            id.short(),
                            kf.created,
                            kf.hostname,
                            kf.username
                        ),
                        Err(e) => println!("{cur}{:<10} damaged: {e}", id.short()),
                    }
                }
            }
        }
        KeyCommand::Add(np) => {
            let pw = crate::ui::new_password(np.new_password_file.as_ref(), false)?;
            let id = repo.add_key(&pw)?;
            if g.json {
                super::print_json(&serde_json::json!({"id": id.to_hex()}))?;
            } else if !g.quiet {
                println!("added key {}", id.short());
            }
        }
        KeyCommand::Passwd(np) => {
            let pw = crate::ui::new_password(np.new_password_file.as_ref(), false)?;
            let id = repo.change_password(&pw)?;
            if g.json {
                super::print_json(&serde_json::json!({"id": id.to_hex()}))?;
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
                super::print_json(&serde_json::json!({"removed": kid.to_hex()}))?;
            } else if !g.quiet {
                println!("removed key {}", kid.short());
            }
        }
    }
    Ok(0)
}
