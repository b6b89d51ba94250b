//! `cairn serve` and `cairn serve token ...`: flags to the server crate's options.

use crate::args::{Global, ScrubArgs, ServeArgs, ServeCommand, TokenCommand, UserCommand};
use anyhow::{Result, anyhow};
use cairn_server::config::{Flags, ServerConfig, default_state_dir};
use cairn_server::policy::Role;
use cairn_server::tokens::TokenStore;
use cairn_server::users::UserStore;

fn state_dir(a: &ServeArgs) -> Result<std::path::PathBuf> {
    if let Some(d) = &a.state_dir {
        return Ok(d.clone());
    }
    // The token commands must find the state directory the server uses: from its
    // settings file when one is given.
    if let Some(c) = &a.config
        && let Some(d) = cairn_server::config::FileConfig::load(c)?.state_dir
    {
        return Ok(d);
    }
    Ok(default_state_dir())
}

pub fn run(g: &Global, a: &ServeArgs) -> Result<i32> {
    if a.command.is_some()
        && let Some(flag) = a.server_only_flag()
    {
        anyhow::bail!(
            "{flag} is for running the server (`cairn serve {flag} ...`), not for its \
             token, user or scrub commands"
        );
    }
    match &a.command {
        Some(ServeCommand::Token(t)) => token(g, a, t),
        Some(ServeCommand::User(u)) => user(g, a, u),
        Some(ServeCommand::Scrub(s)) => scrub(g, s, a.config.as_deref()),
        None => serve(g, a),
    }
}

/// A limit of all clients together: `--limit-total-upload`, or `--limit-upload`
/// as a client's flag and the settings file's `limit_upload` name it (QA: given
/// to `cairn serve`, `--limit-upload` was taken and did nothing). Both given and
/// different is refused rather than one chosen in silence.
fn total_rate(
    total: &Option<String>,
    total_flag: &str,
    plain: &Option<String>,
    plain_flag: &str,
) -> Result<Option<u64>> {
    let total = super::rate_flag(total, total_flag)?;
    let plain = super::rate_flag(plain, plain_flag)?;
    match (total, plain) {
        (Some(t), Some(p)) if t != p => Err(super::bad_argument(format!(
            "{plain_flag} and {total_flag} are the same limit (of all clients together, \
             the settings file's {}): give one",
            plain_flag.trim_start_matches("--").replace('-', "_")
        ))),
        (t, p) => Ok(t.or(p)),
    }
}

fn serve(g: &Global, a: &ServeArgs) -> Result<i32> {
    let config = ServerConfig::from_flags(&Flags {
        config: a.config.clone(),
        listen: a.listen.clone(),
        datastores: a.datastores.clone(),
        state_dir: a.state_dir.clone(),
        tls_cert: a.tls_cert.clone(),
        tls_key: a.tls_key.clone(),
        insecure_http: a.insecure_http,
        limits: cairn_server::config::Limits {
            upload_per_token: super::rate_flag(
                &a.limit_upload_per_token,
                "--limit-upload-per-token",
            )?,
            download_per_token: super::rate_flag(
                &a.limit_download_per_token,
                "--limit-download-per-token",
            )?,
            upload: total_rate(
                &a.limit_total_upload,
                "--limit-total-upload",
                &g.remote.limit_upload,
                "--limit-upload",
            )?,
            download: total_rate(
                &a.limit_total_download,
                "--limit-total-download",
                &g.remote.limit_download,
                "--limit-download",
            )?,
        },
    })
    .map_err(|e| match e {
        e @ cairn_server::config::ConfigError::BadFlag(_) => super::bad_argument(e),
        e => anyhow::Error::from(e),
    })?;
    let names: Vec<String> = config.datastores.keys().cloned().collect();
    let insecure = config.tls == cairn_server::config::Tls::InsecureHttp;
    // Said at start: a limit may come from the environment (CAIRN_LIMIT_UPLOAD,
    // set for the clients of the same machine) or the settings file, and a
    // server slower than its link should say why.
    let l = &config.limits;
    let limits: Vec<String> = [
        (l.upload, "uploads of all clients together"),
        (l.download, "downloads of all clients together"),
        (l.upload_per_token, "uploads per token"),
        (l.download_per_token, "downloads per token"),
    ]
    .into_iter()
    .filter_map(|(rate, what)| rate.map(|r| format!("{what} {}/s", cairn_core::units::bytes(r, 1))))
    .collect();
    if !limits.is_empty() {
        cairn_server::log_line(&format!("bandwidth limits: {}", limits.join(", ")));
    }
    cairn_server::serve(config, |ready| {
        let scheme = if insecure { "http" } else { "https" };
        // Stderr like every log line; tests and service managers wait for it.
        cairn_server::log_line(&format!(
            "listening on {scheme}://{} (datastores: {})",
            ready.addr,
            names.join(", ")
        ));
        if let Some(fp) = &ready.fingerprint {
            cairn_server::log_line(&format!(
                "certificate SHA-256 fingerprint: {fp} (clients: --server-fingerprint {fp})"
            ));
        }
    })
    .map_err(|e| anyhow!("{e}"))?;
    if cairn_server::stopped_by_hangup() {
        cairn_server::log_line(
            "stopped by SIGHUP: exit status 129, so that a service manager restarts it \
             (Restart=on-failure), reading the settings file again",
        );
        return Ok(129);
    }
    Ok(0)
}

