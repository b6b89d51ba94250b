use crate::util::*;
use std::fs;

#[test]
fn several_passwords_change_and_remove() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"data").unwrap();
    let snap = env.backup(&[&src]);
    let data_before: Vec<_> = walk(&env.repo.join("data")).into_keys().collect();

    // A new password ending in a line break would open only from a variable
    // with those exact bytes (a password file drops it): refused.
    for bad in ["second\n", "second\r\n"] {
        let o = env
            .cmd(&["key", "add"])
            .env("CAIRN_NEW_PASSWORD", bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("ends with a line break"), "{err}");
    }

    let o = env
        .cmd(&["key", "add", "--json"])
        .env("CAIRN_NEW_PASSWORD", "second")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let second: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let second = second["id"].as_str().unwrap().to_string();
    let keys: serde_json::Value =
        serde_json::from_str(&env.ok(&["key", "list", "--json"])).unwrap();
    assert_eq!(keys.as_array().unwrap().len(), 2);
    // The table shows when each was made in this machine's time zone, as every
    // other listing does (QA r29: in UTC, as stored).
    let o = env
        .cmd(&["key", "list"])
        .env("TZ", "Asia/Kolkata")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&o.stdout);
    let created = keys[0]["created"].as_str().unwrap();
    let local = std::process::Command::new("date")
        .env("TZ", "Asia/Kolkata")
        .args(["-d", created, "+%Y-%m-%d %H:%M:%S"])
        .output()
        .unwrap();
    let local = String::from_utf8_lossy(&local.stdout).trim().to_string();
    assert_eq!(local.len(), 19, "{local}");
    assert!(
        table.contains(&local) && !table.contains(created),
        "{local}: {table}"
    );
    // Both passwords open the repository.
    let o = env
        .cmd(&["snapshots"])
        .env("CAIRN_PASSWORD", "second")
        .output()
        .unwrap();
    assert!(o.status.success());

    // Change the first password: the old one stops working, data is untouched.
    // A key file of another repository made with the same password (a wrong
    // rsync) is not one of this repository's keys: no word of it.
    let other = Env::new();
    other.init(&[]);
    let stray = fs::read_dir(other.repo.join("keys"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let stray_here = env.repo.join("keys").join(stray.file_name());
    fs::copy(stray.path(), &stray_here).unwrap();
    let o = env
        .cmd(&["key", "passwd"])
        .env("CAIRN_NEW_PASSWORD", "third")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("warning"), "{err}");
    fs::remove_file(&stray_here).unwrap();
    env.fails(&["snapshots"], 12);
    // Two keys with one password: changing one says the other still opens with it.
    let o = env
        .cmd(&["key", "add"])
        .env("CAIRN_PASSWORD", "third")
        .env("CAIRN_NEW_PASSWORD", "third")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = env
        .cmd(&["key", "passwd", "--json"])
        .env("CAIRN_PASSWORD", "third")
        .env("CAIRN_NEW_PASSWORD", "fourth")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("also opens the repository with the old password"),
        "{err}"
    );
    // An empty id names no key (QA: it matched every key as a prefix).
    let empty = env
        .cmd(&["key", "remove", ""])
        .env("CAIRN_PASSWORD", "third")
        .output()
        .unwrap();
    assert!(!empty.status.success());
    assert!(String::from_utf8_lossy(&empty.stderr).contains("no key id given"));
    // The key made just now goes again: the twin opens with "third" as before.
    let fourth: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let o = env
        .cmd(&["key", "remove", fourth["id"].as_str().unwrap()])
        .env("CAIRN_PASSWORD", "third")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = env
        .cmd(&["snapshots"])
        .env("CAIRN_PASSWORD", "third")
        .output()
        .unwrap();
    assert!(o.status.success());
    let data_after: Vec<_> = walk(&env.repo.join("data")).into_keys().collect();
    assert_eq!(
        data_before, data_after,
        "changing a password must not rewrite data"
    );

    // Remove the second key using the third password (its id typed in upper
    // case, as snapshot ids may be: QA); the key in use cannot be removed.
    let upper = second[..8].to_ascii_uppercase();
    let o = env
        .cmd(&["key", "remove", &upper])
        .env("CAIRN_PASSWORD", "third")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = env
        .cmd(&["snapshots"])
        .env("CAIRN_PASSWORD", "second")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(12));
    let keys: serde_json::Value = serde_json::from_slice(
        &env.cmd(&["key", "list", "--json"])
            .env("CAIRN_PASSWORD", "third")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let current = keys[0]["id"].as_str().unwrap().to_string();
    let o = env
        .cmd(&["key", "remove", &current])
        .env("CAIRN_PASSWORD", "third")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("refusing"));
    // Data still restores with the new password.
    let target = env.path("out");
    let o = env
        .cmd(&["restore", &snap, "--target", target.to_str().unwrap()])
        .env("CAIRN_PASSWORD", "third")
        .output()
        .unwrap();
    assert!(o.status.success());
}

