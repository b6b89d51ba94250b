//! Command-line arguments (clap derive). Engine options are built from these in
//! `commands/`; nothing here reaches the engine directly.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Shown after `cairn --help`: every variable cairn reads, in one place.
const ENVIRONMENT: &str = "\
Environment:
  CAIRN_REPO                 the repository (as --repo)
  CAIRN_PASSWORD             the repository's password (init: the new one)
  CAIRN_PASSWORD_FILE        a file holding it (wins over CAIRN_PASSWORD, as in
                             restic; --password-file wins over both)
  CAIRN_PASSWORD_COMMAND     a command printing it (as --password-command; not
                             with CAIRN_PASSWORD_FILE)
  CAIRN_NEW_PASSWORD[_FILE]  the new password of key add and key passwd
  CAIRN_FROM_REPO, CAIRN_FROM_PASSWORD[_FILE|_COMMAND]
                             the source repository of copy and init --copy-key-from
  CAIRN_TOKEN, CAIRN_TOKEN_FILE, CAIRN_SERVER_FINGERPRINT
                             how to reach a cairn server (cairn+https:// repositories)
  CAIRN_CACERT               extra CA certificates for https
  CAIRN_CACHE_DIR            where remote repositories' caches live
  CAIRN_INDEX_PATH           where the SSD index placement keeps its files
  CAIRN_LIMIT_UPLOAD, CAIRN_LIMIT_DOWNLOAD
                             bandwidth limits (as --limit-upload/--limit-download)
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE, AWS_REGION
                             S3 credentials and region";

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "Deduplicating, compressing, encrypting backups",
    long_about = None,
    after_help = ENVIRONMENT,
    // A flag given twice takes the last value, as restic's do (a script's
    // defaults, then the caller's): not an error.
    args_override_self = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Clone)]
pub struct Global {
    /// Repository location: a local directory, or s3:http(s)://HOST[:PORT]/BUCKET[/PREFIX]
    /// (credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE)
    #[arg(short = 'r', long, env = "CAIRN_REPO", global = true)]
    pub repo: Option<String>,
    /// Read the password from this file (first line); wins over CAIRN_PASSWORD
    /// and CAIRN_PASSWORD_FILE
    #[arg(long, global = true)]
    pub password_file: Option<PathBuf>,
    /// Run this command (by /bin/sh) and take the first line it prints as the
    /// password, e.g. "pass show backup" (as CAIRN_PASSWORD_COMMAND)
    #[arg(long, global = true, value_name = "COMMAND")]
    pub password_command: Option<String>,
    /// Print machine-readable JSON instead of text
    #[arg(long, global = true)]
    pub json: bool,
    /// Print only errors and warnings
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// low: lowest CPU priority (nice 19), idle I/O class (the disk serves others
    /// first) and half the cores' threads; high: more CPU and I/O priority (needs
    /// root); normal: as started
    #[arg(
        long,
        global = true,
        value_name = "low|normal|high",
        env = "CAIRN_PRIORITY"
    )]
    pub priority: Option<String>,
    /// Use N cores, not all of this machine's: pools are sized for N, and at most N
    /// backup workers hash and compress at once (the reader's chunking comes on top)
    #[arg(long, global = true, value_name = "N")]
    pub threads: Option<usize>,
    /// Keep the operation's memory under SIZE (e.g. 2G): buffers and caches are
    /// sized from what the index leaves, and a limit the index alone would break is
    /// refused with what to change (default: the repository's; `cairn config
    /// --memory-limit SIZE|none` sets or removes that default; none: no limit)
    #[arg(
        long,
        global = true,
        env = "CAIRN_MEMORY_LIMIT",
        value_name = "SIZE|none"
    )]
    pub memory_limit: Option<String>,
    /// `--memory-limit` was given on the command line, not taken from
    /// `CAIRN_MEMORY_LIMIT`: only then does `cairn config` store it.
    #[arg(skip)]
    pub memory_limit_flag: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// How to reach remote repositories (and how fast). Every command takes them.
#[derive(Args, Clone, Default)]
pub struct RemoteArgs {
    /// Send at most this many bytes per second to the repository (5M = 5 MiB/s, 500K;
    /// or bits per second: 100Mbit). For `serve`: what all its clients send
    /// together (as --limit-total-upload)
    #[arg(long, env = "CAIRN_LIMIT_UPLOAD", global = true, value_name = "RATE")]
    pub limit_upload: Option<String>,
    /// Read at most this many bytes per second from the repository (as
    /// --limit-upload; for `serve`: what all its clients read together)
    #[arg(long, env = "CAIRN_LIMIT_DOWNLOAD", global = true, value_name = "RATE")]
    pub limit_download: Option<String>,
    /// How long a call to a remote repository may keep retrying after transient
    /// failures (timeouts, 5xx, dropped connections): 30s, 10m, 2h; 0 retries
    /// nothing (default: 8 attempts, about a minute and a half, at most 3 minutes
    /// after the first failure when requests go unanswered; the time counts from
    /// the first failure, so a long upload cut short is retried whole). A
    /// request that hears nothing is given up on
    /// after a minute of silence (two for a cairn server, where an upload is not
    /// silent while its body is being taken, however slow the link), or sooner to fit
    /// --retry-for (at least 10 s; 30 s for a cairn server, which holds a job-slot
    /// request up to 20 s before it answers). An address where nothing answers fails within
    /// seconds, unless it answered before in this run (restarting: waited for as
    /// for any transient failure)
    #[arg(long, env = "CAIRN_RETRY_FOR", global = true, value_name = "DURATION")]
    pub retry_for: Option<String>,
    /// While another prune, repair, forget, tag or rewrite holds the repository,
    /// keep trying to take its lock for this long (30s, 10m, 1h30m) instead of
    /// failing after a few seconds
    #[arg(long, env = "CAIRN_RETRY_LOCK", global = true, value_name = "DURATION")]
    pub retry_lock: Option<String>,
    /// Keep no local cache of a remote repository's index, snapshots and trees
    #[arg(long, global = true)]
    pub no_cache: bool,
    /// Where remote repositories' caches live (default ~/.cache/cairn)
    #[arg(long, env = "CAIRN_CACHE_DIR", global = true, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// S3 region to sign requests for (default AWS_REGION, else us-east-1)
    #[arg(long, global = true, value_name = "REGION")]
    pub s3_region: Option<String>,
    /// Address buckets as BUCKET.HOST (virtual-host style) instead of HOST/BUCKET
    #[arg(long, global = true)]
    pub s3_virtual_host: bool,
    /// AWS profile for S3 credentials (default AWS_PROFILE)
    #[arg(long, global = true, value_name = "NAME")]
    pub s3_profile: Option<String>,
    /// Also trust the CA certificate(s) in this PEM file for https
    #[arg(long, env = "CAIRN_CACERT", global = true, value_name = "FILE")]
    pub cacert: Option<PathBuf>,
    /// Accept any TLS certificate (testing only)
    #[arg(long, global = true)]
    pub insecure_tls: bool,
    /// Read the cairn server token from this file (default: CAIRN_TOKEN)
    #[arg(long, env = "CAIRN_TOKEN_FILE", global = true, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Accept exactly the cairn server certificate with this SHA-256 fingerprint
    /// (what `cairn serve` prints for its self-signed certificate)
    #[arg(
        long,
        env = "CAIRN_SERVER_FINGERPRINT",
        global = true,
        value_name = "SHA256"
    )]
    pub server_fingerprint: Option<String>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Create a new repository
    Init(InitArgs),
    /// Back up files and directories (or standard input) into a new snapshot
    Backup(BackupArgs),
    /// List snapshots
    Snapshots(SnapshotsArgs),
    /// List the files in a snapshot
    Ls(LsArgs),
    /// Write one file of a snapshot to standard output
    Dump(DumpArgs),
    /// Restore a snapshot into a directory
    Restore(RestoreArgs),
    /// Find which snapshots hold a file or directory, by name or path pattern
    Find(FindArgs),
    /// Show what changed between two snapshots
    Diff(DiffArgs),
    /// Write a snapshot (or part of it) as a tar or zip archive, for tape or another system
    Export(ExportArgs),
    /// Manage the repository's passwords
    #[command(subcommand)]
    Key(KeyCommand),
    /// Show or change repository settings
    Config(ConfigArgs),
    /// Verify the repository's structure and, with --read-data, every blob
    Check(CheckArgs),
    /// Remove snapshots: the ones named, or those a --keep-* policy does not keep
    Forget(ForgetArgs),
    /// Copy snapshots to another repository, sending only the data it lacks
    Copy(CopyArgs),
    /// Add, remove or set the tags of snapshots
    Tag(TagArgs),
    /// Take files out of existing snapshots (new snapshots without them)
    Rewrite(RewriteArgs),
    /// Remove data no snapshot needs (safe while backups run)
    Prune(PruneArgs),
    /// Show locks and remove stale ones (they also expire by themselves)
    Unlock(UnlockArgs),
    /// Rebuild the index from the packs, or rewrite damaged snapshots
    #[command(subcommand)]
    Repair(RepairCommand),
    /// Save the directory trees no snapshot refers to (a snapshot forgotten by
    /// mistake, before a prune) as a new snapshot tagged "recovered"
    Recover(RecoverArgs),
    /// What the datastore holds: stored data, deduplication, compression, space used
    Stats(StatsArgs),
    /// Measure this machine: speed of each stage and the throughput to expect
    Bench(BenchArgs),
    /// Predict, before creating a datastore, what each block size makes of some data
    Estimate(EstimateArgs),
    /// Show where the index lives and what it costs; change or move it
    Index(IndexArgs),
    /// Serve datastores to cairn clients over HTTPS (recovery-point server)
    Serve(ServeArgs),
    /// Show snapshots as a read-only file system (FUSE) until unmounted
    Mount(MountArgs),
    /// Write shell completions and man pages (as restic's `generate`)
    Generate(GenerateArgs),
    /// List the repository's objects of one kind by id (for looking inside by hand)
    List(ListArgs),
    /// Print one repository object decoded and checked (for looking inside by hand)
    Cat(CatArgs),
    /// Print cairn's version (as --version; restic's `version`), with --json too
    Version,
}