/// Warns when the settings file given serves no datastore of that name: the
/// grant is then refused as "no such datastore" by the server, with nothing said
/// where it was made (QA). Without a settings file the datastores are the
/// server's flags, which this command cannot see.
fn warn_of_unknown_datastore(a: &ServeArgs, datastore: &str) {
    if datastore == cairn_server::tokens::ALL_DATASTORES {
        return;
    }
    let Some(path) = &a.config else { return };
    let Ok(file) = cairn_server::config::FileConfig::load(path) else {
        return;
    };
    if !file.datastores.contains_key(datastore) {
        let known: Vec<&str> = file.datastores.keys().map(String::as_str).collect();
        crate::ui::warn(format!(
            "{} serves no datastore {datastore:?} (it has: {}): clients with this \
             grant are refused until it does",
            path.display(),
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ));
    }
}

fn token(g: &Global, a: &ServeArgs, t: &TokenCommand) -> Result<i32> {
    let store = TokenStore::new(&state_dir(a)?);
    match t {
        TokenCommand::Add(add) => {
            let grant = &add.grant;
            let role = Role::parse(&grant.role).ok_or_else(|| anyhow!("unknown role"))?;
            let expires = add.expires.as_deref().map(expiry).transpose()?;
            let (entry, secret) = store.add(
                &add.name,
                &grant.datastore,
                role,
                grant.host.as_deref(),
                expires,
            )?;
            warn_of_unknown_datastore(a, &grant.datastore);
            if g.json {
                #[derive(serde::Serialize)]
                struct Added<'a> {
                    #[serde(flatten)]
                    entry: &'a cairn_server::tokens::TokenEntry,
                    token: &'a str,
                }
                super::print_json(&Added {
                    entry: &entry,
                    token: &secret,
                })?;
            } else {
                println!("{secret}");
                eprintln!(
                    "token {:?} ({} on {}{}{}) added; it is shown only now",
                    entry.name,
                    entry.role.as_str(),
                    grant_text(&entry.datastore),
                    host_text(entry.host.as_deref()),
                    entry
                        .expires
                        .as_deref()
                        .map(|e| format!(", expires {}", cairn_core::time::local_display(e)))
                        .unwrap_or_default()
                );
            }
        }
        TokenCommand::List => {
            let tokens = store.list()?;
            if g.json {
                super::print_json(&tokens)?;
            } else if tokens.is_empty() {
                println!("no tokens (add one: cairn serve token add NAME --datastore D --role R)");
            } else {
                println!(
                    "{:<16}  {:<20}  {:<12}  {:<8}  {:<12}  {:<19}  expires",
                    "id", "name", "datastore", "role", "host", "created"
                );
                let now = cairn_core::time::now_unix();
                for t in tokens {
                    let expires = match &t.expires {
                        None => "never".to_string(),
                        Some(e) if t.expired_at(now) => {
                            format!("expired {}", cairn_core::time::local_display(e))
                        }
                        Some(e) => cairn_core::time::local_display(e),
                    };
                    println!(
                        "{:<16}  {:<20}  {:<12}  {:<8}  {:<12}  {:<19}  {expires}",
                        t.id,
                        t.name,
                        t.datastore,
                        t.role.as_str(),
                        t.host.as_deref().unwrap_or("-"),
                        t.created.get(..19).unwrap_or(&t.created)
                    );
                }
            }
        }
        TokenCommand::Remove { name } => {
            let removed = store.remove(name)?;
            if g.json {
                super::print_json(&removed)?;
            } else {
                println!("removed token {:?} ({})", removed.name, removed.id);
            }
        }
    }
    Ok(0)
}

