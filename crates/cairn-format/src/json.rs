//! Rules shared by the JSON objects (config, key files, snapshots, locks).
//!
//! - The `version` member is read first, on its own, so that a newer object is
//!   reported as "made by a newer version of cairn" even when its other members have
//!   changed shape beyond what the full parse accepts.
//! - Members this code does not know are ignored when reading. Only the config is
//!   rewritten by a reader that did not create it (a policy change), so only the
//!   config keeps them ([`UnknownFields`]): an older cairn changing the compression
//!   must not drop a newer one's settings. Anything a reader must understand to read
//!   a repository correctly is announced by a name in the config's `features`.

use crate::error::{Result, check_version};
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use std::fmt;

/// Checks the `version` member of a JSON object before the full parse. Input whose
/// version cannot be read this way is left to the full parse to reject.
pub(crate) fn check_json_version(what: &'static str, data: &[u8], supported: u32) -> Result<()> {
    #[derive(Deserialize)]
    struct Probe {
        version: Option<u64>,
    }
    match serde_json::from_slice::<Probe>(data) {
        Ok(Probe { version: Some(v) }) => check_version(what, v, 1, supported.into()),
        _ => Ok(()),
    }
}

/// Members of a JSON object that the reading code does not know, kept as their exact
/// JSON text in the order they appeared, so that rewriting the object keeps them.
#[derive(Clone, Debug, Default)]
pub struct UnknownFields(Vec<(String, Box<RawValue>)>);

impl UnknownFields {
    /// Collects the members of the JSON object `body` whose names are not in
    /// `known`. Costs about the size of the unknown members (their text is copied
    /// once, never expanded into a tree of values).
    pub(crate) fn collect(body: &[u8], known: &'static [&'static str]) -> serde_json::Result<Self> {
        struct Collect(&'static [&'static str]);
        impl<'de> Visitor<'de> for Collect {
            type Value = UnknownFields;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UnknownFields, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    if self.0.contains(&key.as_str()) {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    } else {
                        out.push((key, map.next_value::<Box<RawValue>>()?));
                    }
                }
                Ok(UnknownFields(out))
            }
        }
        let mut de = serde_json::Deserializer::from_slice(body);
        let fields = de.deserialize_map(Collect(known))?;
        de.end()?;
        Ok(fields)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Names of the unknown members, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }

    /// Adds a member (for tests and tools that build a config with settings of a
    /// newer cairn); `json` must be one JSON value.
    pub fn insert(&mut self, name: impl Into<String>, json: &str) -> serde_json::Result<()> {
        let value = RawValue::from_string(json.to_owned())?;
        self.0.push((name.into(), value));
        Ok(())
    }
}

impl PartialEq for UnknownFields {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|((ka, va), (kb, vb))| ka == kb && va.get() == vb.get())
    }
}

impl Eq for UnknownFields {}

/// Written as the members they were (used with `#[serde(flatten)]`).
impl Serialize for UnknownFields {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// Never read through serde: [`UnknownFields::collect`] reads them from the raw
/// text. This impl lets the containing struct derive `Deserialize` and yields
/// nothing, ignoring the input without buffering it.
impl<'de> Deserialize<'de> for UnknownFields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d)?;
        Ok(UnknownFields::default())
    }
}
