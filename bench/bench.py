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
import shutil
import statistics
import subprocess
import sys
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, BENCH_DIR)
import datasets  # noqa: E402

REPO_ROOT = os.path.dirname(BENCH_DIR)
PASSWORD = "cairn-bench-password"
ALL_TOOLS = ["cairn", "restic", "borg"]
ALL_DATASETS = ["mixed", "small", "image"]
ALL_SCENARIOS = ["backup", "maintenance"]
MAINT_TOOLS = ["cairn", "restic"]
MAINT_PHASES = ["forget", "prune", "check-rd"]
MAINT_DATASET = "maint"
MB = 1e6


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def du_bytes(path):
    if not os.path.exists(path):
        return 0
    out = subprocess.run(["du", "-sb", path], capture_output=True, text=True)
    try:
        return int(out.stdout.split()[0])
    except (IndexError, ValueError):
        return 0


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

    def env(self):
        e = dict(os.environ)
        e["XDG_CACHE_HOME"] = self.cache
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
        for k in ("CAIRN_REPO", "CAIRN_PASSWORD_FILE"):
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
        "forget": r"(removed|would remove) \d+ snapshots",
        "prune": r"(\d+ snapshots need|will |would |space reclaimed|wrote |kept |\d+ packs )",
        "check-rd": r"(checked |no errors|\d+ (errors|problems))",
    }


class Restic(Tool):
    name = "restic"

    def env(self):
        e = super().env()
        e["RESTIC_PASSWORD"] = PASSWORD
        e["RESTIC_CACHE_DIR"] = self.cache
        e.pop("RESTIC_REPOSITORY", None)
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


