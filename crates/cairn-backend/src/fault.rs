//! A backend that fails or delays a fraction of calls, for testing that every command
//! either succeeds through retries or fails cleanly with nothing committed lost. A
//! failure is injected either before the call reaches the store (nothing happened)
//! or after it (a put or delete happened but its answer was lost), the two cases a
//! flaky network produces.
//!
//! The CLI installs it below the retry layer when `CAIRN_FAULTS` is set, e.g.
//! `CAIRN_FAULTS=fail=0.2,delay=0.1,delay-ms=20,seed=7` or, to fail only writes,
//! `...,ops=put+delete`. `kind=permanent` makes the failures final (not retried),
//! `kind=io` a disk's I/O error (EIO); `names=data/` limits them to objects whose
//! name starts so (the packs), before `after=N` counts the calls let through.

use crate::{Backend, BackendError, BackendErrorKind, ObjectInfo, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Debug, PartialEq)]
pub struct FaultSpec {
    /// Fraction of calls that fail with a transient error.
    pub fail: f64,
    /// Fraction of calls that are delayed by `delay_time` first.
    pub delay: f64,
    pub delay_time: Duration,
    pub seed: u64,
    /// Operations affected (`put`, `get`, `list`, `delete`); empty = all.
    pub ops: Vec<String>,
    /// Calls of the affected operations that pass untouched before faults start.
    pub after: u64,
    /// Injected errors are permanent (not retried): simulates a dead server or a
    /// full bucket, to test that commands fail cleanly.
    pub permanent: bool,
    /// Injected errors are a local disk's I/O error (EIO): permanent, with the
    /// message the operating system gives (a failing sector under one file).
    pub io: bool,
    /// Only objects whose name starts with this (`data/`: the packs) are affected.
    pub names: Option<String>,
}

impl FaultSpec {
    pub fn parse(s: &str) -> std::result::Result<FaultSpec, String> {
        let mut spec = FaultSpec {
            fail: 0.0,
            delay: 0.0,
            delay_time: Duration::from_millis(10),
            seed: 1,
            ops: Vec::new(),
            after: 0,
            permanent: false,
            io: false,
            names: None,
        };
        let fraction = |v: &str| -> std::result::Result<f64, String> {
            match v.parse::<f64>() {
                Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
                _ => Err(format!("{v:?} is not a fraction between 0 and 1")),
            }
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: expected key=value"))?;
            match k {
                "fail" => spec.fail = fraction(v)?,
                "delay" => spec.delay = fraction(v)?,
                "delay-ms" => {
                    spec.delay_time = Duration::from_millis(
                        v.parse()
                            .map_err(|_| format!("delay-ms: {v:?} is not a number"))?,
                    )
                }
                "seed" => {
                    spec.seed = v
                        .parse()
                        .map_err(|_| format!("seed: {v:?} is not a number"))?
                }
                "after" => {
                    spec.after = v
                        .parse()
                        .map_err(|_| format!("after: {v:?} is not a number"))?
                }
                "kind" => {
                    (spec.permanent, spec.io) = match v {
                        "transient" => (false, false),
                        "permanent" => (true, false),
                        "io" => (true, true),
                        _ => {
                            return Err(format!("kind: {v:?} is not transient, permanent or io"));
                        }
                    }
                }
                "names" => spec.names = Some(v.to_string()),
                "ops" => {
                    for op in v.split('+') {
                        if !["put", "get", "list", "delete"].contains(&op) {
                            return Err(format!("ops: unknown operation {op:?}"));
                        }
                        spec.ops.push(op.to_string());
                    }
                }
                _ => return Err(format!("unknown fault setting {k:?}")),
            }
        }
        Ok(spec)
    }
}

#[derive(Debug)]
pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    spec: FaultSpec,
    rng: Mutex<u64>,
    injected: AtomicU64,
    calls: AtomicU64,
}

enum Fault {
    None,
    Before,
    After,
}

impl FaultyBackend {
    pub fn new(inner: Arc<dyn Backend>, spec: FaultSpec) -> Self {
        let seed = spec.seed;
        FaultyBackend {
            inner,
            spec,
            rng: Mutex::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
            injected: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        }
    }

    /// Failures injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    fn uniform(&self) -> f64 {
        let mut g = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        // xorshift64*: reproducible for a seed (per-thread order aside).
        let mut x = *g;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *g = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn decide(&self, op: &str, name: &str) -> Fault {
        if !self.spec.ops.is_empty() && !self.spec.ops.iter().any(|o| o == op) {
            return Fault::None;
        }
        if (self.spec.names.as_deref()).is_some_and(|p| !name.starts_with(p)) {
            return Fault::None;
        }
        if self.calls.fetch_add(1, Ordering::Relaxed) < self.spec.after {
            return Fault::None;
        }
        if self.spec.delay > 0.0 && self.uniform() < self.spec.delay {
            std::thread::sleep(self.spec.delay_time);
        }
        if self.spec.fail > 0.0 && self.uniform() < self.spec.fail {
            self.injected.fetch_add(1, Ordering::Relaxed);
            if self.uniform() < 0.5 {
                Fault::Before
            } else {
                Fault::After
            }
        } else {
            Fault::None
        }
    }

    fn call<T>(&self, op: &'static str, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let injected = || BackendError {
            kind: if self.spec.permanent {
                BackendErrorKind::Other
            } else {
                BackendErrorKind::Transient
            },
            op,
            path: name.to_string(),
            message: if self.spec.io {
                std::io::Error::from_raw_os_error(5).to_string()
            } else {
                "injected fault (connection reset)".into()
            },
        };
        match self.decide(op, name) {
            Fault::None => f(),
            Fault::Before => Err(injected()),
            Fault::After => {
                let _ = f();
                Err(injected())
            }
        }
    }
}

