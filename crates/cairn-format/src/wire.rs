//! Little binary codec used by every binary object: little-endian fixed integers,
//! LEB128 varints, and length-prefixed byte strings. The reader checks every length
//! against the remaining input (and a caller's cap) before it allocates.

use crate::error::{FormatError, Result};

#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }
    /// Signed values (timestamps before 1970) are zigzag-encoded.
    pub fn varint_i64(&mut self, v: i64) {
        self.varint(((v << 1) ^ (v >> 63)) as u64);
    }
    pub fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.buf.extend_from_slice(b);
    }
    pub fn into_inner(self) -> Vec<u8> {
        self.buf
    }
}

pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8], what: &'static str) -> Self {
        Reader { data, pos: 0, what }
    }
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }
    fn truncated(&self) -> FormatError {
        FormatError::Truncated { what: self.what }
    }
    pub fn malformed(&self, detail: impl Into<String>) -> FormatError {
        FormatError::malformed(self.what, detail)
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.truncated());
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }
    pub fn u8(&mut self) -> Result<u8> {
        let v = self.array::<1>()?[0];
        #[cfg(test)]
        self.trace(self.pos - 1, trace::FieldKind::U8);
        Ok(v)
    }
    pub fn u32(&mut self) -> Result<u32> {
        let v = u32::from_le_bytes(self.array()?);
        #[cfg(test)]
        self.trace(self.pos - 4, trace::FieldKind::U32);
        Ok(v)
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn varint(&mut self) -> Result<u64> {
        #[cfg(test)]
        let start = self.pos;
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.array::<1>()?[0];
            let part = u64::from(b & 0x7f);
            if shift == 63 && part > 1 {
                return Err(self.malformed("varint overflows 64 bits"));
            }
            v |= part << shift;
            if b & 0x80 == 0 {
                #[cfg(test)]
                self.trace(start, trace::FieldKind::Varint);
                return Ok(v);
            }
        }
        Err(self.malformed("varint longer than 10 bytes"))
    }
    pub fn varint_i64(&mut self) -> Result<i64> {
        let u = self.varint()?;
        Ok(((u >> 1) as i64) ^ -((u & 1) as i64))
    }
    /// A varint that must fit `u32`.
    pub fn varint_u32(&mut self) -> Result<u32> {
        let v = self.varint()?;
        u32::try_from(v).map_err(|_| self.malformed("value does not fit 32 bits"))
    }
    /// A count of items each at least `min_item_len` bytes long: rejects counts the
    /// remaining input cannot hold, so callers may `Vec::with_capacity(count)`.
    pub fn count(&mut self, min_item_len: usize, cap: usize) -> Result<usize> {
        let n = self.varint()?;
        let n = usize::try_from(n).map_err(|_| self.malformed("count too large"))?;
        if n > cap {
            return Err(self.malformed(format!("count {n} exceeds limit {cap}")));
        }
        if n.saturating_mul(min_item_len.max(1)) > self.remaining() {
            return Err(self.truncated());
        }
        Ok(n)
    }
    pub fn bytes(&mut self, cap: usize) -> Result<&'a [u8]> {
        let n = self.varint()?;
        if n > cap as u64 {
            return Err(self.malformed(format!("length {n} exceeds limit {cap}")));
        }
        self.take(n as usize)
    }
    /// Records the field just read (test builds only): the fuzzer mutates fields
    /// where the decoder found them.
    #[cfg(test)]
    fn trace(&self, start: usize, kind: trace::FieldKind) {
        trace::record(self.data.as_ptr() as usize + start, self.pos - start, kind);
    }

    pub fn finish(&self) -> Result<()> {
        if self.remaining() != 0 {
            return Err(self.malformed(format!("{} trailing bytes", self.remaining())));
        }
        Ok(())
    }
}

/// Where a decoder found its fields, for the structure-aware fuzzer (`fuzz.rs`):
/// while [`trace::capture`] runs, every integer a [`Reader`] reads is recorded by
/// address, so fields of nested readers (tree nodes, a pending record's index) are
/// found too.
#[cfg(test)]
pub(crate) mod trace {
    use std::cell::RefCell;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum FieldKind {
        U8,
        U32,
        Varint,
    }

    /// A field at `offset` (in the buffer given to [`capture`]) of `len` bytes.
    #[derive(Clone, Copy, Debug)]
    pub struct Field {
        pub offset: usize,
        pub len: usize,
        pub kind: FieldKind,
    }

    thread_local! {
        static FIELDS: RefCell<Option<Vec<(usize, usize, FieldKind)>>> = const { RefCell::new(None) };
    }

    pub(super) fn record(addr: usize, len: usize, kind: FieldKind) {
        // try_with: a reader may run while the thread is being torn down.
        let _ = FIELDS.try_with(|f| {
            if let Some(v) = f.borrow_mut().as_mut() {
                v.push((addr, len, kind));
            }
        });
    }

    /// Runs `decode` on `data` and returns the fields it read within `data`.
    pub fn capture<R>(data: &[u8], decode: impl FnOnce(&[u8]) -> R) -> (R, Vec<Field>) {
        FIELDS.with(|f| *f.borrow_mut() = Some(Vec::new()));
        let out = decode(data);
        let raw = FIELDS.with(|f| f.borrow_mut().take()).unwrap_or_default();
        let base = data.as_ptr() as usize;
        let fields = raw
            .into_iter()
            .filter(|&(addr, len, _)| addr >= base && addr + len <= base + data.len())
            .map(|(addr, len, kind)| Field {
                offset: addr - base,
                len,
                kind,
            })
            .collect();
        (out, fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn varints_round_trip(v: u64, s: i64) {
            let mut w = Writer::new();
            w.varint(v);
            w.varint_i64(s);
            let buf = w.into_inner();
            let mut r = Reader::new(&buf, "test");
            prop_assert_eq!(r.varint().unwrap(), v);
            prop_assert_eq!(r.varint_i64().unwrap(), s);
            prop_assert!(r.finish().is_ok());
        }

        #[test]
        fn reader_never_panics(data: Vec<u8>) {
            let mut r = Reader::new(&data, "test");
            let _ = r.varint();
            let _ = r.bytes(1000);
            let _ = r.count(8, 1000);
            let _ = r.u64();
        }
    }
}