/// `cairn list KIND`: ids one per line (with --json: an array with sizes).
#[derive(Args)]
pub struct ListArgs {
    /// What to list: snapshots, index, packs, keys, locks, pending (prune's pending
    /// deletions) or blobs (from the index: "TYPE ID" per line)
    #[arg(value_parser = ["snapshots", "index", "packs", "keys", "locks", "pending", "blobs"])]
    pub kind: String,
}

/// `cairn cat KIND [ID]`: JSON, except a blob's plaintext bytes.
#[derive(Args)]
pub struct CatArgs {
    /// What to print: config; key, snapshot, index, pack (its header, read from the
    /// pack), lock or pending ID; blob ID (its plaintext bytes); tree ID or
    /// SNAPSHOT[:PATH]; chunklist ID
    #[arg(value_parser = ["config", "key", "snapshot", "index", "pack", "lock", "pending", "blob", "tree", "chunklist"])]
    pub kind: String,
    /// The object's id or a unique prefix of it ("latest" for a snapshot; a blob
    /// needs at least 8 hex digits)
    pub id: Option<String>,
}

/// Each output is a file, or `-` for standard output.
#[derive(Args)]
pub struct GenerateArgs {
    /// Write the bash completion script to this file
    #[arg(long, value_name = "FILE")]
    pub bash_completion: Option<PathBuf>,
    /// Write the zsh completion script to this file
    #[arg(long, value_name = "FILE")]
    pub zsh_completion: Option<PathBuf>,
    /// Write the fish completion script to this file
    #[arg(long, value_name = "FILE")]
    pub fish_completion: Option<PathBuf>,
    /// Write the PowerShell completion script to this file
    #[arg(long, value_name = "FILE")]
    pub powershell_completion: Option<PathBuf>,
    /// Write a man page for cairn and each command (cairn-backup.1, ...) into this
    /// directory (created if missing)
    #[arg(long, value_name = "DIR")]
    pub man: Option<PathBuf>,
}

#[derive(Args)]
pub struct MountArgs {
    /// Directory to mount at (an existing, preferably empty directory)
    pub dir: PathBuf,
    /// Mount only this snapshot's tree (id prefix or "latest") instead of every
    /// snapshot under hosts/, snapshots/ and latest
    #[arg(long)]
    pub snapshot: Option<String>,
    /// Let other users see the mount (the kernel still checks each file's owner,
    /// mode and ACLs; as non-root needs user_allow_other in /etc/fuse.conf)
    #[arg(long)]
    pub allow_other: bool,
    /// Memory for recently read file content (e.g. 64M, 1G; default 64M, or a share
    /// of --memory-limit)
    #[arg(long, value_name = "SIZE")]
    pub cache_size: Option<String>,
    /// Seconds without a request after which the read session and its lock end
    /// (tests shorten it)
    #[arg(long, default_value_t = 30, hide = true)]
    pub idle_secs: u64,
    /// Seconds after which the top level is listed again when looked at (tests
    /// shorten it)
    #[arg(long, default_value_t = 60, hide = true)]
    pub refresh_secs: u64,
    /// Threads answering the kernel (its own name: `--threads` is the global
    /// flag, whose value a default here would set for the whole engine)
    #[arg(long = "fuse-threads", default_value_t = 4, hide = true)]
    pub fuse_threads: usize,
    /// Show no extended attributes nor ACLs (`ls -l` then asks nothing per file;
    /// without it, it asks only in snapshots that have ACLs or with --allow-other)
    #[arg(long)]
    pub no_xattrs: bool,
    /// Files and directories the mount keeps for the kernel before it asks the
    /// kernel to forget the oldest (each costs the mount about 640 bytes; default
    /// 262144, or a share of --memory-limit)
    #[arg(long, value_name = "N")]
    pub max_inodes: Option<usize>,
}

