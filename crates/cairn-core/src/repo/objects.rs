//! Sealed objects stored under the hash of their bytes (index files, pending
//! deletions), pack listings and blob reads.

use super::*;

/// An object larger than its kind may be is damage (or an attack), named as such;
/// so is something not a file in its place.
pub(crate) fn too_large_is_damage(e: cairn_backend::BackendError, what: &str) -> Error {
    if matches!(
        e.kind,
        cairn_backend::BackendErrorKind::TooLarge | cairn_backend::BackendErrorKind::NotAFile
    ) {
        return Error::damaged(what, FormatError::malformed("object", e.message));
    }
    e.into()
}

/// Reads a listed small object (a lock, a key file) with the bound its listing
/// already shows: refused unread when the listing says it is too large, else one
/// read, whose length is checked again (it may have been replaced meanwhile).
pub(crate) fn get_listed(
    backend: &dyn Backend,
    o: &cairn_backend::ObjectInfo,
) -> cairn_backend::Result<Vec<u8>> {
    let max = MAX_SMALL_OBJECT_SIZE as u64;
    if o.size > max {
        return Err(cairn_backend::BackendError::too_large(
            "get", &o.name, o.size, max,
        ));
    }
    let data = backend.get(&o.name)?;
    if data.len() as u64 > max {
        return Err(cairn_backend::BackendError::too_large(
            "get",
            &o.name,
            data.len() as u64,
            max,
        ));
    }
    Ok(data)
}

/// Stores an immutable object under a name that is the hash of its bytes, never
/// replacing one: an object already stored under that name has these bytes (or is
/// damaged, which `check` finds), so `AlreadyExists` — a retried request whose first
/// attempt arrived, or two writers storing the same index record — counts as stored.
pub(crate) fn store_immutable(
    backend: &dyn Backend,
    name: &str,
    data: &[u8],
    metadata: bool,
) -> Result<()> {
    stored(if metadata {
        backend.put_metadata_new(name, data)
    } else {
        backend.put_new(name, data)
    })
}

/// As [`store_immutable`], handing the bytes over (a pack: see
/// [`Backend::put_new_owned`]).
pub(crate) fn store_immutable_owned(
    backend: &dyn Backend,
    name: &str,
    data: cairn_backend::Bytes,
    metadata: bool,
) -> Result<()> {
    stored(backend.put_new_owned(name, data, metadata))
}

/// A create-only put's outcome, `AlreadyExists` counting as stored.
fn stored(r: std::result::Result<(), cairn_backend::BackendError>) -> Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.is_already_exists() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The packs, with their sizes, of a listing of `data/`.
pub(crate) fn packs_of(
    listing: &[cairn_backend::ObjectInfo],
) -> std::collections::HashMap<PackId, u64> {
    listing
        .iter()
        .filter_map(|o| {
            PackId::from_hex(names::listed(&o.name))
                .ok()
                .map(|id| (id, o.size))
        })
        .collect()
}

/// The id of an index file from its object name (`index/<hex>` or
/// `index/admin-<hex>`); `None` for names that are not index files.
pub(crate) fn index_id_of(name: &str) -> Option<IndexId> {
    IndexId::from_hex(names::split_admin(names::listed(name)).1).ok()
}