#[test]
fn password_file_and_repository_from_the_environment() {
    let env = Env::new();
    env.init(&[]);
    let pw = env.path("pw");
    fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    // --password-file (first line), repository from CAIRN_REPO.
    let o = std::process::Command::new(bin())
        .args([
            "snapshots",
            "--json",
            "--password-file",
            pw.to_str().unwrap(),
        ])
        .env("CAIRN_REPO", &env.repo)
        .env_remove("CAIRN_PASSWORD")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // CAIRN_PASSWORD_FILE with a wrong password: exit 12.
    fs::write(&pw, "not it\n").unwrap();
    let o = std::process::Command::new(bin())
        .args(["snapshots"])
        .env("CAIRN_REPO", &env.repo)
        .env("CAIRN_PASSWORD_FILE", &pw)
        .env_remove("CAIRN_PASSWORD")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(12));
    // A missing password file is a clear error.
    let o = std::process::Command::new(bin())
        .args(["snapshots", "--password-file", "/nonexistent/pw"])
        .env("CAIRN_REPO", &env.repo)
        .env_remove("CAIRN_PASSWORD")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("password file"));
}

/// Two `key remove` at once, each from a session opened with the other's key:
/// the first holds the repository's exclusive lock from its listing to its
/// delete, so the second cannot remove the last key (both keys were gone
/// before, and nobody could open the repository).
#[test]
fn two_key_removals_at_once_never_remove_every_key() {
    let env = Env::new();
    env.init(&[]);
    let id_of = |password: &str| -> String {
        let o = env
            .cmd(&["key", "list", "--json"])
            .env("CAIRN_PASSWORD", password)
            .output()
            .unwrap();
        let keys: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        keys.as_array()
            .unwrap()
            .iter()
            .find(|k| k["current"] == true)
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let o = env
        .cmd(&["key", "add"])
        .env("CAIRN_NEW_PASSWORD", "second")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (first, second) = (id_of(PASSWORD), id_of("second"));
    let pause = env.path("pause");
    fs::create_dir_all(&pause).unwrap();
    let a = env
        .cmd(&["key", "remove", &second])
        .env(
            "CAIRN_TEST_PAUSE_AT",
            format!("key:before-remove:1:{}", pause.display()),
        )
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !pause.join("reached").exists() {
        assert!(start.elapsed().as_secs() < 30, "never reached the pause");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = env
        .cmd(&["key", "remove", &first])
        .env("CAIRN_PASSWORD", "second")
        .output()
        .unwrap();
    assert!(!o.status.success(), "the second removal went through too");
    fs::write(pause.join("go"), b"").unwrap();
    let a = a.wait_with_output().unwrap();
    assert!(a.status.success(), "{a:?}");
    env.ok(&["snapshots"]);
    assert_eq!(fs::read_dir(env.repo.join("keys")).unwrap().count(), 1);
}

/// A key file copied in from another repository that opens with the same
/// password (a wrong rsync) is passed over: the repository's own key opens it,
/// and `key list`/`key remove` work to take the stray one out.
#[test]
fn a_key_file_from_another_repository_is_passed_over() {
    // Two repositories with the same password, the other's key file sorting
    // first, so that it is the one tried first: an even chance per pair (a new
    // pair each try: a repository whose own key sorts near the start would
    // rarely find one before it).
    let key_of = |env: &Env| {
        let p = first_key_file(&env.repo);
        (p.file_name().unwrap().to_string_lossy().into_owned(), p)
    };
    let (env, stray) = (0..40)
        .find_map(|_| {
            let env = Env::new();
            env.init(&[]);
            let other = Env::new();
            other.init(&[]);
            let ((own, _), (name, path)) = (key_of(&env), key_of(&other));
            (name < own).then(|| {
                std::fs::copy(path, env.repo.join("keys").join(&name)).unwrap();
                (env, name)
            })
        })
        .expect("a key file that sorts first in 40 pairs");
    let listed = env.ok(&["snapshots"]);
    assert!(listed.contains("0 snapshots"), "{listed}");
    let keys = env.ok(&["key", "list"]);
    assert!(keys.contains(&stray[..8]), "{keys}");
    env.ok(&["key", "remove", &stray[..8]]);
    assert!(!env.repo.join("keys").join(&stray).exists());
}

/// `key list` of a repository without encryption says so (an empty table read
/// as lost keys: QA).
#[test]
fn key_list_of_an_unencrypted_repository_says_it_has_no_keys() {
    let env = Env::new();
    env.init(&["--no-encryption"]);
    let out = env.ok(&["key", "list"]);
    assert!(out.contains("not encrypted"), "{out}");
}