#[derive(Args)]
pub struct ServeArgs {
    #[command(subcommand)]
    pub command: Option<ServeCommand>,
    /// Settings file (TOML: listen, state_dir, TLS, [datastores], limits, passwords,
    /// jobs; see docs/SERVER.md). `token`, `user` and `scrub` read its state_dir
    /// and datastores too
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address and port to listen on (default 127.0.0.1:8443)
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// A datastore to serve, NAME=PATH or NAME=s3:... (repeatable)
    #[arg(long = "datastore", value_name = "NAME=LOCATION")]
    pub datastores: Vec<String>,
    /// Where tokens, the self-signed certificate and lock owners are kept
    /// (default /var/lib/cairn for root, ~/.local/state/cairn otherwise)
    #[arg(long, global = true, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// TLS certificate chain (PEM); without it and --tls-key, a self-signed one
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM)
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Plain HTTP, allowed on a loopback address only (tests, a local proxy)
    #[arg(long)]
    pub insecure_http: bool,
    /// Average upload rate each token may use (e.g. 2M; bytes per second)
    #[arg(long, value_name = "RATE")]
    pub limit_upload_per_token: Option<String>,
    /// Average download rate each token may use
    #[arg(long, value_name = "RATE")]
    pub limit_download_per_token: Option<String>,
    /// Average upload rate of all clients together
    #[arg(long = "limit-total-upload", value_name = "RATE")]
    pub limit_total_upload: Option<String>,
    /// Average download rate of all clients together
    #[arg(long = "limit-total-download", value_name = "RATE")]
    pub limit_total_download: Option<String>,
}

impl ServeArgs {
    /// The first flag given that only running the server takes (`--config` and
    /// `--state-dir` go with `token`, `user` and `scrub` too, before or after).
    pub fn server_only_flag(&self) -> Option<&'static str> {
        [
            (self.listen.is_some(), "--listen"),
            (!self.datastores.is_empty(), "--datastore"),
            (self.tls_cert.is_some(), "--tls-cert"),
            (self.tls_key.is_some(), "--tls-key"),
            (self.insecure_http, "--insecure-http"),
            (
                self.limit_upload_per_token.is_some(),
                "--limit-upload-per-token",
            ),
            (
                self.limit_download_per_token.is_some(),
                "--limit-download-per-token",
            ),
            (self.limit_total_upload.is_some(), "--limit-total-upload"),
            (
                self.limit_total_download.is_some(),
                "--limit-total-download",
            ),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

#[derive(Subcommand)]
pub enum ServeCommand {
    /// Manage the tokens clients present
    #[command(subcommand)]
    Token(TokenCommand),
    /// Manage console users (a name and password, for people signing in with a browser)
    #[command(subcommand)]
    User(UserCommand),
    /// Verify every pack, index file and snapshot against its name, without the
    /// key (finds bit rot on the server); exit 1 when anything is damaged
    Scrub(ScrubArgs),
}

#[derive(Args)]
pub struct ScrubArgs {
    /// A datastore name from --config, or a location (directory or s3:...)
    #[arg(required_unless_present = "datastore_flag")]
    pub datastore: Option<String>,
    /// The same, as `token add` takes it
    #[arg(long = "datastore", value_name = "NAME", conflicts_with = "datastore")]
    pub datastore_flag: Option<String>,
    /// Objects read at once
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Create a token and print it (once: only its hash is kept)
    Add(TokenAddArgs),
    /// List tokens (never their secrets)
    List,
    /// Remove a token by name or id; a running server refuses it at once
    Remove {
        /// The token's name or id
        name: String,
    },
}

#[derive(Subcommand)]
pub enum UserCommand {
    /// Add a user; the password comes from --password-file, CAIRN_NEW_PASSWORD(_FILE)
    /// or is asked twice (at least 8 characters; only an Argon2id hash is kept)
    Add(UserAddArgs),
    /// List users (never their passwords)
    List,
    /// Change a user's password; a running server ends their sessions
    Passwd {
        /// The user's name
        name: String,
        /// Read the new password from the first line of this file
        #[arg(long, value_name = "FILE")]
        password_file: Option<PathBuf>,
    },
    /// Remove a user; a running server ends their sessions at once
    Remove {
        /// The user's name
        name: String,
    },
}

#[derive(Args)]
pub struct UserAddArgs {
    /// The name to sign in with (letters, digits, '.', '_', '@', '-')
    pub name: String,
    #[command(flatten)]
    pub grant: GrantArgs,
    /// Read the password from the first line of this file
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
}

#[derive(Args)]
pub struct TokenAddArgs {
    /// A name for people (e.g. the client's host name)
    pub name: String,
    #[command(flatten)]
    pub grant: GrantArgs,
    /// When the token stops opening anything: after a time (90d, 12h, 1d12h) or
    /// at a date (2027-01-31, '2027-01-31 18:00', RFC 3339); a client presenting
    /// it then is told it expired (default: never)
    #[arg(long, value_name = "DURATION|DATE")]
    pub expires: Option<String>,
}

/// What a token or a console user may open and do.
#[derive(Args)]
pub struct GrantArgs {
    /// The datastore it opens, or '*' for all (admin and restore only)
    #[arg(long)]
    pub datastore: String,
    /// backup (add backups, never delete or overwrite), restore (read), admin (all)
    #[arg(long, value_parser = ["backup", "restore", "admin"])]
    pub role: String,
    /// The host it is for: it sees only the snapshots the server recorded as this
    /// host's (a view, not a wall: its client holds the datastore's key and reads
    /// the packs every host shares; hosts whose data must stay apart need
    /// datastores of their own, docs/SERVER.md)
    #[arg(long)]
    pub host: Option<String>,
}

#[derive(Args)]
pub struct EstimateArgs {
    /// Files and directories to read (nothing is written)
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Block sizes to compare
    #[arg(long, value_delimiter = ',', default_value = "4K,8K,16K,32K,64K")]
    pub block_sizes: Vec<String>,
    /// Protected data to project the index and datastore size to (default: the data read)
    #[arg(long)]
    pub scale: Option<String>,
    /// RAM of the machine that will run the datastore (default: this machine's)
    #[arg(long)]
    pub ram: Option<String>,
    /// RAM this estimate may use to remember chunk hashes; above that it samples
    #[arg(long, default_value = "2G")]
    pub memory: String,
    /// Also write a self-contained HTML report with charts to this file
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Exclude a pattern (as for backup; repeatable)
    #[arg(short = 'e', long = "exclude", value_parser = snapshot_path())]
    pub excludes: Vec<String>,
    /// Stay on the file system of each path
    #[arg(short = 'x', long)]
    pub one_file_system: bool,
}

#[derive(Args)]
pub struct BenchArgs {
    /// How much generated data each stage processes
    #[arg(long, default_value = "64M")]
    pub size: String,
    /// Instead: build an index of this many synthetic blobs (e.g. 100M) in each
    /// placement and measure RAM per blob, build time and lookups per second
    #[arg(long)]
    pub index: Option<String>,
    /// With --index: only this placement (ram or ssd), so that the process's peak
    /// memory is that placement's
    #[arg(long = "index-placement", alias = "placement", requires = "index")]
    pub placement: Option<String>,
    /// Scratch directory for the SSD placement's run of --index
    #[arg(
        long = "index-path",
        alias = "index-dir",
        default_value = "/var/tmp/cairn-index-bench"
    )]
    pub index_dir: std::path::PathBuf,
}