/// `, host H only` for a grant bound to a host (said when it is made: QA r13).
fn host_text(host: Option<&str>) -> String {
    host.map(|h| format!(", host {h:?} only"))
        .unwrap_or_default()
}

/// `token add --expires`: a time from now (`90d`) or a date (`2027-01-31`, a
/// local midnight; `2027-01-31 18:00`; RFC 3339), as RFC 3339 UTC.
fn expiry(s: &str) -> Result<String> {
    if let Ok(d) = cairn_core::units::parse_duration(s) {
        if d.is_zero() {
            return Err(super::bad_argument(
                "--expires 0: a token would open nothing",
            ));
        }
        let at = cairn_core::time::now_unix().saturating_add(d.as_secs() as i64);
        return Ok(cairn_core::time::format_unix(at, 0));
    }
    let date_only = s.len() == 10
        && s.bytes().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
    let spelled = if date_only {
        format!("{s} 00:00")
    } else {
        s.to_string()
    };
    let at = cairn_core::time::parse_user_time(&spelled).ok_or_else(|| {
        super::bad_argument(format!(
            "--expires {s:?}: give a time from now (90d, 12h) or a date (2027-01-31, \
             '2027-01-31 18:00', RFC 3339): {}",
            cairn_core::time::user_time_problem(&spelled)
        ))
    })?;
    if cairn_core::time::parse_rfc3339(&at).is_none_or(|t| t <= cairn_core::time::now_unix()) {
        return Err(super::bad_argument(format!(
            "--expires {s:?} is past: a token would open nothing"
        )));
    }
    Ok(at)
}

fn user(g: &Global, a: &ServeArgs, u: &UserCommand) -> Result<i32> {
    let store = UserStore::new(&state_dir(a)?);
    match u {
        UserCommand::Add(add) => {
            let grant = &add.grant;
            let role = Role::parse(&grant.role).ok_or_else(|| anyhow!("unknown role"))?;
            let password = user_password(add.password_file.as_deref())?;
            warn_of_unknown_datastore(a, &grant.datastore);
            let entry = store.add(
                &add.name,
                &grant.datastore,
                role,
                grant.host.as_deref(),
                &password,
            )?;
            if g.json {
                super::print_json(&entry)?;
            } else {
                println!(
                    "user {:?} added ({} on {}{})",
                    entry.name,
                    entry.role.as_str(),
                    grant_text(&entry.datastore),
                    host_text(entry.host.as_deref())
                );
            }
        }
        UserCommand::List => {
            let users = store.list()?;
            if g.json {
                super::print_json(&users)?;
            } else if users.is_empty() {
                println!(
                    "no users (add one: cairn serve user add NAME --datastore D|'*' --role R)"
                );
            } else {
                println!(
                    "{:<20}  {:<12}  {:<8}  {:<12}  created",
                    "name", "datastore", "role", "host"
                );
                for u in users {
                    println!(
                        "{:<20}  {:<12}  {:<8}  {:<12}  {}",
                        u.name,
                        u.datastore,
                        u.role.as_str(),
                        u.host.as_deref().unwrap_or("-"),
                        u.created.get(..19).unwrap_or(&u.created)
                    );
                }
            }
        }
        UserCommand::Passwd {
            name,
            password_file,
        } => {
            if store.list()?.iter().all(|u| &u.name != name) {
                return Err(anyhow!("no user named {name:?}"));
            }
            let password = user_password(password_file.as_deref())?;
            store.passwd(name, &password)?;
            println!("password of user {name:?} changed");
        }
        UserCommand::Remove { name } => {
            let removed = store.remove(name)?;
            if g.json {
                super::print_json(&removed)?;
            } else {
                println!("removed user {:?}", removed.name);
            }
        }
    }
    Ok(0)
}

