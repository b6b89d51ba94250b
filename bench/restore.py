#!/usr/bin/env python3
"""Restore speed in three conditions, side by side (issue #18).

    bench/restore.py [--runs 5] [--tools cairn,restic,cp] [--fs root,journal]
                     [--dataset mixed|small] [--mib 600] [--writeback-mib 1200] [--settle 65]

The tree is the `mixed` dataset at --mib MiB (whole /usr directories), or with
--dataset small the `small` dataset of bench/datasets.sh (200,000 files of 1-8 KiB
at full scale).

For each file system the targets live on (`root`: the work directory's own file
system; `journal`: a fresh ext4 with the default journal on a loop device backed
by a file in the work directory, O_DIRECT loop so nothing is cached twice), every
tool restores the same tree `--runs` times in each condition, the tools taking
turns run by run:

  quiet      page cache dropped, nothing dirty, nothing deleted lately
  writeback  a second process writes --writeback-mib MiB to the same file
             system and fsyncs it, started half a second before the restore
  deleted    the tool's previous restore (the whole tree) is removed with
             `rm -rf` right before the restore

`cp` is `cp -a` of the source tree: what the file system allows without a
repository. Every tool first backs the tree up once from a cold cache (the
reference for "restore >= 1.5x backup"), and every tool's first quiet restore
is compared with the source (`diff -r`). Between conditions the targets are
removed, synced, and the machine left alone for --settle seconds (ext4 without
a journal will not reuse an inode for 60 s after it was freed).

Writes bench/results/<date>-restore-<sha>.csv and prints min/median/max per
condition. Needs root (drop_caches, losetup, mount).
"""
import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench  # noqa: E402  (the harness's tool classes: how each tool inits, backs up and restores)


def log(msg):
    print(f"[restore] {msg}", file=sys.stderr, flush=True)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def timed(argv, cwd=None, env=None):
    """Runs argv to completion; wall, user and system seconds of the child."""
    with tempfile.TemporaryFile() as err:
        start = time.monotonic()
        p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - start
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            err.seek(0)
            text = err.read().decode(errors="replace")
            raise SystemExit(f"{argv[0]} failed ({p.returncode}): {text.strip()[-2000:]}")
    return wall, ru.ru_utime, ru.ru_stime


def tree_bytes(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            st = os.lstat(os.path.join(d, f))
            total += st.st_size
    return total


class Cp:
    """`cp -a` of the source tree: what the file system allows without a repository."""
    name = "cp"

    def __init__(self, source):
        self.source = source

    def env(self):
        return dict(os.environ)


def restore_argv(t, source, target):
    """(argv, cwd) restoring the latest snapshot of tool t (or copying, for cp) into target."""
    if isinstance(t, Cp):
        return ["cp", "-a", source, target], None
    return t.restore_cmd(target, "latest")


def restored_root(t, source, target):
    """Where the source tree lands under a restore target."""
    return target if isinstance(t, Cp) else os.path.join(target, source.lstrip("/"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tools", default="cairn,restic,cp")
    ap.add_argument("--fs", default="root,journal")
    ap.add_argument("--conditions", default="quiet,writeback,deleted")
    ap.add_argument("--dataset", default="mixed", choices=["mixed", "small"])
    ap.add_argument("--mib", type=int, default=600, help="size of the mixed dataset (whole /usr directories)")
    ap.add_argument("--writeback-mib", type=int, default=1200)
    ap.add_argument("--settle", type=int, default=65)
    ap.add_argument("--work", default=os.path.join(HERE, ".work", "restore"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        ap.error("needs root (drop_caches, losetup, mount)")
    tools_wanted = a.tools.split(",")
    for t in tools_wanted:
        if t not in ("cairn", "restic", "cp"):
            ap.error(f"unknown tool {t} (cairn, restic or cp)")
    if "restic" in tools_wanted and not os.path.exists(os.path.join(HERE, ".tools", "restic")):
        subprocess.run([os.path.join(HERE, "install-peers.sh")], check=True)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "cairn-cli"], cwd=ROOT, check=True)
    if a.dataset == "small":
        subprocess.run([os.path.join(HERE, "datasets.sh"), "small"], check=True)
        import datasets  # noqa: E402  (the dataset generator's naming)
        source = os.path.join(HERE, ".work", "data", datasets.dataset_dirname("small", datasets.scale_config()))
    else:
        env = dict(os.environ, BENCH_MIXED_MIB=str(a.mib))
        subprocess.run([os.path.join(HERE, "datasets.sh"), "mixed"], env=env, check=True)
        source = os.path.join(HERE, ".work", "data", f"mixed-{a.mib}M")
    size = tree_bytes(source)
    nfiles = sum(len(f) for _, _, f in os.walk(source))
    log(f"dataset {source}: {size / 1e6:.0f} MB, {nfiles} files")

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(os.path.join(a.work, "repos"))
    bins = {"cairn": os.path.join(ROOT, "target", "release", "cairn"), "restic": os.path.join(HERE, ".tools", "restic")}
    tools = [Cp(source) if t == "cp" else bench.TOOL_CLASSES[t](bins[t], a.work, "restore") for t in tools_wanted]

    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True).stdout.strip()
    stamp = time.strftime("%Y-%m-%d-%H%M%S")
    out = os.path.join(HERE, "results", f"{stamp}-restore-{sha}.csv")
    rows = []
    backups = {}
    for t in tools:
        if isinstance(t, Cp):
            continue
        argv, cwd = t.init_cmd()
        subprocess.run(argv, cwd=cwd, env=t.env(), check=True, stdout=subprocess.DEVNULL)
        argv, cwd = t.backup_cmd(source, "restore")
        if argv:
            drop_caches()
            wall, user, sys_ = timed(argv, cwd=cwd, env=t.env())
            backups[t.name] = wall
            log(f"{t.name} backup: {wall:.2f} s ({size / 1e6 / wall:.0f} MB/s), user {user:.2f} sys {sys_:.2f}")
            rows.append(dict(fs="-", condition="backup", tool=t.name, run=1, wall=wall, user=user,
                             sys=sys_, mb_per_s=size / 1e6 / wall))

    noise = "/dev/shm/cairn-bench-noise"
    with open("/dev/urandom", "rb") as src, open(noise, "wb") as dst:
        for _ in range(a.writeback_mib):
            dst.write(src.read(1 << 20))
    try:
        for fs in a.fs.split(","):
            jfs = None
            if fs == "journal":
                need = (a.runs * len(tools) * size + (a.writeback_mib << 20)) * 1.3
                need += a.runs * len(tools) * nfiles * 4096  # the small files' last blocks
                jfs = bench.JournalFs(a.work, max(8, int(need / (1 << 30)) + 2),
                                int(a.runs * len(tools) * nfiles * 1.3) + 100_000)
                base = jfs.mnt
            elif fs == "root":
                base = os.path.join(a.work, "targets")
                os.makedirs(base, exist_ok=True)
            else:
                raise SystemExit(f"unknown --fs {fs}")
            try:
                run_fs(a, fs, base, tools, source, size, noise, rows)
            finally:
                if jfs:
                    jfs.close()
    finally:
        os.unlink(noise)
        with open(out, "w", newline="") as f:
            f.write(f"# bench/restore.py {' '.join(sys.argv[1:])}; dataset {source}, {size} bytes, {nfiles} files; "
                    f"commit {sha}; {os.cpu_count()} cores\n")
            w = csv.DictWriter(f, fieldnames=["fs", "condition", "tool", "run", "wall", "user", "sys", "mb_per_s"])
            w.writeheader()
            for r in rows:
                w.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()})
        log(f"wrote {out}")
    table(rows, backups, size)