#[derive(Args)]
pub struct StatsArgs {
    /// Only these snapshots (id prefixes or "latest"); default all
    pub snapshots: Vec<String>,
    /// Only snapshots of this host (repeatable)
    #[arg(long)]
    pub host: Vec<String>,
}

#[derive(Subcommand)]
pub enum RepairCommand {
    /// Rebuild the index from every pack, keeping only blobs that verify
    Index {
        /// Only read and check every pack, and report what would be indexed,
        /// lost and replaced (a shared lock: other commands go on)
        #[arg(short = 'n', long)]
        dry_run: bool,
    },
    /// Rewrite snapshots to drop only the files and directories that are lost
    Snapshots {
        /// Only report what would be dropped
        #[arg(short = 'n', long)]
        dry_run: bool,
    },
    /// Seal the config again when it reads but does not authenticate (its MAC
    /// damaged, a value edited by hand), with the key the password opens once
    /// that key has opened the repository's snapshots
    Config {
        /// Only check the config and the key, and say what would be sealed
        #[arg(short = 'n', long)]
        dry_run: bool,
    },
}

#[derive(Args, Clone, Default)]
pub struct RecoverArgs {
    /// Only say what would be saved
    #[arg(short = 'n', long)]
    pub dry_run: bool,
}

#[derive(Args, Clone, Default)]
pub struct PruneArgs {
    /// Only print the plan: what would be deleted, repacked and reclaimed
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Unused space to tolerate in kept packs: a percentage of used data ("5%"), a
    /// size ("2G") or "unlimited"
    #[arg(long, default_value = "5%")]
    pub max_unused: String,
    /// Repack at most this much in one run (e.g. "10G")
    #[arg(long)]
    pub max_repack_size: Option<String>,
}

#[derive(Args)]
pub struct UnlockArgs {
    /// Remove every lock, not only stale ones, except those of processes running on
    /// this machine (only when no cairn process runs elsewhere)
    #[arg(long)]
    pub remove_all: bool,
}

#[derive(Args)]
pub struct InitArgs {
    /// Average chunk size: 4K, 8K, 16K (the default), 32K or 64K (fixed at creation;
    /// with --copy-key-from, the source's)
    #[arg(long)]
    pub block_size: Option<String>,
    /// Compression for new data: none, standard or max
    #[arg(long, default_value = "standard")]
    pub compression: String,
    /// Store data unencrypted (checksummed, not confidential)
    #[arg(long)]
    pub no_encryption: bool,
    /// Where the index lives: ram (47 bytes of RAM per chunk) or ssd (a local disk,
    /// about 1.4 bytes of RAM per chunk)
    #[arg(long, default_value = "ram")]
    pub index_placement: String,
    /// Directory for the SSD placement (default: ~/.cache/cairn/index)
    #[arg(long)]
    pub index_path: Option<PathBuf>,
    /// How many backup jobs may write at once (default 4); more wait their turn
    #[arg(long, value_name = "N")]
    pub max_concurrent_jobs: Option<u32>,
    /// Share this repository's key and chunking (its block size) so that `copy`
    /// between the two sends blobs as they are, reading only what is missing
    #[arg(long, value_name = "REPO")]
    pub copy_key_from: Option<String>,
    /// With --copy-key-from: that repository's password file (else
    /// CAIRN_FROM_PASSWORD, CAIRN_FROM_PASSWORD_FILE, or a prompt)
    #[arg(long, value_name = "FILE", requires = "copy_key_from")]
    pub from_password_file: Option<PathBuf>,
    /// With --copy-key-from: a command printing that repository's password
    #[arg(long, value_name = "COMMAND", requires = "copy_key_from")]
    pub from_password_command: Option<String>,
}

#[derive(Args)]
pub struct IndexArgs {
    /// Move the index to this placement: ram or ssd (as `init --index-placement`)
    #[arg(long = "index-placement", alias = "placement")]
    pub placement: Option<String>,
    /// Directory for the SSD placement's files on this machine
    #[arg(long = "index-path", alias = "path")]
    pub path: Option<PathBuf>,
}

