use crate::{Backend, BackendError, ObjectInfo, Result};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// An in-memory backend for tests.
#[derive(Debug, Default)]
pub struct MemBackend {
    objects: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl MemBackend {
    pub fn new() -> Self {
        Self::default()
    }
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<u8>>> {
        // A panic while holding the lock cannot leave the map half-updated.
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Backend for MemBackend {
    fn location(&self) -> String {
        "memory".into()
    }
    fn size(&self, name: &str) -> Result<u64> {
        (self.map().get(name))
            .map(|d| d.len() as u64)
            .ok_or_else(|| BackendError::not_found("get", name))
    }
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.map().insert(name.to_string(), data.to_vec());
        Ok(())
    }
    fn put_new(&self, name: &str, data: &[u8]) -> Result<()> {
        let mut m = self.map();
        if m.contains_key(name) {
            return Err(BackendError::already_exists("put", name));
        }
        m.insert(name.to_string(), data.to_vec());
        Ok(())
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.map()
            .get(name)
            .cloned()
            .ok_or_else(|| BackendError::not_found("get", name))
    }
    fn get_bounded(&self, name: &str, max: u64) -> Result<Vec<u8>> {
        let m = self.map();
        let d = m
            .get(name)
            .ok_or_else(|| BackendError::not_found("get", name))?;
        if d.len() as u64 > max {
            return Err(BackendError::too_large("get", name, d.len() as u64, max));
        }
        Ok(d.clone())
    }
    fn get_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        let m = self.map();
        let d = m
            .get(name)
            .ok_or_else(|| BackendError::not_found("get", name))?;
        let end = offset.checked_add(length).filter(|e| *e <= d.len() as u64);
        match end {
            Some(end) => Ok(d[offset as usize..end as usize].to_vec()),
            None => Err(BackendError {
                kind: crate::BackendErrorKind::OutOfRange,
                op: "get range",
                path: name.into(),
                message: "range beyond end of object".into(),
            }),
        }
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        Ok(self
            .map()
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| ObjectInfo {
                name: k.clone(),
                size: v.len() as u64,
            })
            .collect())
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.map()
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| BackendError::not_found("delete", name))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn conformance() {
        crate::conformance::run(&super::MemBackend::new());
    }
}
