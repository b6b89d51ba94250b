#!/usr/bin/env python3
"""Run cairn, restic and borg side by side on the bench datasets.

Normally started through bench/run.sh (which builds cairn and installs the
peers first). Standard library only.

For every dataset, each phase is run for every selected tool before the next
phase starts, so all tools see the same tree state:
  mixed: first backup, unchanged re-backup, backup after day-2 edits, restore
  small: first backup, unchanged re-backup, restore
  image: first backup (v1), unchanged re-backup, backup of changed copy (v2), restore
The maintenance scenario (--scenario maintenance; cairn and restic only) backs
up a day-by-day history of the mixed tree (day 1 = the tree, each later day
applies datasets.apply_history_day: ~4% of the files deleted, rewritten or
edited) into fresh repositories, then runs forget --keep-last K, prune
(--max-unused 5%, both tools' default) and check --read-data, each measured on
its own: phases day1..dayN, forget, prune, check-rd.
The blocksizes scenario (--scenario blocksizes; cairn only; not part of all)
keeps the same history as one directory per day (WORK/history/day-01..,
cached), runs `cairn estimate --block-sizes ...` over all day dirs once, then
for each block size x compression creates a datastore, backs up every day dir,
restores the last day, records `cairn stats --json` and compares it with the
estimate (within 2 percentage points expected).
The jobs scenario (--scenario jobs; cairn and restic; not part of all) starts
1, 2 and 4 backups at once into one fresh repository, job k backing up history
day k (the blocksizes day dirs), and records the total wall time (first start
to last end), the aggregate MB/s and what the repository holds (cairn stats
--json, restic stats --mode raw-data, du); the same trees backed up one after
another give the baseline, so occupied(concurrent) - occupied(sequential) is the
duplicate data the concurrent jobs stored. cairn then runs prune --max-unused 0%
and, after the largest run, restores and verifies every job's snapshot and runs
check --read-data.
The s3 scenario (--scenario s3; cairn and restic; not part of all) starts a
throwaway MinIO (scripts/s3-server.sh, under WORK/s3-server, stopped at the
end even on error) and, for each --datasets entry, backs up to a fresh S3
prefix per tool (first, unchanged) and restores (verified); besides wall, MB/s,
CPU and RSS it records the bytes each command sent and received: cairn's own
counters (CAIRN_TRAFFIC_REPORT=1) and, for every tool, MinIO's server-side
counters (v3 metrics). Repository size = bytes of the prefix's objects.
The copy scenario (--scenario copy; cairn, restic optional; not part of all)
backs up a --copy-days (12) history of the mixed tree (the maintenance
history: datasets.apply_history_day on one live tree) into a cairn repository
R1 with --block-size 4K, then measures `cairn copy --from R1` into a fresh
local 64K repository (and into a 64K repository on MinIO when a MinIO binary
is present), records bytes_sent against the snapshots' logical bytes, runs
each copy a second time (must send nothing), and copies days 1..N-1 and then
day N alone into a third repository (day N's bytes_sent against the bytes that
day changed). With restic in --tools, `restic copy` of the same days between
two restic repositories (target made with init --copy-chunker-params).
Every command runs under /usr/bin/time -v (CPU user+sys, peak RSS); wall time
is measured here. After each command `sync` runs (timed separately, not part
of wall) so one tool's dirty pages do not slow the next one down.
"""
import argparse
import csv
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, BENCH_DIR)
import datasets  # noqa: E402

REPO_ROOT = os.path.dirname(BENCH_DIR)
PASSWORD = "cairn-bench-password"
ALL_TOOLS = ["cairn", "restic", "borg", "kopia"]
DEFAULT_TOOLS = ["cairn", "restic", "borg"]  # kopia: name it (--tools ...,kopia)
ALL_DATASETS = ["mixed", "small", "image", "dense"]
DEFAULT_DATASETS = ["mixed", "small", "image"]  # dense (1M files): name it
ALL_SCENARIOS = ["backup", "maintenance", "blocksizes", "jobs", "s3", "copy", "server", "clients", "slowlink",
                 "recovery"]
CLIENTS_DATASET = "clients"  # rows of the clients scenario
SLOWLINK_DATASET = "slowlink"  # rows of the slow-link scenario
SLOWLINK_RATE = 250_000  # bytes per second: a 2 Mbit/s uplink
SLOWLINK_PACK = "1M"  # cairn's pack size on that link (a drop loses at most ~4 s of sending)
CLIENTS_N = 8
DEFAULT_SCENARIOS = ["backup", "maintenance"]  # what --scenario all runs (blocksizes, jobs, s3, copy, server: opt in)
# server scenario: each tool locally and through its server, side by side
SERVER_TOOLS = {"cairn": "cairn-serve", "restic": "restic-rest"}
SERVER_PREFIX = "srv-"  # dataset of the server scenario's rows: srv-<kind>
MAINT_TOOLS = ["cairn", "restic"]
MAINT_PHASES = ["forget", "prune", "check-rd"]
MAINT_DATASET = "maint"
BS_DATASET = "blocksizes"
BS_SIZES = "4K,8K,16K,32K,64K"
BS_COMPRESSIONS = "standard,max"
# fields of `cairn stats --json` recorded per datastore (plus index.bytes and index.ram_bytes)
STATS_FIELDS = ["stored_bytes", "dedup_percent", "compression_percent", "reduction_percent", "occupied_bytes",
                "unique_chunks", "average_chunk_bytes"]
# fields of each `cairn estimate --json` block_sizes entry recorded per block size
EST_FIELDS = ["dedup_percent", "compression_standard_percent", "compression_max_percent",
              "reduction_standard_percent", "reduction_max_percent"]
EST_TOLERANCE_PP = 2.0  # estimate vs real datastore: required to agree within this many percentage points
JOBS_DATASET = "jobs"
JOBS_TOOLS = ["cairn", "restic"]
JOBS_COUNTS = "1,2,4"
# fields of `cairn stats --json` recorded in the jobs scenario (name in the CSV note -> path in the JSON)
JOBS_CAIRN_STATS = {"stored_bytes": ("stored_bytes",), "unique_data_bytes": ("unique_data_bytes",),
                    "compressed_data_bytes": ("compressed_data_bytes",), "occupied_bytes": ("occupied_bytes",),
                    "unused_bytes": ("overhead", "unused_bytes"), "packs_bytes": ("packs", "bytes"),
                    "unique_chunks": ("unique_chunks",), "snapshots": ("snapshots",)}
# fields of `restic stats --mode raw-data --json`
JOBS_RESTIC_STATS = {"raw_total_size": ("total_size",), "raw_total_uncompressed_size": ("total_uncompressed_size",),
                     "raw_blob_count": ("total_blob_count",), "snapshots": ("snapshots_count",)}
S3_TOOLS = ["cairn", "restic"]
S3_SCRIPT = os.path.join(REPO_ROOT, "scripts", "s3-server.sh")
S3_PREFIX = "s3-"  # dataset of the s3 scenario's rows: s3-<kind>
COPY_DATASET = "copy"
COPY_DAYS = 12
RECOVERY_DATASET = "recovery"
RECOVERY_DAYS = 25
RECOVERY_TOOLS = ("cairn", "restic", "borg", "kopia")
COPY_SRC_BLOCK = "4K"
COPY_DST_BLOCK = "64K"
# fields of `cairn copy --json` recorded in the note
COPY_FIELDS = ["snapshots_copied", "same_chunking", "logical_bytes", "files", "files_rechunked",
               "bytes_read_from_source", "blobs_added", "bytes_added", "bytes_sent", "bytes_received",
               "duration_secs"]
# what cairn prints at exit with CAIRN_TRAFFIC_REPORT=1, one line per repository opened
TRAFFIC_RE = re.compile(r"^traffic: (.+): uploaded (\d+) bytes, downloaded (\d+) bytes, (\d+) requests\s*$")
MB = 1e6


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_size(s):
    """"16K" -> 16384 (K, M, G: powers of 1024; a plain number is bytes)."""
    s = str(s).strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)


def _fmt_num(v):
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def du_bytes(path):
    if not os.path.exists(path):
        return 0
    out = subprocess.run(["du", "-sb", path], capture_output=True, text=True)
    try:
        return int(out.stdout.split()[0])
    except (IndexError, ValueError):
        return 0


def repo_size(t):
    """Bytes a tool's repository holds: du -sb of a local directory, or for a repository on the
    s3 server the sum of its objects' sizes (ListObjectsV2 of its prefix)."""
    s3 = getattr(t, "s3", None)
    if s3 is not None:
        n = s3.prefix_bytes(t.s3_prefix)
        return 0 if n is None else n
    return du_bytes(getattr(t, "repo_dir", None) or t.repo)


def free_port():
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


class ServerProcess:
    """A server the server scenario starts for one tool (cairn serve, rest-server), logging to a
    file; its CPU time and peak RSS come from /proc, since /usr/bin/time only sees the client."""

    def __init__(self, argv, env, log_path):
        self.argv, self.env, self.log_path = argv, env, log_path
        self.proc = None

    def start(self, ready, timeout=60):
        """Start and wait until ready(log text) returns something true; returns that."""
        self.logf = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=self.logf,
                                     stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            got = ready(open(self.log_path, errors="replace").read())
            if got:
                return got
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.argv[0]} did not start: {open(self.log_path, errors='replace').read()[-800:]}")

    def cpu_s(self):
        try:
            f = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError, AttributeError):
            return 0.0

    def hwm_kib(self):
        try:
            for line in open(f"/proc/{self.proc.pid}/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        except (OSError, ValueError, AttributeError):
            pass
        return 0

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "logf", None):
            self.logf.close()


def cairn_traffic(log_path):
    """{location: (uploaded, downloaded, requests)} from the `traffic:` lines cairn prints at
    exit when CAIRN_TRAFFIC_REPORT is set (one line per repository it opened)."""
    out = {}
    try:
        text = open(log_path, errors="replace").read()
    except OSError:
        return out
    for line in text.splitlines():
        m = TRAFFIC_RE.match(line.strip())
        if m:
            out[m.group(1)] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
    return out


def minio_binary():
    """The MinIO binary scripts/s3-server.sh would use, without building one: $CAIRN_MINIO,
    `minio` on PATH, the CI cache, or go's bin directory. None if there is none."""
    cands = [os.environ.get("CAIRN_MINIO"), shutil.which("minio"),
             os.path.join(os.environ.get("CAIRN_CI_CACHE") or os.path.join(os.environ.get("HOME") or "/tmp",
                                                                          ".cache", "cairn-ci"), "minio")]
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None)
    if go:
        try:
            gobin, gopath = subprocess.run([go, "env", "GOBIN", "GOPATH"], capture_output=True, text=True,
                                           timeout=30).stdout.splitlines()[:2]
            cands.append(os.path.join(gobin, "minio") if gobin else
                         os.path.join(gopath.split(":")[0], "bin", "minio"))
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