#[derive(Args)]
pub struct BackupArgs {
    /// Files and directories to back up
    pub paths: Vec<PathBuf>,
    /// Create the repository with default settings if it does not exist
    #[arg(long)]
    pub init: bool,
    /// Add tags to the snapshot: a comma-separated list (repeatable)
    #[arg(long = "tag", value_delimiter = ',', value_parser = nonempty("tag"))]
    pub tags: Vec<String>,
    /// Host name to record (default: this machine's)
    #[arg(long, value_parser = nonempty("host name"))]
    pub host: Option<String>,
    /// Exclude paths matching this pattern (repeatable); `!PATTERN` includes again
    /// what an earlier pattern excluded (the last matching pattern decides), but
    /// an excluded directory is not entered: exclude `dir/*`, not `dir`, to keep
    /// `!dir/keep` (as restic). Unlike restic, `{a,b}` matches either (write `\{`
    /// for a brace) and `[!a]` is a negated class
    #[arg(short = 'e', long = "exclude", value_parser = snapshot_path())]
    pub excludes: Vec<String>,
    /// Read exclude patterns from a file, one per line ($VAR and ${VAR} are
    /// replaced by the variable's value, as in restic)
    #[arg(long = "exclude-file")]
    pub exclude_files: Vec<PathBuf>,
    /// As --exclude, ignoring case (repeatable)
    #[arg(long = "iexclude", value_parser = snapshot_path())]
    pub iexcludes: Vec<String>,
    /// As --exclude-file, ignoring case
    #[arg(long = "iexclude-file")]
    pub iexclude_files: Vec<PathBuf>,
    /// Leave out the content of directories holding a file of this name (the
    /// directory and the file stay); NAME:HEADER only those whose file starts with
    /// HEADER (repeatable)
    #[arg(long = "exclude-if-present", value_name = "NAME[:HEADER]")]
    pub exclude_if_present: Vec<String>,
    /// Leave out the content of cache directories: those tagged with a
    /// CACHEDIR.TAG file (https://bford.info/cachedir/; the directory and its tag
    /// stay)
    #[arg(long)]
    pub exclude_caches: bool,
    /// Leave out regular files larger than this (e.g. 500M, 2G)
    #[arg(long, value_name = "SIZE")]
    pub exclude_larger_than: Option<String>,
    /// Read the paths to back up from this file, one per line ("-": standard
    /// input); lines starting with # and empty lines are skipped, glob patterns
    /// are expanded, and \ takes the next character as it is (\* a literal star;
    /// repeatable, combines with paths given as arguments)
    #[arg(long = "files-from", value_name = "FILE")]
    pub files_from: Vec<PathBuf>,
    /// As --files-from, each line a path as it is: no comments, no patterns
    #[arg(long = "files-from-verbatim", value_name = "FILE")]
    pub files_from_verbatim: Vec<PathBuf>,
    /// As --files-from-verbatim, the paths separated by NUL bytes (find -print0)
    #[arg(long = "files-from-raw", value_name = "FILE")]
    pub files_from_raw: Vec<PathBuf>,
    /// The snapshot's time instead of now (importing old backups): RFC 3339 or
    /// "YYYY-MM-DD HH:MM:SS" in local time
    #[arg(long)]
    pub time: Option<String>,
    /// Do everything but store: read, chunk and deduplicate, then say what the
    /// backup would add (nothing is written to the repository but a lock)
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Do not cross filesystem boundaries
    #[arg(short = 'x', long)]
    pub one_file_system: bool,
    /// Back up a disk image or block device (a file, /dev/sdX, /dev/vg/snap) in
    /// fixed blocks of the repository's block size; every snapshot is a full image
    #[arg(long, value_name = "SOURCE")]
    pub image: Option<PathBuf>,
    /// The image's name in the snapshot (default: the source's file name)
    #[arg(long, requires = "image")]
    pub name: Option<String>,
    /// Read only the byte ranges this file lists as changed since the parent image
    /// snapshot and take every other block from it (changed-block tracking; see
    /// docs/IMAGES.md for the formats); `-` reads the list from standard input
    #[arg(long, value_name = "FILE", requires = "image")]
    pub changed_blocks: Option<PathBuf>,
    /// Format of --changed-blocks: auto, ranges ("OFFSET LENGTH" lines), json,
    /// qemu-dirty-map (qemu-img map over a dirty bitmap), thin-delta (LVM thin_delta)
    #[arg(
        long,
        value_name = "FORMAT",
        default_value = "auto",
        requires = "changed_blocks"
    )]
    pub changed_blocks_format: String,
    /// Back up standard input as one file
    #[arg(long)]
    pub stdin: bool,
    /// Run the command given after the options (`-- pg_dump mydb`) and back up what
    /// it writes to standard output as one file; if it exits with a failure, no
    /// snapshot is saved (a pipe into --stdin cannot tell)
    #[arg(long, conflicts_with = "stdin")]
    pub stdin_from_command: bool,
    /// File name for --stdin and --stdin-from-command
    #[arg(long, default_value = "stdin", visible_alias = "stdin-filename")]
    pub stdin_name: String,
    /// Snapshot to compare against for unchanged files (default: latest of this host and paths)
    #[arg(long)]
    pub parent: Option<String>,
    /// Read every file, even ones the parent snapshot shows unchanged
    #[arg(long)]
    pub force: bool,
    /// Save no snapshot when nothing changed since the parent (content and
    /// metadata): the parent stays the latest
    #[arg(long)]
    pub skip_if_unchanged: bool,
    /// List each file on stdout as the backup reaches it, and each directory
    /// (ending in /) once done: new, modified or unchanged since the parent
    /// (restic's -vv; with --json, a "file" event line each on stderr)
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Take a file as unchanged by its size and modification time alone, not its
    /// inode number and change time (file systems that number inodes anew at
    /// each mount: some FUSE and network ones)
    #[arg(long)]
    pub ignore_inode: bool,
    /// Take a file as unchanged without comparing its change time (ctime)
    #[arg(long)]
    pub ignore_ctime: bool,
    /// Do not add up the size of what is to be read first (the progress then has
    /// no total and no ETA; saves a walk of the source)
    #[arg(long)]
    pub no_scan: bool,
    /// Small files (up to 1 MiB) read at once (default: 8 per core, at least 16;
    /// more helps on network filesystems and cold disks)
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub read_concurrency: Option<u32>,
    /// This backup's pack size (128K to 256M; default: the repository's, see
    /// `cairn config`): small packs over a slow link, so an interruption costs
    /// seconds.
    #[arg(long, value_name = "SIZE")]
    pub pack_size: Option<String>,
    /// Read the sources at most this many bytes per second on average (50M; or
    /// bits: 400Mbit), to leave the disks to the production workload
    #[arg(long, value_name = "RATE")]
    pub read_limit: Option<String>,
}

/// A value that must not be empty (a tag, a host name), trimmed.
fn nonempty(what: &'static str) -> impl clap::builder::TypedValueParser<Value = String> {
    move |s: &str| -> std::result::Result<String, String> {
        let t = s.trim();
        if t.is_empty() {
            Err(format!("an empty {what}"))
        } else {
            Ok(t.to_string())
        }
    }
}

/// A path inside a snapshot (or a pattern) as given, even when it is not UTF-8 (a
/// file name with other bytes): those bytes travel as the engine's stand-ins
/// (`cairn_core::ls::escape_arg`), so that the name is matched by its exact bytes.
/// A name typed as listings show it (U+FFFD for such bytes) is matched too when
/// only one name of its directory reads that way.
fn snapshot_path() -> impl clap::builder::TypedValueParser<Value = String> {
    use clap::builder::TypedValueParser;
    use std::os::unix::ffi::OsStrExt;
    clap::builder::OsStringValueParser::new().map(|s| cairn_core::ls::escape_arg(s.as_bytes()))
}

#[derive(Args)]
pub struct LsArgs {
    /// Snapshot id (prefix) or "latest"
    pub snapshot: String,
    /// Directories or files inside the snapshot (default: all of it)
    #[arg(value_parser = snapshot_path(), value_name = "PATH")]
    pub dirs: Vec<String>,
    /// Long listing: mode, owner, size, time
    #[arg(short, long)]
    pub long: bool,
    /// Only list the given directory, not its subdirectories
    #[arg(long)]
    pub no_recursive: bool,
    /// List the subdirectories too: cairn's default, taken for restic's scripts
    /// (restic lists one level of a directory named without it)
    #[arg(long, conflicts_with = "no_recursive")]
    pub recursive: bool,
    /// Write the directory's tree in ncdu's export format, to see what takes
    /// the room: `cairn ls latest --ncdu > s.json; ncdu -f s.json`
    #[arg(long, conflicts_with_all = ["long", "no_recursive", "reverse"])]
    pub ncdu: bool,
    /// Order of the listing: name (the tree's order), size, time (= mtime),
    /// atime, ctime, extension. Other than name, the whole listing is held and
    /// sorted before anything is written, as restic's
    #[arg(short = 's', long, value_name = "BY", default_value = "name",
          value_parser = ["name", "size", "time", "mtime", "atime", "ctime", "extension"])]
    pub sort: String,
    /// List in the reverse order (largest, newest or last name first)
    #[arg(long)]
    pub reverse: bool,
    #[command(flatten)]
    pub image_fs: ImageFsArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
}

/// Files inside the filesystem of an image snapshot.
#[derive(Args)]
pub struct ImageFsArgs {
    /// A path inside the ext2/3/4 filesystem of an image snapshot (backup --image),
    /// or of the disk image file --image-file names, read in place: no loop
    /// device, no restore of the disk (restore writes TARGET/<its last name>,
    /// TARGET/root for /)
    #[arg(long, value_name = "PATH", value_parser = snapshot_path())]
    pub image_fs: Option<String>,
    /// With --image-fs on a snapshot of files: the raw disk image file in it to
    /// look inside (an image backed up as a file, or one `recover` saved)
    #[arg(long, value_name = "PATH", requires = "image_fs", value_parser = snapshot_path())]
    pub image_file: Option<String>,
    /// With --image-fs on a whole-disk image: the partition (1-based) holding the
    /// filesystem (default: the image itself, else the first partition holding one)
    #[arg(long, value_name = "N", requires = "image_fs")]
    pub partition: Option<u32>,
}