impl Repository {
    /// Every index file's id, once (a file stored under both names, which only a
    /// hostile writer would do, is read under the plain one).
    pub fn list_index_files(&self) -> Result<Vec<IndexId>> {
        let mut ids: Vec<IndexId> = self
            .backend
            .list(names::INDEX)?
            .iter()
            .filter_map(|i| index_id_of(&i.name))
            .collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// Whether the repository marks objects that remove or hide data by name (the
    /// `admin-names` feature).
    pub fn admin_names(&self) -> bool {
        self.config
            .has_feature(cairn_format::consts::FEATURE_ADMIN_NAMES)
    }

    /// Deletes an index file under whichever name it has (plain or `admin-`), and
    /// its dedup list.
    pub(crate) fn delete_index_file(&self, id: &IndexId) -> Result<()> {
        let hex = id.to_hex();
        let mut found = false;
        for name in [names::index(&hex), names::admin_index(&hex)] {
            match self.backend.delete(&name) {
                Ok(()) => found = true,
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        if found {
            // Its dedup list after it (a list without its file is ignored).
            match self.backend.delete(&names::dedup(&hex)) {
                Ok(()) => Ok(()),
                Err(e) if e.is_not_found() => Ok(()),
                Err(e) => Err(e.into()),
            }
        } else {
            Err(cairn_backend::BackendError::not_found("delete", &names::index(&hex)).into())
        }
    }

    /// Reads an object stored under the BLAKE3 hash of its sealed bytes, checks the
    /// hash and opens the envelope. `what` names the object in errors.
    pub(crate) fn read_sealed_object(
        &self,
        name: &str,
        hash: &[u8; 32],
        kind: &'static str,
        what: &str,
        max: Option<u64>,
    ) -> Result<Vec<u8>> {
        let data = match max {
            Some(m) => self.backend.get_bounded(name, m),
            None => self.backend.get(name),
        }
        .map_err(|e| too_large_is_damage(e, what))?;
        if data.is_empty() {
            return Err(Error::damaged(what, FormatError::Empty));
        }
        if blake3::hash(&data).as_bytes() != hash {
            return Err(Error::damaged(
                what,
                FormatError::IdMismatch {
                    expected: hex::encode(hash),
                },
            ));
        }
        self.key
            .sealer
            .open(kind, &data)
            .map_err(|e| Error::damaged(what, e))
    }

    /// Reads an index file. In a repository with the `admin-names` feature, its
    /// `supersedes` and `forgotten` lists count only when it is stored as
    /// `index/admin-<id>`: under a plain name they are dropped, because an
    /// append-only writer (a backup token of `cairn serve`) may write plain index
    /// files and must not be able to hide other files or snapshots with them.
    /// There a plain file larger than any cairn writes
    /// ([`cairn_format::consts::MAX_WRITTEN_INDEX_FILE_SIZE`]) is junk such a
    /// writer stored: it counts as damaged, not downloaded (a hijacked client
    /// stored 1 GiB ones that every restore and check read).
    pub fn read_index_file(&self, id: &IndexId) -> Result<IndexFile> {
        let plain_max = if self.admin_names() {
            cairn_format::consts::MAX_WRITTEN_INDEX_FILE_SIZE
        } else {
            MAX_INDEX_FILE_SIZE
        };
        self.read_index_file_within(id, plain_max as u64)
    }

    /// [`Self::read_index_file`], taking a file stored under a plain name as
    /// damaged, unread, when it is larger than `plain_max` (an admin-named file
    /// may be as large as any index file).
    fn read_index_file_within(&self, id: &IndexId, plain_max: u64) -> Result<IndexFile> {
        let what = format!("index file {}", id.to_hex());
        let hex = id.to_hex();
        let read = |name: &str, max: u64| {
            self.read_sealed_object(name, &id.0, "index file", &what, Some(max))
        };
        let admin_names = self.admin_names();
        let (plain, admin) = match read(&names::index(&hex), plain_max) {
            Err(Error::Backend(e)) if e.is_not_found() && admin_names => (
                read(&names::admin_index(&hex), MAX_INDEX_FILE_SIZE as u64)?,
                true,
            ),
            r => (r?, false),
        };
        let mut file = match IndexFile::decode(&plain) {
            Ok(f) => f,
            // A plain file may be an append-only writer's, and a version number
            // is only its word: taken at it, one byte stopped every command with
            // "upgrade cairn" (`repair index` too). It is passed over as a file
            // that does not decode is, and the message still names the version.
            Err(e) if admin_names && !admin && e.needs_newer_cairn() => {
                return Err(Error::Damaged {
                    what: format!("{what} (stored under a name any client may use)"),
                    source: e,
                });
            }
            Err(e) => return Err(Error::damaged(&what, e)),
        };
        if admin_names && !admin {
            file.supersedes.clear();
            file.forgotten.clear();
        }
        Ok(file)
    }

    /// Upload threads for packs of this repository (index files named and listed
    /// as its features want).
    pub fn uploader(
        &self,
        pool: Arc<crate::repo::packer::BufferPool>,
    ) -> crate::repo::packer::Uploader {
        let mut u =
            crate::repo::packer::Uploader::start(self.backend.clone(), self.key.clone(), pool);
        u.set_admin_names(self.admin_names());
        u
    }

    /// An uploader for what adds data (backup, copy): it keeps
    /// [`crate::repo::room::room_for_prune`] free on storage that has a limit
    /// cairn can read.
    pub fn uploader_keeping_room(
        &self,
        pool: Arc<crate::repo::packer::BufferPool>,
    ) -> Result<crate::repo::packer::Uploader> {
        let mut u = self.uploader(pool);
        if let Some(room) = crate::repo::room::room_for_prune(self.backend.as_ref())? {
            u.keep_free(room);
        }
        Ok(u)
    }

    pub fn write_index_file(&self, file: &IndexFile) -> Result<IndexId> {
        crate::repo::packer::write_index_file(
            self.backend.as_ref(),
            &self.key,
            file,
            self.admin_names(),
        )
    }

    /// Every stored pack with its size.
    /// The blob entries of a pack of `size` bytes, from its own header (two
    /// ranged reads: the trailer, then the sealed header it points to).
    pub fn read_pack_header(
        &self,
        id: &PackId,
        size: u64,
    ) -> Result<Vec<cairn_format::index::IndexBlob>> {
        use cairn_format::pack;
        let what = format!("pack {}", id.to_hex());
        let name = names::pack(&id.to_hex());
        if size < PACK_TRAILER_LEN as u64 {
            return Err(Error::damaged(
                what,
                FormatError::malformed("pack", "too short to be a pack"),
            ));
        }
        let trailer = self.backend.get_range(
            &name,
            size - PACK_TRAILER_LEN as u64,
            PACK_TRAILER_LEN as u64,
        )?;
        let (off, len) =
            pack::parse_trailer(size, &trailer).map_err(|e| Error::damaged(&what, e))?;
        let sealed = self.backend.get_range(&name, off, u64::from(len))?;
        let plain = self
            .key
            .sealer
            .open("pack header", &sealed)
            .map_err(|e| Error::damaged(&what, e))?;
        let entries = pack::decode_header(&plain).map_err(|e| Error::damaged(&what, e))?;
        Ok(cairn_format::index::IndexBlob::from_header(entries))
    }

    pub fn list_packs(&self) -> Result<std::collections::HashMap<PackId, u64>> {
        Ok(packs_of(&self.backend.list(names::DATA)?))
    }

    pub fn list_pending(&self) -> Result<Vec<PendingId>> {
        Ok(self
            .backend
            .list(names::PENDING)?
            .iter()
            .filter_map(|i| PendingId::from_hex(names::listed(&i.name)).ok())
            .collect())
    }

    pub fn read_pending(&self, id: &PendingId) -> Result<PendingDeletion> {
        let what = format!("pending deletion {}", id.to_hex());
        let plain = self.read_sealed_object(
            &names::pending(&id.to_hex()),
            &id.0,
            "pending deletion",
            &what,
            Some(cairn_format::consts::MAX_PENDING_RECORD_SIZE),
        )?;
        PendingDeletion::decode(&plain).map_err(|e| Error::damaged(what, e))
    }

    pub fn write_pending(&self, p: &PendingDeletion) -> Result<PendingId> {
        let sealed = self.key.sealer.seal(&p.encode());
        let id = PendingId::of_content(&sealed);
        store_immutable(
            self.backend.as_ref(),
            &names::pending(&id.to_hex()),
            &sealed,
            false,
        )?;
        Ok(id)
    }

    // ---- blobs ----

    pub fn read_pack_range(&self, pack: &PackId, offset: u64, length: u64) -> Result<Vec<u8>> {
        Ok(self
            .backend
            .get_range(&names::pack(&pack.to_hex()), offset, length)?)
    }

    /// [`Repository::read_pack_range`] into a buffer the caller keeps for the next
    /// range (see [`cairn_backend::Backend::get_range_into`]).
    pub fn read_pack_range_into(
        &self,
        pack: &PackId,
        offset: u64,
        length: u64,
        out: &mut cairn_backend::bufpool::Pooled,
    ) -> Result<()> {
        Ok(self
            .backend
            .get_range_into(&names::pack(&pack.to_hex()), offset, length, out)?)
    }

    /// Reads, opens, decompresses and verifies one blob; when the copy the index
    /// gives first cannot be read or does not hold the blob, its other copies
    /// (see [`crate::index::MasterIndex::copies`]).
    pub fn read_blob(&self, id: &BlobId) -> Result<Vec<u8>> {
        let loc = self.index.get(id).ok_or_else(|| {
            match self.index.ssd().and_then(|s| s.failures()) {
                Some((_, error)) => Error::LocalIndexFailed { blob: *id, error },
                None => Error::BlobNotFound(*id),
            }
        })?;
        let r = self
            .read_blob_at(id, &loc)
            .or_else(|e| self.read_other_copy(id, |l| *l == loc).ok_or(e));
        // Damaged, gone, or in a pack cut short: lost where it lies (review r34:
        // a truncated pack's "out of range" was taken for a store that failed).
        // A store that could not be reached says nothing about the blob.
        if let Err(e) = &r
            && e.is_lost_in_storage()
        {
            let gone = matches!(e.root(), Error::PackMissing { .. });
            self.index.found_unreadable(id, gone.then_some(&loc));
        }
        r
    }

    /// The blob from a copy other than those `tried` says were read already, if
    /// another copy holds it (see `BlobLocation::is_entry`).
    pub fn read_other_copy(
        &self,
        id: &BlobId,
        tried: impl Fn(&crate::index::BlobLocation) -> bool,
    ) -> Option<Vec<u8>> {
        self.index
            .copies(id)
            .into_iter()
            .filter(|l| !tried(l))
            .find_map(|l| self.read_blob_at(id, &l).ok())
    }

    /// One copy of a blob, read and verified (no other copy tried).
    pub(crate) fn read_blob_at(
        &self,
        id: &BlobId,
        loc: &crate::index::BlobLocation,
    ) -> Result<Vec<u8>> {
        let pack = self.index.pack_of(loc);
        let name = names::pack(&pack.to_hex());
        let (offset, length) = (loc.offset.into(), loc.length.into());
        let sealed = if loc.kind == cairn_format::pack::BlobKind::Data {
            self.backend.get_range(&name, offset, length)
        } else {
            self.backend.get_metadata_range(&name, offset, length)
        };
        let sealed = sealed.map_err(Error::from).map_err(|e| match e {
            Error::Backend(b) if b.is_not_found() => Error::PackMissing {
                pack: pack.short(),
                blob: id.short(),
            },
            e => e,
        })?;
        blob::decode(&self.key, id, &sealed, loc.raw_length, loc.compression)
    }

    pub fn load_tree(&self, id: &BlobId) -> Result<Tree> {
        let data = self.read_blob(id)?;
        Tree::decode(&data).map_err(|e| Error::damaged(format!("tree {}", id.short()), e))
    }

    pub fn load_chunk_list(&self, id: &BlobId) -> Result<ChunkList> {
        let data = self.read_blob(id)?;
        ChunkList::decode(&data)
            .map_err(|e| Error::damaged(format!("chunk list {}", id.short()), e))
    }
}

#[cfg(test)]
mod tests {
    use cairn_format::pack::BlobKind;

    /// A blob that fails to read because it is damaged, or its pack is cut short
    /// or gone, is no longer live (a backup stores it again); a pack gone takes
    /// its other blobs with it; the blobs that read stay live (QA r33, review r34).
    #[test]
    fn blobs_found_lost_are_not_live() {
        let mut repo = crate::testutil::mem_repo();
        let blobs = |seed: u8| -> Vec<(BlobKind, Vec<u8>)> {
            (0..3u8)
                .map(|i| (BlobKind::Tree, vec![seed ^ i; 300 + usize::from(i) * 50]))
                .collect()
        };
        let (a, b, c) = (blobs(1), blobs(2), blobs(3));
        let packs: Vec<_> = [&a, &b, &c]
            .iter()
            .map(|x| crate::testutil::store(&repo, x))
            .collect();
        repo.write_index_file(&cairn_format::index::IndexFile {
            packs: packs.clone(),
            ..Default::default()
        })
        .unwrap();
        repo.load_index_in_ram().unwrap();
        let id = |d: &[u8]| repo.key().blob_id(d);
        let name = |i: usize| cairn_backend::names::pack(&packs[i].id.to_hex());
        let live = |x: &[(BlobKind, Vec<u8>)]| -> Vec<bool> {
            x.iter()
                .map(|(_, d)| repo.index().is_live(&id(d)))
                .collect()
        };
        // Pack A: its first blob damaged. Pack B: cut short before its last blob.
        // Pack C: gone.
        let mut bytes = repo.backend().get(&name(0)).unwrap();
        let hit = &packs[0].blobs[0];
        bytes[(hit.offset + hit.length / 2) as usize] ^= 0x40;
        repo.backend().put(&name(0), &bytes).unwrap();
        let bytes = repo.backend().get(&name(1)).unwrap();
        let cut = packs[1].blobs[2].offset as usize + 10;
        repo.backend().put(&name(1), &bytes[..cut]).unwrap();
        repo.backend().delete(&name(2)).unwrap();
        for x in [&a, &b, &c] {
            assert_eq!(live(x), vec![true; 3]);
            for (_, d) in x.iter() {
                let _ = repo.read_blob(&id(d));
            }
        }
        assert_eq!(live(&a), vec![false, true, true]);
        assert_eq!(live(&b), vec![true, true, false]);
        assert_eq!(live(&c), vec![false; 3]);
    }
}