/// A console user's new password: `--password-file`, `CAIRN_NEW_PASSWORD(_FILE)`,
/// or asked twice on a terminal.
fn user_password(file: Option<&std::path::Path>) -> Result<String> {
    crate::ui::Source {
        flag: file,
        command: None,
        env_command: None,
        env: "CAIRN_NEW_PASSWORD",
        env_file: "CAIRN_NEW_PASSWORD_FILE",
        what: "the user",
        flags: "--password-file",
    }
    .new_password()
}

fn grant_text(datastore: &str) -> String {
    if datastore == cairn_server::tokens::ALL_DATASTORES {
        "every datastore".into()
    } else {
        format!("datastore {datastore}")
    }
}

/// `cairn serve scrub`: runs on the server's machine against the datastore's
/// storage directly (no token, no key).
fn scrub(g: &Global, s: &ScrubArgs, config: Option<&std::path::Path>) -> Result<i32> {
    // A datastore name from the settings file, or a location as `--repo` takes it;
    // and the file's datastore names (in order: its table is a BTreeMap).
    let datastore = s
        .datastore
        .as_ref()
        .or(s.datastore_flag.as_ref())
        .ok_or_else(|| anyhow!("name the datastore to scrub"))?;
    let (location, named): (String, Vec<String>) = match config {
        Some(c) => {
            let file = cairn_server::config::FileConfig::load(c)?;
            let location = file.datastores.get(datastore).cloned();
            (
                location.unwrap_or_else(|| datastore.clone()),
                file.datastores.into_keys().collect(),
            )
        }
        None => (datastore.clone(), Vec::new()),
    };
    let opts = cairn_core::repo::storage::StorageOptions {
        cache: cairn_core::repo::storage::CacheChoice::Off,
        ..super::storage_options(g)?
    };
    let storage = cairn_core::repo::storage::open_storage(
        &location,
        &opts,
        &cairn_core::progress::Progress::none(),
    )?;
    if !cairn_core::repo::storage::repository_exists(&storage)? {
        // Exit 10, "no repository", as every command (QA r35: 1, which a monitor
        // takes for damage found).
        let none = cairn_core::Error::RepositoryNotFound(location.clone());
        // A name the settings file does not hold reads as a location: say both.
        if !named.is_empty() && location == *datastore {
            return Err(anyhow::Error::new(none).context(format!(
                "no datastore {:?} in the settings file (it has: {})",
                datastore,
                named.join(", ")
            )));
        }
        // A bare name without the settings file is a datastore's name the
        // state directory does not hold (QA r29: "no repository at main").
        if config.is_none() && !location.contains('/') && !location.contains(':') {
            return Err(anyhow::Error::new(none).context(format!(
                "{location:?} is no datastore's location, and a datastore's name needs \
                 the settings file (`cairn serve scrub {location} --config FILE`); or give \
                 its location (`cairn serve scrub /srv/cairn/{location}`, or s3:...)"
            )));
        }
        return Err(none.into());
    }
    let mut p = super::progress(g);
    p.start();
    let report = cairn_server::scrub::scrub(storage.backend.as_ref(), s.threads, &p.progress);
    p.finish();
    let report = report?;
    if g.json {
        super::print_json(&report)?;
    } else {
        for p in &report.problems {
            println!("{}: {} ({})", p.name, p.problem.replace('_', " "), p.detail);
        }
        for n in &report.unknown_names {
            println!("{n}: not a repository object (left alone)");
        }
        println!(
            "scrubbed {}, {} in {:.1}s: {}",
            cairn_core::units::count(report.objects_checked, "object"),
            cairn_core::units::bytes(report.bytes_read, 2),
            report.secs,
            if report.is_clean() {
                // What scrub can see without the key: the objects stored. One
                // missing is `check`'s to find (QA: "no damage" beside a
                // missing pack).
                "no damage found in what is stored (an object missing altogether is \
                 found by `cairn check`, with the key)"
                    .to_string()
            } else {
                format!(
                    "{} damaged (run `cairn check --read-data` and `cairn repair` with the key)",
                    report
                        .problems
                        .iter()
                        .filter(|p| p.problem != "vanished")
                        .count()
                )
            }
        );
    }
    Ok(if report.is_clean() { 0 } else { 1 })
}