#[derive(Args)]
pub struct FindArgs {
    /// Glob matched against names (`*.conf`, `report-202?.pdf`) or, when it holds a
    /// `/`, against whole paths in the snapshot (`/home/*/notes.txt`, `docs/**/*.pdf`);
    /// a trailing `/` matches directories only (`cache/`)
    #[arg(value_parser = snapshot_path())]
    pub pattern: String,
    /// Search only these snapshots (id prefixes or "latest"; repeatable; default: all)
    #[arg(long = "snapshot", short = 's', value_name = "SNAPSHOT")]
    pub snapshots: Vec<String>,
    /// Stop once the N newest snapshots holding a match are found
    #[arg(long, value_name = "N")]
    pub newest: Option<usize>,
    /// Match names and paths without regard to case
    #[arg(short, long)]
    pub ignore_case: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
}

/// Which snapshots a command considers, as restic's flags: `latest` means the newest
/// of those, and a snapshot named by id must be one of them.
#[derive(Args, Clone, Default)]
pub struct FilterArgs {
    /// Only snapshots of this host (repeatable)
    #[arg(long = "host", value_name = "HOST")]
    pub hosts: Vec<String>,
    /// Only snapshots carrying all of these comma-separated tags (repeatable: any)
    #[arg(long = "tag", value_name = "TAGS")]
    pub tags: Vec<String>,
    /// Only snapshots that include this path (repeatable: all)
    #[arg(long = "path", value_name = "PATH")]
    pub paths: Vec<std::path::PathBuf>,
}

impl FilterArgs {
    /// A relative `--path` is taken from the current directory, as backup takes
    /// its paths (snapshots record absolute ones: `--path data` matched nothing).
    pub fn engine(&self) -> cairn_core::forget::SnapshotFilter {
        cairn_core::forget::SnapshotFilter {
            hosts: self.hosts.clone(),
            tags: self.tags.clone(),
            // As snapshots record paths: bytes that are not UTF-8 as their
            // stand-ins (a name in Latin-1 is matched by its bytes).
            paths: self
                .paths
                .iter()
                .map(|p| {
                    use std::os::unix::ffi::OsStrExt;
                    let text =
                        |p: &std::path::Path| cairn_core::ls::escape_arg(p.as_os_str().as_bytes());
                    if p.is_absolute() {
                        return text(p);
                    }
                    // Resolved as backup resolves it, when it exists here.
                    std::fs::canonicalize(p)
                        .or_else(|_| std::path::absolute(p))
                        .map_or_else(|_| text(p), |a| text(&a))
                })
                .collect(),
        }
    }
}

#[derive(Args)]
pub struct RewriteArgs {
    /// Snapshots to rewrite (id prefixes or "latest"); none: every snapshot the
    /// --host/--tag/--path filters select
    pub snapshots: Vec<String>,
    /// Take out what matches this pattern (as backup's --exclude, against the
    /// paths `ls` prints; repeatable)
    #[arg(short = 'e', long = "exclude", value_parser = snapshot_path())]
    pub excludes: Vec<String>,
    /// Read such patterns from a file, one per line
    #[arg(long = "exclude-file")]
    pub exclude_files: Vec<PathBuf>,
    /// As --exclude, ignoring case (repeatable)
    #[arg(long = "iexclude", value_parser = snapshot_path())]
    pub iexcludes: Vec<String>,
    /// Forget each rewritten snapshot once its replacement is stored (else both
    /// stay, the replacement tagged "rewrite", as in restic); `prune` then frees
    /// what only it held
    #[arg(long)]
    pub forget: bool,
    /// Only say what would be taken out
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Args)]
pub struct TagArgs {
    /// Snapshots to change (id prefixes or "latest"); none: every snapshot the
    /// --host/--tag/--path filters select
    pub snapshots: Vec<String>,
    /// Add these comma-separated tags (repeatable)
    #[arg(long, value_name = "TAGS", value_delimiter = ',')]
    pub add: Vec<String>,
    /// Remove these comma-separated tags (repeatable)
    #[arg(long, value_name = "TAGS", value_delimiter = ',')]
    pub remove: Vec<String>,
    /// Replace all tags with these comma-separated ones ("" removes them all;
    /// repeatable)
    #[arg(long, value_name = "TAGS", value_delimiter = ',')]
    pub set: Vec<String>,
    /// Only say what would change
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Args)]
pub struct SnapshotsArgs {
    /// Only these snapshots (id prefixes or "latest": the newest of those the
    /// filters leave), as restic's: `cairn snapshots latest --json`
    #[arg(value_name = "SNAPSHOT")]
    pub snapshots: Vec<String>,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Only the N newest snapshots of each host and set of paths (0: all), those
    /// dated over an hour in the future last, as `latest` passes them over
    #[arg(long, value_name = "N")]
    pub latest: Option<usize>,
    /// List the snapshots in groups sharing these: host,paths,tags (--latest then
    /// counts per group; --json: one object per group, as restic's)
    #[arg(short = 'g', long, value_name = "FIELDS")]
    pub group_by: Option<String>,
    /// No paths column: id, time, host, tags and size
    #[arg(short = 'c', long)]
    pub compact: bool,
}

#[derive(Args)]
pub struct DiffArgs {
    /// The older snapshot (id prefix or "latest")
    pub first: String,
    /// The newer snapshot (id prefix or "latest")
    pub second: String,
    /// Compare only this directory or file of both
    #[arg(value_parser = snapshot_path())]
    pub path: Option<String>,
    /// Also list entries whose content is the same but whose owner, mode, time or
    /// extended attributes changed (always counted in the summary)
    #[arg(long)]
    pub metadata: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Args)]
pub struct DumpArgs {
    /// Snapshot id (prefix) or "latest"
    pub snapshot: String,
    /// Path of the file inside the snapshot; required but with --archive (a
    /// directory, or the whole snapshot when left out) or --image-fs. A
    /// directory's archive names its members from the directory itself
    /// (`/srv/www` gives `www/...`; restic's from the root: `srv/www/...`)
    #[arg(required_unless_present_any = ["image_fs", "archive"], value_parser = snapshot_path())]
    pub file: Option<String>,
    /// Write the path and everything below it as an archive (`tar`: GNU tar's
    /// format, owners, ns times, xattrs and hard links; streams, e.g. to tape;
    /// `zip`). A
    /// directory is written as tar without it.
    /// (Not with --image-fs, whose files are read in place one at a time: restore
    /// --image-fs a directory instead.)
    #[arg(long, value_parser = ["tar", "zip"], conflicts_with = "image_fs")]
    pub archive: Option<String>,
    /// Write to this file instead of standard output (as restic's; it appears
    /// only whole: written beside it and renamed; an --archive that is not whole
    /// goes to FILE.incomplete). A symlink is followed, as `> FILE` follows it
    #[arg(short, long, value_name = "FILE", conflicts_with = "image_fs")]
    pub target: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub image_fs: ImageFsArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Args)]
