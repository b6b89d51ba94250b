#!/usr/bin/env python3
"""Reproducible benchmark datasets for cairn vs restic vs borg.

Everything is derived from a fixed seed (and, for `mixed`/`image`, from the
contents of /usr on this machine: the same machine image gives the same bytes;
the manifest records a hash of the /usr file list that was used).

Datasets (see scale_config for sizes):
  mixed  a tree of real files copied from /usr (whole directories picked
         deterministically), ~2 GiB at full scale; `day N` edits ~2% of it.
  small  N small files (1-8 KiB; compressible text-like and random) in D dirs.
  dense  the same kind of tree at dense-filesystem size: 1,000,000 files in
         10,000 dirs (100 top dirs x 100 subdirs x 100 files) at full scale.
  image  one large image-like file (sparse zero regions, /usr-derived
         compressible content, random blocks) plus a changed copy (~2% of 4K
         blocks rewritten in scattered runs plus an unaligned inserted region).

Subcommands:
  gen {mixed,small,image,dense} --out DIR [--size-mib N] [--files N --dirs D] [--seed S]
  small-change --dir TREE [--fraction 0.01]
                                         rewrite 1% of a small/dense tree's files
  day --dir TREE --day N [--seed S]      apply the day-N edits in place
  history --dir TREE --day N [--seed S] [--fraction F]
                                         apply day-N edits of the maintenance history
  digest DIR                             print a content digest of a tree
  config [--scale S]                     print the dataset sizes for a scale

Standard library only.
"""
import argparse
import hashlib
import json
import os
import random
import shutil
import stat
import sys
import time

DEFAULT_SEED = 20240601
MiB = 1 << 20
# Fixed timestamps so the generated trees are byte- and metadata-identical
# across runs (mtime of day N = BASE_MTIME + N days).
BASE_MTIME = 1704067200  # 2024-01-01T00:00:00Z
DAY = 86400
USR_ROOTS = ["/usr/share", "/usr/lib", "/usr/bin", "/usr/include", "/usr/libexec", "/usr/sbin"]