TOOL_CLASSES = {"cairn": Cairn, "restic": Restic, "borg": Borg}


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
        self.bins = {"cairn": args.cairn_bin, "restic": args.restic_bin, "borg": args.borg_bin}
        self.versions = {}

    # -- csv
    def open_csv(self):
        self.csv_f = open(self.csv_path, "w", newline="")
        self.csv_f.write(f"# hardware: {hardware_line()}\n")
        self.csv_f.write(f"# settings: scale={self.cfg['scale']} cfg={json.dumps(self.cfg, sort_keys=True)} "
                         f"cache={self.cache_mode} datasets={','.join(self.a.datasets)} tools={','.join(self.a.tools)} "
                         f"scenarios={','.join(self.a.scenarios)} maint_days={self.a.maint_days} "
                         f"maint_keep_last={self.a.maint_keep} maint_churn={self.a.maint_churn}\n")
        self.csv_f.write(f"# versions: {json.dumps(self.versions, sort_keys=True)}\n")
        self.csv_f.write("# units: mb_per_s = 10^6 bytes of input (backup) or restored data (restore) per wall second; "
                         "cpu_s = user+sys; max_rss_kib from /usr/bin/time -v; maintenance rows (dataset maint): "
                         "input_bytes = repository bytes before the command, mb_per_s of check-rd = repository "
                         "bytes read per wall second, note = the tool's own summary lines\n")
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
    def measure(self, tool, label, argv, cwd=None):
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
    def run_dataset(self, kind, rep):
        src = self.dataset_src(kind)
        log(f"{kind} (repetition {rep}): preparing live copy of {src}")
        live = self.prepare_live(kind, src)
        for d in ("repos", "restore"):
            os.makedirs(os.path.join(self.work, d), exist_ok=True)
        # rotate the tool order between repetitions to cancel order effects
        order = self.a.tools[(rep - 1) % len(self.a.tools):] + self.a.tools[:(rep - 1) % len(self.a.tools)]
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
        last_snap = {}
        for name, t in tools.items():
            r = self.measure(t, f"{kind}-{name}-init-r{rep}", *t.init_cmd())
            alive[name] = r["rc"] == 0
            last_repo[name] = du_bytes(t.repo)
            self.add_row(dict(common, tool=name, tool_version=self.versions.get(name), phase="init",
                              status="ok" if alive[name] else f"fail rc={r['rc']}", wall_s=f"{r['wall_s']:.3f}",
                              user_s=r.get("user_s", ""), sys_s=r.get("sys_s", ""), cpu_s=f"{r['cpu_s']:.2f}",
                              max_rss_kib=r.get("max_rss_kib", ""), repo_bytes=last_repo[name], log=r["log"]))

        phases = ["first", "unchanged"]
        if kind == "mixed":
            phases.append("day2")
        if kind == "image":
            phases.append("changed")
        for phase in phases:
            if phase == "day2":
                log("applying day-2 edits to live mixed tree")
                datasets.apply_day(live, 2, datasets.DEFAULT_SEED)
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
                r = self.measure(t, f"{kind}-{name}-{phase}-r{rep}", *t.backup_cmd(live, snap))
                repo = du_bytes(t.repo)
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
                    sync_s=f"{r['sync_s']:.2f}", other_cpu_s=r["other_cpu_s"], steal_s=r["steal_s"], log=r["log"]))
                last_repo[name] = repo
                self.print_row(self.rows[-1])

        # restore of the latest snapshot into a fresh dir per tool; the
        # restored trees are removed only after all tools ran (deleting many
        # files is slow here and would disturb the next tool's measurement)
        src_digest = None
        if not self.a.no_verify:
            log(f"{kind}: hashing source tree for restore verification")
            src_digest = datasets.tree_digest(live)
        targets = []
        for name, t in tools.items():
            if not alive[name] or name not in last_snap:
                continue
            target = os.path.join(self.work, "restore", f"{name}-{kind}")
            if os.path.exists(target):
                shutil.rmtree(target)
            os.makedirs(target)
            settle()
            targets.append(target)
            r = self.measure(t, f"{kind}-{name}-restore-r{rep}", *t.restore_cmd(target, last_snap[name]))
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
                repo_bytes=du_bytes(t.repo), cache_bytes=du_bytes(t.cache), sync_s=f"{r['sync_s']:.2f}",
                other_cpu_s=r["other_cpu_s"], steal_s=r["steal_s"], verify=verify, log=r["log"]))
            self.print_row(self.rows[-1])
        log(f"{kind}: cleaning up")
        for target in targets:
            shutil.rmtree(target, ignore_errors=True)
        if not self.a.keep:
            for t in tools.values():
                shutil.rmtree(t.repo, ignore_errors=True)
                shutil.rmtree(t.cache, ignore_errors=True)
            shutil.rmtree(live, ignore_errors=True)
        settle()

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
        if not self.a.keep:
            for t in tools.values():
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
        self.csv_f.close()
        print(render_table(self.rows, self.a.tools))
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
    reps = max([a["n"] for a in agg] or [1])
    out = []
    if reps > 1:
        out.append(f"(medians over {reps} repetitions)")
    hdr = f"{'dataset':7} {'phase':9} {'tool':6} {'status':6} {'wall s':>8} {'MB/s':>8} {'files/s':>9} " \
          f"{'CPU s':>7} {'RSS MiB':>8} {'repo MiB':>9} {'+repo MiB':>9} {'other':>6} verify"
    out.append(hdr)
    out.append("-" * len(hdr))
    for a in agg:
        out.append(f"{a['dataset']:7} {a['phase']:9} {a['tool']:6} {a['status'][:6]:6} "
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
        h2 = f"{'dataset':7} {'phase':9} {'peer':6} {'speed':>6} {'cpu':>6} {'rss':>6} {'repo':>6}"
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
                out.append(f"{a['dataset']:7} {a['phase']:9} {p:6} {_ratio(a['mb_per_s'], pr['mb_per_s']):>6} "
                           f"{_ratio(a['cpu_s'], pr['cpu_s']):>6} {_ratio(a['max_rss_kib'], pr['max_rss_kib']):>6} "
                           f"{_ratio(a['repo_bytes'], pr['repo_bytes']):>6}")
    maint = [a for a in agg if a["phase"] in MAINT_PHASES]
    if "cairn" in tools and any(a["tool"] != "cairn" for a in maint):
        out.append("")
        out.append("Maintenance ratios cairn vs peer: time = peer wall s / cairn wall s (>1: cairn faster); "
                   "cpu, rss = cairn / peer (<1: cairn uses less); repo = repository size after, cairn / peer")
        h3 = f"{'dataset':7} {'phase':9} {'peer':6} {'time':>6} {'cpu':>6} {'rss':>6} {'repo':>6}"
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
                out.append(f"{a['dataset']:7} {a['phase']:9} {p:6} {_ratio(pr['wall_s'], a['wall_s']):>6} "
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


def table_from_csv(path):
    with open(path) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    tools = []
    for r in rows:
        if r["tool"] not in tools:
            tools.append(r["tool"])
    return render_table(rows, tools)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default=",".join(ALL_DATASETS), help="comma list of mixed,small,image")
    ap.add_argument("--tools", default=",".join(ALL_TOOLS), help="comma list of cairn,restic,borg")
    ap.add_argument("--scenario", default="all",
                    help="comma list of backup (the --datasets runs) and maintenance (day-by-day history, "
                         "then forget/prune/check --read-data; cairn and restic), or all (default)")
    ap.add_argument("--maint-days", type=int, default=8,
                    help="daily versions in the maintenance history (default 8, at every scale: with fewer, "
                         "keep-last 3 forgets too little for prune to repack anything)")
    ap.add_argument("--maint-keep", type=int, default=3, help="forget --keep-last N in the maintenance scenario")
    ap.add_argument("--maint-churn", type=float, default=0.04,
                    help="fraction of files deleted/rewritten/edited per day in the maintenance history")
    ap.add_argument("--scale", default=None, help="full | quick | fraction (default: $BENCH_SCALE or full)")
    ap.add_argument("--data-dir", default=os.environ.get("BENCH_DATA", os.path.join(BENCH_DIR, ".work", "data")))
    ap.add_argument("--work-dir", default=os.environ.get("BENCH_WORK", os.path.join(BENCH_DIR, ".work", "run")))
    ap.add_argument("--results-dir", default=os.path.join(BENCH_DIR, "results"))
    ap.add_argument("--out", help="CSV path (default results/<date>-<gitsha>.csv)")
    ap.add_argument("--cairn-bin", default=os.environ.get("CAIRN_BIN", os.path.join(REPO_ROOT, "target", "release", "cairn")))
    ap.add_argument("--restic-bin", default=os.environ.get("RESTIC_BIN", os.path.join(BENCH_DIR, ".tools", "restic")))
    ap.add_argument("--borg-bin", default=os.environ.get("BORG_BIN", os.path.join(BENCH_DIR, ".tools", "borg-venv", "bin", "borg")))
    ap.add_argument("--cold", action="store_true", help="drop the page cache before every measured command (root)")
    ap.add_argument("--no-verify", action="store_true", help="skip content verification of restores")
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
    a.scenarios = ALL_SCENARIOS if a.scenario == "all" else [x for x in a.scenario.split(",") if x]
    for x in a.scenarios:
        if x not in ALL_SCENARIOS:
            ap.error(f"unknown scenario {x} (backup, maintenance or all)")
    if a.maint_days < 1 or a.maint_keep < 1:
        ap.error("--maint-days and --maint-keep must be at least 1")
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