pub struct ExportArgs {
    /// Snapshot id (prefix) or "latest"
    pub snapshot: String,
    /// Directory or file of the snapshot to export (default: all of it)
    #[arg(value_parser = snapshot_path())]
    pub path: Option<String>,
    /// tar (GNU tar's format, with pax records: owners, ns times, xattrs, ACLs,
    /// hard links, devices, sparse files), tar.zst (the same through zstd, as
    /// `tar --zstd -xf` reads it) or zip (names, modes, symlinks, 2 s times;
    /// deflated). Default: as an --output FILE is named (*.zip, *.tar.zst or
    /// *.tzst), tar otherwise
    #[arg(long, value_parser = ["tar", "tar.zst", "zip"])]
    pub format: Option<String>,
    /// Write to this file (made complete, then renamed into place) instead of
    /// standard output (`-`: standard output). An archive with entries left out
    /// or zeros for content that could not be read goes to FILE.incomplete, and
    /// FILE is left as it was. A symlink is followed, as `> FILE` follows it
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Args)]
pub struct RestoreArgs {
    /// Snapshot id (prefix) or "latest"; SNAP:PATH restores the snapshot's
    /// directory PATH as the target itself (latest:/home/alice -t /home/alice),
    /// with --include/--exclude paths below it; a target the restore creates
    /// gets PATH's own mode, owner and times, one that exists keeps its own
    pub snapshot: String,
    /// Directory to restore into (created if missing); with --image, the file or
    /// block device to write the image to
    #[arg(short, long)]
    pub target: PathBuf,
    /// Restore only this path of the snapshot and what is below it; one that
    /// names no entry is a pattern (as --exclude's: '*.conf', '/home/*/mail',
    /// 'sub' at any depth, '!x' taking back), choosing what it matches (repeatable)
    #[arg(short, long = "include", value_parser = snapshot_path())]
    pub includes: Vec<String>,
    /// Read such paths or patterns from a file, one per line (# comments and empty lines skipped)
    #[arg(long = "include-file", value_name = "FILE")]
    pub include_files: Vec<PathBuf>,
    /// As --include's patterns, ignoring case (repeatable)
    #[arg(long = "iinclude", value_parser = snapshot_path())]
    pub iincludes: Vec<String>,
    /// Read such patterns from a file, one per line
    #[arg(long = "iinclude-file", value_name = "FILE")]
    pub iinclude_files: Vec<PathBuf>,
    /// Do not restore what matches this pattern (as backup's --exclude, against
    /// the paths `ls` prints; --delete leaves it alone too, unless it is inside
    /// a directory the snapshot lacks, which goes whole; repeatable)
    #[arg(short = 'e', long = "exclude", value_parser = snapshot_path())]
    pub excludes: Vec<String>,
    /// Read such patterns from a file, one per line
    #[arg(long = "exclude-file", value_name = "FILE")]
    pub exclude_files: Vec<PathBuf>,
    /// As --exclude, ignoring case (repeatable)
    #[arg(long = "iexclude", value_parser = snapshot_path())]
    pub iexcludes: Vec<String>,
    /// Read such patterns from a file, one per line
    #[arg(long = "iexclude-file", value_name = "FILE")]
    pub iexclude_files: Vec<PathBuf>,
    /// What to do with entries already in the target: always (replace), if-changed
    /// (replace unless size and time, or else the content, match the snapshot; a
    /// file with the snapshot's content gets its mode, time and extended
    /// attributes in place; one whose owner differs, or with other hard links,
    /// is written anew, since it may be someone else's file), if-newer
    /// (replace when the snapshot's is newer), never. A directory that is there
    /// keeps its own mode, owner, times and attributes under never, and under
    /// if-newer unless the snapshot's is newer; what goes into it is restored
    #[arg(long, value_name = "WHEN", default_value = "if-changed")]
    pub overwrite: String,
    /// Remove what the snapshot does not have from the directories it backed up
    /// (its paths and below, not the directories above them), and a directory where
    /// it has a file; nothing on another file system mounted in the target, nor the
    /// repository being restored from
    #[arg(long)]
    pub delete: bool,
    /// Change nothing: print how many entries would be written and kept, and each
    /// one that would be deleted (--delete; a directory once, counted with what
    /// it holds)
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    /// Read every file written back and compare it with the snapshot; with
    /// --overwrite if-changed, a file whose size and time match is kept only
    /// once its bytes are compared too (else it is written again)
    #[arg(long)]
    pub verify: bool,
    /// List each entry on stdout once done: restored (where nothing was),
    /// updated (written over, or metadata only), unchanged, deleted (--delete);
    /// with --dry-run, what would be ("would restore", "would update", "would
    /// delete")
    /// (restic's -vv; with --json, a "file" event line each on stderr).
    /// Directories (as they are entered), symlinks and special files are listed
    /// too; a directory is "updated" when its mode, owner or time is set back
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Accepted for restic's scripts: cairn always leaves a file's runs of zeros
    /// (whole pages) as holes
    #[arg(long)]
    pub sparse: bool,
    /// Write at most this many bytes per second on average (as --read-limit)
    #[arg(long, value_name = "RATE")]
    pub write_limit: Option<String>,
    /// Leave extended attributes whose name matches this glob alone: neither set
    /// nor removed nor compared ('security.selinux', 'trusted.*'; repeatable)
    #[arg(long = "exclude-xattr", value_name = "PATTERN")]
    pub exclude_xattrs: Vec<String>,
    /// Restore only the extended attributes whose name matches this glob
    /// ('user.*', 'system.posix_acl_*'; repeatable; --exclude-xattr still applies)
    #[arg(long = "include-xattr", value_name = "PATTERN")]
    pub include_xattrs: Vec<String>,
    /// Restore an image snapshot (backup --image) to the file or block device
    /// given as --target (a directory gets the image under its name)
    #[arg(long, conflicts_with = "image_fs")]
    pub image: bool,
    /// With --image onto a device known to hold zeros: do not write zero blocks
    #[arg(long, requires = "image")]
    pub zeroed: bool,
    #[command(flatten)]
    pub image_fs: ImageFsArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Subcommand)]
pub enum KeyCommand {
    /// List the repository's keys
    List,
    /// Add a password (asked for, or from --new-password-file)
    Add(NewPassword),
    /// Change the password of the key in use
    Passwd(NewPassword),
    /// Remove a key by id (prefix)
    Remove { id: String },
}

#[derive(Args)]
pub struct NewPassword {
    /// Read the new password from this file
    #[arg(long)]
    pub new_password_file: Option<PathBuf>,
}

#[derive(Args)]
pub struct ConfigArgs {
    /// Set the compression for data written from now on: none, standard or max
    #[arg(long)]
    pub compression: Option<String>,
    /// Set how many backup jobs may write at once (default 4); more wait their turn
    #[arg(long)]
    pub max_concurrent_jobs: Option<u32>,
    /// Pack size for new data (1M to 256M): smaller for clients on slow links, so a
    /// dropped connection loses seconds of upload, not minutes.
    #[arg(long, value_name = "SIZE")]
    pub pack_size: Option<String>,
    /// Not a setting: the block size is fixed at creation (refused with what to do)
    #[arg(long, hide = true, value_name = "SIZE")]
    pub block_size: Option<String>,
    /// Not a setting: encryption is chosen at creation (refused with what to do)
    #[arg(long, hide = true)]
    pub no_encryption: bool,
}