def run_fs(a, fs, base, tools, source, size, noise, rows):
    verified = set()
    for cond in a.conditions.split(","):
        log(f"{fs}: condition {cond}")
        previous = {}
        if cond == "deleted":
            for t in tools:
                target = os.path.join(base, f"{t.name}-prime")
                timed(*restore_argv(t, source, target), env=t.env())
                previous[t.name] = target
        for run in range(1, a.runs + 1):
            for t in tools:
                target = os.path.join(base, f"{t.name}-{cond}-{run}")
                drop_caches()
                writer = None
                if cond == "deleted":
                    shutil.rmtree(previous[t.name])
                elif cond == "writeback":
                    writer = subprocess.Popen(["dd", f"if={noise}", f"of={os.path.join(base, 'noise')}",
                                               "bs=1M", "conv=fsync", "status=none"])
                    time.sleep(0.5)
                wall, user, sys_ = timed(*restore_argv(t, source, target), env=t.env())
                if writer:
                    writer.wait()
                    os.unlink(os.path.join(base, "noise"))
                previous[t.name] = target
                log(f"{fs} {cond} {t.name} run {run}: {wall:.2f} s, user {user:.2f} sys {sys_:.2f}")
                rows.append(dict(fs=fs, condition=cond, tool=t.name, run=run, wall=wall, user=user,
                                 sys=sys_, mb_per_s=size / 1e6 / wall))
                if t.name not in verified:
                    subprocess.run(["diff", "-r", "--no-dereference", source, restored_root(t, source, target)],
                                   check=True, stdout=subprocess.DEVNULL)
                    verified.add(t.name)
        for name in os.listdir(base):
            if name != "lost+found":
                p = os.path.join(base, name)
                shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)
        os.sync()
        log(f"{fs}: settling {a.settle} s")
        time.sleep(a.settle)


def table(rows, backups, size):
    print()
    print(f"| fs | condition | tool | wall s min / median / max | median MB/s | sys s median | "
          f"median ÷ cairn's backup | tool ÷ cairn (median wall) |")
    print("|---|---|---|---|---|---|---|---|")
    groups = {}
    for r in rows:
        if r["condition"] != "backup":
            groups.setdefault((r["fs"], r["condition"], r["tool"]), []).append(r)
    for (fs, cond, tool), rs in groups.items():
        walls = sorted(r["wall"] for r in rs)
        med = statistics.median(walls)
        sys_med = statistics.median(r["sys"] for r in rs)
        vs_backup = f"{backups['cairn'] / med:.2f}x" if "cairn" in backups and tool == "cairn" else ""
        cairn = groups.get((fs, cond, "cairn"))
        ratio = ""
        if cairn and tool != "cairn":
            ratio = f"{med / statistics.median(r['wall'] for r in cairn):.2f}"
        print(f"| {fs} | {cond} | {tool} | {walls[0]:.2f} / {med:.2f} / {walls[-1]:.2f} | "
              f"{size / 1e6 / med:.0f} | {sys_med:.2f} | {vs_backup} | {ratio} |")
    for name, wall in backups.items():
        print(f"backup {name}: {wall:.2f} s, {size / 1e6 / wall:.0f} MB/s (cold cache)")


if __name__ == "__main__":
    main()