class S3Server:
    """A throwaway MinIO on loopback (scripts/s3-server.sh) for the s3 and copy scenarios.

    It runs with MINIO_PROMETHEUS_AUTH_TYPE=public, so its v3 metrics (bytes received and sent,
    requests; updated at once, unlike the cached v2 ones) can be read without a token: the same
    traffic counters for every tool. Data lives in DIR/data, which remove() and the end of the
    scenario clean up."""
    BUCKET_ENV = "CAIRN_TEST_S3_BUCKET"

    def __init__(self, work, name="s3-server"):
        self.dir = os.path.join(work, name)
        self.env = {}

    def start(self, build=True):
        """Start MinIO and read its `export` lines. With build=False, only when a MinIO binary
        exists already (s3-server.sh would otherwise spend ~10 minutes building one).
        Raises RuntimeError when it cannot."""
        env = dict(os.environ, MINIO_PROMETHEUS_AUTH_TYPE="public")
        if not build:
            b = minio_binary()
            if not b:
                raise RuntimeError("no MinIO binary (CAIRN_MINIO, PATH, ~/.cache/cairn-ci, go bin); "
                                   "`scripts/s3-server.sh ensure` builds one")
            env["CAIRN_MINIO"] = b
        if os.path.exists(self.dir):  # left over from an interrupted run
            subprocess.run([S3_SCRIPT, "stop", self.dir], capture_output=True)
            shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        out = subprocess.run([S3_SCRIPT, "start", self.dir], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"scripts/s3-server.sh start failed (exit {out.returncode}): {out.stderr.strip()[-800:]}")
        for line in out.stdout.splitlines():
            toks = shlex.split(line)
            if toks[:1] == ["export"]:
                for tok in toks[1:]:
                    k, _, v = tok.partition("=")
                    self.env[k] = v
        for k in ("CAIRN_TEST_S3", "CAIRN_TEST_S3_ENDPOINT", self.BUCKET_ENV, "AWS_ACCESS_KEY_ID",
                  "AWS_SECRET_ACCESS_KEY"):
            if not self.env.get(k):
                self.stop()
                raise RuntimeError(f"scripts/s3-server.sh start printed no {k}")
        self.env.setdefault("AWS_REGION", "us-east-1")
        self.endpoint = self.env["CAIRN_TEST_S3_ENDPOINT"]
        self.bucket = self.env[self.BUCKET_ENV]
        log(f"s3: MinIO at {self.endpoint}, bucket {self.bucket}, data in {self.dir}/data")
        return self

    def stop(self):
        subprocess.run([S3_SCRIPT, "stop", self.dir], capture_output=True)

    def location(self, prefix):
        return f"{self.env['CAIRN_TEST_S3']}/{prefix}"

    def tool_env(self):
        """What a tool needs to reach the server (restic and cairn read the same AWS_* variables)."""
        return {k: v for k, v in self.env.items() if k.startswith("AWS_") or k.lower() == "no_proxy"}

    def _curl(self, url):
        r = subprocess.run(["curl", "-fsS", "--noproxy", "*", "--max-time", "60", "--aws-sigv4",
                            f"aws:amz:{self.env['AWS_REGION']}:s3", "--user",
                            f"{self.env['AWS_ACCESS_KEY_ID']}:{self.env['AWS_SECRET_ACCESS_KEY']}", url],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(r.stderr.strip())
        return r.stdout

    def prefix_bytes(self, prefix):
        """Sum of the sizes of the objects under prefix/ (ListObjectsV2, paged), or None."""
        import urllib.parse
        import xml.etree.ElementTree as ET
        total, token = 0, None
        try:
            while True:
                q = "list-type=2&prefix=" + urllib.parse.quote(prefix.rstrip("/") + "/", safe="")
                if token:
                    # sigv4 wants the query sorted: continuation-token < list-type < prefix
                    q = "continuation-token=" + urllib.parse.quote(token, safe="") + "&" + q
                doc = ET.fromstring(self._curl(f"{self.endpoint}/{self.bucket}?{q}"))
                ns = doc.tag[:doc.tag.index("}") + 1] if doc.tag.startswith("{") else ""
                for c in doc.iter(ns + "Contents"):
                    total += int(c.findtext(ns + "Size") or 0)
                if (doc.findtext(ns + "IsTruncated") or "").lower() != "true":
                    return total
                token = doc.findtext(ns + "NextContinuationToken")
                if not token:
                    return total
        except (RuntimeError, ValueError, ET.ParseError) as ex:
            log(f"s3: listing {prefix} failed: {ex}")
            return None

    def metrics(self):
        """Server-side counters: {rx: bytes received, tx: bytes sent, requests}, or {}."""
        import urllib.request
        try:
            req = urllib.request.Request(f"{self.endpoint}/minio/metrics/v3/api/requests")
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            text = opener.open(req, timeout=30).read().decode()
        except OSError as ex:
            log(f"s3: reading MinIO metrics failed: {ex}")
            return {}
        m = dict(rx=0, tx=0, requests=0)
        for line in text.splitlines():
            if line.startswith("#") or 'type="s3"' not in line:
                continue
            try:
                v = float(line.rsplit(None, 1)[1])
            except (IndexError, ValueError):
                continue
            if line.startswith("minio_api_requests_traffic_received_bytes{"):
                m["rx"] += int(v)
            elif line.startswith("minio_api_requests_traffic_sent_bytes{"):
                m["tx"] += int(v)
            elif line.startswith("minio_api_requests_total{"):
                m["requests"] += int(v)
        return m

    def remove(self, prefix):
        """Delete a repository's objects. Straight from MinIO's data directory (a single-drive
        MinIO keeps each object as a directory there and no index of them), which is much
        faster than deleting thousands of objects through the API."""
        shutil.rmtree(os.path.join(self.dir, "data", self.bucket, prefix), ignore_errors=True)


def tree_size(path):
    files = nbytes = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for fn in filenames:
            p = os.path.join(dirpath, fn)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            files += 1
            if not os.path.islink(p):
                nbytes += st.st_size
    return files, nbytes


def drop_caches():
    subprocess.run(["sync"])
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def cpu_jiffies():
    """(busy, steal) jiffies of the whole machine from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    # user nice system idle iowait irq softirq steal ...
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    steal = v[7] if len(v) > 7 else 0
    return busy, steal


def fresh_dir(path):
    """An empty directory at path (removing what was there)."""
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)


def measured_fields(r):
    """The CSV fields of one measured command (see Runner.measure)."""
    return dict(wall_s=f"{r['wall_s']:.3f}", user_s=r.get("user_s", ""), sys_s=r.get("sys_s", ""),
                cpu_s=f"{r['cpu_s']:.2f}", max_rss_kib=r.get("max_rss_kib", ""),
                sync_s=f"{r['sync_s']:.2f}", other_cpu_s=r["other_cpu_s"], steal_s=r["steal_s"],
                log=r["log"])


def kv_note(d):
    """key=value pairs for a CSV note, leaving out empty values."""
    return " ".join(f"{k}={_fmt_num(v)}" for k, v in d.items() if v is not None and v != "")


def warm_tree(path):
    """Read every file of the tree once, right before a measured backup in warm mode. This VM
    reclaims clean page-cache pages that were not used for ~20 s (DAMON), so without it "warm"
    means partly cold, by an amount that depends on what ran before: the tool that runs first
    after a copy or a long peer run reads much of the tree from disk. Every tool gets the same
    warm tree; --cold measures the other extreme."""
    t0 = time.monotonic()
    find = subprocess.Popen(["find", path, "-type", "f", "-print0"], stdout=subprocess.PIPE)
    subprocess.run(["xargs", "-0", "-P", "4", "-n", "256", "cat"], stdin=find.stdout,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    find.wait()
    log(f"warmed the page cache with {path} ({time.monotonic() - t0:.1f}s, not measured)")


class JournalFs:
    """A fresh ext4 with a journal (mkfs.ext4's default) on a loop device backed by a
    file in `work` (O_DIRECT loop, so nothing is cached twice). This machine's root
    ext4 has no journal, and there a restore right after many files were deleted pays
    for the kernel's skipping of recently freed inodes (docs/PERFORMANCE.md)."""

    def __init__(self, work, size_gib, inodes):
        self.img = os.path.join(work, "journal-ext4.img")
        self.mnt = os.path.join(work, "journal-mnt")
        os.makedirs(self.mnt, exist_ok=True)
        with open(self.img, "wb") as f:
            f.truncate(size_gib << 30)
        # Enough inodes for every restore a condition keeps (the small set's files
        # would run out of mkfs's default of one per 16 KiB).
        subprocess.run(["mkfs.ext4", "-q", "-F", "-N", str(inodes), self.img], check=True)
        self.dev = subprocess.run(["losetup", "--direct-io=on", "-f", "--show", self.img],
                                  check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run(["mount", self.dev, self.mnt], check=True)

    def close(self):
        subprocess.run(["umount", self.mnt], check=False)
        subprocess.run(["losetup", "-d", self.dev], check=False)
        os.unlink(self.img)


def settle():
    """Flush dirty pages (and, on discard-mounted ext4, pending trims)."""
    subprocess.run(["sync"])


def parse_time_v(path):
    res = {}
    try:
        text = open(path).read()
    except OSError:
        return res
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("User time (seconds):"):
            res["user_s"] = float(line.split(":")[-1])
        elif line.startswith("System time (seconds):"):
            res["sys_s"] = float(line.split(":")[-1])
        elif line.startswith("Maximum resident set size (kbytes):"):
            res["max_rss_kib"] = int(line.split(":")[-1])
        elif line.startswith("Exit status:"):
            res["exit"] = int(line.split(":")[-1])
    return res


def hardware_line():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
                break
    except OSError:
        pass
    fs = "?"
    try:
        out = subprocess.run(["df", "-T", BENCH_DIR], capture_output=True, text=True).stdout.splitlines()
        fs = out[1].split()[1]
    except Exception:
        pass
    return (f"cpu={cpu}; cores={os.cpu_count()}; mem={mem}; kernel={platform.release()}; "
            f"fs={fs}; python={platform.python_version()}")


def git_sha():
    try:
        sha = subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "nocommit"
    dirty = subprocess.run(["git", "-C", REPO_ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return sha + ("-dirty" if dirty else "")


# --------------------------------------------------------------------------
# tools
# --------------------------------------------------------------------------
class Tool:
    name = "?"

    def __init__(self, bin_path, work, dataset):
        self.bin = bin_path
        self.repo = os.path.join(work, "repos", f"{self.name}-{dataset}")
        self.cache = os.path.join(work, "cache", f"{self.name}-{dataset}")
        os.makedirs(self.cache, exist_ok=True)
        self.extra_env = {}  # e.g. the s3 server's credentials
        self.s3 = None  # set (with s3_prefix) when the repository is on the s3 server

    def use_s3(self, server, prefix):
        """Put the repository on the s3 server, under a prefix of the bucket."""
        self.s3, self.s3_prefix = server, prefix
        self.repo = server.location(prefix)
        self.extra_env.update(server.tool_env())

    def env(self):
        e = dict(os.environ)
        e["XDG_CACHE_HOME"] = self.cache
        e.update(self.extra_env)
        return e

    def version(self):
        try:
            out = subprocess.run(self.version_cmd(), capture_output=True, text=True, env=self.env(), timeout=60)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except Exception as ex:  # noqa: BLE001
            return f"unknown ({ex})"

    # each returns (argv, cwd)
    def init_cmd(self):
        raise NotImplementedError

    def backup_cmd(self, path, snap):
        raise NotImplementedError

    def restore_cmd(self, target, snap):
        raise NotImplementedError

    # maintenance scenario (cairn and restic)
    def forget_cmd(self, keep_last):
        return [self.bin, "forget", "--repo", self.repo, "--keep-last", str(keep_last)], None

    def prune_cmd(self):
        # 5% is the default of both cairn and restic; spelled out for the logs
        return [self.bin, "prune", "--repo", self.repo, "--max-unused", "5%"], None

    def check_data_cmd(self):
        return [self.bin, "check", "--repo", self.repo, "--read-data"], None

    # lines of a command's output that summarise what it did (for the CSV note)
    SUMMARY_RE = {}

    def summary(self, phase, log_path):
        pat = self.SUMMARY_RE.get(phase)
        if not pat:
            return ""
        try:
            text = open(log_path, errors="replace").read()
        except OSError:
            return ""
        lines = [" ".join(line.split()) for line in text.splitlines()]
        return " | ".join(line for line in lines if re.match(pat, line))


class Cairn(Tool):
    name = "cairn"

    def env(self):
        e = super().env()
        e["CAIRN_PASSWORD"] = PASSWORD
        e["CAIRN_FROM_PASSWORD"] = PASSWORD  # copy: the source repository's password
        # settings from the caller's environment that would change what is measured
        for k in ("CAIRN_REPO", "CAIRN_PASSWORD_FILE", "CAIRN_FROM_REPO", "CAIRN_FROM_PASSWORD_FILE",
                  "CAIRN_CACHE_DIR", "CAIRN_LIMIT_UPLOAD", "CAIRN_LIMIT_DOWNLOAD", "CAIRN_FAULTS"):
            if k not in self.extra_env:
                e.pop(k, None)
        return e

    def version_cmd(self):
        return [self.bin, "--version"]

    def init_cmd(self):
        extra = os.environ.get("CAIRN_INIT_ARGS", "").split()
        return [self.bin, "init", "--repo", self.repo] + extra, None

    def backup_cmd(self, path, snap):
        extra = os.environ.get("CAIRN_BACKUP_ARGS", "").split()
        return [self.bin, "backup", "--repo", self.repo] + extra + [path], None

    def restore_cmd(self, target, snap):
        return [self.bin, "restore", "latest", "--repo", self.repo, "--target", target], None

    SUMMARY_RE = {
        "forget": r"(removed|would remove) \d+ snapshots?",
        "prune": r"(\d+ snapshots? need|will |would |space reclaimed|space to reclaim|wrote |kept |\d+ packs )",
        "check-rd": r"(checked |no errors|\d+ (errors|problems))",
    }


class Restic(Tool):
    name = "restic"

    def env(self):
        e = super().env()
        e["RESTIC_PASSWORD"] = PASSWORD
        e["RESTIC_CACHE_DIR"] = self.cache
        for k in ("RESTIC_REPOSITORY", "RESTIC_PASSWORD_FILE", "RESTIC_PASSWORD_COMMAND", "RESTIC_FROM_REPOSITORY",
                  "RESTIC_FROM_PASSWORD", "RESTIC_FROM_PASSWORD_FILE", "RESTIC_FROM_PASSWORD_COMMAND"):
            e.pop(k, None)
        return e

    def version_cmd(self):
        return [self.bin, "version"]

    def init_cmd(self):
        return [self.bin, "init", "--repo", self.repo], None

    def backup_cmd(self, path, snap):
        return [self.bin, "backup", "--repo", self.repo, "--host", "bench", path], None

    def restore_cmd(self, target, snap):
        return [self.bin, "restore", "latest", "--repo", self.repo, "--target", target], None

    SUMMARY_RE = {
        "forget": r"remove \d+ snapshots",
        "prune": r"(to repack:|this removes:|to delete:|total prune:|remaining:|unused size after prune:|"
                 r"totally used packs:|partly used packs:|unused packs:|to keep:|.*packs repacked|removing \d+ old packs)",
        "check-rd": r"(no errors|Fatal|.*[Ee]rror)",
    }


class Borg(Tool):
    name = "borg"

    def env(self):
        e = super().env()
        e["BORG_PASSPHRASE"] = PASSWORD
        e["BORG_BASE_DIR"] = self.cache  # cache, config, security dirs
        e["BORG_DISPLAY_PASSPHRASE"] = "no"
        e["BORG_RELOCATED_REPO_ACCESS_IS_OK"] = "yes"
        e.pop("BORG_REPO", None)
        return e

    def version_cmd(self):
        return [self.bin, "--version"]

    def init_cmd(self):
        return [self.bin, "init", "--encryption", "repokey-blake2", self.repo], None

    def backup_cmd(self, path, snap):
        # default compression (lz4)
        return [self.bin, "create", f"{self.repo}::{snap}", path], None

    def restore_cmd(self, target, snap):
        return [self.bin, "extract", f"{self.repo}::{snap}"], target


class Kopia(Tool):
    """kopia with its defaults (AES256-GCM-HMAC-SHA256, no compression, its own
    parallelism); the config, cache and logs live in the tool's cache dir."""
    name = "kopia"

    def env(self):
        e = super().env()
        e["KOPIA_PASSWORD"] = PASSWORD
        e["KOPIA_CONFIG_PATH"] = os.path.join(self.cache, "repository.config")
        e["KOPIA_CACHE_DIRECTORY"] = os.path.join(self.cache, "kcache")
        e["KOPIA_LOG_DIR"] = os.path.join(self.cache, "logs")
        e["KOPIA_CHECK_FOR_UPDATES"] = "false"
        return e

    def version_cmd(self):
        stamp = self.bin + ".version"  # a module-proxy build reports "v0-unofficial"
        if os.path.exists(stamp):
            return ["echo", "kopia " + open(stamp).read().strip()]
        return [self.bin, "--version"]

    def init_cmd(self):
        return [self.bin, "repository", "create", "filesystem", "--path", self.repo], None

    def backup_cmd(self, path, snap):
        self.last_path = path
        return [self.bin, "snapshot", "create", path], None

    def restore_cmd(self, target, snap):
        out = subprocess.run([self.bin, "snapshot", "list", "--json", self.last_path], capture_output=True,
                             text=True, env=self.env())
        try:
            sid = json.loads(out.stdout)[-1]["id"]
        except (ValueError, LookupError, TypeError):
            sid = "no-snapshot-found"
        return [self.bin, "snapshot", "restore", sid, target], None


class CairnServe(Cairn):
    """cairn through `cairn serve` on loopback: TLS with the self-signed certificate pinned by
    fingerprint, an admin token (the policy checks run for every role). The datastore is
    created locally first (the server serves existing repositories), then the server starts."""
    name = "cairn-serve"

    def __init__(self, bin_path, work, dataset):
        super().__init__(bin_path, work, dataset)
        self.repo_dir = self.repo
        self.state = os.path.join(work, "serve-state", dataset)
        self.server = None
        self.server_args = []  # more `cairn serve` flags (the slow-link scenario's rate limit)

    def after_init(self, logdir):
        shutil.rmtree(self.state, ignore_errors=True)
        out = subprocess.run([self.bin, "serve", "token", "add", "bench", "--datastore", "ds", "--role", "admin",
                              "--state-dir", self.state], capture_output=True, text=True, env=self.env())
        if out.returncode != 0:
            raise RuntimeError(f"cairn serve token add: {out.stderr.strip()}")
        self.server = ServerProcess([self.bin, "serve", "--listen", "127.0.0.1:0", "--datastore",
                                     f"ds={self.repo_dir}", "--state-dir", self.state] + self.server_args, self.env(),
                                    os.path.join(logdir, f"cairn-serve-{os.path.basename(self.repo_dir)}.log"))

        def ready(text):
            m = re.search(r"listening on https://127\.0\.0\.1:(\d+).*\n.*fingerprint: ([0-9a-f]{64})", text)
            return m and (m.group(1), m.group(2))
        port, fp = self.server.start(ready)
        self.repo = f"cairn+https://127.0.0.1:{port}/ds"
        self.extra_env.update(CAIRN_TOKEN=out.stdout.strip(), CAIRN_SERVER_FINGERPRINT=fp)


class ResticRest(Restic):
    """restic through rest-server on loopback (plain HTTP, no auth: the cheapest setting)."""
    name = "restic-rest"

    def __init__(self, bin_path, work, dataset, rest_server_bin=None):
        super().__init__(bin_path, work, dataset)
        self.repo_dir = self.repo
        self.rest_server_bin = rest_server_bin
        self.server = None

    def before_init(self, logdir):
        import socket
        os.makedirs(self.repo_dir, exist_ok=True)
        port = free_port()
        self.server = ServerProcess([self.rest_server_bin, "--path", self.repo_dir, "--listen", f"127.0.0.1:{port}",
                                     "--no-auth"], dict(os.environ),
                                    os.path.join(logdir, f"rest-server-{os.path.basename(self.repo_dir)}.log"))

        def ready(_text):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return True
            except OSError:
                return False
        self.server.start(ready)
        self.repo = f"rest:http://127.0.0.1:{port}/"


TOOL_CLASSES = {"cairn": Cairn, "restic": Restic, "borg": Borg, "kopia": Kopia, "cairn-serve": CairnServe,
                "restic-rest": ResticRest}


# --------------------------------------------------------------------------
# runner
# --------------------------------------------------------------------------
CSV_FIELDS = ["date", "git_sha", "scale", "cache", "rep", "dataset", "tool", "tool_version", "phase", "status",
              "input_bytes", "input_files", "wall_s", "user_s", "sys_s", "cpu_s", "max_rss_kib",
              "mb_per_s", "files_per_s", "repo_bytes", "repo_delta_bytes", "cache_bytes", "sync_s", "other_cpu_s", "steal_s",
              "verify", "log", "note"]


class Runner:
    def __init__(self, args):
        self.a = args
        self.work = os.path.abspath(args.work_dir)
        self.data = os.path.abspath(args.data_dir)
        self.cfg = datasets.scale_config(args.scale)
        self.date = datetime.datetime.now().strftime("%Y-%m-%d-%H%M%S")
        self.sha = git_sha()
        os.makedirs(args.results_dir, exist_ok=True)
        self.csv_path = os.path.abspath(args.out or os.path.join(args.results_dir, f"{self.date}-{self.sha}.csv"))
        self.rows = []
        self.cache_mode = "cold (drop_caches before each command)" if args.cold else "warm page cache"
        self.bins = {"cairn": args.cairn_bin, "restic": args.restic_bin, "borg": args.borg_bin,
                     "kopia": args.kopia_bin}
        self.versions = {}

    # -- csv
    def open_csv(self):
        self.csv_f = open(self.csv_path, "w", newline="")
        self.csv_f.write(f"# hardware: {hardware_line()}\n")
        self.csv_f.write(f"# settings: scale={self.cfg['scale']} cfg={json.dumps(self.cfg, sort_keys=True)} "
                         f"cache={self.cache_mode} datasets={','.join(self.a.datasets)} tools={','.join(self.a.tools)} "
                         f"scenarios={','.join(self.a.scenarios)} cairn_bin={self.bins.get('cairn')} "
                         f"maint_days={self.a.maint_days} "
                         f"maint_keep_last={self.a.maint_keep} maint_churn={self.a.maint_churn} "
                         f"block_sizes={','.join(self.a.block_sizes)} compressions={','.join(self.a.compressions)} "
                         f"job_counts={','.join(map(str, self.a.job_counts))} copy_days={self.a.copy_days}\n")
        self.csv_f.write(f"# versions: {json.dumps(self.versions, sort_keys=True)}\n")
        self.csv_f.write("# units: mb_per_s = 10^6 bytes of input (backup) or restored data (restore) per wall second; "
                         "cpu_s = user+sys; max_rss_kib from /usr/bin/time -v; maintenance rows (dataset maint): "
                         "input_bytes = repository bytes before the command, mb_per_s of check-rd = repository "
                         "bytes read per wall second, note = the tool's own summary lines; blocksizes rows "
                         "(dataset blocksizes): backup-<block>-<compression> sums the backups of all days "
                         "(max_rss_kib = the largest), note = key=value pairs of cairn stats --json, the "
                         "matching cairn estimate --json values (est_*) and estimate - real in percentage "
                         "points (diff_*_pp); the estimate row's note holds the estimate per block size; "
                         "jobs rows (dataset jobs): jobs<N> = N backups started at once into one fresh "
                         "repository, wall_s = first start to last end, mb_per_s = sum of the N sources / wall_s, "
                         "cpu_s = sum, max_rss_kib = the largest; seq<N> = the same N sources backed up one after "
                         "another (wall_s summed); note = key=value pairs: cairn stats --json fields or restic "
                         "stats --mode raw-data (raw_*), occupied_bytes (restic: du -sb), seq_occupied_bytes, "
                         "duplicate_bytes = occupied - seq_occupied, after prune --max-unused 0%: "
                         "*_after_prune_bytes; s3 rows (dataset s3-<kind>): the backup scenario against a "
                         "MinIO server, repo_bytes = bytes of the repository's objects, note = srv_rx_bytes / "
                         "srv_tx_bytes / srv_requests (MinIO's counters: bytes it received = uploaded, sent = "
                         "downloaded, S3 requests) and for cairn uploaded_bytes / downloaded_bytes / requests "
                         "(CAIRN_TRAFFIC_REPORT); copy rows (dataset copy): day<N> = backups of the history "
                         "(cairn into R1, 4K blocks; restic into its source repository), copy-<target>[-again] = "
                         "cairn copy into a 64K repository (input_bytes = logical_bytes, note = the copy --json "
                         "fields, sent_pct = bytes_sent / logical_bytes, sent_pct_history = bytes_sent / the sum "
                         "of the days' sizes), incr-* = days 1..N-1 then day N alone (day_new_bytes = bytes that "
                         "day's edits wrote), restore-<target> = the copied last day restored and verified; "
                         "restic copy-local: repo_delta_bytes = target growth\n")
        self.w = csv.DictWriter(self.csv_f, fieldnames=CSV_FIELDS)
        self.w.writeheader()
        self.csv_f.flush()

    def add_row(self, row):
        full = {k: "" for k in CSV_FIELDS}
        full.update(date=self.date, git_sha=self.sha, scale=self.cfg["scale"],
                    cache="cold" if self.a.cold else "warm")
        full.update(row)
        self.rows.append(full)
        self.w.writerow(full)
        self.csv_f.flush()

    # -- run one command measured
    def measure(self, tool, label, argv, cwd=None, stdout_path=None):
        """Run argv under /usr/bin/time -v; output goes to logs/<label>.log (with
        stdout_path, stdout goes to that file instead, e.g. for --json output)."""
        logdir = os.path.join(self.work, "logs")
        os.makedirs(logdir, exist_ok=True)
        base = os.path.join(logdir, label)
        if self.a.cold:
            drop_caches()
        tv = base + ".time"
        cmd = ["/usr/bin/time", "-v", "-o", tv] + argv
        busy0, steal0 = cpu_jiffies()
        t0 = time.monotonic()
        with open(base + ".log", "w") as lf:
            lf.write("$ " + " ".join(argv) + (f"   (cwd {cwd})" if cwd else "") + "\n")
            lf.flush()
            if stdout_path:
                with open(stdout_path, "w") as of:
                    rc = subprocess.run(cmd, cwd=cwd, env=tool.env(), stdout=of, stderr=lf,
                                        stdin=subprocess.DEVNULL).returncode
            else:
                rc = subprocess.run(cmd, cwd=cwd, env=tool.env(), stdout=lf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL).returncode
        wall = time.monotonic() - t0
        busy1, steal1 = cpu_jiffies()
        t1 = time.monotonic()
        subprocess.run(["sync"])
        sync_s = time.monotonic() - t1
        r = parse_time_v(tv)
        r.update(rc=rc, wall_s=wall, sync_s=sync_s, log=os.path.relpath(base + ".log", BENCH_DIR))
        r["cpu_s"] = r.get("user_s", 0.0) + r.get("sys_s", 0.0)
        hz = os.sysconf("SC_CLK_TCK")
        # CPU used by everything else on the machine meanwhile (kernel
        # writeback threads, a concurrent build, ...) and hypervisor steal:
        # noise indicators, not part of the tool's numbers.
        r["other_cpu_s"] = f"{max(0.0, (busy1 - busy0) / hz - r['cpu_s']):.2f}"
        r["steal_s"] = f"{(steal1 - steal0) / hz:.2f}"
        if rc != 0:
            tail = open(base + ".log", errors="replace").read()[-1500:]
            log(f"{label}: exit {rc}; log tail:\n{tail}")
        return r

    def measure_concurrent(self, tool, jobs):
        """Start every (label, argv) of jobs at once, each under /usr/bin/time -v like measure(),
        and wait for all of them. Returns (per-job results, total): each per-job result has what
        measure() returns (wall_s = that job's own start to end) plus start_s/end_s relative to
        the first start; total has wall_s (first start to last end), cpu_s (sum), other_cpu_s,
        steal_s and sync_s (one sync after the last job)."""
        logdir = os.path.join(self.work, "logs")
        os.makedirs(logdir, exist_ok=True)
        if self.a.cold:
            drop_caches()
        env = tool.env()
        procs, files, res = [], [], []
        busy0, steal0 = cpu_jiffies()
        t0 = time.monotonic()
        for label, argv in jobs:
            base = os.path.join(logdir, label)
            lf = open(base + ".log", "w")
            lf.write("$ " + " ".join(argv) + "\n")
            lf.flush()
            start = time.monotonic()
            p = subprocess.Popen(["/usr/bin/time", "-v", "-o", base + ".time"] + argv, env=env, stdout=lf,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            procs.append(p)
            files.append(lf)
            res.append(dict(label=label, base=base, start=start))

        def waiter(p, r):
            r["rc"] = p.wait()
            r["end"] = time.monotonic()

        threads = [threading.Thread(target=waiter, args=(p, r)) for p, r in zip(procs, res)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        t_end = max(r["end"] for r in res)
        busy1, steal1 = cpu_jiffies()
        for lf in files:
            lf.close()
        t1 = time.monotonic()
        subprocess.run(["sync"])
        sync_s = time.monotonic() - t1
        out = []
        for r in res:
            m = parse_time_v(r["base"] + ".time")
            m.update(rc=r["rc"], wall_s=r["end"] - r["start"], start_s=r["start"] - t0, end_s=r["end"] - t0,
                     log=os.path.relpath(r["base"] + ".log", BENCH_DIR))
            m["cpu_s"] = m.get("user_s", 0.0) + m.get("sys_s", 0.0)
            if r["rc"] != 0:
                tail = open(r["base"] + ".log", errors="replace").read()[-1500:]
                log(f"{r['label']}: exit {r['rc']}; log tail:\n{tail}")
            out.append(m)
        hz = os.sysconf("SC_CLK_TCK")
        cpu = sum(m["cpu_s"] for m in out)
        total = dict(wall_s=t_end - t0, cpu_s=cpu, sync_s=sync_s,
                     other_cpu_s=f"{max(0.0, (busy1 - busy0) / hz - cpu):.2f}",
                     steal_s=f"{(steal1 - steal0) / hz:.2f}")
        return out, total

    # -- dataset preparation
    def dataset_src(self, kind):
        name = datasets.dataset_dirname(kind, self.cfg)
        path = os.path.join(self.data, name)
        if not os.path.exists(path + ".json") or not os.path.isdir(path):
            log(f"generating dataset {name} in {self.data}")
            args = [sys.executable, os.path.join(BENCH_DIR, "datasets.py"), "gen", kind, "--out", path]
            if kind == "mixed":
                args += ["--size-mib", str(self.cfg["mixed_mib"])]
            elif kind == "small":
                args += ["--files", str(self.cfg["small_files"]), "--dirs", str(self.cfg["small_dirs"])]
            elif kind == "dense":
                args += ["--files", str(self.cfg["dense_files"]), "--dirs", str(self.cfg["dense_dirs"])]
            elif kind == "seed":
                args += ["--files", str(self.cfg["seed_files"])]
            else:
                args += ["--size-mib", str(self.cfg["image_mib"])]
            subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
        return path

    def prepare_live(self, kind, src):
        live = os.path.join(self.work, "live", kind)
        if os.path.exists(live):
            shutil.rmtree(live)
        os.makedirs(os.path.dirname(live), exist_ok=True)
        if kind == "image":
            os.makedirs(live)
            subprocess.run(["cp", "--sparse=always", "--preserve=timestamps",
                            os.path.join(src, "disk-v1.img"), os.path.join(live, "disk.img")], check=True)
        else:
            subprocess.run(["cp", "-a", src, live], check=True)
        subprocess.run(["sync"])  # no writeback of the copy during measurements
        return live

    # -- one dataset
    def measure_traffic(self, t, label, argv, cwd=None, stdout_path=None):
        """measure(), plus for a repository on the s3 server what went over the wire: MinIO's own
        counters before and after (r["srv"] = dict(rx, tx, requests): bytes the server received,
        i.e. the tool uploaded, bytes it sent, requests) and cairn's `traffic:` lines (r["traffic"]
        = {location: (uploaded, downloaded, requests)}; set CAIRN_TRAFFIC_REPORT=1 in the tool's
        env). r["note"] holds them as key=value pairs (empty for a local repository)."""
        m0 = t.s3.metrics() if t.s3 is not None else {}
        srv = getattr(t, "server", None)
        c0 = srv.cpu_s() if srv else 0.0
        r = self.measure(t, label, argv, cwd=cwd, stdout_path=stdout_path)
        m1 = t.s3.metrics() if t.s3 is not None else {}
        srv_part = []
        if srv:
            # The server's work is part of the job: its CPU is added to cpu_s (and given apart).
            c1 = srv.cpu_s()
            r["cpu_s"] += c1 - c0
            srv_part = [f"client_cpu_s={r.get('user_s', 0.0) + r.get('sys_s', 0.0):.2f}",
                        f"srv_cpu_s={c1 - c0:.2f}", f"srv_peak_rss_kib={srv.hwm_kib()}"]
        r["traffic"] = cairn_traffic(os.path.join(BENCH_DIR, r["log"]))
        parts = []
        if m0 and m1:
            r["srv"] = {k: m1[k] - m0[k] for k in ("rx", "tx", "requests")}
            parts += [f"srv_rx_bytes={r['srv']['rx']}", f"srv_tx_bytes={r['srv']['tx']}",
                      f"srv_requests={r['srv']['requests']}"]
        tr = r["traffic"].get(t.repo)
        if tr is not None:
            parts += [f"uploaded_bytes={tr[0]}", f"downloaded_bytes={tr[1]}", f"requests={tr[2]}"]
        r["note"] = " ".join(parts + srv_part)
        return r

    # -- one dataset
    def make_tool(self, name, ds):
        if name == "restic-rest":
            return ResticRest(self.bins["restic"], self.work, ds, self.a.rest_server_bin)
        if name == "cairn-serve":
            return CairnServe(self.bins["cairn"], self.work, ds)
        return TOOL_CLASSES[name](self.bins[name], self.work, ds)

    def run_dataset(self, kind, rep, s3=None, tool_names=None, served=False):
        """The backup scenario for one dataset: first, unchanged (and day2/changed/changed1),
        restore. With s3 (an S3Server), the s3 scenario: each repository on a fresh prefix of the
        s3 server, phases first, unchanged and restore, rows under dataset s3-<kind> with the
        traffic of each command in the note."""
        ds = kind if s3 is None else S3_PREFIX + kind
        if served:
            ds = SERVER_PREFIX + kind
        names = tool_names or self.a.tools
        src = self.dataset_src(kind)
        log(f"{ds} (repetition {rep}): preparing live copy of {src}")
        live = self.prepare_live(kind, src)
        for d in ("repos", "restore"):
            os.makedirs(os.path.join(self.work, d), exist_ok=True)
        # rotate the tool order between repetitions to cancel order effects
        order = names[(rep - 1) % len(names):] + names[:(rep - 1) % len(names)]
        tools = {}
        for name in order:
            t = self.make_tool(name, ds)
            for p in (t.repo, t.cache):
                if os.path.exists(p):
                    shutil.rmtree(p)
            os.makedirs(t.cache)
            if s3 is not None:
                # a fresh prefix per tool, dataset and run
                t.use_s3(s3, f"{name}-{kind}-r{rep}-{self.date}")
                if name == "cairn":
                    t.extra_env["CAIRN_TRAFFIC_REPORT"] = "1"
            tools[name] = t
        settle()
        common = dict(dataset=ds, rep=rep)
        alive = {}
        last_repo = {}
        last_snap = {}
        logdir = os.path.join(self.work, "logs")
        os.makedirs(logdir, exist_ok=True)
        for name, t in tools.items():
            try:
                if hasattr(t, "before_init"):
                    t.before_init(logdir)
            except RuntimeError as ex:
                log(f"{ds}: {name}: {ex}")
                alive[name] = False
                continue
            r = self.measure_traffic(t, f"{ds}-{name}-init-r{rep}", *t.init_cmd())
            alive[name] = r["rc"] == 0
            if alive[name] and hasattr(t, "after_init"):
                try:
                    t.after_init(logdir)
                except RuntimeError as ex:
                    log(f"{ds}: {name}: {ex}")
                    alive[name] = False
            last_repo[name] = repo_size(t)
            self.add_row(dict(common, tool=name, tool_version=self.versions.get(name), phase="init",
                              status="ok" if alive[name] else f"fail rc={r['rc']}", wall_s=f"{r['wall_s']:.3f}",
                              user_s=r.get("user_s", ""), sys_s=r.get("sys_s", ""), cpu_s=f"{r['cpu_s']:.2f}",
                              max_rss_kib=r.get("max_rss_kib", ""), repo_bytes=last_repo[name], log=r["log"],
                              note=r["note"]))

        phases = ["first", "unchanged"]
        if s3 is None and not served:
            if kind == "mixed":
                phases.append("day2")
            if kind == "image":
                phases.append("changed")
            if kind == "dense":
                phases.append("changed1")
        for phase in phases:
            if phase == "day2":
                log("applying day-2 edits to live mixed tree")
                datasets.apply_day(live, 2, datasets.DEFAULT_SEED)
                settle()
            if phase == "changed1":
                log("rewriting 1% of the live dense tree's files")
                datasets.apply_small_change(live, datasets.DEFAULT_SEED, 0.01)
                settle()
            if phase == "changed":
                log("replacing live image with the changed copy (v2)")
                subprocess.run(["cp", "--sparse=always", "--preserve=timestamps",
                                os.path.join(src, "disk-v2.img"), os.path.join(live, "disk.img")], check=True)
                settle()
            nfiles, nbytes = tree_size(live)
            for name, t in tools.items():
                if not alive[name]:
                    continue
                snap = f"{kind}-{phase}"
                if not self.a.cold:
                    warm_tree(live)
                r = self.measure_traffic(t, f"{ds}-{name}-{phase}-r{rep}", *t.backup_cmd(live, snap))
                repo = repo_size(t)
                ok = r["rc"] == 0
                if ok:
                    last_snap[name] = snap
                else:
                    alive[name] = phase != "first"  # a failed first backup stops this tool
                self.add_row(dict(
                    common, tool=name, tool_version=self.versions.get(name), phase=phase,
                    status="ok" if ok else f"fail rc={r['rc']}",
                    input_bytes=nbytes, input_files=nfiles, wall_s=f"{r['wall_s']:.3f}",
                    user_s=r.get("user_s", ""), sys_s=r.get("sys_s", ""), cpu_s=f"{r['cpu_s']:.2f}",
                    max_rss_kib=r.get("max_rss_kib", ""),
                    mb_per_s=f"{nbytes / MB / r['wall_s']:.2f}", files_per_s=f"{nfiles / r['wall_s']:.1f}",
                    repo_bytes=repo, repo_delta_bytes=repo - last_repo[name], cache_bytes=du_bytes(t.cache),
                    sync_s=f"{r['sync_s']:.2f}", other_cpu_s=r["other_cpu_s"], steal_s=r["steal_s"], log=r["log"],
                    note=r["note"]))
                last_repo[name] = repo
                self.print_row(self.rows[-1])

        # restore of the latest snapshot into a fresh dir per tool; the
        # restored trees are removed only after all tools ran (deleting many
        # files is slow here and would disturb the next tool's measurement)
        src_digest = None
        if not self.a.no_verify:
            log(f"{ds}: hashing source tree for restore verification")
            src_digest = datasets.tree_digest(live)
        targets = []
        # --restore-fs journal: every tool restores onto one fresh journaled ext4,
        # unmounted and dropped afterwards (nothing deleted file by file, so the next
        # repetition's restores do not pay for this one's).
        jfs = None
        restore_base = os.path.join(self.work, "restore")
        if self.a.restore_fs == "journal":
            live_files, live_bytes = tree_size(live)
            n = len(tools) if kind != "dense" else 1
            need = n * (live_bytes * 1.3 + live_files * 4096)
            jfs = JournalFs(self.work, max(4, int(need / (1 << 30)) + 2), int(n * live_files * 1.3) + 100_000)
            restore_base = jfs.mnt
        for name, t in tools.items():
            if not alive[name] or name not in last_snap:
                continue
            target = os.path.join(restore_base, f"{name}-{ds}")
            fresh_dir(target)
            settle()
            targets.append(target)
            r = self.measure_traffic(t, f"{ds}-{name}-restore-r{rep}", *t.restore_cmd(target, last_snap[name]))
            verify = "skipped"
            rfiles, rbytes = tree_size(target)
            if r["rc"] == 0 and src_digest is not None:
                verify = self.verify(target, live, src_digest)
            self.add_row(dict(
                common, tool=name, tool_version=self.versions.get(name), phase="restore",
                status="ok" if r["rc"] == 0 else f"fail rc={r['rc']}",
                input_bytes=rbytes, input_files=rfiles, wall_s=f"{r['wall_s']:.3f}",
                user_s=r.get("user_s", ""), sys_s=r.get("sys_s", ""), cpu_s=f"{r['cpu_s']:.2f}",
                max_rss_kib=r.get("max_rss_kib", ""),
                mb_per_s=f"{rbytes / MB / r['wall_s']:.2f}", files_per_s=f"{rfiles / r['wall_s']:.1f}",
                repo_bytes=repo_size(t), cache_bytes=du_bytes(t.cache), sync_s=f"{r['sync_s']:.2f}",
                other_cpu_s=r["other_cpu_s"], steal_s=r["steal_s"], verify=verify, log=r["log"], note=r["note"]))
            self.print_row(self.rows[-1])
            if kind == "dense":
                # a million restored files per tool would not fit beside the others
                shutil.rmtree(target, ignore_errors=True)
                settle()
        log(f"{ds}: cleaning up")
        for t in tools.values():
            if getattr(t, "server", None):
                t.server.stop()
        if jfs is not None:
            jfs.close()
        else:
            for target in targets:
                shutil.rmtree(target, ignore_errors=True)
        if not self.a.keep:
            for t in tools.values():
                if t.s3 is not None:
                    t.s3.remove(t.s3_prefix)
                else:
                    shutil.rmtree(getattr(t, "repo_dir", None) or t.repo, ignore_errors=True)
                shutil.rmtree(t.cache, ignore_errors=True)
            shutil.rmtree(live, ignore_errors=True)
        settle()

    # -- clients scenario: N clients at once through each tool's server
    def run_clients(self, rep):
        """N backups started at once through the tool's server into one fresh repository, every
        client backing up its own copy of the same small tree (the data overlaps entirely):
        total wall, aggregate MB/s, CPU (clients + server), the repository against one client's
        backup alone (duplicate bytes), and for cairn the server's request latencies (p50, p99)
        from its log. Afterwards check --read-data, and one client's snapshot restored and
        verified."""
        n = CLIENTS_N
        names = self.served_tools("clients")
        src = self.dataset_src("small")
        live = self.prepare_live("small", src)
        nfiles, nbytes = tree_size(live)
        logdir = os.path.join(self.work, "logs")
        os.makedirs(logdir, exist_ok=True)
        common = dict(dataset=CLIENTS_DATASET, rep=rep)
        for name in names:
            ver = self.versions.get(name.split("-")[0])
            # One client alone first (the baseline size), then N at once into a fresh repository.
            sizes = {}
            for phase, count in (("one", 1), (f"clients{n}", n)):
                t = self.make_tool(name, f"{CLIENTS_DATASET}-{phase}")
                for pth in (t.repo_dir, t.cache):
                    shutil.rmtree(pth, ignore_errors=True)
                os.makedirs(t.cache)
                if hasattr(t, "before_init"):
                    t.before_init(logdir)
                r = self.measure(t, f"{CLIENTS_DATASET}-{name}-{phase}-init-r{rep}", *t.init_cmd())
                if r["rc"] != 0:
                    self.add_row(dict(common, tool=name, tool_version=ver, phase=phase, status="fail init"))
                    continue
                if name == "cairn-serve":
                    subprocess.run([t.bin, "config", "--repo", t.repo_dir, "--max-concurrent-jobs", str(n)],
                                   env=t.env(), capture_output=True)
                if hasattr(t, "after_init"):
                    t.after_init(logdir)
                settle()
                srv_log0 = os.path.getsize(t.server.log_path) if t.server else 0
                c0 = t.server.cpu_s() if t.server else 0.0
                jobs = []
                for k in range(count):
                    argv, _ = t.backup_cmd(live, f"client{k}")
                    if name == "restic-rest":
                        argv = [a if a != "bench" else f"client{k}" for a in argv]
                    else:
                        argv = argv[:-1] + ["--host", f"client{k}", argv[-1]]
                    jobs.append((f"{CLIENTS_DATASET}-{name}-{phase}-{k}-r{rep}", argv))
                per, total = self.measure_concurrent(t, jobs)
                srv_cpu = (t.server.cpu_s() - c0) if t.server else 0.0
                ok = all(x["rc"] == 0 for x in per)
                repo = du_bytes(t.repo_dir)
                sizes[phase] = repo
                note = {"clients": count, "srv_cpu_s": f"{srv_cpu:.2f}",
                        "client_cpu_s": f"{total['cpu_s']:.2f}"}
                if phase != "one" and "one" in sizes:
                    note["duplicate_bytes"] = repo - sizes["one"]
                if name == "cairn-serve" and t.server:
                    with open(t.server.log_path, errors="replace") as f:
                        f.seek(srv_log0)
                        lat = sorted(float(m.group(1)) for m in re.finditer(r" (\d+\.\d+)s$", f.read(), re.M))
                    if lat:
                        note.update(requests=len(lat), p50_ms=f"{1000 * lat[len(lat) // 2]:.1f}",
                                    p99_ms=f"{1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))]:.1f}",
                                    max_ms=f"{1000 * lat[-1]:.1f}")
                verify = ""
                if ok and phase != "one":
                    # Integrity of everything stored, then one client's snapshot restored exactly.
                    chk = self.measure(t, f"{CLIENTS_DATASET}-{name}-check-r{rep}", *t.check_data_cmd())
                    note["check_read_data"] = "ok" if chk["rc"] == 0 else f"rc={chk['rc']}"
                    target = os.path.join(self.work, "restore", f"{name}-{CLIENTS_DATASET}")
                    fresh_dir(target)
                    rr = self.measure(t, f"{CLIENTS_DATASET}-{name}-restore-r{rep}", *t.restore_cmd(target, "x"))
                    verify = self.verify(target, live, datasets.tree_digest(live)) if rr["rc"] == 0 else "fail"
                    shutil.rmtree(target, ignore_errors=True)
                self.add_row(dict(
                    common, tool=name, tool_version=ver, phase=phase, status="ok" if ok else "fail",
                    input_bytes=nbytes * count, input_files=nfiles * count, wall_s=f"{total['wall_s']:.3f}",
                    cpu_s=f"{total['cpu_s'] + srv_cpu:.2f}",
                    max_rss_kib=max(x.get("max_rss_kib", 0) for x in per),
                    mb_per_s=f"{nbytes * count / MB / total['wall_s']:.2f}",
                    files_per_s=f"{nfiles * count / total['wall_s']:.1f}", repo_bytes=repo,
                    other_cpu_s=total["other_cpu_s"], steal_s=total["steal_s"], verify=verify,
                    note=kv_note(note)))
                self.print_row(self.rows[-1])
                self.done_with(t)
        if not self.a.keep:
            shutil.rmtree(live, ignore_errors=True)

    def served_tools(self, scenario):
        """cairn-serve and restic-rest, as far as --tools names them and rest-server exists."""
        names = [x for x in ("cairn-serve", "restic-rest") if x.split("-")[0] in self.a.tools]
        if "restic-rest" in names and not os.access(self.a.rest_server_bin, os.X_OK):
            log(f"{scenario}: no rest-server; restic skipped")
            names.remove("restic-rest")
        return names

    def done_with(self, t):
        """A served tool's run is over: its server stopped, its repository and cache removed
        (unless --keep)."""
        if t.server:
            t.server.stop()
        if not self.a.keep:
            shutil.rmtree(t.repo_dir, ignore_errors=True)
            shutil.rmtree(t.cache, ignore_errors=True)
        settle()

    # -- slow-link scenario: the online-backup seed over a 2 Mbit/s uplink
    def run_slowlink(self, rep):
        """The seed of an online backup: ~200 MB of compressible small files (text only) backed
        up once over a 2 Mbit/s uplink. cairn goes through `cairn serve --limit-total-upload
        250000` with --pack-size 1M (the transfer unit a user sets for such a link); restic
        through rest-server with its own --limit-upload 244 (KiB/s, the same rate). Reported:
        the wall time against what the link allows for the bytes each stored (repository
        growth = compressed unique bytes; link_s = those bytes / 250,000 B/s, link_use =
        link_s / wall), then a restore of the snapshot verified against the source."""
        names = self.served_tools("slowlink")
        src = self.dataset_src("seed")
        live = self.prepare_live("seed", src)
        nfiles, nbytes = tree_size(live)
        digest = None if self.a.no_verify else datasets.tree_digest(live)
        logdir = os.path.join(self.work, "logs")
        os.makedirs(logdir, exist_ok=True)
        common = dict(dataset=SLOWLINK_DATASET, rep=rep)
        for name in names:
            ver = self.versions.get(name.split("-")[0])
            t = self.make_tool(name, SLOWLINK_DATASET)
            for pth in (t.repo_dir, t.cache):
                shutil.rmtree(pth, ignore_errors=True)
            os.makedirs(t.cache)
            if name == "cairn-serve":
                t.server_args = ["--limit-total-upload", str(SLOWLINK_RATE)]
            if hasattr(t, "before_init"):
                t.before_init(logdir)
            r = self.measure(t, f"{SLOWLINK_DATASET}-{name}-init-r{rep}", *t.init_cmd())
            if r["rc"] != 0:
                self.add_row(dict(common, tool=name, tool_version=ver, phase="first", status="fail init"))
                continue
            if hasattr(t, "after_init"):
                t.after_init(logdir)
            settle()
            base = du_bytes(t.repo_dir)
            argv, _ = t.backup_cmd(live, "seed")
            if name == "cairn-serve":
                argv = argv[:-1] + ["--pack-size", SLOWLINK_PACK, argv[-1]]
            else:
                argv = argv[:-1] + ["--limit-upload", str(SLOWLINK_RATE // 1024), argv[-1]]
            warm_tree(live)
            r = self.measure_traffic(t, f"{SLOWLINK_DATASET}-{name}-first-r{rep}", argv)
            stored = du_bytes(t.repo_dir) - base
            link_s = stored / SLOWLINK_RATE
            note = {"link_bytes_per_s": SLOWLINK_RATE, "stored_bytes": stored, "link_s": f"{link_s:.1f}",
                    "link_use": f"{link_s / r['wall_s']:.2f}" if r["wall_s"] > 0 else ""}
            if name == "cairn-serve":
                note["pack_size"] = SLOWLINK_PACK
            verify = ""
            if r["rc"] == 0 and digest is not None:
                target = os.path.join(self.work, "restore", f"{name}-{SLOWLINK_DATASET}")
                fresh_dir(target)
                rr = self.measure(t, f"{SLOWLINK_DATASET}-{name}-restore-r{rep}", *t.restore_cmd(target, "seed"))
                verify = self.verify(target, live, digest) if rr["rc"] == 0 else "fail"
                shutil.rmtree(target, ignore_errors=True)
            self.add_row(dict(
                common, tool=name, tool_version=ver, phase="first", status="ok" if r["rc"] == 0 else f"fail rc={r['rc']}",
                input_bytes=nbytes, input_files=nfiles, wall_s=f"{r['wall_s']:.3f}",
                user_s=r.get("user_s", ""), sys_s=r.get("sys_s", ""), cpu_s=f"{r['cpu_s']:.2f}",
                max_rss_kib=r.get("max_rss_kib", ""), mb_per_s=f"{nbytes / MB / r['wall_s']:.2f}",
                files_per_s=f"{nfiles / r['wall_s']:.1f}", repo_bytes=du_bytes(t.repo_dir),
                repo_delta_bytes=stored, other_cpu_s=r["other_cpu_s"], steal_s=r["steal_s"], verify=verify,
                log=r["log"], note=kv_note(note) + (" " + r["note"] if r.get("note") else "")))
            self.print_row(self.rows[-1])
            self.done_with(t)
        if not self.a.keep:
            shutil.rmtree(live, ignore_errors=True)

    # -- s3 scenario: the backup scenario's first/unchanged/restore against a MinIO server
    def run_s3(self):
        names = [t for t in self.a.tools if t in S3_TOOLS]
        skipped = [t for t in self.a.tools if t not in S3_TOOLS]
        if skipped:
            log(f"s3: skipping {','.join(skipped)} (the scenario runs cairn and restic)")
        if not names:
            return
        server = S3Server(self.work)
        try:
            log("s3: starting MinIO (scripts/s3-server.sh; it builds MinIO first if there is none, ~10 min)")
            server.start(build=True)
        except RuntimeError as ex:
            log(f"s3: ERROR, scenario skipped: {ex}")
            self.add_row(dict(dataset="s3", tool="minio", phase="server", status="fail", rep=1, note=str(ex)[:500]))
            return
        try:
            for kind in self.a.datasets:
                for rep in range(1, self.a.repeat + 1):
                    self.run_dataset(kind, rep, s3=server, tool_names=names)
        finally:
            log("s3: stopping MinIO")
            server.stop()
            if not self.a.keep:
                shutil.rmtree(server.dir, ignore_errors=True)

    # -- maintenance scenario: prune and check --read-data on a day-by-day history
    def run_maintenance(self, rep):
        kind = MAINT_DATASET
        names = [t for t in self.a.tools if t in MAINT_TOOLS]
        skipped = [t for t in self.a.tools if t not in MAINT_TOOLS]
        if skipped:
            log(f"maintenance: skipping {','.join(skipped)} (the scenario compares cairn and restic)")
        if not names:
            return
        src = self.dataset_src("mixed")
        days, keep, churn = self.a.maint_days, self.a.maint_keep, self.a.maint_churn
        log(f"maintenance (repetition {rep}): {days} daily versions of {os.path.basename(src)}, "
            f"{churn:.0%} of files changed per day, then forget --keep-last {keep}, prune, check --read-data")
        live = os.path.join(self.work, "live", kind)
        if os.path.exists(live):
            shutil.rmtree(live)
        os.makedirs(os.path.dirname(live), exist_ok=True)
        subprocess.run(["cp", "-a", src, live], check=True)
        os.makedirs(os.path.join(self.work, "repos"), exist_ok=True)
        order = names[(rep - 1) % len(names):] + names[:(rep - 1) % len(names)]
        tools = {}
        for name in order:
            t = TOOL_CLASSES[name](self.bins[name], self.work, kind)
            for p in (t.repo, t.cache):
                if os.path.exists(p):
                    shutil.rmtree(p)
            os.makedirs(t.cache)
            tools[name] = t
        settle()
        common = dict(dataset=kind, rep=rep)
        alive = {}
        last_repo = {}

        def row(name, t, phase, r, **extra):
            d = dict(common, tool=name, tool_version=self.versions.get(name), phase=phase,
                     status="ok" if r["rc"] == 0 else f"fail rc={r['rc']}", wall_s=f"{r['wall_s']:.3f}",
                     user_s=r.get("user_s", ""), sys_s=r.get("sys_s", ""), cpu_s=f"{r['cpu_s']:.2f}",
                     max_rss_kib=r.get("max_rss_kib", ""), cache_bytes=du_bytes(t.cache),
                     sync_s=f"{r['sync_s']:.2f}", other_cpu_s=r["other_cpu_s"], steal_s=r["steal_s"], log=r["log"])
            d.update(extra)
            self.add_row(d)

        for name, t in tools.items():
            r = self.measure(t, f"{kind}-{name}-init-r{rep}", *t.init_cmd())
            alive[name] = r["rc"] == 0
            last_repo[name] = du_bytes(t.repo)
            row(name, t, "init", r, repo_bytes=last_repo[name])

        for day in range(1, days + 1):
            if day > 1:
                datasets.apply_history_day(live, day, datasets.DEFAULT_SEED, churn)
                settle()
            nfiles, nbytes = tree_size(live)
            for name, t in tools.items():
                if not alive[name]:
                    continue
                r = self.measure(t, f"{kind}-{name}-day{day}-r{rep}", *t.backup_cmd(live, f"{kind}-day{day}"))
                repo = du_bytes(t.repo)
                alive[name] = r["rc"] == 0
                row(name, t, f"day{day}", r, input_bytes=nbytes, input_files=nfiles,
                    mb_per_s=f"{nbytes / MB / r['wall_s']:.2f}", files_per_s=f"{nfiles / r['wall_s']:.1f}",
                    repo_bytes=repo, repo_delta_bytes=repo - last_repo[name])
                last_repo[name] = repo
                self.print_row(self.rows[-1])

        steps = [("forget", lambda t: t.forget_cmd(keep)), ("prune", lambda t: t.prune_cmd()),
                 ("check-rd", lambda t: t.check_data_cmd())]
        for phase, cmd in steps:
            for name, t in tools.items():
                if not alive[name]:
                    continue
                before = du_bytes(t.repo)
                r = self.measure(t, f"{kind}-{name}-{phase}-r{rep}", *cmd(t))
                after = du_bytes(t.repo)
                note = t.summary(phase, os.path.join(BENCH_DIR, r["log"]))
                extra = dict(input_bytes=before, repo_bytes=after, repo_delta_bytes=after - before, note=note)
                if phase == "check-rd":
                    extra["mb_per_s"] = f"{before / MB / r['wall_s']:.2f}"
                row(name, t, phase, r, **extra)
                if r["rc"] != 0:
                    alive[name] = False
                self.print_row(self.rows[-1])
                if note:
                    log(f"{kind} {phase} {name}: {note}")
        log(f"{kind}: cleaning up")
        self.clean_up(tools, live)

    # -- blocksizes scenario: every block size x compression on the day-by-day history
    def history_days(self):
        """The maintenance history kept as one directory per day: WORK/history/day-01 .. day-NN.

        day-01 is a copy of the mixed dataset; day-N is a `cp -a` of day-(N-1) with
        datasets.apply_history_day(day N) applied, so day-N holds exactly what the live
        tree of the maintenance scenario holds on day N. Cached like the datasets:
        WORK/history.json is written last and lists what the history was built from;
        it is reused when that matches and rebuilt otherwise.
        Returns (list of day dirs, manifest)."""
        src = self.dataset_src("mixed")
        days, churn = self.a.maint_days, self.a.maint_churn
        root = os.path.join(self.work, "history")
        mpath = root + ".json"
        with open(src + ".json") as f:
            src_manifest = json.load(f)
        want = dict(kind="history", generator="datasets.apply_history_day", source=os.path.basename(src),
                    source_manifest=src_manifest, seed=datasets.DEFAULT_SEED, days=days, churn=churn)
        day_dirs = [os.path.join(root, f"day-{d:02d}") for d in range(1, days + 1)]
        have = None
        try:
            with open(mpath) as f:
                have = json.load(f)
        except (OSError, ValueError):
            pass
        if (have and all(have.get(k) == v for k, v in want.items()) and have.get("last_day_digest")
                and all(os.path.isdir(d) for d in day_dirs)):
            log(f"history: reusing {root} ({days} days of {want['source']})")
            return day_dirs, have
        log(f"history: building {root}: {days} days of {want['source']}, "
            f"{churn:.0%} of files changed per day")
        t0 = time.monotonic()
        if os.path.exists(mpath):
            os.unlink(mpath)
        tmp = root + ".tmp"
        for p in (root, tmp):
            if os.path.exists(p):
                shutil.rmtree(p)
        os.makedirs(tmp)
        per_day = []
        for d in range(1, days + 1):
            dst = os.path.join(tmp, f"day-{d:02d}")
            prev = src if d == 1 else os.path.join(tmp, f"day-{d - 1:02d}")
            subprocess.run(["cp", "-a", prev, dst], check=True)
            edits = {}
            if d > 1:
                edits = datasets.apply_history_day(dst, d, datasets.DEFAULT_SEED, churn)
            nfiles, nbytes = tree_size(dst)
            per_day.append(dict(day=d, files=nfiles, bytes=nbytes, edits=edits))
        os.rename(tmp, root)
        log("history: hashing the last day for restore verification")
        manifest = dict(want, per_day=per_day, last_day_digest=datasets.tree_digest(day_dirs[-1]),
                        built_in_s=round(time.monotonic() - t0, 1))
        with open(mpath + ".tmp", "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
        os.rename(mpath + ".tmp", mpath)
        settle()
        log(f"history: built in {manifest['built_in_s']}s")
        return day_dirs, manifest

    def run_blocksizes(self, rep):
        if "cairn" not in self.a.tools:
            log("blocksizes: skipped (the scenario runs cairn only; add cairn to --tools)")
            return
        skipped = [t for t in self.a.tools if t != "cairn"]
        if skipped:
            log(f"blocksizes: skipping {','.join(skipped)} (the scenario runs cairn only)")
        day_dirs, manifest = self.history_days()
        days = len(day_dirs)
        in_files = sum(d["files"] for d in manifest["per_day"])
        in_bytes = sum(d["bytes"] for d in manifest["per_day"])
        last_digest = manifest["last_day_digest"]
        sizes, comps = self.a.block_sizes, self.a.compressions
        log(f"blocksizes (repetition {rep}): {days} days, {in_bytes / 2**20:.0f} MiB in all; "
            f"block sizes {','.join(sizes)} x compression {','.join(comps)}")
        for d in ("repos", "restore", "logs"):
            os.makedirs(os.path.join(self.work, d), exist_ok=True)
        common = dict(dataset=BS_DATASET, tool="cairn", tool_version=self.versions.get("cairn"), rep=rep)

        def measured(r):
            return dict(wall_s=f"{r['wall_s']:.3f}", user_s=r.get("user_s", ""), sys_s=r.get("sys_s", ""),
                        cpu_s=f"{r['cpu_s']:.2f}", max_rss_kib=r.get("max_rss_kib", ""),
                        sync_s=f"{r['sync_s']:.2f}", other_cpu_s=r["other_cpu_s"], steal_s=r["steal_s"],
                        log=r["log"])

        # 1. estimate, once, over all day dirs (they hold exactly what the snapshots hold)
        t = Cairn(self.bins["cairn"], self.work, f"{BS_DATASET}-estimate")
        label = f"{BS_DATASET}-estimate-r{rep}"
        out_json = os.path.join(self.work, "logs", label + ".json")
        r = self.measure(t, label, [t.bin, "estimate", "--json", "--block-sizes", ",".join(sizes)] + day_dirs,
                         stdout_path=out_json)
        est, est_doc = {}, {}
        if r["rc"] == 0:
            try:
                with open(out_json) as f:
                    est_doc = json.load(f)
                est = {e["block_size"]: e for e in est_doc.get("block_sizes", [])}
            except (OSError, ValueError, KeyError, TypeError) as ex:
                log(f"blocksizes: cannot parse {out_json}: {ex}")
        parts = [f"tool_mb_per_s={_fmt_num(est_doc.get('mb_per_s'))}", f"tool_bytes={est_doc.get('bytes', '')}",
                 f"tool_seconds={_fmt_num(est_doc.get('seconds'))}"]
        for b in sizes:
            e = est.get(parse_size(b), {})
            parts.append(f"{b}:" + ",".join(f"{k}={_fmt_num(e.get(k))}" for k in EST_FIELDS))
        self.add_row(dict(common, phase="estimate", status="ok" if r["rc"] == 0 and est else f"fail rc={r['rc']}",
                          input_bytes=in_bytes, input_files=in_files, mb_per_s=f"{in_bytes / MB / r['wall_s']:.2f}",
                          files_per_s=f"{in_files / r['wall_s']:.1f}", note=" ".join(parts), **measured(r)))
        self.print_row(self.rows[-1])
        if est_doc and est_doc.get("bytes") not in (None, in_bytes):
            log(f"blocksizes: WARNING estimate read {est_doc.get('bytes')} B, the day dirs hold {in_bytes} B")
        shutil.rmtree(t.cache, ignore_errors=True)

        # 2. one datastore per block size x compression
        for b in sizes:
            for c in comps:
                tag = f"{b}-{c}"
                t = Cairn(self.bins["cairn"], self.work, f"{BS_DATASET}-{tag}")
                for p in (t.repo, t.cache):
                    if os.path.exists(p):
                        shutil.rmtree(p)
                os.makedirs(t.cache)
                settle()
                base_note = f"block={b} compression={c} days={days}"
                r = self.measure(t, f"{BS_DATASET}-{tag}-init-r{rep}",
                                 [t.bin, "init", "--repo", t.repo, "--block-size", b, "--compression", c])
                if r["rc"] != 0:
                    self.add_row(dict(common, phase=f"backup-{tag}", status=f"fail init rc={r['rc']}",
                                      note=base_note, **measured(r)))
                    self.print_row(self.rows[-1])
                    continue
                walls, tot = [], dict(wall_s=0.0, user_s=0.0, sys_s=0.0, cpu_s=0.0, sync_s=0.0, other=0.0, steal=0.0)
                rss, status, last = 0, "ok", r
                for d, path in enumerate(day_dirs, 1):
                    r = self.measure(t, f"{BS_DATASET}-{tag}-day{d:02d}-r{rep}", *t.backup_cmd(path, f"day{d}"))
                    last = r
                    walls.append(r["wall_s"])
                    for k in ("wall_s", "user_s", "sys_s", "cpu_s", "sync_s"):
                        tot[k] += r.get(k, 0.0)
                    tot["other"] += float(r["other_cpu_s"])
                    tot["steal"] += float(r["steal_s"])
                    rss = max(rss, r.get("max_rss_kib", 0))
                    log(f"blocksizes {tag} day{d:02d}: wall={r['wall_s']:.2f}s cpu={r['cpu_s']:.2f}s"
                        + ("" if r["rc"] == 0 else f" FAILED rc={r['rc']}"))
                    if r["rc"] != 0:
                        status = f"fail day{d} rc={r['rc']}"
                        break
                stats = {}
                if status == "ok":
                    out = subprocess.run([t.bin, "stats", "--repo", t.repo, "--json"], env=t.env(),
                                         capture_output=True, text=True, stdin=subprocess.DEVNULL)
                    with open(os.path.join(self.work, "logs", f"{BS_DATASET}-{tag}-stats-r{rep}.json"), "w") as f:
                        f.write(out.stdout + out.stderr)
                    try:
                        stats = json.loads(out.stdout)
                    except ValueError:
                        status = f"fail stats rc={out.returncode}"
                        log(f"blocksizes {tag}: stats failed: {out.stderr[-500:]}")
                real = {k: stats.get(k) for k in STATS_FIELDS}
                real["index_bytes"] = (stats.get("index") or {}).get("bytes")
                real["index_ram_bytes"] = (stats.get("index") or {}).get("ram_bytes")
                e = est.get(parse_size(b), {})
                estv = dict(est_dedup_percent=e.get("dedup_percent"),
                            est_compression_percent=e.get(f"compression_{c}_percent"),
                            est_reduction_percent=e.get(f"reduction_{c}_percent"))
                diffs = {}
                for k in ("dedup", "compression", "reduction"):
                    ev, rv = _f(estv[f"est_{k}_percent"]), _f(real[f"{k}_percent"])
                    diffs[f"diff_{k}_pp"] = None if ev is None or rv is None else ev - rv
                if stats and stats.get("stored_bytes") != in_bytes:
                    log(f"blocksizes {tag}: WARNING stored_bytes {stats.get('stored_bytes')} != {in_bytes} B "
                        f"in the day dirs")
                note = " ".join([base_note, "day_wall_s=" + "/".join(f"{w:.2f}" for w in walls)]
                                + [f"{k}={_fmt_num(v)}" for k, v in list(real.items()) + list(estv.items())
                                   + list(diffs.items())])
                repo_bytes = du_bytes(t.repo)
                wall = tot["wall_s"] or 1e-9
                self.add_row(dict(common, phase=f"backup-{tag}", status=status, input_bytes=in_bytes,
                                  input_files=in_files, wall_s=f"{tot['wall_s']:.3f}", user_s=f"{tot['user_s']:.2f}",
                                  sys_s=f"{tot['sys_s']:.2f}", cpu_s=f"{tot['cpu_s']:.2f}", max_rss_kib=rss or "",
                                  mb_per_s=f"{in_bytes / MB / wall:.2f}", files_per_s=f"{in_files / wall:.1f}",
                                  repo_bytes=repo_bytes, cache_bytes=du_bytes(t.cache), sync_s=f"{tot['sync_s']:.2f}",
                                  other_cpu_s=f"{tot['other']:.2f}", steal_s=f"{tot['steal']:.2f}", log=last["log"],
                                  note=note))
                self.print_row(self.rows[-1])
                big = [k for k, v in diffs.items() if v is not None and abs(v) > EST_TOLERANCE_PP]
                if diffs and any(v is not None for v in diffs.values()):
                    log(f"blocksizes {tag}: estimate - real = "
                        + ", ".join(f"{k[5:-3]} {v:+.2f} pp" for k, v in diffs.items() if v is not None)
                        + (f"  OVER {EST_TOLERANCE_PP:g} pp: {','.join(k[5:-3] for k in big)}" if big else ""))

                if status == "ok":
                    target = os.path.join(self.work, "restore", f"cairn-{BS_DATASET}")
                    fresh_dir(target)
                    settle()
                    r = self.measure(t, f"{BS_DATASET}-{tag}-restore-r{rep}", *t.restore_cmd(target, "latest"))
                    rfiles, rbytes = tree_size(target)
                    verify = "skipped"
                    if r["rc"] == 0 and not self.a.no_verify:
                        verify = self.verify(target, day_dirs[-1], last_digest)
                    self.add_row(dict(common, phase=f"restore-{tag}",
                                      status="ok" if r["rc"] == 0 else f"fail rc={r['rc']}",
                                      input_bytes=rbytes, input_files=rfiles,
                                      mb_per_s=f"{rbytes / MB / r['wall_s']:.2f}",
                                      files_per_s=f"{rfiles / r['wall_s']:.1f}", repo_bytes=repo_bytes,
                                      verify=verify, note=base_note, **measured(r)))
                    self.print_row(self.rows[-1])
                    shutil.rmtree(target, ignore_errors=True)
                if not self.a.keep:
                    shutil.rmtree(t.repo, ignore_errors=True)
                    shutil.rmtree(t.cache, ignore_errors=True)
                settle()

    # -- jobs scenario: N concurrent backups of different, overlapping trees into one repository
    def jobs_stats(self, name, t, label):
        """What the repository holds now: `cairn stats --json` (JOBS_CAIRN_STATS) or
        `restic stats --mode raw-data --json` (JOBS_RESTIC_STATS), plus repo_bytes (du -sb).
        For restic, occupied_bytes is du -sb of the repository (restic reports no such figure)."""
        if name == "cairn":
            argv, fields = [t.bin, "stats", "--repo", t.repo, "--json"], JOBS_CAIRN_STATS
        else:
            argv, fields = [t.bin, "stats", "--repo", t.repo, "--mode", "raw-data", "--json"], JOBS_RESTIC_STATS
        out = subprocess.run(argv, env=t.env(), capture_output=True, text=True, stdin=subprocess.DEVNULL)
        with open(os.path.join(self.work, "logs", label + ".json"), "w") as f:
            f.write("$ " + " ".join(argv) + "\n" + out.stdout + out.stderr)
        vals = {}
        try:
            doc = json.loads(out.stdout)
            for k, path in fields.items():
                v = doc
                for p in path:
                    v = v.get(p) if isinstance(v, dict) else None
                vals[k] = v
        except ValueError:
            log(f"{label}: stats failed (exit {out.returncode}): {out.stderr[-500:]}")
            vals["stats_error"] = f"rc={out.returncode}"
        vals["repo_bytes"] = du_bytes(t.repo)
        if name != "cairn":
            vals["occupied_bytes"] = vals["repo_bytes"]
        return vals

    def run_jobs(self, rep):
        names = [t for t in self.a.tools if t in JOBS_TOOLS]
        skipped = [t for t in self.a.tools if t not in JOBS_TOOLS]
        if skipped:
            log(f"jobs: skipping {','.join(skipped)} (the scenario runs cairn and restic)")
        if not names:
            return
        counts = self.a.job_counts
        nmax = max(counts)
        day_dirs, manifest = self.history_days()
        per_day = {d["day"]: d for d in manifest["per_day"]}
        ds = day_dirs[:nmax]
        log(f"jobs (repetition {rep}): {','.join(map(str, counts))} concurrent backups into one repository; "
            f"job k backs up {os.path.basename(os.path.dirname(ds[0]))}/day-0k "
            f"({', '.join('%.0f' % (per_day[k]['bytes'] / 2**20) for k in range(1, nmax + 1))} MiB); "
            f"tools {','.join(names)}")
        for d in ("repos", "restore", "logs"):
            os.makedirs(os.path.join(self.work, d), exist_ok=True)
        order = names[(rep - 1) % len(names):] + names[:(rep - 1) % len(names)]
        common = dict(dataset=JOBS_DATASET, rep=rep)

        def in_sizes(n):
            return (sum(per_day[k]["files"] for k in range(1, n + 1)),
                    sum(per_day[k]["bytes"] for k in range(1, n + 1)))

        def fresh(name, tag):
            t = TOOL_CLASSES[name](self.bins[name], self.work, f"{JOBS_DATASET}-{tag}")
            for p in (t.repo, t.cache):
                if os.path.exists(p):
                    shutil.rmtree(p)
            os.makedirs(t.cache)
            settle()
            return t

        measured, kv = measured_fields, kv_note

        def cleanup(t):
            if not self.a.keep:
                shutil.rmtree(t.repo, ignore_errors=True)
                shutil.rmtree(t.cache, ignore_errors=True)
            settle()

        # 1. baseline: the same trees backed up one after another into a fresh repository.
        # After k backups the repository is what k sequential backups make, so one repository
        # gives the baseline of every job count.
        baseline = {}
        for name in order:
            ver = self.versions.get(name)
            t = fresh(name, "seq")
            r = self.measure(t, f"{JOBS_DATASET}-{name}-seq-init-r{rep}", *t.init_cmd())
            if r["rc"] != 0:
                self.add_row(dict(common, tool=name, tool_version=ver, phase="seq", status=f"fail init rc={r['rc']}",
                                  **measured(r)))
                cleanup(t)
                continue
            walls, tot, rss = [], dict(cpu_s=0.0, user_s=0.0, sys_s=0.0, sync_s=0.0, other=0.0, steal=0.0), 0
            for k in range(1, nmax + 1):
                r = self.measure(t, f"{JOBS_DATASET}-{name}-seq-day{k:02d}-r{rep}",
                                 *t.backup_cmd(ds[k - 1], f"day{k}"))
                walls.append(r["wall_s"])
                for f in ("cpu_s", "user_s", "sys_s", "sync_s"):
                    tot[f] += r.get(f, 0.0)
                tot["other"] += float(r["other_cpu_s"])
                tot["steal"] += float(r["steal_s"])
                rss = max(rss, r.get("max_rss_kib", 0))
                log(f"jobs {name} sequential day-{k:02d}: wall={r['wall_s']:.2f}s cpu={r['cpu_s']:.2f}s"
                    + ("" if r["rc"] == 0 else f" FAILED rc={r['rc']}"))
                if r["rc"] != 0:
                    self.add_row(dict(common, tool=name, tool_version=ver, phase=f"seq{k}",
                                      status=f"fail day{k} rc={r['rc']}", **measured(r)))
                    break
                if k not in counts:
                    continue
                st = self.jobs_stats(name, t, f"{JOBS_DATASET}-{name}-seq{k}-stats-r{rep}")
                wall = sum(walls)
                baseline[(name, k)] = dict(st, wall_s=wall)
                nfiles, nbytes = in_sizes(k)
                self.add_row(dict(common, tool=name, tool_version=ver, phase=f"seq{k}",
                                  status="ok" if "stats_error" not in st else "fail stats",
                                  input_bytes=nbytes, input_files=nfiles, wall_s=f"{wall:.3f}",
                                  user_s=f"{tot['user_s']:.2f}", sys_s=f"{tot['sys_s']:.2f}",
                                  cpu_s=f"{tot['cpu_s']:.2f}", max_rss_kib=rss or "",
                                  mb_per_s=f"{nbytes / MB / wall:.2f}", files_per_s=f"{nfiles / wall:.1f}",
                                  repo_bytes=st["repo_bytes"], cache_bytes=du_bytes(t.cache),
                                  sync_s=f"{tot['sync_s']:.2f}", other_cpu_s=f"{tot['other']:.2f}",
                                  steal_s=f"{tot['steal']:.2f}", log=r["log"],
                                  note=kv(dict(jobs=k, mode="sequential",
                                               day_wall_s="/".join(f"{w:.2f}" for w in walls), **st))))
                self.print_row(self.rows[-1])
            cleanup(t)

        # 2. N backups at once into a fresh repository, for each N
        for n in counts:
            nfiles, nbytes = in_sizes(n)
            for name in order:
                ver = self.versions.get(name)
                t = fresh(name, f"n{n}")
                r = self.measure(t, f"{JOBS_DATASET}-{name}-n{n}-init-r{rep}", *t.init_cmd())
                if r["rc"] != 0:
                    self.add_row(dict(common, tool=name, tool_version=ver, phase=f"jobs{n}",
                                      status=f"fail init rc={r['rc']}", **measured(r)))
                    cleanup(t)
                    continue
                log(f"jobs {name}: starting {n} backup(s) at once")
                jobs = [(f"{JOBS_DATASET}-{name}-n{n}-job{k}-r{rep}", t.backup_cmd(ds[k - 1], f"day{k}")[0])
                        for k in range(1, n + 1)]
                res, tot = self.measure_concurrent(t, jobs)
                for k, jr in enumerate(res, 1):
                    self.add_row(dict(common, tool=name, tool_version=ver, phase=f"jobs{n}-job{k}",
                                      status="ok" if jr["rc"] == 0 else f"fail rc={jr['rc']}",
                                      input_bytes=per_day[k]["bytes"], input_files=per_day[k]["files"],
                                      wall_s=f"{jr['wall_s']:.3f}", user_s=jr.get("user_s", ""),
                                      sys_s=jr.get("sys_s", ""), cpu_s=f"{jr['cpu_s']:.2f}",
                                      max_rss_kib=jr.get("max_rss_kib", ""),
                                      mb_per_s=f"{per_day[k]['bytes'] / MB / jr['wall_s']:.2f}",
                                      files_per_s=f"{per_day[k]['files'] / jr['wall_s']:.1f}", log=jr["log"],
                                      note=f"jobs={n} job={k} source={os.path.basename(ds[k - 1])} "
                                           f"start_s={jr['start_s']:.3f} end_s={jr['end_s']:.3f}"))
                failed = [k for k, jr in enumerate(res, 1) if jr["rc"] != 0]
                status = "ok" if not failed else "fail job" + ",".join(map(str, failed))
                wall = tot["wall_s"]
                log(f"jobs {name} x{n}: total wall={wall:.2f}s ({nbytes / MB / wall:.1f} MB/s aggregate), "
                    f"job walls " + "/".join(f"{jr['wall_s']:.2f}" for jr in res) + f"s, cpu={tot['cpu_s']:.2f}s"
                    + ("" if not failed else f" FAILED jobs {failed}"))
                st = self.jobs_stats(name, t, f"{JOBS_DATASET}-{name}-n{n}-stats-r{rep}")
                base = baseline.get((name, n), {})
                dup = None
                if st.get("occupied_bytes") is not None and base.get("occupied_bytes") is not None:
                    dup = st["occupied_bytes"] - base["occupied_bytes"]
                info = dict(jobs=n, mode="concurrent", **st)
                info.update(seq_occupied_bytes=base.get("occupied_bytes"), seq_wall_s=base.get("wall_s"),
                            duplicate_bytes=dup,
                            job_wall_s="/".join(f"{jr['wall_s']:.2f}" for jr in res),
                            job_cpu_s="/".join(f"{jr['cpu_s']:.2f}" for jr in res),
                            job_rss_kib="/".join(str(jr.get("max_rss_kib", "")) for jr in res),
                            job_start_s="/".join(f"{jr['start_s']:.3f}" for jr in res),
                            job_end_s="/".join(f"{jr['end_s']:.3f}" for jr in res))
                if name == "restic" and base.get("raw_total_size") is not None:
                    info["seq_raw_total_size"] = base.get("raw_total_size")

                # cairn: prune away the duplicate copies, then look again
                if name == "cairn" and not failed:
                    before = du_bytes(t.repo)
                    pr = self.measure(t, f"{JOBS_DATASET}-{name}-n{n}-prune-r{rep}",
                                      [t.bin, "prune", "--repo", t.repo, "--max-unused", "0%"])
                    st2 = self.jobs_stats(name, t, f"{JOBS_DATASET}-{name}-n{n}-stats-after-prune-r{rep}")
                    self.add_row(dict(common, tool=name, tool_version=ver, phase=f"jobs{n}-prune",
                                      status="ok" if pr["rc"] == 0 else f"fail rc={pr['rc']}",
                                      input_bytes=before, repo_bytes=st2["repo_bytes"],
                                      repo_delta_bytes=st2["repo_bytes"] - before, cache_bytes=du_bytes(t.cache),
                                      note=" ".join(x for x in (
                                          kv(dict(jobs=n, max_unused="0%",
                                                  occupied_before_bytes=st.get("occupied_bytes"),
                                                  unused_before_bytes=st.get("unused_bytes"),
                                                  occupied_after_bytes=st2.get("occupied_bytes"),
                                                  unused_after_bytes=st2.get("unused_bytes"))),
                                          t.summary("prune", os.path.join(BENCH_DIR, pr["log"]))) if x),
                                      **measured(pr)))
                    self.print_row(self.rows[-1])
                    info.update(prune_wall_s=pr["wall_s"], prune_rc=pr["rc"],
                                occupied_after_prune_bytes=st2.get("occupied_bytes"),
                                unused_after_prune_bytes=st2.get("unused_bytes"),
                                stored_after_prune_bytes=st2.get("stored_bytes"))
                    if pr["rc"] != 0:
                        status = f"fail prune rc={pr['rc']}"
                    elif st2.get("unused_bytes"):
                        log(f"jobs cairn x{n}: WARNING {st2['unused_bytes']} B still unused after prune "
                            f"--max-unused 0%")
                if "stats_error" in st and status == "ok":
                    status = "fail stats"
                if st.get("stored_bytes") is not None and st["stored_bytes"] != nbytes:
                    log(f"jobs {name} x{n}: WARNING stored_bytes {st['stored_bytes']} != {nbytes} B in the sources")
                self.add_row(dict(common, tool=name, tool_version=ver, phase=f"jobs{n}", status=status,
                                  input_bytes=nbytes, input_files=nfiles, wall_s=f"{wall:.3f}",
                                  user_s=f"{sum(jr.get('user_s', 0.0) for jr in res):.2f}",
                                  sys_s=f"{sum(jr.get('sys_s', 0.0) for jr in res):.2f}",
                                  cpu_s=f"{tot['cpu_s']:.2f}",
                                  max_rss_kib=max(jr.get("max_rss_kib", 0) for jr in res) or "",
                                  mb_per_s=f"{nbytes / MB / wall:.2f}", files_per_s=f"{nfiles / wall:.1f}",
                                  repo_bytes=st["repo_bytes"], cache_bytes=du_bytes(t.cache),
                                  sync_s=f"{tot['sync_s']:.2f}", other_cpu_s=tot["other_cpu_s"],
                                  steal_s=tot["steal_s"], log=res[-1]["log"], note=kv(info)))
                self.print_row(self.rows[-1])

                # 3. after the largest run: restore every job's snapshot, compare, check --read-data
                if name == "cairn" and n == nmax and not failed and not self.a.no_verify:
                    self.jobs_verify(t, n, rep, ds, manifest)
                cleanup(t)

    def jobs_verify(self, t, n, rep, ds, manifest):
        """Restore each job's snapshot of cairn's n-job repository, compare it with its source
        day dir, then check --read-data (rows jobs<n>-restore-job<k> and jobs<n>-check-rd)."""
        common = dict(dataset=JOBS_DATASET, rep=rep, tool="cairn", tool_version=self.versions.get("cairn"))
        out = subprocess.run([t.bin, "snapshots", "--repo", t.repo, "--json"], env=t.env(), capture_output=True,
                             text=True, stdin=subprocess.DEVNULL)
        try:
            snaps = json.loads(out.stdout)
        except ValueError:
            snaps = []
            log(f"jobs: cairn snapshots failed: {out.stderr[-500:]}")
        by_path = {}
        for s in snaps:
            for p in s.get("paths") or []:
                by_path[os.path.realpath(p)] = s.get("id")
        for k in range(1, n + 1):
            src = ds[k - 1]
            sid = by_path.get(os.path.realpath(src))
            if not sid:
                self.add_row(dict(common, phase=f"jobs{n}-restore-job{k}", status="fail no snapshot",
                                  verify="MISMATCH: no snapshot of " + os.path.basename(src)))
                continue
            target = os.path.join(self.work, "restore", f"cairn-{JOBS_DATASET}")
            fresh_dir(target)
            settle()
            r = self.measure(t, f"{JOBS_DATASET}-cairn-n{n}-restore-job{k}-r{rep}",
                             [t.bin, "restore", sid, "--repo", t.repo, "--target", target])
            rfiles, rbytes = tree_size(target)
            verify = "skipped"
            if r["rc"] == 0:
                log(f"jobs: hashing {os.path.basename(src)} to verify the restore")
                last = os.path.basename(src) == f"day-{manifest['days']:02d}"
                digest = manifest["last_day_digest"] if last else datasets.tree_digest(src)
                verify = self.verify(target, src, digest)
            self.add_row(dict(common, phase=f"jobs{n}-restore-job{k}",
                              status="ok" if r["rc"] == 0 else f"fail rc={r['rc']}",
                              input_bytes=rbytes, input_files=rfiles, wall_s=f"{r['wall_s']:.3f}",
                              user_s=r.get("user_s", ""), sys_s=r.get("sys_s", ""), cpu_s=f"{r['cpu_s']:.2f}",
                              max_rss_kib=r.get("max_rss_kib", ""), mb_per_s=f"{rbytes / MB / r['wall_s']:.2f}",
                              files_per_s=f"{rfiles / r['wall_s']:.1f}", repo_bytes=du_bytes(t.repo),
                              sync_s=f"{r['sync_s']:.2f}", other_cpu_s=r["other_cpu_s"], steal_s=r["steal_s"],
                              verify=verify, log=r["log"], note=f"jobs={n} job={k} snapshot={sid[:8]} "
                                                                f"source={os.path.basename(src)}"))
            self.print_row(self.rows[-1])
            shutil.rmtree(target, ignore_errors=True)
        before = du_bytes(t.repo)
        r = self.measure(t, f"{JOBS_DATASET}-cairn-n{n}-check-rd-r{rep}", *t.check_data_cmd())
        note = t.summary("check-rd", os.path.join(BENCH_DIR, r["log"]))
        self.add_row(dict(common, phase=f"jobs{n}-check-rd", status="ok" if r["rc"] == 0 else f"fail rc={r['rc']}",
                          input_bytes=before, repo_bytes=du_bytes(t.repo), mb_per_s=f"{before / MB / r['wall_s']:.2f}",
                          wall_s=f"{r['wall_s']:.3f}", user_s=r.get("user_s", ""), sys_s=r.get("sys_s", ""),
                          cpu_s=f"{r['cpu_s']:.2f}", max_rss_kib=r.get("max_rss_kib", ""),
                          sync_s=f"{r['sync_s']:.2f}", other_cpu_s=r["other_cpu_s"], steal_s=r["steal_s"],
                          verify="ok" if r["rc"] == 0 else "FAILED", log=r["log"], note=f"jobs={n} {note}".strip()))
        self.print_row(self.rows[-1])

    # -- copy scenario: cairn copy of a day-by-day history into repositories with another block size
    def run_copy(self, rep):
        if "cairn" not in self.a.tools:
            log("copy: skipped (the scenario needs cairn in --tools)")
            return
        skipped = [t for t in self.a.tools if t not in ("cairn", "restic")]
        if skipped:
            log(f"copy: skipping {','.join(skipped)} (the scenario runs cairn, and restic when named)")
        use_restic = "restic" in self.a.tools
        ds = COPY_DATASET
        days, churn = self.a.copy_days, self.a.maint_churn
        src = self.dataset_src("mixed")
        log(f"copy (repetition {rep}): {days} daily versions of {os.path.basename(src)} "
            f"({churn:.0%} of files changed per day) into cairn R1 ({COPY_SRC_BLOCK} blocks), then cairn copy "
            f"into {COPY_DST_BLOCK} repositories" + ("; restic copy between two restic repositories" if use_restic else ""))
        live = os.path.join(self.work, "live", ds)
        if os.path.exists(live):
            shutil.rmtree(live)
        os.makedirs(os.path.dirname(live), exist_ok=True)
        subprocess.run(["cp", "-a", src, live], check=True)
        for d in ("repos", "restore", "logs"):
            os.makedirs(os.path.join(self.work, d), exist_ok=True)
        common = dict(dataset=ds, rep=rep)
        made = []

        def fresh(name, tag):
            t = TOOL_CLASSES[name](self.bins[name], self.work, f"{ds}-{tag}")
            for p in (t.repo, t.cache):
                if os.path.exists(p):
                    shutil.rmtree(p)
            os.makedirs(t.cache)
            if name == "cairn":
                t.extra_env["CAIRN_TRAFFIC_REPORT"] = "1"
            made.append(t)
            return t

        measured, kv = measured_fields, kv_note

        def init(name, t, phase, argv, note):
            r = self.measure_traffic(t, f"{ds}-{name}-{phase}-r{rep}", argv)
            self.add_row(dict(common, tool=name, tool_version=self.versions.get(name), phase=phase,
                              status="ok" if r["rc"] == 0 else f"fail rc={r['rc']}", repo_bytes=repo_size(t),
                              note=" ".join(x for x in (note, r["note"]) if x), **measured(r)))
            return r["rc"] == 0

        # 1. the history, backed up day by day into R1 (cairn, 4K) and RS (restic), like the
        # maintenance scenario: one live tree, datasets.apply_history_day in place
        r1 = fresh("cairn", "r1")
        tools = {"cairn": r1}
        alive = {"cairn": init("cairn", r1, "init", [r1.bin, "init", "--repo", r1.repo, "--block-size",
                                                      COPY_SRC_BLOCK], f"repo=R1 block={COPY_SRC_BLOCK}")}
        if use_restic:
            rs = fresh("restic", "src")
            tools["restic"] = rs
            alive["restic"] = init("restic", rs, "init", rs.init_cmd()[0], "repo=source")
        last = {name: repo_size(t) for name, t in tools.items()}
        per_day = []
        for day in range(1, days + 1):
            edits = {}
            if day > 1:
                edits = datasets.apply_history_day(live, day, datasets.DEFAULT_SEED, churn)
                settle()
            nfiles, nbytes = tree_size(live)
            info = dict(day=day, files=nfiles, bytes=nbytes,
                        new_bytes=nbytes if day == 1 else edits.get("new_bytes", 0),
                        removed_bytes=edits.get("removed_bytes", 0))
            for name, t in tools.items():
                if not alive[name]:
                    continue
                r = self.measure(t, f"{ds}-{name}-day{day}-r{rep}", *t.backup_cmd(live, f"day{day}"))
                repo = repo_size(t)
                alive[name] = r["rc"] == 0
                info[f"{name}_added_bytes"] = repo - last[name]
                self.add_row(dict(common, tool=name, tool_version=self.versions.get(name), phase=f"day{day}",
                                  status="ok" if r["rc"] == 0 else f"fail rc={r['rc']}", input_bytes=nbytes,
                                  input_files=nfiles, mb_per_s=f"{nbytes / MB / r['wall_s']:.2f}",
                                  files_per_s=f"{nfiles / r['wall_s']:.1f}", repo_bytes=repo,
                                  repo_delta_bytes=repo - last[name], cache_bytes=du_bytes(t.cache),
                                  note=kv(dict(day=day, block=COPY_SRC_BLOCK if name == "cairn" else None,
                                               new_bytes=info["new_bytes"], removed_bytes=info["removed_bytes"])),
                                  **measured(r)))
                last[name] = repo
                self.print_row(self.rows[-1])
            per_day.append(info)
        history_bytes = sum(d["bytes"] for d in per_day)
        history_files = sum(d["files"] for d in per_day)
        log(f"copy: history of {days} days holds {history_bytes / 2**20:.1f} MiB in {history_files} files "
            f"(day {days}: {per_day[-1]['bytes'] / 2**20:.1f} MiB, {per_day[-1]['new_bytes'] / 2**20:.2f} MiB new)")
        digest = None
        if not self.a.no_verify:
            log("copy: hashing the last day for restore verification")
            digest = datasets.tree_digest(live)

        ids = []
        if alive["cairn"]:
            out = subprocess.run([r1.bin, "snapshots", "--repo", r1.repo, "--json"], env=r1.env(),
                                 capture_output=True, text=True, stdin=subprocess.DEVNULL)
            try:
                ids = [x["id"] for x in sorted(json.loads(out.stdout), key=lambda x: x.get("time") or "")]
            except (ValueError, KeyError, TypeError):
                log(f"copy: cairn snapshots failed: {out.stderr[-500:]}")
            if len(ids) != days:
                log(f"copy: WARNING R1 holds {len(ids)} snapshots, expected {days}")

        def copy_run(t, phase, target, snaps, **extra):
            """One measured `cairn copy --from R1 --to T --json [SNAPSHOT...]` (a row); returns its JSON."""
            label = f"{ds}-cairn-{phase}-r{rep}"
            out_json = os.path.join(self.work, "logs", label + ".json")
            before = repo_size(t)
            settle()
            r = self.measure_traffic(t, label, [t.bin, "copy", "--from", r1.repo, "--to", t.repo, "--json"] + snaps,
                                     stdout_path=out_json)
            doc = {}
            if r["rc"] == 0:
                try:
                    with open(out_json) as f:
                        doc = json.load(f)
                except (OSError, ValueError) as ex:
                    log(f"copy {phase}: cannot parse {out_json}: {ex}")
            after = repo_size(t)
            info = {k: doc.get(k) for k in COPY_FIELDS}
            logical, sent = _f(doc.get("logical_bytes")), _f(doc.get("bytes_sent"))
            src_tr = r["traffic"].get(r1.repo)
            info.update(target=target, block=COPY_DST_BLOCK, source_block=COPY_SRC_BLOCK,
                        snapshots_asked=len(snaps) if snaps else len(ids), history_bytes=history_bytes,
                        sent_pct=100 * sent / logical if sent is not None and logical else None,
                        sent_pct_history=100 * sent / history_bytes if sent is not None and history_bytes else None,
                        src_downloaded_bytes=src_tr[1] if src_tr else None, src_requests=src_tr[2] if src_tr else None)
            info.update(extra)
            status = "ok" if r["rc"] == 0 and doc else (f"fail rc={r['rc']}" if r["rc"] else "fail json")
            wall = r["wall_s"] or 1e-9
            self.add_row(dict(common, tool="cairn", tool_version=self.versions.get("cairn"), phase=phase,
                              status=status, input_bytes=doc.get("logical_bytes", ""), input_files=doc.get("files", ""),
                              mb_per_s=f"{logical / MB / wall:.2f}" if logical else "",
                              repo_bytes=after, repo_delta_bytes=after - before, cache_bytes=du_bytes(t.cache),
                              note=" ".join(x for x in (kv(info), r["note"]) if x), **measured(r)))
            self.print_row(self.rows[-1])
            if doc:
                log(f"copy {phase}: {doc.get('snapshots_copied')} snapshots, logical "
                    f"{(logical or 0) / 2**20:.1f} MiB, sent {(sent or 0) / 2**20:.2f} MiB"
                    + (f" ({info['sent_pct']:.2f}% of logical)" if info["sent_pct"] is not None else "")
                    + f", {doc.get('files_rechunked')}/{doc.get('files')} files re-chunked, "
                      f"{doc.get('duration_secs', 0):.2f}s")
            return doc if status == "ok" else None

        def restore_check(t, phase, target_desc):
            if digest is None:
                return
            target = os.path.join(self.work, "restore", f"cairn-{ds}")
            fresh_dir(target)
            settle()
            r = self.measure_traffic(t, f"{ds}-cairn-{phase}-r{rep}", *t.restore_cmd(target, "latest"))
            rfiles, rbytes = tree_size(target)
            verify = self.verify(target, live, digest) if r["rc"] == 0 else "skipped"
            self.add_row(dict(common, tool="cairn", tool_version=self.versions.get("cairn"), phase=phase,
                              status="ok" if r["rc"] == 0 else f"fail rc={r['rc']}", input_bytes=rbytes,
                              input_files=rfiles, mb_per_s=f"{rbytes / MB / r['wall_s']:.2f}",
                              files_per_s=f"{rfiles / r['wall_s']:.1f}", repo_bytes=repo_size(t), verify=verify,
                              note=" ".join(x for x in (f"target={target_desc} snapshot=latest day={days}", r["note"])
                                            if x), **measured(r)))
            self.print_row(self.rows[-1])
            shutil.rmtree(target, ignore_errors=True)

        def copy_target(tag, target_desc, t):
            """init 64K, copy everything, copy again (no-op), restore the last day and verify."""
            ok = init("cairn", t, f"init-{tag}", [t.bin, "init", "--repo", t.repo, "--block-size", COPY_DST_BLOCK],
                      f"target={target_desc} block={COPY_DST_BLOCK}")
            if not ok:
                return
            doc = copy_run(t, f"copy-{tag}", target_desc, [])
            if doc is None:
                return
            if doc.get("logical_bytes") not in (None, history_bytes):
                log(f"copy {tag}: WARNING logical_bytes {doc.get('logical_bytes')} != {history_bytes} B, the sum "
                    f"of the {days} days")
            again = copy_run(t, f"copy-{tag}-again", target_desc, [])
            if again is not None and again.get("snapshots_copied"):
                log(f"copy {tag}: WARNING the second copy copied {again.get('snapshots_copied')} snapshots "
                    f"(expected none)")
            restore_check(t, f"restore-{tag}", target_desc)

        if alive["cairn"] and ids:
            # 2. into a fresh local repository with 64K blocks
            copy_target("local", "local", fresh("cairn", "r2"))
            # 3. into a 64K repository on MinIO, when there is a MinIO binary (none is built here)
            server = S3Server(self.work, "s3-server-copy")
            try:
                server.start(build=False)
            except RuntimeError as ex:
                server = None
                log(f"copy: no S3 target ({ex})")
            if server is not None:
                try:
                    r3 = fresh("cairn", "r3")
                    r3.use_s3(server, f"copy-r3-r{rep}-{self.date}")
                    copy_target("s3", "s3", r3)
                finally:
                    log("copy: stopping MinIO")
                    server.stop()
                    if not self.a.keep:
                        shutil.rmtree(server.dir, ignore_errors=True)
            # 4. incremental: days 1..N-1 first, then day N alone
            r4 = fresh("cairn", "r4")
            if days > 1 and init("cairn", r4, "init-incr", [r4.bin, "init", "--repo", r4.repo, "--block-size",
                                                             COPY_DST_BLOCK], f"target=incr block={COPY_DST_BLOCK}"):
                first = copy_run(r4, f"incr-days1-{days - 1}", "local", ids[:-1], days_copied=f"1-{days - 1}")
                if first is not None:
                    lastd = per_day[-1]
                    doc = copy_run(r4, f"incr-day{days}", "local", ids[-1:], days_copied=str(days),
                                   day_bytes=lastd["bytes"], day_new_bytes=lastd["new_bytes"],
                                   day_removed_bytes=lastd["removed_bytes"],
                                   day_r1_added_bytes=lastd.get("cairn_added_bytes"))
                    if doc is not None and lastd["new_bytes"]:
                        log(f"copy incr-day{days}: sent {doc.get('bytes_sent', 0) / 2**20:.2f} MiB for a day that "
                            f"wrote {lastd['new_bytes'] / 2**20:.2f} MiB of new bytes "
                            f"({100 * doc.get('bytes_sent', 0) / lastd['new_bytes']:.1f}%)")
                    restore_check(r4, "restore-incr", "incr")

        # 5. restic copy between two restic repositories (target shares the source's chunker parameters)
        if use_restic and alive.get("restic"):
            rs = tools["restic"]
            rt = fresh("restic", "dst")
            pw = os.path.join(self.work, "copy-from-password")
            with open(os.open(pw, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(PASSWORD + "\n")
            src_args = ["--from-repo", rs.repo, "--from-password-file", pw]
            if init("restic", rt, "init-local", [rt.bin, "init", "--repo", rt.repo, "--copy-chunker-params"]
                    + src_args, "target=local copy_chunker_params=yes"):
                for phase in ("copy-local", "copy-local-again"):
                    before = repo_size(rt)
                    settle()
                    r = self.measure(rt, f"{ds}-restic-{phase}-r{rep}",
                                     [rt.bin, "copy", "--repo", rt.repo] + src_args)
                    after = repo_size(rt)
                    try:
                        text = open(os.path.join(BENCH_DIR, r["log"]), errors="replace").read()
                    except OSError:
                        text = ""
                    copied = len(re.findall(r"^snapshot [0-9a-f]+ saved", text, re.M))
                    if copied not in (0, days):
                        log(f"copy restic {phase}: WARNING {copied} of {days} snapshots copied")
                    self.add_row(dict(common, tool="restic", tool_version=self.versions.get("restic"), phase=phase,
                                      status="ok" if r["rc"] == 0 else f"fail rc={r['rc']}",
                                      input_bytes=history_bytes if copied else 0,
                                      input_files=history_files if copied else 0,
                                      mb_per_s=f"{history_bytes / MB / r['wall_s']:.2f}" if copied else "",
                                      repo_bytes=after, repo_delta_bytes=after - before, cache_bytes=du_bytes(rt.cache),
                                      note=kv(dict(target="local", snapshots_copied=copied, history_bytes=history_bytes,
                                                   added_pct_history=100 * (after - before) / history_bytes
                                                   if history_bytes else None,
                                                   source_repo_bytes=repo_size(rs))),
                                      **measured(r)))
                    self.print_row(self.rows[-1])
                    if r["rc"] != 0:
                        break
            os.unlink(pw)

        log(f"{ds}: cleaning up")
        if not self.a.keep:
            for t in made:
                if t.s3 is None:
                    shutil.rmtree(t.repo, ignore_errors=True)
                shutil.rmtree(t.cache, ignore_errors=True)
            shutil.rmtree(live, ignore_errors=True)
        settle()

    def verify(self, target, live, src_digest):
        rel = live.lstrip("/")
        for cand in (os.path.join(target, rel), os.path.join(target, os.path.basename(live)), target):
            if os.path.isdir(cand):
                d = datasets.tree_digest(cand)
                if d["digest"] == src_digest["digest"]:
                    return "ok"
        # report what the most likely candidate looked like
        for cand in (os.path.join(target, rel), os.path.join(target, os.path.basename(live)), target):
            if os.path.isdir(cand):
                d = datasets.tree_digest(cand)
                return (f"MISMATCH at {os.path.relpath(cand, target)}: {d['files']} files/{d['bytes']} B "
                        f"vs {src_digest['files']}/{src_digest['bytes']}")
        return "MISMATCH: nothing restored"

    # -- recovery scenario (issue #18): what happens after the backups, beside the peers
    def snapshot_refs(self, t, day):
        """How tool t names the snapshot of history day `day` (1-based), for restore/mount/export."""
        if t.name == "borg":
            return f"{t.repo}::{RECOVERY_DATASET}-day{day}"
        if t.name == "kopia":
            out = subprocess.run([t.bin, "snapshot", "list", "--json", t.last_path], capture_output=True,
                                 text=True, env=t.env())
        else:
            out = subprocess.run([t.bin, "snapshots", "--json", "--repo", t.repo], capture_output=True,
                                 text=True, env=t.env())
        snaps = sorted(json.loads(out.stdout or "[]"), key=lambda x: x.get("time") or x.get("startTime") or "")
        return snaps[day - 1]["id"]

    def recovery_restore_cmd(self, t, ref, target, over=False):
        """(argv, cwd) restoring snapshot `ref` of tool t into target; over: into a target that holds an older
        day (cairn and restic then also delete what the snapshot lacks; borg and kopia overwrite, never delete)."""
        if t.name == "cairn":
            return [t.bin, "restore", ref, "--repo", t.repo, "--target", target] + (["--delete"] if over else []), None
        if t.name == "restic":
            extra = ["--overwrite", "if-changed", "--delete"] if over else []
            return [t.bin, "restore", ref, "--repo", t.repo, "--target", target] + extra, None
        if t.name == "borg":
            return [t.bin, "extract", ref], target
        return [t.bin, "snapshot", "restore", ref, target], None

    def run_recovery(self, rep):
        """A --recovery-days history of the mixed tree backed up by each tool, then per tool: restore of the last
        day into an empty directory; the last day restored over a directory holding the day before; `cp -a` of
        the last day out of the tool's FUSE mount; a search for one name over every snapshot (cairn find, restic
        find; borg and kopia list each snapshot through grep: they have no search); the last day exported as a tar
        file (cairn export, restic dump --archive tar, borg export-tar, kopia restore to .tar). Wall, CPU and peak
        RSS of each (for the mount: cp's plus the mount process's CPU, and the mount's peak RSS)."""
        kind = RECOVERY_DATASET
        names = [t for t in self.a.tools if t in RECOVERY_TOOLS]
        if not names:
            return
        src = self.dataset_src("mixed")
        days, churn = self.a.recovery_days, self.a.maint_churn
        log(f"recovery (repetition {rep}): {days} daily versions of {os.path.basename(src)}, then restore, "
            "restore over the day before, cp out of a mount, find over every snapshot, export to tar")
        live = os.path.join(self.work, "live", kind)
        shutil.rmtree(live, ignore_errors=True)
        os.makedirs(os.path.dirname(live), exist_ok=True)
        subprocess.run(["cp", "-a", src, live], check=True)
        tools = {}
        for name in names:
            t = TOOL_CLASSES[name](self.bins[name], self.work, kind)
            for p in (t.repo, t.cache):
                shutil.rmtree(p, ignore_errors=True)
            os.makedirs(t.cache)
            if name == "borg":
                t.extra_env["BORG_FUSE_IMPL"] = "pyfuse3"
            tools[name] = t
            r = self.measure(t, f"{kind}-{name}-init-r{rep}", *t.init_cmd())
            if r["rc"] != 0:
                sys.exit(f"recovery: {name} init failed, see {r['log']}")
            if name == "kopia":
                # kopia's default retention would delete most of 25 snapshots taken
                # within minutes; every tool keeps them all here.
                subprocess.run([t.bin, "policy", "set", "--global", "--keep-latest", "1000"]
                               + [f"--keep-{p}=0" for p in ("hourly", "daily", "weekly", "monthly", "annual")],
                               env=t.env(), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # the name searched for: a file of day 1, in the middle of the sorted list
        day1 = sorted(os.path.relpath(os.path.join(d, f), live) for d, _, fs in os.walk(live) for f in fs)
        needle = os.path.basename(day1[len(day1) // 2])
        for day in range(1, days + 1):
            if day > 1:
                datasets.apply_history_day(live, day, datasets.DEFAULT_SEED, churn)
            settle()
            for name, t in tools.items():
                r = self.measure(t, f"{kind}-{name}-day{day}-r{rep}", *t.backup_cmd(live, f"{kind}-day{day}"))
                if r["rc"] != 0:
                    sys.exit(f"recovery: {name} backup of day {day} failed, see {r['log']}")
            log(f"recovery: day {day} backed up by every tool")
        nfiles, nbytes = tree_size(live)
        digest = datasets.tree_digest(live)
        common = dict(dataset=kind, rep=rep, input_bytes=nbytes, input_files=nfiles)
        rel = live.lstrip("/")
        out_root = os.path.join(self.work, "restore", kind)

        def row(name, phase, r, **extra):
            d = dict(common, tool=name, tool_version=self.versions.get(name), phase=phase,
                     status="ok" if r["rc"] == 0 else f"fail rc={r['rc']}", wall_s=f"{r['wall_s']:.3f}",
                     user_s=r.get("user_s", ""), sys_s=r.get("sys_s", ""), cpu_s=f"{r['cpu_s']:.2f}",
                     max_rss_kib=r.get("max_rss_kib", ""), sync_s=f"{r['sync_s']:.2f}",
                     other_cpu_s=r["other_cpu_s"], steal_s=r["steal_s"], log=r["log"])
            d.update(extra)
            self.add_row(d)
            self.print_row(self.rows[-1])

        for name, t in tools.items():
            last, before = self.snapshot_refs(t, days), self.snapshot_refs(t, days - 1)
            # restore into an empty directory
            target = os.path.join(out_root, f"{name}-fresh")
            shutil.rmtree(target, ignore_errors=True)
            os.makedirs(target)
            settle()
            r = self.measure(t, f"{kind}-{name}-restore-r{rep}", *self.recovery_restore_cmd(t, last, target))
            row(name, "restore", r, mb_per_s=f"{nbytes / MB / r['wall_s']:.2f}",
                verify=self.verify(target, live, digest) if r["rc"] == 0 else "fail")
            shutil.rmtree(target, ignore_errors=True)
            # the last day over the day before
            target = os.path.join(out_root, f"{name}-over")
            shutil.rmtree(target, ignore_errors=True)
            os.makedirs(target)
            argv, cwd = self.recovery_restore_cmd(t, before, target)
            subprocess.run(argv, cwd=cwd, env=t.env(), check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            settle()
            r = self.measure(t, f"{kind}-{name}-restore-over-r{rep}",
                             *self.recovery_restore_cmd(t, last, target, over=True))
            if name in ("cairn", "restic"):
                verify = self.verify(target, live, digest) if r["rc"] == 0 else "fail"
            else:
                verify = "not compared (no --delete: files deleted since hold on)"
            row(name, "restore-over", r, mb_per_s=f"{nbytes / MB / r['wall_s']:.2f}", verify=verify)
            shutil.rmtree(target, ignore_errors=True)
            # cp -a out of the mount
            self.recovery_mount_copy(t, last, rel, live, digest, out_root, rep, row, nbytes)
            # find one name over every snapshot
            if name in ("cairn", "restic"):
                argv = [t.bin, "find", needle, "--repo", t.repo]
            elif name == "borg":
                argv = ["bash", "-c", f'for a in $("{t.bin}" list --short "{t.repo}"); do '
                        f'"{t.bin}" list "{t.repo}::$a" --format "{{path}}{{NL}}" | grep -F "{needle}" || true; done']
            else:
                ids = " ".join(self.snapshot_refs(t, d) for d in range(1, days + 1))
                argv = ["bash", "-c", f'for i in {ids}; do "{t.bin}" ls -r "$i" | grep -F "{needle}" || true; done']
            out = os.path.join(out_root, f"{name}-find.txt")
            os.makedirs(out_root, exist_ok=True)
            r = self.measure(t, f"{kind}-{name}-find-r{rep}", argv, stdout_path=out)
            hits = sum(1 for line in open(out, errors="replace") if needle in line)
            row(name, "find", r, note=f"{needle}: {hits} lines over {days} snapshots")
            os.unlink(out)
            # export to tar
            tar = os.path.join(out_root, f"{name}.tar")
            if name == "cairn":
                r = self.measure(t, f"{kind}-{name}-export-r{rep}", [t.bin, "export", last, "--repo", t.repo,
                                                                      "--format", "tar"], stdout_path=tar)
            elif name == "restic":
                r = self.measure(t, f"{kind}-{name}-export-r{rep}", [t.bin, "dump", "--repo", t.repo,
                                                                      "--archive", "tar", last, "/"],
                                 stdout_path=tar)
            elif name == "borg":
                r = self.measure(t, f"{kind}-{name}-export-r{rep}", [t.bin, "export-tar", last, tar])
            else:
                r = self.measure(t, f"{kind}-{name}-export-r{rep}", [t.bin, "snapshot", "restore", last, tar])
            size = os.path.getsize(tar) if os.path.exists(tar) else 0
            row(name, "export-tar", r, mb_per_s=f"{nbytes / MB / r['wall_s']:.2f}", note=f"{size} bytes of tar")
            if os.path.exists(tar):
                os.unlink(tar)
        self.clean_up(tools, live)

    def clean_up(self, tools, live):
        """Removes the scenario's repositories, caches and live tree (unless --keep)."""
        if not self.a.keep:
            for t in tools.values():
                shutil.rmtree(t.repo, ignore_errors=True)
                shutil.rmtree(t.cache, ignore_errors=True)
            shutil.rmtree(live, ignore_errors=True)
        settle()

    def recovery_mount_copy(self, t, last, rel, live, digest, out_root, rep, row, nbytes):
        """Mounts tool t's repository, copies the last day out with cp -a (measured), unmounts."""
        mnt = os.path.join(self.work, "mnt", t.name)
        subprocess.run(["fusermount3", "-u", mnt], stderr=subprocess.DEVNULL)
        os.makedirs(mnt, exist_ok=True)
        if t.name == "cairn":
            argv, inside = [t.bin, "mount", mnt, "--repo", t.repo], os.path.join(mnt, "latest", rel)
        elif t.name == "restic":
            argv, inside = [t.bin, "mount", mnt, "--repo", t.repo], os.path.join(mnt, "snapshots", "latest", rel)
        elif t.name == "borg":
            argv, inside = [t.bin, "mount", "-f", last, mnt], os.path.join(mnt, rel)
        else:
            argv, inside = [t.bin, "mount", last, mnt], mnt
        logp = os.path.join(self.work, "logs", f"{RECOVERY_DATASET}-{t.name}-mount-r{rep}.log")
        with open(logp, "w") as lf:
            proc = subprocess.Popen(argv, env=t.env(), stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        probe = os.path.join(inside, os.listdir(live)[0])
        for _ in range(600):
            if os.path.exists(probe) or proc.poll() is not None:
                break
            time.sleep(0.1)
        dest = os.path.join(out_root, f"{t.name}-mountcopy")
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(out_root, exist_ok=True)
        if not os.path.exists(probe):
            proc.kill()
            proc.wait()
            log(f"recovery: {t.name} mount did not come up (see {logp})")
            return
        r = self.measure(t, f"{RECOVERY_DATASET}-{t.name}-mount-cp-r{rep}", ["cp", "-a", inside, dest])

        def proc_stat():
            fields = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            hwm = next((int(line.split()[1]) for line in open(f"/proc/{proc.pid}/status")
                        if line.startswith("VmHWM:")), 0)
            return cpu, hwm
        try:
            mount_cpu, mount_hwm = proc_stat()
        except (OSError, IndexError, ValueError):
            mount_cpu, mount_hwm = 0.0, 0
        subprocess.run(["fusermount3", "-u", mnt], stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        verify = self.verify(dest, live, digest) if r["rc"] == 0 else "fail"
        cp_cpu = r["cpu_s"]
        r["cpu_s"] = cp_cpu + mount_cpu
        row(t.name, "mount-cp", r, mb_per_s=f"{nbytes / MB / r['wall_s']:.2f}", verify=verify,
            max_rss_kib=mount_hwm,
            note=f"CPU: cp {cp_cpu:.2f} s + mount {mount_cpu:.2f} s; peak RSS is the mount's")
        shutil.rmtree(dest, ignore_errors=True)

    def print_row(self, r):
        rate = f"{r['mb_per_s']} MB/s {r['files_per_s']} files/s " if r["files_per_s"] else \
            (f"{r['mb_per_s']} MB/s " if r["mb_per_s"] else "")
        log(f"{r['dataset']:6} {r['phase']:9} {r['tool']:6} {r['status']:4} wall={r['wall_s']}s "
            f"{rate}cpu={r['cpu_s']}s "
            f"rss={int(r['max_rss_kib'] or 0) / 1024:.0f}MiB repo={int(r['repo_bytes'] or 0) / 2**20:.1f}MiB"
            + (f" verify={r['verify']}" if r['verify'] else ""))

    def run(self):
        for name in self.a.tools:
            b = self.bins[name]
            if not (b and os.path.exists(b) and os.access(b, os.X_OK)):
                sys.exit(f"{name} binary not found: {b}")
            self.versions[name] = TOOL_CLASSES[name](b, self.work, "version").version()
        for name in self.a.tools:
            shutil.rmtree(os.path.join(self.work, "cache", f"{name}-version"), ignore_errors=True)
        if {"s3", "copy"} & set(self.a.scenarios):
            mb = minio_binary()
            if mb:
                try:
                    out = subprocess.run([mb, "--version"], capture_output=True, text=True, timeout=60)
                    self.versions["minio"] = (out.stdout or out.stderr).strip().splitlines()[0]
                except (OSError, IndexError, subprocess.SubprocessError) as ex:
                    self.versions["minio"] = f"unknown ({ex})"
        shutil.rmtree(os.path.join(self.work, "logs"), ignore_errors=True)
        self.open_csv()
        log(f"results -> {self.csv_path}")
        log(f"hardware: {hardware_line()}")
        log(f"versions: {self.versions}; scale {self.cfg}; {self.cache_mode}")
        if "backup" in self.a.scenarios:
            for kind in self.a.datasets:
                for rep in range(1, self.a.repeat + 1):
                    self.run_dataset(kind, rep)
        if "maintenance" in self.a.scenarios:
            for rep in range(1, self.a.repeat + 1):
                self.run_maintenance(rep)
        if "blocksizes" in self.a.scenarios:
            for rep in range(1, self.a.repeat + 1):
                self.run_blocksizes(rep)
        if "jobs" in self.a.scenarios:
            for rep in range(1, self.a.repeat + 1):
                self.run_jobs(rep)
        if "s3" in self.a.scenarios:
            self.run_s3()
        if "clients" in self.a.scenarios:
            for rep in range(1, self.a.repeat + 1):
                self.run_clients(rep)
        if "slowlink" in self.a.scenarios:
            for rep in range(1, self.a.repeat + 1):
                self.run_slowlink(rep)
        if "server" in self.a.scenarios:
            names = []
            for t in self.a.tools:
                if t in SERVER_TOOLS:
                    names += [t, SERVER_TOOLS[t]]
            if "restic-rest" in names and not os.access(self.a.rest_server_bin, os.X_OK):
                log(f"server: no rest-server at {self.a.rest_server_bin} (bench/install-peers.sh builds it); "
                    "restic-rest skipped")
                names.remove("restic-rest")
            for n in names:
                if n not in self.versions:
                    self.versions[n] = self.versions.get(n.split("-")[0], "")
            for kind in self.a.datasets:
                for rep in range(1, self.a.repeat + 1):
                    self.run_dataset(kind, rep, tool_names=names, served=True)
        if "copy" in self.a.scenarios:
            for rep in range(1, self.a.repeat + 1):
                self.run_copy(rep)
        if "recovery" in self.a.scenarios:
            for rep in range(1, self.a.repeat + 1):
                self.run_recovery(rep)
        self.csv_f.close()
        print(render_all(self.rows, self.a.tools))
        print(f"\nCSV: {self.csv_path}")
        print(f"Logs: {os.path.join(self.work, 'logs')}")
        print(f"Note: {self.cache_mode}; throughput = dataset bytes / wall time (MB = 10^6 B).")


# --------------------------------------------------------------------------
# table
# --------------------------------------------------------------------------
def _f(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _ratio(a, b):
    a, b = _f(a), _f(b)
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}"


NUMERIC = ["wall_s", "mb_per_s", "files_per_s", "cpu_s", "max_rss_kib", "repo_bytes", "repo_delta_bytes",
           "other_cpu_s"]


def aggregate(rows, tools):
    """Median over repetitions per (dataset, phase, tool), in run order."""
    groups = {}
    for r in rows:
        if r["phase"] == "init":
            continue
        groups.setdefault((r["dataset"], r["phase"]), {}).setdefault(r["tool"], []).append(r)
    out = []
    for (ds, ph), by_tool in groups.items():
        for tool in [t for t in tools if t in by_tool]:
            rs = by_tool[tool]
            ok = [r for r in rs if r["status"] == "ok"]
            agg = dict(dataset=ds, phase=ph, tool=tool, n=len(rs))
            agg["status"] = "ok" if len(ok) == len(rs) else (f"{len(ok)}/{len(rs)}ok" if ok else rs[-1]["status"])
            for k in NUMERIC:
                vals = sorted(v for v in (_f(r.get(k)) for r in ok) if v is not None)
                agg[k] = statistics.median(vals) if vals else None
            vs = sorted({r.get("verify", "") for r in rs} - {""})
            agg["verify"] = ",".join(vs)
            out.append(agg)
    return out


def _num(v, fmt, width):
    return format(v, fmt).rjust(width) if v is not None else "-".rjust(width)


def render_table(rows, tools):
    agg = aggregate(rows, tools)
    dw = max([7] + [len(a["dataset"]) for a in agg])  # s3-mixed and the like are 8 wide
    reps = max([a["n"] for a in agg] or [1])
    out = []
    if reps > 1:
        out.append(f"(medians over {reps} repetitions)")
    hdr = f"{'dataset':{dw}} {'phase':9} {'tool':6} {'status':6} {'wall s':>8} {'MB/s':>8} {'files/s':>9} " \
          f"{'CPU s':>7} {'RSS MiB':>8} {'repo MiB':>9} {'+repo MiB':>9} {'other':>6} verify"
    out.append(hdr)
    out.append("-" * len(hdr))
    for a in agg:
        out.append(f"{a['dataset']:{dw}} {a['phase']:9} {a['tool']:6} {a['status'][:6]:6} "
                   f"{_num(a['wall_s'], '.2f', 8)} {_num(a['mb_per_s'], '.1f', 8)} {_num(a['files_per_s'], '.0f', 9)} "
                   f"{_num(a['cpu_s'], '.2f', 7)} "
                   f"{_num(a['max_rss_kib'] and a['max_rss_kib'] / 1024, '.1f', 8)} "
                   f"{_num(a['repo_bytes'] and a['repo_bytes'] / 2**20, '.1f', 9)} "
                   f"{_num(None if a['repo_delta_bytes'] is None else a['repo_delta_bytes'] / 2**20, '.1f', 9)} "
                   f"{_num(a['other_cpu_s'], '.1f', 6)} {a['verify']}")
    noisy = [r for r in rows if _f(r.get("other_cpu_s")) and _f(r.get("wall_s"))
             and _f(r["other_cpu_s"]) > 0.3 * _f(r["wall_s"])]
    out.append("(other = CPU seconds used by the rest of the machine during the command: kernel writeback, "
               "concurrent jobs; high values mean a noisy measurement)")
    if noisy:
        out.append(f"WARNING: {len(noisy)} measurement(s) ran while other work used >0.3 core: "
                   + ", ".join(f"{r['dataset']}/{r['phase']}/{r['tool']}" for r in noisy[:8])
                   + (" ..." if len(noisy) > 8 else ""))
    peers = [t for t in tools if t != "cairn"]
    if "cairn" in tools and peers:
        out.append("")
        out.append("Ratios cairn vs peer: speed = cairn MB/s / peer MB/s (>1: cairn faster); "
                   "cpu, rss, repo = cairn / peer (<1: cairn uses less)")
        h2 = f"{'dataset':{dw}} {'phase':9} {'peer':6} {'speed':>6} {'cpu':>6} {'rss':>6} {'repo':>6}"
        out.append(h2)
        out.append("-" * len(h2))
        idx = {(a["dataset"], a["phase"], a["tool"]): a for a in agg if a["mb_per_s"] is not None}
        for a in agg:
            if a["tool"] != "cairn" or a["phase"] in MAINT_PHASES or (a["dataset"], a["phase"], "cairn") not in idx:
                continue
            for p in peers:
                pr = idx.get((a["dataset"], a["phase"], p))
                if not pr:
                    continue
                out.append(f"{a['dataset']:{dw}} {a['phase']:9} {p:6} {_ratio(a['mb_per_s'], pr['mb_per_s']):>6} "
                           f"{_ratio(a['cpu_s'], pr['cpu_s']):>6} {_ratio(a['max_rss_kib'], pr['max_rss_kib']):>6} "
                           f"{_ratio(a['repo_bytes'], pr['repo_bytes']):>6}")
    maint = [a for a in agg if a["phase"] in MAINT_PHASES]
    if "cairn" in tools and any(a["tool"] != "cairn" for a in maint):
        out.append("")
        out.append("Maintenance ratios cairn vs peer: time = peer wall s / cairn wall s (>1: cairn faster); "
                   "cpu, rss = cairn / peer (<1: cairn uses less); repo = repository size after, cairn / peer")
        h3 = f"{'dataset':{dw}} {'phase':9} {'peer':6} {'time':>6} {'cpu':>6} {'rss':>6} {'repo':>6}"
        out.append(h3)
        out.append("-" * len(h3))
        idx = {(a["dataset"], a["phase"], a["tool"]): a for a in maint if a["wall_s"] is not None}
        for a in maint:
            if a["tool"] != "cairn" or (a["dataset"], a["phase"], "cairn") not in idx:
                continue
            for p in peers:
                pr = idx.get((a["dataset"], a["phase"], p))
                if not pr:
                    continue
                out.append(f"{a['dataset']:{dw}} {a['phase']:9} {p:6} {_ratio(pr['wall_s'], a['wall_s']):>6} "
                           f"{_ratio(a['cpu_s'], pr['cpu_s']):>6} {_ratio(a['max_rss_kib'], pr['max_rss_kib']):>6} "
                           f"{_ratio(a['repo_bytes'], pr['repo_bytes']):>6}")
    notes = [r for r in rows if r.get("phase") in ("forget", "prune", "check-rd") and r.get("note")]
    if notes:
        out.append("")
        out.append("What forget, prune and check reported (repository MiB before -> after):")
        for r in notes:
            before, after = _f(r.get("input_bytes")), _f(r.get("repo_bytes"))
            size = f"{before / 2**20:.1f} -> {after / 2**20:.1f} MiB" if before is not None and after is not None else ""
            out.append(f"  {r['dataset']} r{r['rep']} {r['phase']} {r['tool']} ({size}): {r['note']}")
    return "\n".join(out)


def _note_kv(note):
    kv = {}
    for tok in (note or "").split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            kv[k] = v
    return kv


def _est_per_block(note):
    """{"16K": {field: value}} from the estimate row's note (tokens like 16K:dedup_percent=..,..)."""
    per = {}
    for tok in (note or "").split():
        if ":" in tok and "=" in tok and tok.index(":") < tok.index("="):
            b, rest = tok.split(":", 1)
            per[b] = dict(x.split("=", 1) for x in rest.split(",") if "=" in x)
    return per


def render_blocksizes(rows):
    """Tables of the blocksizes scenario (text and Markdown), from its CSV rows."""
    rows = [r for r in rows if r.get("dataset") == BS_DATASET]
    reps = sorted({str(r.get("rep")) for r in rows})
    restores = {(str(r["rep"]), r["phase"][len("restore-"):]): r for r in rows if r["phase"].startswith("restore-")}
    data = []
    for r in rows:
        if not r["phase"].startswith("backup-"):
            continue
        kv = _note_kv(r.get("note"))
        rr = restores.get((str(r["rep"]), r["phase"][len("backup-"):]), {})
        mib = lambda k: (lambda v: None if v is None else v / 2**20)(_f(kv.get(k)))  # noqa: E731
        diffs = [_f(kv.get(f"diff_{k}_pp")) for k in ("dedup", "compression", "reduction")]
        over = [k for k, v in zip(("dedup", "compression", "reduction"), diffs)
                if v is not None and abs(v) > EST_TOLERANCE_PP]
        data.append(dict(
            rep=str(r["rep"]), block=kv.get("block", "?"), comp=kv.get("compression", "?"), status=r["status"],
            stored=mib("stored_bytes"), dedup=_f(kv.get("dedup_percent")), compr=_f(kv.get("compression_percent")),
            red=_f(kv.get("reduction_percent")), occupied=mib("occupied_bytes"), index=mib("index_bytes"),
            index_ram=mib("index_ram_bytes"), chunks=_f(kv.get("unique_chunks")),
            avg_chunk=_f(kv.get("average_chunk_bytes")), backup_s=_f(r.get("wall_s")),
            backup_mbs=_f(r.get("mb_per_s")), restore_s=_f(rr.get("wall_s")), restore_mbs=_f(rr.get("mb_per_s")),
            verify=rr.get("verify", "") or ("-" if r["status"] == "ok" else r["status"]),
            est_dedup=_f(kv.get("est_dedup_percent")), est_compr=_f(kv.get("est_compression_percent")),
            est_red=_f(kv.get("est_reduction_percent")), diffs=diffs, over=over))
    if not data and not rows:
        return ""

    def n(v, fmt):
        return "-" if v is None else format(v, fmt)

    def dpp(ds):
        return "/".join("-" if v is None else f"{v:+.2f}" for v in ds)

    out = ["", "blocksizes: one datastore per block size x compression, all days backed up, then a restore of "
           "the last day", "(stored = data of all snapshots; dedup/compression/reduction % from cairn stats; "
           "est. = cairn estimate over the same day dirs; diff pp = estimate - real, dedup/compression/reduction, "
           f"'!' = more than {EST_TOLERANCE_PP:g} points apart)"]
    cols = [("block", 5), ("compr.", 8), ("stored MiB", 10), ("dedup %", 7), ("compr. %", 8), ("reduct. %", 9),
            ("occupied MiB", 12), ("index MiB", 9), ("backup s", 9), ("restore s", 9), ("est. red. %", 11),
            ("diff pp d/c/r", 19), ("verify", 6)]
    if len(reps) > 1:
        cols.insert(0, ("rep", 3))
    hdr = " ".join(name.rjust(w) if i >= (3 if len(reps) > 1 else 2) else name.ljust(w)
                   for i, (name, w) in enumerate(cols))
    out.append(hdr)
    out.append("-" * len(hdr))
    for d in data:
        vals = [d["block"], d["comp"], n(d["stored"], ".1f"), n(d["dedup"], ".2f"), n(d["compr"], ".2f"),
                n(d["red"], ".2f"), n(d["occupied"], ".1f"), n(d["index"], ".2f"), n(d["backup_s"], ".1f"),
                n(d["restore_s"], ".1f"), n(d["est_red"], ".2f"), dpp(d["diffs"]) + ("!" if d["over"] else " "),
                d["verify"] if d["status"] == "ok" else d["status"]]
        if len(reps) > 1:
            vals.insert(0, d["rep"])
        out.append(" ".join(v.rjust(w) if i >= (3 if len(reps) > 1 else 2) else v.ljust(w)
                            for i, (v, (_, w)) in enumerate(zip(vals, cols))))
    out.append("")
    rp = (lambda d: f"{d['rep']:3} ") if len(reps) > 1 else (lambda d: "")  # noqa: E731
    h2 = ("rep " if len(reps) > 1 else "") + (
          f"{'block':5} {'compr.':8} {'unique chunks':>13} {'avg chunk B':>11} {'index RAM MiB':>13} "
          f"{'dedup real/est':>15} {'compr. real/est':>15} {'backup MB/s':>11} {'restore MB/s':>12}")
    out.append(h2)
    out.append("-" * len(h2))
    for d in data:
        out.append(rp(d) + f"{d['block']:5} {d['comp']:8} {n(d['chunks'], '.0f'):>13} {n(d['avg_chunk'], '.0f'):>11} "
                   f"{n(d['index_ram'], '.2f'):>13} "
                   f"{n(d['dedup'], '.2f') + '/' + n(d['est_dedup'], '.2f'):>15} "
                   f"{n(d['compr'], '.2f') + '/' + n(d['est_compr'], '.2f'):>15} "
                   f"{n(d['backup_mbs'], '.1f'):>11} {n(d['restore_mbs'], '.1f'):>12}")
    for r in rows:
        if r["phase"] != "estimate":
            continue
        kv = _note_kv(r.get("note"))
        out.append("")
        out.append(f"estimate{' r' + str(r['rep']) if len(reps) > 1 else ''}: {r['status']}, "
                   f"{n(_f(r.get('input_bytes')) and _f(r.get('input_bytes')) / 2**20, '.1f')} MiB read in "
                   f"{n(_f(r.get('wall_s')), '.1f')} s = {n(_f(r.get('mb_per_s')), '.1f')} MB/s measured, "
                   f"{n(_f(kv.get('tool_mb_per_s')), '.1f')} MB/s reported by cairn estimate (mb_per_s); "
                   f"cpu {n(_f(r.get('cpu_s')), '.1f')} s, rss {n(_f(r.get('max_rss_kib')) and _f(r.get('max_rss_kib')) / 1024, '.0f')} MiB")
        per = _est_per_block(r.get("note"))
        if per:
            out.append(f"  {'block':5} {'dedup %':>8} {'compr. std %':>12} {'compr. max %':>12} "
                       f"{'red. std %':>10} {'red. max %':>10}")
            for b, e in per.items():
                out.append(f"  {b:5} {n(_f(e.get('dedup_percent')), '.2f'):>8} "
                           f"{n(_f(e.get('compression_standard_percent')), '.2f'):>12} "
                           f"{n(_f(e.get('compression_max_percent')), '.2f'):>12} "
                           f"{n(_f(e.get('reduction_standard_percent')), '.2f'):>10} "
                           f"{n(_f(e.get('reduction_max_percent')), '.2f'):>10}")
    over = [d for d in data if d["over"]]
    missing = [d for d in data if d["status"] == "ok" and any(v is None for v in d["diffs"])]
    out.append("")
    if over:
        out.append(f"WARNING: estimate and datastore more than {EST_TOLERANCE_PP:g} points apart: "
                   + "; ".join(f"{d['block']} {d['comp']} ({', '.join(f'{k} {v:+.2f}' for k, v in zip(('dedup', 'compression', 'reduction'), d['diffs']) if k in d['over'])})"
                               for d in over))
    elif data and not missing:
        out.append(f"estimate vs datastores: every difference within {EST_TOLERANCE_PP:g} points "
                   f"(largest {max(abs(v) for d in data for v in d['diffs'] if v is not None):.2f})")
    if missing:
        out.append("estimate vs datastores: no comparison for " + ", ".join(f"{d['block']} {d['comp']}" for d in missing))
    bad = [d for d in data if d["status"] != "ok" or d["verify"] not in ("ok", "skipped")]
    if bad:
        out.append("WARNING: failed or unverified: " + ", ".join(f"{d['block']} {d['comp']} ({d['status']}, "
                                                               f"verify {d['verify']})" for d in bad))
    out.append("")
    out.append("Markdown:")
    out.append("")
    mcols = ["block", "compression", "stored MiB", "dedup %", "compression %", "reduction %", "occupied MiB",
             "index MiB", "backup s", "restore s", "est. reduction %", "diff pp (dedup/compr./red.)"]
    if len(reps) > 1:
        mcols.insert(0, "rep")
    out.append("| " + " | ".join(mcols) + " |")
    out.append("| " + " | ".join(["---"] * 2 + ["---:"] * (len(mcols) - 2)) + " |")
    for d in data:
        vals = [d["block"], d["comp"], n(d["stored"], ".1f"), n(d["dedup"], ".2f"), n(d["compr"], ".2f"),
                n(d["red"], ".2f"), n(d["occupied"], ".1f"), n(d["index"], ".2f"), n(d["backup_s"], ".1f"),
                n(d["restore_s"], ".1f"), n(d["est_red"], ".2f"),
                dpp(d["diffs"]) + (" **!**" if d["over"] else "")]
        if len(reps) > 1:
            vals.insert(0, d["rep"])
        out.append("| " + " | ".join(vals) + " |")
    return "\n".join(out)


def render_jobs(rows):
    """Tables of the jobs scenario (text and Markdown), from its CSV rows."""
    rows = [r for r in rows if r.get("dataset") == JOBS_DATASET]
    reps = sorted({str(r.get("rep")) for r in rows})
    multi = len(reps) > 1

    def n(v, fmt):
        return "-" if v is None else format(v, fmt)

    def mib(v):
        v = _f(v)
        return None if v is None else v / 2**20

    data = []
    for r in rows:
        m = re.fullmatch(r"jobs(\d+)", r.get("phase", ""))
        if not m:
            continue
        kv = _note_kv(r.get("note"))
        wall, seq = _f(r.get("wall_s")), _f(kv.get("seq_wall_s"))
        data.append(dict(
            rep=str(r["rep"]), tool=r["tool"], jobs=int(m.group(1)), status=r["status"], wall=wall,
            mbs=_f(r.get("mb_per_s")), seq=seq, speedup=seq / wall if seq and wall else None,
            stored=mib(kv.get("stored_bytes")),
            data=mib(kv.get("compressed_data_bytes", kv.get("raw_total_size"))),
            occupied=mib(kv.get("occupied_bytes")), seq_occupied=mib(kv.get("seq_occupied_bytes")),
            dup=mib(kv.get("duplicate_bytes")), unused=mib(kv.get("unused_bytes")),
            unused_after=mib(kv.get("unused_after_prune_bytes")),
            occupied_after=mib(kv.get("occupied_after_prune_bytes")), prune=_f(kv.get("prune_wall_s")),
            job_walls=kv.get("job_wall_s", "-"), cpu=_f(r.get("cpu_s")),
            rss=None if _f(r.get("max_rss_kib")) is None else _f(r.get("max_rss_kib")) / 1024,
            other=_f(r.get("other_cpu_s"))))
    if not data and not rows:
        return ""
    cols = [("tool", 6), ("jobs", 4), ("wall s", 8), ("MB/s", 7), ("seq. s", 8), ("speedup", 7),
            ("stored MiB", 10), ("data MiB", 9), ("occupied MiB", 12), ("dup. MiB", 9), ("unused MiB", 10),
            ("unused after", 12), ("prune s", 7), ("status", 6)]
    if multi:
        cols.insert(0, ("rep", 3))
    first_num = 2 if multi else 1  # columns before this one are left-aligned

    def line(vals):
        return " ".join(v.ljust(w) if i < first_num else v.rjust(w) for i, (v, (_, w)) in enumerate(zip(vals, cols)))

    def vals_of(d):
        v = [d["tool"], str(d["jobs"]), n(d["wall"], ".2f"), n(d["mbs"], ".1f"), n(d["seq"], ".2f"),
             n(d["speedup"], ".2f"), n(d["stored"], ".2f"), n(d["data"], ".2f"), n(d["occupied"], ".2f"),
             n(d["dup"], "+.2f"), n(d["unused"], ".2f"), n(d["unused_after"], ".2f"), n(d["prune"], ".2f"),
             d["status"]]
        return [d["rep"]] + v if multi else v

    out = ["", "jobs: N backups started at once into one fresh repository, job k backing up history day k",
           "(wall s = first start to last end; MB/s = the N sources' bytes / wall s; seq. s = the same N sources "
           "backed up one after another into a fresh repository, summed; speedup = seq. s / wall s;",
           " stored = data the snapshots hold, data = compressed unique data (cairn compressed_data_bytes, restic "
           "raw-data total_size), occupied = repository space (cairn stats; restic du -sb);",
           " dup. = occupied - occupied of the sequential repository: duplicate copies the concurrent jobs "
           "stored; unused = cairn overhead.unused_bytes before / after prune --max-unused 0%)"]
    hdr = line([c for c, _ in cols])
    out.append(hdr)
    out.append("-" * len(hdr))
    for d in data:
        out.append(line(vals_of(d)))
    out.append("")
    h2 = ("rep " if multi else "") + (f"{'tool':6} {'jobs':>4} {'job wall s':>27} {'CPU s':>8} {'RSS MiB':>8} "
                                      f"{'other':>6} {'seq. occupied MiB':>17} {'occupied after prune MiB':>24}")
    out.append(h2)
    out.append("-" * len(h2))
    for d in data:
        out.append((f"{d['rep']:3} " if multi else "") +
                   f"{d['tool']:6} {d['jobs']:>4} {d['job_walls']:>27} {n(d['cpu'], '.2f'):>8} "
                   f"{n(d['rss'], '.0f'):>8} {n(d['other'], '.1f'):>6} {n(d['seq_occupied'], '.2f'):>17} "
                   f"{n(d['occupied_after'], '.2f'):>24}")
    checks = [r for r in rows if re.fullmatch(r"jobs\d+-(restore-job\d+|check-rd)", r.get("phase", ""))]
    if checks:
        out.append("")
        out.append("Verification (cairn, largest job count, after the prune):")
        for r in checks:
            what = "restore " + _note_kv(r.get("note")).get("source", "") if "restore" in r["phase"] else "check --read-data"
            out.append(f"  {('r' + str(r['rep']) + ' ') if multi else ''}{r['phase']}: {what}: status {r['status']}, "
                       f"verify {r.get('verify') or '-'}, {n(_f(r.get('wall_s')), '.2f')} s"
                       + (f" ({r['note']})" if "check" in r["phase"] and r.get("note") else ""))
    bad = [d for d in data if d["status"] != "ok"]
    bad_checks = [r for r in checks if r["status"] != "ok" or (r.get("verify") or "ok") not in ("ok", "skipped")]
    left = [d for d in data if d["unused_after"]]
    if bad or bad_checks or left:
        out.append("")
    if bad or bad_checks:
        out.append("WARNING: failed or unverified: " + ", ".join(
            [f"{d['tool']} x{d['jobs']} ({d['status']})" for d in bad]
            + [f"{r['phase']} ({r['status']}, verify {r.get('verify')})" for r in bad_checks]))
    if left:
        out.append("WARNING: unused space left after prune --max-unused 0%: "
                   + ", ".join(f"{d['tool']} x{d['jobs']} {d['unused_after']:.2f} MiB" for d in left))
    out.append("")
    out.append("Markdown:")
    out.append("")
    mcols = ["tool", "jobs", "wall s", "aggregate MB/s", "sequential s", "speedup", "stored MiB", "data MiB",
             "occupied MiB", "duplicate MiB (concurrent - sequential)", "unused MiB before prune",
             "unused MiB after prune", "prune s"]
    if multi:
        mcols.insert(0, "rep")
    out.append("| " + " | ".join(mcols) + " |")
    out.append("| " + " | ".join(["---"] * (2 if multi else 1) + ["---:"] * (len(mcols) - (2 if multi else 1))) + " |")
    for d in data:
        v = vals_of(d)[:-1]
        if d["status"] != "ok":
            v[-1] += f" ({d['status']})"
        out.append("| " + " | ".join(v) + " |")
    return "\n".join(out)


def _mib(v):
    v = _f(v)
    return None if v is None else v / 2**20


def _n(v, fmt):
    return "-" if v is None else format(v, fmt)


def render_s3(rows):
    """Tables of the s3 scenario (text and Markdown): what each backup and restore sent and
    received, from its CSV rows (dataset s3-<kind>)."""
    rows = [r for r in rows if str(r.get("dataset", "")).startswith(S3_PREFIX) or r.get("dataset") == "s3"]
    fails = [r for r in rows if r.get("dataset") == "s3"]
    rows = [r for r in rows if r.get("dataset") != "s3" and r.get("phase") != "init"]
    multi = len({str(r.get("rep")) for r in rows}) > 1
    out = ["", "s3: backups to and restores from a MinIO server on loopback (a fresh prefix per tool and dataset)",
           "(repo = bytes of the repository's objects; srv up/down = MinIO's counters: bytes it received (the tool "
           "uploaded) and sent (the tool downloaded), req = S3 requests, the same for every tool;",
           " cairn up/down = cairn's own counters (CAIRN_TRAFFIC_REPORT), request bodies only; "
           "MB/s = dataset bytes / wall s)"]
    for r in fails:
        out.append(f"WARNING: the s3 scenario did not run: {r.get('note')}")
    data = []
    for r in rows:
        kv = _note_kv(r.get("note"))
        data.append(dict(rep=str(r["rep"]), ds=r["dataset"], phase=r["phase"], tool=r["tool"], status=r["status"],
                         wall=_f(r.get("wall_s")), mbs=_f(r.get("mb_per_s")), cpu=_f(r.get("cpu_s")),
                         rss=None if _f(r.get("max_rss_kib")) is None else _f(r["max_rss_kib"]) / 1024,
                         repo=_mib(r.get("repo_bytes")), srv_up=_mib(kv.get("srv_rx_bytes")),
                         srv_down=_mib(kv.get("srv_tx_bytes")), req=_f(kv.get("srv_requests")),
                         up=_mib(kv.get("uploaded_bytes")), down=_mib(kv.get("downloaded_bytes")),
                         creq=_f(kv.get("requests")), verify=r.get("verify") or ""))
    if not data:
        return "\n".join(out) if fails else ""
    cols = [("dataset", 8), ("phase", 9), ("tool", 6), ("status", 6), ("wall s", 8), ("MB/s", 7), ("CPU s", 7),
            ("RSS MiB", 7), ("repo MiB", 9), ("srv up MiB", 10), ("srv down MiB", 12), ("req", 6),
            ("cairn up MiB", 12), ("cairn down MiB", 14), ("cairn req", 9), ("verify", 6)]
    if multi:
        cols.insert(0, ("rep", 3))
    first_num = 5 if multi else 4

    def vals(d):
        v = [d["ds"], d["phase"], d["tool"], d["status"][:6], _n(d["wall"], ".2f"), _n(d["mbs"], ".1f"),
             _n(d["cpu"], ".2f"), _n(d["rss"], ".0f"), _n(d["repo"], ".2f"), _n(d["srv_up"], ".2f"),
             _n(d["srv_down"], ".2f"), _n(d["req"], ".0f"), _n(d["up"], ".2f"), _n(d["down"], ".2f"),
             _n(d["creq"], ".0f"), d["verify"] or "-"]
        return [d["rep"]] + v if multi else v

    def line(v):
        return " ".join(x.ljust(w) if i < first_num or i == len(cols) - 1 else x.rjust(w)
                        for i, (x, (_, w)) in enumerate(zip(v, cols)))

    hdr = line([c for c, _ in cols])
    out.append(hdr)
    out.append("-" * len(hdr))
    for d in data:
        out.append(line(vals(d)))
    # cairn vs restic, per dataset and phase (medians over repetitions)
    groups = {}
    for d in data:
        if d["status"] == "ok":
            groups.setdefault((d["ds"], d["phase"]), {}).setdefault(d["tool"], []).append(d)
    med = lambda ds, k: (lambda v: statistics.median(v) if v else None)(  # noqa: E731
        [d[k] for d in ds if d[k] is not None])
    ratios = []
    for (dsn, ph), by in groups.items():
        if "cairn" in by and "restic" in by:
            c, p = by["cairn"], by["restic"]
            ratios.append([dsn, ph, _ratio(med(c, "mbs"), med(p, "mbs")), _ratio(med(c, "cpu"), med(p, "cpu")),
                           _ratio(med(c, "rss"), med(p, "rss")), _ratio(med(c, "repo"), med(p, "repo")),
                           _ratio(med(c, "srv_up"), med(p, "srv_up")), _ratio(med(c, "srv_down"), med(p, "srv_down")),
                           _ratio(med(c, "req"), med(p, "req"))])
    rh = ["dataset", "phase", "speed", "cpu", "rss", "repo", "up", "down", "requests"]
    if ratios:
        out.append("")
        out.append("s3 ratios cairn vs restic: speed = cairn MB/s / restic MB/s (>1: cairn faster); cpu, rss, repo, "
                   "up, down, requests = cairn / restic (<1: cairn uses less); up/down/requests from MinIO's counters")
        h = f"{'dataset':8} {'phase':9} " + " ".join(f"{x:>8}" for x in rh[2:])
        out.append(h)
        out.append("-" * len(h))
        for x in ratios:
            out.append(f"{x[0]:8} {x[1]:9} " + " ".join(f"{v:>8}" for v in x[2:]))
    bad = [d for d in data if d["status"] != "ok" or d["verify"] not in ("", "ok", "skipped")]
    if bad:
        out.append("")
        out.append("WARNING: failed or unverified: " + ", ".join(
            f"{d['ds']}/{d['phase']}/{d['tool']} ({d['status']}, verify {d['verify'] or '-'})" for d in bad))
    out.append("")
    out.append("Markdown:")
    out.append("")
    mcols = ["dataset", "phase", "tool", "wall s", "MB/s", "CPU s", "RSS MiB", "repo MiB", "uploaded MiB (MinIO)",
             "downloaded MiB (MinIO)", "requests", "uploaded MiB (cairn)", "downloaded MiB (cairn)", "verify"]
    if multi:
        mcols.insert(0, "rep")
    nl = 4 if multi else 3
    out.append("| " + " | ".join(mcols) + " |")
    out.append("| " + " | ".join(["---"] * nl + ["---:"] * (len(mcols) - nl - 1) + ["---"]) + " |")
    for d in data:
        v = vals(d)
        v = v[:nl] + v[nl + 1:]  # no status column: a failure shows in verify
        if d["status"] != "ok":
            v[-1] = d["status"]
        del v[-2]  # cairn req
        out.append("| " + " | ".join(v) + " |")
    if ratios:
        out.append("")
        out.append("| " + " | ".join(["dataset", "phase", "speed (cairn/restic)", "CPU", "RSS", "repo size",
                                      "uploaded", "downloaded", "requests"]) + " |")
        out.append("| --- | --- | " + " | ".join(["---:"] * 7) + " |")
        for x in ratios:
            out.append("| " + " | ".join(x) + " |")
    return "\n".join(out)


def render_copy(rows):
    """Tables of the copy scenario (text and Markdown), from its CSV rows (dataset copy)."""
    rows = [r for r in rows if r.get("dataset") == COPY_DATASET]
    if not rows:
        return ""
    reps = sorted({str(r.get("rep")) for r in rows}, key=lambda x: int(x) if x.isdigit() else 0)
    out = []
    for rep in reps:
        rr = [r for r in rows if str(r.get("rep")) == rep]
        out.append(_render_copy_rep(rr, rep if len(reps) > 1 else None))
    return "\n".join(out)


def _render_copy_rep(rows, rep):
    days = [r for r in rows if re.fullmatch(r"day\d+", r.get("phase", ""))]
    cdays = [r for r in days if r["tool"] == "cairn"]
    rdays = [r for r in days if r["tool"] == "restic"]
    ndays = len(cdays)
    hist = sum(_f(r.get("input_bytes")) or 0 for r in cdays)
    day_kv = [_note_kv(r.get("note")) for r in cdays]
    title = "copy" + (f" (repetition {rep})" if rep else "")
    out = ["", f"{title}: {ndays} days of the mixed tree backed up into cairn R1 ({COPY_SRC_BLOCK} blocks), then "
               f"cairn copy from R1 into {COPY_DST_BLOCK} repositories"]
    if cdays:
        r1 = _mib(cdays[-1].get("repo_bytes"))
        out.append(f"history: {hist / 2**20:.1f} MiB in all (sum of the {ndays} days; last day "
                   f"{(_f(cdays[-1].get('input_bytes')) or 0) / 2**20:.1f} MiB, "
                   f"{(_f(day_kv[-1].get('new_bytes')) or 0) / 2**20:.2f} MiB of it new); backups into R1 "
                   f"{sum(_f(r.get('wall_s')) or 0 for r in cdays):.1f} s, R1 {_n(r1, '.1f')} MiB"
                   + (f"; restic source repository {sum(_f(r.get('wall_s')) or 0 for r in rdays):.1f} s, "
                      f"{_n(_mib(rdays[-1].get('repo_bytes')), '.1f')} MiB" if rdays else ""))
        bad_days = [r for r in days if r["status"] != "ok"]
        if bad_days:
            out.append("WARNING: failed backups: " + ", ".join(f"{r['tool']} {r['phase']} ({r['status']})"
                                                               for r in bad_days))
    out.append("(sent = bytes uploaded to the destination: cairn bytes_sent; restic: the target repository's growth; "
               "% logical = sent / logical_bytes of the copied snapshots; % history = sent / the sum of the days;")
    out.append(" rechunked = files re-chunked / files; re-read = plaintext of the files re-chunked "
               "(bytes_read_from_source); recv = bytes downloaded from R1 (bytes_received); "
               "+repo = growth of the target (du -sb, or its objects on MinIO))")
    runs = [r for r in rows if r.get("phase", "").startswith(("copy-", "incr-"))]
    cols = [("tool", 6), ("run", 16), ("status", 6), ("wall s", 8), ("snaps", 5), ("logical MiB", 11),
            ("sent MiB", 9), ("% logical", 9), ("% history", 9), ("rechunked", 11), ("re-read MiB", 11),
            ("recv MiB", 9), ("+repo MiB", 9), ("repo MiB", 9), ("CPU s", 7), ("RSS MiB", 7)]

    def vals(r):
        kv = _note_kv(r.get("note"))
        if r["tool"] == "cairn":
            sent = _mib(kv.get("bytes_sent"))
            pl, ph = _f(kv.get("sent_pct")), _f(kv.get("sent_pct_history"))
            rech = f"{kv.get('files_rechunked', '-')}/{kv.get('files', '-')}"
            snaps = kv.get("snapshots_copied", "-")
            logical = _mib(kv.get("logical_bytes"))
            read, recv = _mib(kv.get("bytes_read_from_source")), _mib(kv.get("bytes_received"))
        else:
            sent = _mib(r.get("repo_delta_bytes"))
            pl, ph = None, _f(kv.get("added_pct_history"))
            rech, snaps, logical, read, recv = "-", kv.get("snapshots_copied", "-"), _mib(r.get("input_bytes")), None, None
        return [r["tool"], r["phase"], r["status"][:6], _n(_f(r.get("wall_s")), ".2f"), str(snaps),
                _n(logical, ".1f"), _n(sent, ".2f"), _n(pl, ".2f"), _n(ph, ".2f"), rech, _n(read, ".1f"),
                _n(recv, ".2f"), _n(_mib(r.get("repo_delta_bytes")), ".2f"), _n(_mib(r.get("repo_bytes")), ".1f"),
                _n(_f(r.get("cpu_s")), ".2f"),
                _n(None if _f(r.get("max_rss_kib")) is None else _f(r["max_rss_kib"]) / 1024, ".0f")]

    def line(v):
        return " ".join(x.ljust(w) if i < 3 else x.rjust(w) for i, (x, (_, w)) in enumerate(zip(v, cols)))

    hdr = line([c for c, _ in cols])
    out.append(hdr)
    out.append("-" * len(hdr))
    for r in runs:
        out.append(line(vals(r)))
    by = {(r["tool"], r["phase"]): r for r in runs}
    notes = []
    inc = [r for r in runs if r["tool"] == "cairn" and re.fullmatch(r"incr-day\d+", r["phase"])]
    for r in inc:
        kv = _note_kv(r.get("note"))
        sent, new = _f(kv.get("bytes_sent")), _f(kv.get("day_new_bytes"))
        added = _f(kv.get("day_r1_added_bytes"))
        notes.append(f"incremental: {r['phase']} alone sent {_n(sent and sent / 2**20, '.2f')} MiB; that day's "
                     f"edits wrote {_n(new and new / 2**20, '.2f')} MiB of new bytes"
                     + (f" (sent = {100 * sent / new:.1f}% of them)" if sent is not None and new else "")
                     + f"; its backup grew R1 ({COPY_SRC_BLOCK}) by {_n(added and added / 2**20, '.2f')} MiB; "
                       f"{kv.get('files_rechunked', '-')}/{kv.get('files', '-')} files re-chunked")
    for r in runs:
        kv = _note_kv(r.get("note"))
        if r["tool"] == "cairn" and kv.get("srv_rx_bytes") is not None:
            notes.append(f"{r['phase']}: MinIO received {_n(_mib(kv.get('srv_rx_bytes')), '.2f')} MiB and sent "
                         f"{_n(_mib(kv.get('srv_tx_bytes')), '.2f')} MiB in {kv.get('srv_requests')} requests "
                         f"(cairn counted {_n(_mib(kv.get('uploaded_bytes')), '.2f')} MiB up, "
                         f"{_n(_mib(kv.get('downloaded_bytes')), '.2f')} MiB down)")
    for tag in ("local", "s3"):
        c, again = by.get(("cairn", f"copy-{tag}")), by.get(("cairn", f"copy-{tag}-again"))
        if c and again:
            kv, ka = _note_kv(c.get("note")), _note_kv(again.get("note"))
            notes.append(f"copy-{tag}-again (no-op): {ka.get('snapshots_copied', '-')} snapshots copied, "
                         f"{_n(_f(ka.get('bytes_sent')), '.0f')} B sent, {_n(_f(again.get('wall_s')), '.2f')} s "
                         f"(first copy {_n(_f(c.get('wall_s')), '.2f')} s)")
            if _f(kv.get("logical_bytes")) is not None and hist and abs(_f(kv["logical_bytes"]) - hist) > 0.5:
                notes.append(f"WARNING: copy-{tag} logical_bytes {kv['logical_bytes']} != {hist:.0f} B, the sum of "
                             f"the days")
            if _f(ka.get("snapshots_copied")):
                notes.append(f"WARNING: copy-{tag}-again copied {ka['snapshots_copied']} snapshots (expected none)")
    rc, cc = by.get(("restic", "copy-local")), by.get(("cairn", "copy-local"))
    if rc and cc:
        notes.append(f"restic copy (blob by blob: the target has the source's chunker parameters, nothing is "
                     f"re-chunked) took {_n(_f(rc.get('wall_s')), '.2f')} s and grew its target by "
                     f"{_n(_mib(rc.get('repo_delta_bytes')), '.2f')} MiB; cairn copy-local (re-chunked "
                     f"{COPY_SRC_BLOCK} -> {COPY_DST_BLOCK}) {_n(_f(cc.get('wall_s')), '.2f')} s, "
                     f"{_n(_mib(cc.get('repo_delta_bytes')), '.2f')} MiB; time restic/cairn = "
                     f"{_ratio(rc.get('wall_s'), cc.get('wall_s'))}")
    checks = [r for r in rows if r.get("phase", "").startswith("restore-")]
    for r in checks:
        notes.append(f"{r['phase']}: latest copied snapshot restored in {_n(_f(r.get('wall_s')), '.2f')} s, "
                     f"status {r['status']}, verify {r.get('verify') or '-'}")
    bad = [r for r in runs + checks if r["status"] != "ok" or (r.get("verify") or "ok") not in ("ok", "skipped")]
    if bad:
        notes.append("WARNING: failed or unverified: " + ", ".join(
            f"{r['tool']} {r['phase']} ({r['status']}{', verify ' + r['verify'] if r.get('verify') else ''})"
            for r in bad))
    if notes:
        out.append("")
        out += notes
    out.append("")
    out.append("Markdown:")
    out.append("")
    mcols = ["tool", "run", "wall s", "snapshots copied", "logical MiB", "sent MiB", "sent % of logical",
             "sent % of history", "files re-chunked", "re-read MiB", "received MiB", "target growth MiB", "CPU s",
             "RSS MiB"]
    out.append("| " + " | ".join(mcols) + " |")
    out.append("| --- | --- | " + " | ".join(["---:"] * (len(mcols) - 2)) + " |")
    for r in runs:
        v = vals(r)
        run = v[1] + ("" if r["status"] == "ok" else f" ({r['status']})")
        out.append("| " + " | ".join([v[0], run] + v[3:13] + v[14:]) + " |")
    return "\n".join(out)


def render_recovery(rows):
    """The recovery scenario: per phase, each tool's wall / CPU / peak RSS and its wall over cairn's."""
    phases = ["restore", "restore-over", "mount-cp", "find", "export-tar"]
    lines = ["", "Recovery scenario (medians over repetitions; ratio = tool wall / cairn wall, above 1: cairn faster)",
             "| phase | tool | wall s | MB/s | CPU s | peak RSS MiB | tool ÷ cairn | verify / note |",
             "|---|---|---|---|---|---|---|---|"]
    for ph in phases:
        by_tool = {}
        for r in rows:
            if r.get("phase") == ph and str(r.get("status")) == "ok":
                by_tool.setdefault(r["tool"], []).append(r)
        med = {t: statistics.median(_f(x["wall_s"]) for x in rs) for t, rs in by_tool.items()}
        for t, rs in by_tool.items():
            r = rs[-1]
            cpu = statistics.median(_f(x["cpu_s"]) for x in rs)
            rss = statistics.median(_f(x["max_rss_kib"]) or 0 for x in rs) / 1024
            ratio = f"{med[t] / med['cairn']:.2f}" if "cairn" in med and t != "cairn" and med["cairn"] else ""
            lines.append(f"| {ph} | {t} | {med[t]:.2f} | {r.get('mb_per_s') or ''} | {cpu:.2f} | {rss:.0f} | "
                         f"{ratio} | {r.get('verify') or ''} {r.get('note') or ''} |")
    return "\n".join(lines)


def render_all(rows, tools):
    """The scenario tables: backup/maintenance ones (with the s3 scenario's rows and ratios), then
    the blocksizes, jobs, s3 (traffic) and copy ones."""
    srv = [r for r in rows if str(r.get("dataset", "")).startswith(SERVER_PREFIX)]
    cl = [r for r in rows if r.get("dataset") == CLIENTS_DATASET]
    sl = [r for r in rows if r.get("dataset") == SLOWLINK_DATASET]
    other = [r for r in rows if r.get("dataset") not in (BS_DATASET, JOBS_DATASET, COPY_DATASET, "s3",
                                                          CLIENTS_DATASET, SLOWLINK_DATASET, RECOVERY_DATASET)
             and r not in srv]
    rec = [r for r in rows if r.get("dataset") == RECOVERY_DATASET]
    bs = [r for r in rows if r.get("dataset") == BS_DATASET]
    jobs = [r for r in rows if r.get("dataset") == JOBS_DATASET]
    s3 = [r for r in rows if str(r.get("dataset", "")).startswith(S3_PREFIX) or r.get("dataset") == "s3"]
    cp = [r for r in rows if r.get("dataset") == COPY_DATASET]
    parts = []
    if other or not (bs or jobs or s3 or cp or srv or cl or sl or rec):
        parts.append(render_table(other, tools))
    if bs:
        parts.append(render_blocksizes(bs))
    if jobs:
        parts.append(render_jobs(jobs))
    if s3:
        parts.append(render_s3(s3))
    if cp:
        parts.append(render_copy(cp))
    if rec:
        parts.append(render_recovery(rec))
    if srv:
        parts.append(render_server(srv))
    if cl:
        lines = ["", f"Clients scenario ({CLIENTS_N} backups at once through each tool's server; CPU = clients + server)",
                 f"{'tool':<12} {'phase':<10} {'status':<6} {'wall s':>8} {'MB/s':>8} {'CPU s':>8} {'repo MiB':>9}  note"]
        def num(v, fmt, width, scale=1.0):
            try:
                return format(float(v) / scale, fmt).rjust(width)
            except (TypeError, ValueError):
                return "-".rjust(width)
        for r in cl:
            lines.append(f"{r['tool']:<12} {r['phase']:<10} {r['status']:<6} {num(r.get('wall_s'), '.2f', 8)} "
                         f"{num(r.get('mb_per_s'), '.0f', 8)} {num(r.get('cpu_s'), '.1f', 8)} "
                         f"{num(r.get('repo_bytes'), '.1f', 9, 2**20)}  {r.get('note', '')} {r.get('verify', '')}")
        parts.append("\n".join(lines))
    if sl:
        lines = ["", f"Slow-link scenario (seed of ~200 MB compressible small files over {SLOWLINK_RATE * 8 / 1e6:g} Mbit/s up; "
                     "link s = stored bytes / link rate)",
                 f"{'tool':<12} {'status':<6} {'wall s':>8} {'link s':>8} {'link use':>8} {'stored MiB':>10}  verify"]
        notes = {}
        for r in sl:
            kv = dict(x.split("=", 1) for x in str(r.get("note", "")).split() if "=" in x)
            notes[r["tool"]] = (kv, r)
            stored = float(kv.get("stored_bytes", 0) or 0) / 2**20
            lines.append(f"{r['tool']:<12} {r['status']:<6} {float(r.get('wall_s') or 0):>8.1f} "
                         f"{kv.get('link_s', '-'):>8} {kv.get('link_use', '-'):>8} {stored:>10.1f}  {r.get('verify', '')}")
        if "cairn-serve" in notes and "restic-rest" in notes:
            try:
                ratio = float(notes["restic-rest"][1]["wall_s"]) / float(notes["cairn-serve"][1]["wall_s"])
                lines.append(f"cairn is {ratio:.2f}x restic's speed on this link")
            except (TypeError, ValueError, ZeroDivisionError):
                pass
        parts.append("\n".join(lines))
    return "\n".join(parts)


def render_server(rows):
    """Server scenario: MB/s per tool locally and through its server (medians over repetitions),
    cairn-serve / cairn (target >= 0.8) and cairn-serve / restic-rest (target >= 3), and CPU
    seconds with the server's share."""
    agg = {}
    for r in rows:
        if r.get("status") != "ok" or r.get("phase") == "init" or not r.get("mb_per_s"):
            continue
        agg.setdefault((r["dataset"], r["phase"], r["tool"]), []).append(r)

    def med(key, field):
        vals = [float(x[field]) for x in agg.get(key, []) if x.get(field) not in (None, "")]
        return statistics.median(vals) if vals else None

    def f(v, fmt="{:.0f}"):
        return "-" if v is None else fmt.format(v)
    lines = ["", "Server scenario (MB/s of the dataset per wall second, medians; CPU = client + server seconds)",
             f"{'dataset':<10} {'phase':<10} {'cairn':>7} {'c-serve':>7} {'restic':>7} {'r-rest':>7} "
             f"{'serve/local':>11} {'serve/r-rest':>12} {'c-serve CPU':>11} {'r-rest CPU':>10}"]
    keys = sorted({(k[0], k[1]) for k in agg}, key=lambda k: (k[0], ["first", "unchanged", "restore"].index(k[1])
                                                                 if k[1] in ("first", "unchanged", "restore") else 9))
    for ds, ph in keys:
        v = {t: med((ds, ph, t), "mb_per_s") for t in ("cairn", "cairn-serve", "restic", "restic-rest")}
        cpu = {t: med((ds, ph, t), "cpu_s") for t in ("cairn-serve", "restic-rest")}
        local = (v["cairn-serve"] / v["cairn"]) if v["cairn-serve"] and v["cairn"] else None
        vs = (v["cairn-serve"] / v["restic-rest"]) if v["cairn-serve"] and v["restic-rest"] else None
        lines.append(f"{ds:<10} {ph:<10} {f(v['cairn']):>7} {f(v['cairn-serve']):>7} {f(v['restic']):>7} "
                     f"{f(v['restic-rest']):>7} {f(local, '{:.2f}'):>11} {f(vs, '{:.2f}'):>12} "
                     f"{f(cpu['cairn-serve'], '{:.1f}'):>11} {f(cpu['restic-rest'], '{:.1f}'):>10}")
    return "\n".join(lines)


def table_from_csv(path):
    with open(path) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    tools = []
    for r in rows:
        if r["tool"] not in tools:
            tools.append(r["tool"])
    return render_all(rows, tools)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default=",".join(DEFAULT_DATASETS),
                    help="comma list of mixed,small,image,dense (dense: 1M files, name it)")
    ap.add_argument("--tools", default=",".join(DEFAULT_TOOLS), help="comma list of cairn,restic,borg,kopia")
    ap.add_argument("--scenario", default="all",
                    help="comma list of backup (the --datasets runs), maintenance (day-by-day history, "
                         "then forget/prune/check --read-data; cairn and restic), blocksizes (the same history "
                         "into one cairn datastore per --block-sizes x --compressions, compared with cairn "
                         "estimate; long, so not part of all) and jobs (1, 2 and 4 backups of different history "
                         "days at once into one repository: aggregate throughput and duplicate bytes stored; "
                         "cairn and restic; not part of all), s3 (the --datasets backed up to and restored "
                         "from a MinIO server, with the bytes sent and received; cairn and restic; not part of "
                         "all), copy (a --copy-days history in a 4K cairn repository copied with cairn copy into "
                         "64K repositories, local and on MinIO: bytes sent, no-op re-copy, incremental day; "
                         "restic copy when restic is in --tools; not part of all), or all (default: "
                         "backup,maintenance)")
    ap.add_argument("--maint-days", type=int, default=8,
                    help="daily versions in the maintenance history (default 8, at every scale: with fewer, "
                         "keep-last 3 forgets too little for prune to repack anything)")
    ap.add_argument("--maint-keep", type=int, default=3, help="forget --keep-last N in the maintenance scenario")
    ap.add_argument("--maint-churn", type=float, default=0.04,
                    help="fraction of files deleted/rewritten/edited per day in the maintenance history")
    ap.add_argument("--block-sizes", default=BS_SIZES, help=f"blocksizes scenario: block sizes (default {BS_SIZES})")
    ap.add_argument("--compressions", default=BS_COMPRESSIONS,
                    help=f"blocksizes scenario: compressions (default {BS_COMPRESSIONS})")
    ap.add_argument("--job-counts", default=JOBS_COUNTS,
                    help=f"jobs scenario: numbers of concurrent backups (default {JOBS_COUNTS}); job k backs up "
                         "history day k, so the largest must not exceed --maint-days")
    ap.add_argument("--recovery-days", type=int, default=RECOVERY_DAYS,
                    help=f"recovery scenario: days in the history (default {RECOVERY_DAYS}): find searches them all")
    ap.add_argument("--copy-days", type=int, default=COPY_DAYS,
                    help=f"copy scenario: days in the history (default {COPY_DAYS}); the incremental check copies "
                         "days 1..N-1, then day N alone")
    ap.add_argument("--scale", default=None, help="full | quick | fraction (default: $BENCH_SCALE or full)")
    ap.add_argument("--data-dir", default=os.environ.get("BENCH_DATA", os.path.join(BENCH_DIR, ".work", "data")))
    ap.add_argument("--work-dir", default=os.environ.get("BENCH_WORK", os.path.join(BENCH_DIR, ".work", "run")))
    ap.add_argument("--results-dir", default=os.path.join(BENCH_DIR, "results"))
    ap.add_argument("--out", help="CSV path (default results/<date>-<gitsha>.csv)")
    ap.add_argument("--cairn-bin", default=os.environ.get("CAIRN_BIN", os.path.join(REPO_ROOT, "target", "release", "cairn")))
    ap.add_argument("--restic-bin", default=os.environ.get("RESTIC_BIN", os.path.join(BENCH_DIR, ".tools", "restic")))
    ap.add_argument("--borg-bin", default=os.environ.get("BORG_BIN", os.path.join(BENCH_DIR, ".tools", "borg-venv", "bin", "borg")))
    ap.add_argument("--rest-server-bin", default=os.environ.get("REST_SERVER_BIN",
                                                                os.path.join(BENCH_DIR, ".tools", "rest-server")))
    ap.add_argument("--kopia-bin", default=os.environ.get("KOPIA_BIN", os.path.join(BENCH_DIR, ".tools", "kopia")))
    ap.add_argument("--cold", action="store_true", help="drop the page cache before every measured command (root)")
    ap.add_argument("--no-verify", action="store_true", help="skip content verification of restores")
    ap.add_argument("--restore-fs", choices=["root", "journal"], default="root",
                    help="where restores land: the work dir's file system, or a fresh journaled ext4 on a "
                         "loop device per dataset and repetition (root)")
    ap.add_argument("--keep", action="store_true", help="keep repos, caches and live trees under the work dir")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each dataset N times (fresh repos, rotated tool order); the table shows medians")
    ap.add_argument("--table", metavar="CSV", help="only print the table for an existing CSV")
    a = ap.parse_args()
    if a.table:
        print(table_from_csv(a.table))
        return
    a.datasets = [d for d in a.datasets.split(",") if d]
    a.tools = [t for t in a.tools.split(",") if t]
    a.scenarios = DEFAULT_SCENARIOS if a.scenario == "all" else [x for x in a.scenario.split(",") if x]
    for x in a.scenarios:
        if x not in ALL_SCENARIOS:
            ap.error(f"unknown scenario {x} (backup, maintenance, blocksizes, jobs, s3, copy, server, clients, "
                     "slowlink, recovery or all)")
    a.block_sizes = [b.strip().upper() for b in a.block_sizes.split(",") if b.strip()]
    a.compressions = [c.strip() for c in a.compressions.split(",") if c.strip()]
    for b in a.block_sizes:
        try:
            parse_size(b)
        except ValueError:
            ap.error(f"bad block size {b} (4K, 8K, 16K, 32K or 64K)")
    for c in a.compressions:
        if c not in ("none", "standard", "max"):
            ap.error(f"unknown compression {c} (none, standard or max)")
    if a.maint_days < 1 or a.maint_keep < 1:
        ap.error("--maint-days and --maint-keep must be at least 1")
    if a.recovery_days < 2:
        ap.error("--recovery-days must be at least 2 (the last day is restored over the one before)")
    if a.copy_days < 2:
        ap.error("--copy-days must be at least 2 (the incremental check copies the last day on its own)")
    try:
        a.job_counts = sorted({int(x) for x in a.job_counts.split(",") if x.strip()})
    except ValueError:
        ap.error(f"bad --job-counts {a.job_counts} (a comma list of numbers, e.g. 1,2,4)")
    if not a.job_counts or a.job_counts[0] < 1 or a.job_counts[-1] > a.maint_days:
        ap.error(f"--job-counts must be between 1 and --maint-days ({a.maint_days}): job k backs up history day k")
    for d in a.datasets:
        if d not in ALL_DATASETS:
            ap.error(f"unknown dataset {d}")
    for t in a.tools:
        if t not in ALL_TOOLS:
            ap.error(f"unknown tool {t}")
    if a.cold and not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        ap.error("--cold needs a writable /proc/sys/vm/drop_caches (root)")
    Runner(a).run()


if __name__ == "__main__":
    main()