# --------------------------------------------------------------------------
# scale
# --------------------------------------------------------------------------
def scale_config(scale=None):
    """Dataset sizes for BENCH_SCALE (full | quick | <fraction of full>).

    Individual env overrides: BENCH_MIXED_MIB, BENCH_SMALL_FILES,
    BENCH_SMALL_DIRS, BENCH_IMAGE_MIB.
    """
    if scale is None:
        scale = os.environ.get("BENCH_SCALE", "full")
    scale = str(scale).strip().lower()
    if scale in ("full", "", "1", "1.0"):
        cfg = dict(mixed_mib=2048, small_files=200_000, small_dirs=2_000, image_mib=2048,
                   dense_files=1_000_000, dense_dirs=10_000, seed_files=43_000)
    elif scale in ("quick", "small"):
        cfg = dict(mixed_mib=300, small_files=20_000, small_dirs=200, image_mib=300,
                   dense_files=50_000, dense_dirs=500, seed_files=4_300)
    else:
        f = float(scale)
        files = max(100, int(200_000 * f))
        dense = max(100, int(1_000_000 * f))
        cfg = dict(mixed_mib=max(16, int(2048 * f)), small_files=files,
                   small_dirs=max(1, files // 100), image_mib=max(16, int(2048 * f)),
                   dense_files=dense, dense_dirs=max(1, dense // 100),
                   seed_files=max(100, int(43_000 * f)))
    for key, env in (("mixed_mib", "BENCH_MIXED_MIB"), ("small_files", "BENCH_SMALL_FILES"),
                     ("small_dirs", "BENCH_SMALL_DIRS"), ("image_mib", "BENCH_IMAGE_MIB"),
                     ("dense_files", "BENCH_DENSE_FILES"), ("dense_dirs", "BENCH_DENSE_DIRS")):
        if os.environ.get(env):
            cfg[key] = int(os.environ[env])
    cfg["scale"] = scale
    return cfg


def dataset_dirname(kind, cfg):
    if kind == "mixed":
        return f"mixed-{cfg['mixed_mib']}M"
    if kind == "small":
        return f"small-{cfg['small_files']}f-{cfg['small_dirs']}d"
    if kind == "image":
        return f"image-{cfg['image_mib']}M"
    if kind == "dense":
        return f"dense-{cfg['dense_files']}f-{cfg['dense_dirs']}d"
    if kind == "seed":
        return f"seed-{cfg['seed_files']}f"
    raise ValueError(kind)


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def hkey(seed, s):
    return hashlib.sha256(f"{seed}:{s}".encode()).digest()


def log(msg):
    print(f"[datasets] {msg}", file=sys.stderr, flush=True)


def usr_inventory(roots=USR_ROOTS, max_file=64 * MiB):
    """Sorted list of (path, size) of readable regular files under roots."""
    out = []
    for root in roots:
        if not os.path.isdir(root) or os.path.islink(root):
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for fn in sorted(filenames):
                p = os.path.join(dirpath, fn)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_size > max_file:
                    continue
                if not os.access(p, os.R_OK):
                    continue
                out.append((p, st.st_size))
    out.sort()
    return out


def finish_dir(tmp, final, manifest):
    """Atomically publish a generated dataset; the manifest (and completion
    marker) is FINAL.json next to the tree, so it is not part of backups."""
    if os.path.exists(final):
        shutil.rmtree(final)
    if os.path.exists(final + ".json"):
        os.unlink(final + ".json")
    os.rename(tmp, final)
    with open(final + ".json.tmp", "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    os.rename(final + ".json.tmp", final + ".json")


def set_tree_mtime(root, mtime):
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for fn in filenames:
            p = os.path.join(dirpath, fn)
            if not os.path.islink(p):
                os.utime(p, (mtime, mtime))
        os.utime(dirpath, (mtime, mtime))


# --------------------------------------------------------------------------
# mixed
# --------------------------------------------------------------------------
def gen_mixed(out, size_mib, seed):
    target = size_mib * MiB
    t0 = time.time()
    inv = usr_inventory()
    inv_hash = hashlib.sha256("\n".join(f"{p}\t{s}" for p, s in inv).encode()).hexdigest()
    by_dir = {}
    for p, s in inv:
        by_dir.setdefault(os.path.dirname(p), []).append((p, s))
    # whole directories in hash order; a single directory contributes at most
    # 10% of the target (its files taken in hash order) so that no one huge
    # directory (e.g. /usr/lib/x86_64-linux-gnu) dominates.
    dirs = sorted(by_dir, key=lambda d: hkey(seed, "dir:" + d))
    per_dir_cap = max(target // 10, 4 * MiB)
    chosen, total = [], 0
    for d in dirs:
        if total >= target:
            break
        files = sorted(by_dir[d], key=lambda ps: hkey(seed, "file:" + ps[0]))
        dsum = 0
        for p, s in files:
            if dsum + s > per_dir_cap and dsum > 0:
                continue
            if total + s > target * 1.02 and total > 0:
                continue
            chosen.append((p, s))
            dsum += s
            total += s
            if total >= target:
                break
    chosen.sort()
    tmp = out + ".tmp"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    copied = 0
    nbytes = 0
    for p, s in chosen:
        dst = os.path.join(tmp, p.lstrip("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            shutil.copyfile(p, dst)
        except OSError as e:
            log(f"skip {p}: {e}")
            continue
        mode = os.stat(p).st_mode
        os.chmod(dst, 0o755 if mode & 0o111 else 0o644)
        copied += 1
        nbytes += os.path.getsize(dst)
    set_tree_mtime(tmp, BASE_MTIME)
    manifest = dict(kind="mixed", seed=seed, size_mib=size_mib, files=copied, bytes=nbytes,
                    usr_inventory_sha256=inv_hash, usr_inventory_files=len(inv),
                    generated_in_s=round(time.time() - t0, 1))
    finish_dir(tmp, out, manifest)
    log(f"mixed: {copied} files, {nbytes / MiB:.0f} MiB in {time.time() - t0:.0f}s -> {out}")
    return manifest


def _rand_payload(rng, n):
    # half random, half text-like
    if rng.random() < 0.5:
        return rng.randbytes(n)
    words = [b"lorem", b"ipsum", b"backup", b"cairn", b"chunk", b"index", b"restic", b"borg",
             b"snapshot", b"pack", b"blob", b"tree", b"data", b"\n"]
    buf = b" ".join(rng.choices(words, k=n // 5 + 1))
    return buf[:n]


def apply_day(tree, day, seed, fraction=0.02):
    """Deterministically edit ~fraction of the regular files under tree.

    Operation mix on the chosen files: 30% overwrite a range in place (same
    size), 20% append, 20% insert bytes in the middle (rewrite), 10% delete,
    10% rename (maybe to another dir), 10% truncate. Plus new files (0.2% of
    the file count). Touched files get mtime BASE_MTIME + day days.
    """
    rng = random.Random(f"{seed}-day-{day}")
    files = []
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        for fn in sorted(filenames):
            p = os.path.join(dirpath, fn)
            if os.path.isfile(p) and not os.path.islink(p):
                files.append(p)
    files.sort()
    dirs = sorted({os.path.dirname(p) for p in files})
    n = max(1, int(len(files) * fraction))
    chosen = rng.sample(files, min(n, len(files)))
    mtime = BASE_MTIME + day * DAY
    stats = dict(overwrite=0, append=0, insert=0, delete=0, rename=0, truncate=0, new=0)
    changed_bytes = 0
    for p in chosen:
        op = rng.choices(["overwrite", "append", "insert", "delete", "rename", "truncate"],
                         weights=[30, 20, 20, 10, 10, 10])[0]
        size = os.path.getsize(p)
        if op == "overwrite" and size > 0:
            ln = min(size, rng.randint(1, max(1, min(64 * 1024, size // 4 + 1))))
            off = rng.randint(0, size - ln)
            with open(p, "r+b") as f:
                f.seek(off)
                f.write(_rand_payload(rng, ln))
            changed_bytes += ln
        elif op in ("append", "overwrite"):
            ln = rng.randint(16, 256 * 1024)
            with open(p, "ab") as f:
                f.write(_rand_payload(rng, ln))
            changed_bytes += ln
            op = "append"
        elif op == "insert":
            ln = rng.randint(16, 64 * 1024)
            off = rng.randint(0, size)
            with open(p, "rb") as f:
                data = f.read()
            with open(p, "wb") as f:  # in place: same inode
                f.write(data[:off])
                f.write(_rand_payload(rng, ln))
                f.write(data[off:])
            changed_bytes += ln
        elif op == "delete":
            os.unlink(p)
            stats[op] += 1
            continue
        elif op == "rename":
            dst_dir = rng.choice(dirs) if rng.random() < 0.3 else os.path.dirname(p)
            dst = os.path.join(dst_dir, f"{os.path.basename(p)}.renamed-d{day}")
            if not os.path.exists(dst):
                os.rename(p, dst)
                os.utime(dst_dir, (mtime, mtime))
            p = dst
        elif op == "truncate":
            with open(p, "r+b") as f:
                f.truncate(rng.randint(0, size))
        stats[op] += 1
        if os.path.exists(p):
            os.utime(p, (mtime, mtime))
        os.utime(os.path.dirname(p), (mtime, mtime))
    for i in range(max(1, len(files) // 500)):
        d = rng.choice(dirs)
        p = os.path.join(d, f"new-d{day}-{i:05d}.dat")
        ln = int(rng.lognormvariate(9, 2)) % (8 * MiB) + 1
        with open(p, "wb") as f:
            f.write(_rand_payload(rng, ln))
        os.utime(p, (mtime, mtime))
        os.utime(d, (mtime, mtime))
        changed_bytes += ln
        stats["new"] += 1
    stats["changed_bytes"] = changed_bytes
    stats["files_before"] = len(files)
    log(f"day {day} on {tree}: {stats}")
    return stats


def _xor_table(rng):
    key = rng.randint(1, 255)
    return bytes(b ^ key for b in range(256))


def apply_history_day(tree, day, seed, fraction=0.04):
    """Day-N edits of the maintenance history (prune/check scenario), in place.

    Unlike apply_day, the mix is weighted towards removing data, so that snapshots
    a keep-last policy forgets hold data the kept ones do not. Of ~fraction of the
    regular files (chosen with a generator seeded by seed and day): 35% deleted,
    25% rewritten whole, 20% a range of up to 256 KiB overwritten in place, 10%
    appended to (16 B - 256 KiB), 10% truncated. As many new files as were deleted
    are added. New bytes are existing bytes of the tree XORed with a random byte:
    new content (new chunks for every tool) that compresses like the original.
    Touched files get mtime BASE_MTIME + day days. Deterministic for a given tree
    state, seed and day.
    """
    rng = random.Random(f"{seed}-history-{day}")
    files = []
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        for fn in sorted(filenames):
            p = os.path.join(dirpath, fn)
            if os.path.isfile(p) and not os.path.islink(p):
                files.append(p)
    files.sort()
    dirs = sorted({os.path.dirname(p) for p in files})
    n = max(1, int(len(files) * fraction))
    chosen = sorted(rng.sample(files, min(n, len(files))))
    chosen_set = set(chosen)
    donors = [p for p in files if p not in chosen_set]
    mtime = BASE_MTIME + day * DAY
    stats = dict(delete=0, rewrite=0, overwrite=0, append=0, truncate=0, new=0)
    removed_bytes = 0
    new_bytes = 0
    deleted_sizes = []

    def donor_bytes(ln):
        # ln bytes from a donor file (cycled if short), XORed with a random key
        d = rng.choice(donors) if donors else None
        data = b""
        if d is not None:
            with open(d, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > ln:
                    f.seek(rng.randint(0, size - ln))
                data = f.read(ln)
        if not data:
            return rng.randbytes(ln)
        if len(data) < ln:
            data = (data * (ln // len(data) + 1))[:ln]
        return data.translate(_xor_table(rng))

    for p in chosen:
        op = rng.choices(["delete", "rewrite", "overwrite", "append", "truncate"],
                         weights=[35, 25, 20, 10, 10])[0]
        size = os.path.getsize(p)
        if op == "delete":
            os.unlink(p)
            deleted_sizes.append(size)
            removed_bytes += size
        elif op == "rewrite":
            with open(p, "rb") as f:
                data = f.read()
            with open(p, "wb") as f:  # same inode, new content
                f.write(data.translate(_xor_table(rng)))
            removed_bytes += size
            new_bytes += size
        elif op == "overwrite" and size > 0:
            ln = rng.randint(1, min(size, 256 * 1024))
            off = rng.randint(0, size - ln)
            with open(p, "r+b") as f:
                f.seek(off)
                old = f.read(ln)
                f.seek(off)
                f.write(old.translate(_xor_table(rng)))
            removed_bytes += ln
            new_bytes += ln
        elif op in ("append", "overwrite"):
            op = "append"
            ln = rng.randint(16, 256 * 1024)
            with open(p, "ab") as f:
                f.write(donor_bytes(ln))
            new_bytes += ln
        elif op == "truncate":
            keep = rng.randint(0, size)
            with open(p, "r+b") as f:
                f.truncate(keep)
            removed_bytes += size - keep
        stats[op] += 1
        if os.path.exists(p):
            os.utime(p, (mtime, mtime))
        os.utime(os.path.dirname(p), (mtime, mtime))
    for i, size in enumerate(deleted_sizes):
        d = rng.choice(dirs)
        p = os.path.join(d, f"new-h{day}-{i:05d}.dat")
        ln = max(1, size)
        with open(p, "wb") as f:
            f.write(donor_bytes(ln))
        os.utime(p, (mtime, mtime))
        os.utime(d, (mtime, mtime))
        new_bytes += ln
        stats["new"] += 1
    stats.update(files_before=len(files), removed_bytes=removed_bytes, new_bytes=new_bytes)
    log(f"history day {day} on {tree}: {stats}")
    return stats


# --------------------------------------------------------------------------
# small
# --------------------------------------------------------------------------
def gen_small(out, nfiles, ndirs, seed, text_share=0.6, kind="small"):
    """Small files (1-8 KiB) in a 2-level tree; text_share of them text in a Zipf-ish
    vocabulary (compressible), the rest random bytes. The seed kind (the slow-link
    scenario's "200 MB of compressible small files") is all text."""
    t0 = time.time()
    rng = random.Random(f"{seed}-small")
    # pseudo-word vocabulary with a Zipf-ish frequency
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    vocab = ["".join(rng.choices(letters, weights=range(26, 0, -1), k=rng.randint(2, 10)))
             for _ in range(6000)]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    cum = []
    acc = 0.0
    for w in weights:
        acc += w
        cum.append(acc)
    tmp = out + ".tmp"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    # ~2000 dirs in a 2-level hierarchy
    top = max(1, int(ndirs ** 0.5))
    dirs = []
    for i in range(ndirs):
        d = os.path.join(tmp, f"d{i % top:03d}", f"sub{i:05d}")
        os.makedirs(d, exist_ok=True)
        dirs.append(d)
    nbytes = 0
    ntext = 0
    for i in range(nfiles):
        d = dirs[i % ndirs]
        size = rng.randint(1024, 8192)
        if rng.random() < text_share:
            ext = rng.choice([".txt", ".md", ".log", ".json", ".c", ".py"])
            words = rng.choices(vocab, cum_weights=cum, k=size // 5 + 8)
            # newline roughly every 12 words
            body = f"# file {i} seed {seed}\n" + " ".join(
                w + ("\n" if j % 12 == 11 else "") for j, w in enumerate(words))
            data = body.encode()[:size]
            ntext += 1
        else:
            ext = rng.choice([".bin", ".dat", ".gz", ".jpg"])
            data = rng.randbytes(size)
        with open(os.path.join(d, f"f{i:06d}{ext}"), "wb") as f:
            f.write(data)
        nbytes += len(data)
    set_tree_mtime(tmp, BASE_MTIME)
    manifest = dict(kind=kind, seed=seed, files=nfiles, dirs=ndirs, bytes=nbytes,
                    text_files=ntext, generated_in_s=round(time.time() - t0, 1))
    finish_dir(tmp, out, manifest)
    log(f"{kind}: {nfiles} files in {ndirs} dirs, {nbytes / MiB:.0f} MiB in {time.time() - t0:.0f}s -> {out}")
    return manifest


def apply_small_change(tree, seed, fraction=0.01):
    """Rewrites `fraction` of the files of a small/dense tree (chosen by a generator
    seeded by `seed`): new bytes of a new length (1-8 KiB) and an mtime one day
    later, as an application rewriting its small files would. Returns counts."""
    files = []
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        for fn in sorted(filenames):
            files.append(os.path.join(dirpath, fn))
    rng = random.Random(f"{seed}-small-change")
    n = max(1, int(len(files) * fraction)) if files else 0
    chosen = rng.sample(files, n) if n else []
    nbytes = 0
    for p in chosen:
        data = rng.randbytes(rng.randint(1024, 8192))
        with open(p, "wb") as f:
            f.write(data)
        os.utime(p, (BASE_MTIME + DAY, BASE_MTIME + DAY))
        nbytes += len(data)
    log(f"small change: rewrote {n} of {len(files)} files ({nbytes / MiB:.1f} MiB) in {tree}")
    return dict(files=len(files), changed=n, bytes=nbytes)


# --------------------------------------------------------------------------
# image
# --------------------------------------------------------------------------
class UsrStream:
    """Endless deterministic byte stream from /usr files (hash order)."""

    def __init__(self, seed):
        inv = usr_inventory(["/usr/lib", "/usr/share", "/usr/bin"], max_file=16 * MiB)
        self.inv_hash = hashlib.sha256("\n".join(f"{p}\t{s}" for p, s in inv).encode()).hexdigest()
        self.files = [p for p, s in sorted(inv, key=lambda ps: hkey(seed, "img:" + ps[0])) if s > 0]
        self.idx = 0
        self.buf = b""

    def read(self, n):
        out = []
        while n > 0:
            if not self.buf:
                p = self.files[self.idx % len(self.files)]
                self.idx += 1
                try:
                    with open(p, "rb") as f:
                        self.buf = f.read()
                except OSError:
                    self.buf = b""
                continue
            take = self.buf[:n]
            self.buf = self.buf[n:]
            out.append(take)
            n -= len(take)
        return b"".join(out)


def gen_image(out, size_mib, seed):
    t0 = time.time()
    rng = random.Random(f"{seed}-image")
    total = size_mib * MiB
    tmp = out + ".tmp"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    usr = UsrStream(seed)
    v1 = os.path.join(tmp, "disk-v1.img")
    regions = {"zero": 0, "usr": 0, "random": 0}
    with open(v1, "wb") as f:
        pos = 0
        while pos < total:
            kind = rng.choices(["zero", "usr", "random"], weights=[25, 45, 30])[0]
            ln = min(total - pos, rng.randint(16, 4096) * 4096)  # 64 KiB .. 16 MiB, 4K aligned
            if kind == "zero":
                f.seek(ln, os.SEEK_CUR)  # sparse hole
            else:
                left = ln
                while left > 0:
                    step = min(left, 4 * MiB)
                    f.write(usr.read(step) if kind == "usr" else rng.randbytes(step))
                    left -= step
            regions[kind] += ln
            pos += ln
        f.truncate(total)
    # v2: ~2% of 4K blocks rewritten in runs of 1..16 blocks, plus an
    # unaligned inserted region (256 KiB + 1234 bytes) at ~40% of the file.
    nblocks = total // 4096
    target_blocks = int(nblocks * 0.02)
    dirty = set()
    while len(dirty) < target_blocks:
        start = rng.randrange(nblocks)
        for b in range(start, min(nblocks, start + rng.randint(1, 16))):
            dirty.add(b)
    insert_at = int(total * 0.4) + 777
    insert_data = rng.randbytes(256 * 1024 + 1234)
    v2 = os.path.join(tmp, "disk-v2.img")
    zero4k = bytes(4096)
    with open(v1, "rb") as fi, open(v2, "wb") as fo:
        pos = 0
        chunk = 1 * MiB
        while pos < total:
            data = bytearray(fi.read(chunk))
            if not data:
                break
            for b in range(pos // 4096, (pos + len(data)) // 4096):
                if b in dirty:
                    o = b * 4096 - pos
                    data[o:o + 4096] = rng.randbytes(4096)
            if pos <= insert_at < pos + len(data):
                o = insert_at - pos
                pieces = [bytes(data[:o]), insert_data, bytes(data[o:])]
            else:
                pieces = [bytes(data)]
            for piece in pieces:
                # keep zero blocks sparse
                i = 0
                while i < len(piece):
                    blk = piece[i:i + 4096]
                    if blk == zero4k:
                        fo.seek(len(blk), os.SEEK_CUR)
                    else:
                        fo.write(blk)
                    i += 4096
            pos += len(data)
        fo.truncate(fo.tell())
    os.utime(v1, (BASE_MTIME, BASE_MTIME))
    os.utime(v2, (BASE_MTIME + DAY, BASE_MTIME + DAY))
    manifest = dict(kind="image", seed=seed, size_mib=size_mib, bytes=total,
                    v2_bytes=os.path.getsize(v2), regions=regions,
                    dirty_blocks=len(dirty), total_blocks=nblocks, insert_at=insert_at,
                    insert_len=len(insert_data), usr_inventory_sha256=usr.inv_hash,
                    generated_in_s=round(time.time() - t0, 1))
    finish_dir(tmp, out, manifest)
    log(f"image: {size_mib} MiB (+v2) in {time.time() - t0:.0f}s -> {out}")
    return manifest


# --------------------------------------------------------------------------
# digest
# --------------------------------------------------------------------------
def tree_digest(root):
    """sha256 over (relative path, type, size, content hash / link target)."""
    h = hashlib.sha256()
    nfiles = nbytes = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        h.update(f"D {rel}\n".encode())
        for fn in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            p = os.path.join(dirpath, fn)
            r = os.path.join(rel, fn)
            if os.path.islink(p):
                h.update(f"L {r} {os.readlink(p)}\n".encode())
                continue
            fh = hashlib.sha256()
            with open(p, "rb") as f:
                while True:
                    b = f.read(4 * MiB)
                    if not b:
                        break
                    fh.update(b)
                    nbytes += len(b)
            nfiles += 1
            h.update(f"F {r} {fh.hexdigest()}\n".encode())
    return dict(digest=h.hexdigest(), files=nfiles, bytes=nbytes)


# --------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("kind", choices=["mixed", "small", "image", "dense", "seed"])
    g.add_argument("--out", required=True)
    g.add_argument("--seed", type=int, default=DEFAULT_SEED)
    g.add_argument("--size-mib", type=int)
    g.add_argument("--files", type=int)
    g.add_argument("--dirs", type=int)
    d = sub.add_parser("day")
    d.add_argument("--dir", required=True)
    d.add_argument("--day", type=int, required=True)
    d.add_argument("--seed", type=int, default=DEFAULT_SEED)
    hd = sub.add_parser("history")
    hd.add_argument("--dir", required=True)
    hd.add_argument("--day", type=int, required=True)
    hd.add_argument("--seed", type=int, default=DEFAULT_SEED)
    hd.add_argument("--fraction", type=float, default=0.04)
    sc = sub.add_parser("small-change")
    sc.add_argument("--dir", required=True)
    sc.add_argument("--seed", type=int, default=DEFAULT_SEED)
    sc.add_argument("--fraction", type=float, default=0.01)
    dg = sub.add_parser("digest")
    dg.add_argument("dir")
    c = sub.add_parser("config")
    c.add_argument("--scale")
    a = ap.parse_args(argv)
    cfg = scale_config()
    if a.cmd == "gen":
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        if a.kind == "mixed":
            m = gen_mixed(a.out, a.size_mib or cfg["mixed_mib"], a.seed)
        elif a.kind == "small":
            m = gen_small(a.out, a.files or cfg["small_files"], a.dirs or cfg["small_dirs"], a.seed)
        elif a.kind == "dense":
            m = gen_small(a.out, a.files or cfg["dense_files"], a.dirs or cfg["dense_dirs"], a.seed)
        elif a.kind == "seed":
            files = a.files or cfg["seed_files"]
            m = gen_small(a.out, files, a.dirs or max(1, files // 100), a.seed, text_share=1.0, kind="seed")
        else:
            m = gen_image(a.out, a.size_mib or cfg["image_mib"], a.seed)
        print(json.dumps(m))
    elif a.cmd == "day":
        print(json.dumps(apply_day(a.dir, a.day, a.seed)))
    elif a.cmd == "history":
        print(json.dumps(apply_history_day(a.dir, a.day, a.seed, a.fraction)))
    elif a.cmd == "small-change":
        print(json.dumps(apply_small_change(a.dir, a.seed, a.fraction)))
    elif a.cmd == "digest":
        print(json.dumps(tree_digest(a.dir)))
    elif a.cmd == "config":
        c = scale_config(a.scale)
        c["dirs"] = {k: dataset_dirname(k, c) for k in ("mixed", "small", "image", "dense", "seed")}
        print(json.dumps(c))


if __name__ == "__main__":
    main()