impl Backend for FaultyBackend {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.call("put", name, || self.inner.put(name, data))
    }
    fn put_new(&self, name: &str, data: &[u8]) -> Result<()> {
        self.call("put", name, || self.inner.put_new(name, data))
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.call("get", name, || self.inner.get(name))
    }
    fn get_bounded(&self, name: &str, max: u64) -> Result<Vec<u8>> {
        self.call("get", name, || self.inner.get_bounded(name, max))
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.call("get", name, || self.inner.size(name))
    }
    fn get_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        self.call("get", name, || self.inner.get_range(name, offset, length))
    }
    fn get_range_into(
        &self,
        name: &str,
        offset: u64,
        length: u64,
        out: &mut crate::bufpool::Pooled,
    ) -> Result<()> {
        self.call("get", name, || {
            self.inner.get_range_into(name, offset, length, out)
        })
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.call("list", prefix, || self.inner.list(prefix))
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.call("delete", name, || self.inner.delete(name))
    }
    fn put_metadata_new(&self, name: &str, data: &[u8]) -> Result<()> {
        self.call("put", name, || self.inner.put_metadata_new(name, data))
    }
    fn put_new_owned(&self, name: &str, data: crate::Bytes, metadata: bool) -> Result<()> {
        self.call("put", name, || {
            self.inner.put_new_owned(name, data.clone(), metadata)
        })
    }
    fn get_metadata_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        self.call("get", name, || {
            self.inner.get_metadata_range(name, offset, length)
        })
    }
    fn remove_stale_temporaries(&self) -> Result<u64> {
        self.inner.remove_stale_temporaries()
    }
    fn lock_owner_prefix(&self) -> Option<[u8; 8]> {
        self.inner.lock_owner_prefix()
    }
    fn free_space(&self) -> Option<u64> {
        self.inner.free_space()
    }
    fn clock_skew(&self) -> Option<i64> {
        self.inner.clock_skew()
    }
    fn may_remove(&self) -> Result<bool> {
        self.inner.may_remove()
    }
    fn bound_host(&self) -> Result<Option<String>> {
        self.inner.bound_host()
    }
    fn partial_view(&self) -> Result<Option<String>> {
        self.inner.partial_view()
    }
    fn dedup_plan(&self) -> Result<Option<crate::DedupPlan>> {
        self.inner.dedup_plan()
    }
    fn dedup_query(&self, ids: &[[u8; 32]]) -> Result<Vec<crate::DedupAnswer>> {
        self.inner.dedup_query(ids)
    }
    fn dedup_confirm(&self, ids: &[[u8; 32]]) -> Result<Vec<[u8; 32]>> {
        self.inner.dedup_confirm(ids)
    }
    fn job_slot(&self, operation: &str, host: &str) -> Result<crate::JobSlot> {
        self.inner.job_slot(operation, host)
    }
    fn report_job_progress(&self, report: crate::JobReport) {
        self.inner.report_job_progress(report)
    }
    fn release_job_slot(&self) {
        self.inner.release_job_slot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        let s = FaultSpec::parse("fail=0.25, delay=0.5,delay-ms=3,seed=9,ops=put+delete").unwrap();
        assert_eq!(s.fail, 0.25);
        assert_eq!(s.delay, 0.5);
        assert_eq!(s.delay_time, Duration::from_millis(3));
        assert_eq!(s.seed, 9);
        assert_eq!(s.ops, vec!["put", "delete"]);
        let s = FaultSpec::parse("fail=1,after=3,kind=permanent").unwrap();
        assert_eq!((s.after, s.permanent), (3, true));
        for bad in [
            "fail=2",
            "fail",
            "ops=rename",
            "colour=blue",
            "seed=x",
            "kind=odd",
            "after=-1",
        ] {
            assert!(FaultSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_objects_under_the_named_prefix_fail_with_an_io_error() {
        let mem = Arc::new(crate::MemBackend::new());
        mem.put("config", b"c").unwrap();
        mem.put("data/ab/abcd", b"pack").unwrap();
        let b = FaultyBackend::new(
            mem,
            FaultSpec::parse("fail=1,ops=get,names=data/,kind=io").unwrap(),
        );
        assert_eq!(b.get("config").unwrap(), b"c");
        let e = b.get_range("data/ab/abcd", 0, 4).unwrap_err();
        assert_eq!(e.kind, BackendErrorKind::Other);
        assert!(e.message.contains("Input/output error"), "{}", e.message);
    }

    #[test]
    fn only_the_named_operations_fail() {
        let b = FaultyBackend::new(
            Arc::new(crate::MemBackend::new()),
            FaultSpec::parse("fail=1,ops=put").unwrap(),
        );
        let e = b.put("config", b"x").unwrap_err();
        assert_eq!(e.kind, BackendErrorKind::Transient);
        assert!(b.get("config").unwrap_err().is_not_found());
        assert!(b.list("data/").unwrap().is_empty());
        assert_eq!(b.injected(), 1);
    }

    #[test]
    fn faults_start_after_the_given_calls() {
        let b = FaultyBackend::new(
            Arc::new(crate::MemBackend::new()),
            FaultSpec::parse("fail=1,after=2,kind=permanent").unwrap(),
        );
        b.put("a", b"1").unwrap();
        b.put("b", b"2").unwrap();
        assert_eq!(b.put("c", b"3").unwrap_err().kind, BackendErrorKind::Other);
    }
}