#[derive(Args)]
pub struct CheckArgs {
    /// Also read, decrypt and verify every blob
    #[arg(long, conflicts_with = "read_data_subset")]
    pub read_data: bool,
    /// Read and verify only part of the packs: "N/M" (group N of M, by pack id),
    /// "P%" (a random sample) or a size such as "500M" (random packs until that
    /// much is read; at least one)
    #[arg(long, value_name = "N/M|P%|SIZE")]
    pub read_data_subset: Option<String>,
}

/// Counts are strings so that a bad value is reported by `forget` itself (exit 1, one
/// line) rather than by clap; "unlimited" is accepted for -1.
#[derive(Args)]
pub struct ForgetArgs {
    /// Snapshot ids (prefixes) to remove; not combinable with --keep-* or filters
    #[arg(value_name = "SNAPSHOT")]
    pub snapshots: Vec<String>,
    /// Keep the N newest snapshots (-1 or "unlimited": all)
    #[arg(short = 'l', long, value_name = "N", allow_negative_numbers = true)]
    pub keep_last: Option<String>,
    /// Keep the newest snapshot of each of the last N hours that have one
    #[arg(short = 'H', long, value_name = "N", allow_negative_numbers = true)]
    pub keep_hourly: Option<String>,
    /// Keep the newest snapshot of each of the last N days that have one
    #[arg(short = 'd', long, value_name = "N", allow_negative_numbers = true)]
    pub keep_daily: Option<String>,
    /// Keep the newest snapshot of each of the last N ISO weeks that have one
    #[arg(short = 'w', long, value_name = "N", allow_negative_numbers = true)]
    pub keep_weekly: Option<String>,
    /// Keep the newest snapshot of each of the last N months that have one
    #[arg(short = 'm', long, value_name = "N", allow_negative_numbers = true)]
    pub keep_monthly: Option<String>,
    /// Keep the newest snapshot of each of the last N years that have one
    #[arg(short = 'y', long, value_name = "N", allow_negative_numbers = true)]
    pub keep_yearly: Option<String>,
    /// Keep snapshots newer than DURATION (e.g. 1y2m3d4h) before the group's newest
    #[arg(long, value_name = "DURATION")]
    pub keep_within: Option<String>,
    /// Keep the newest snapshot of each hour within DURATION of the group's newest
    #[arg(long, value_name = "DURATION")]
    pub keep_within_hourly: Option<String>,
    /// Keep the newest snapshot of each day within DURATION of the group's newest
    #[arg(long, value_name = "DURATION")]
    pub keep_within_daily: Option<String>,
    /// Keep the newest snapshot of each ISO week within DURATION of the group's newest
    #[arg(long, value_name = "DURATION")]
    pub keep_within_weekly: Option<String>,
    /// Keep the newest snapshot of each month within DURATION of the group's newest
    #[arg(long, value_name = "DURATION")]
    pub keep_within_monthly: Option<String>,
    /// Keep the newest snapshot of each year within DURATION of the group's newest
    #[arg(long, value_name = "DURATION")]
    pub keep_within_yearly: Option<String>,
    /// Keep snapshots carrying all of these comma-separated tags (repeatable; an empty
    /// value, `--keep-tag ''`, keeps the snapshots that have no tags)
    #[arg(long = "keep-tag", value_name = "TAGS")]
    pub keep_tags: Vec<String>,
    /// Which snapshots the policy considers (the others are neither kept nor removed)
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Apply the policy per group of snapshots sharing these: host,paths,tags or ''
    #[arg(short = 'g', long, value_name = "FIELDS")]
    pub group_by: Option<String>,
    /// Show what would be removed without removing anything
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Run prune afterwards if snapshots were removed
    #[arg(long)]
    pub prune: bool,
}

#[derive(Args)]
pub struct CopyArgs {
    /// Repository to copy from (a directory or s3:...; --from-repo, as restic)
    #[arg(
        long,
        visible_alias = "from-repo",
        env = "CAIRN_FROM_REPO",
        value_name = "REPO"
    )]
    pub from: String,
    /// Repository to copy to (default: --repo / CAIRN_REPO)
    #[arg(long, value_name = "REPO")]
    pub to: Option<String>,
    /// The source repository's password file (else CAIRN_FROM_PASSWORD,
    /// CAIRN_FROM_PASSWORD_FILE, or a prompt)
    #[arg(long, value_name = "FILE")]
    pub from_password_file: Option<PathBuf>,
    /// A command printing the source repository's password (first line; as
    /// CAIRN_FROM_PASSWORD_COMMAND)
    #[arg(long, value_name = "COMMAND")]
    pub from_password_command: Option<String>,
    /// The source's cairn server token, first line of this file (else
    /// CAIRN_FROM_TOKEN; neither: the destination's --token-file / CAIRN_TOKEN)
    #[arg(long, env = "CAIRN_FROM_TOKEN_FILE", value_name = "FILE")]
    pub from_token_file: Option<PathBuf>,
    /// The source cairn server's certificate fingerprint (else the destination's
    /// --server-fingerprint)
    #[arg(long, env = "CAIRN_FROM_SERVER_FINGERPRINT", value_name = "SHA256")]
    pub from_server_fingerprint: Option<String>,
    /// CA certificate(s) to trust for the source (else the destination's --cacert)
    #[arg(long, env = "CAIRN_FROM_CACERT", value_name = "FILE")]
    pub from_cacert: Option<PathBuf>,
    /// This copy's pack size (128K to 256M; default: the destination's): small
    /// packs over a slow link, so an interruption costs seconds
    #[arg(long, value_name = "SIZE")]
    pub pack_size: Option<String>,
    /// Snapshots to copy (id prefixes or "latest"); default: all that the
    /// --host/--tag/--path filters select. Files are re-chunked on --threads
    /// threads (default: the number of cores)
    pub snapshots: Vec<String>,
    #[command(flatten)]
    pub filter: FilterArgs,
}

/// The command line, with an environment variable that is set but empty taken as
/// unset (as `CAIRN_TOKEN_FILE=` in a script that clears it means), not as an
/// empty value that fails as a flag the user never gave.
pub fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    fn without_empty_env(mut cmd: clap::Command) -> clap::Command {
        let empty: Vec<clap::Id> = cmd
            .get_arguments()
            .filter(|a| {
                a.get_env()
                    .and_then(std::env::var_os)
                    .is_some_and(|v| v.is_empty())
            })
            .map(|a| a.get_id().clone())
            .collect();
        for id in empty {
            cmd = cmd.mut_arg(id, |a| a.env(None::<&str>));
        }
        let subs: Vec<String> = cmd
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        for name in subs {
            cmd = cmd.mut_subcommand(name, without_empty_env);
        }
        cmd
    }
    let matches = without_empty_env(Cli::command()).get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let given = |m: &clap::ArgMatches| {
        m.value_source("memory_limit") == Some(clap::parser::ValueSource::CommandLine)
    };
    cli.global.memory_limit_flag =
        given(&matches) || matches.subcommand().is_some_and(|(_, m)| given(m));
    cli
}
