//! The files a source install owns: what each should hold, its
//! fingerprint in the manifest, and removal only of what is still exactly
//! what install wrote (an admin's edit is never removed).

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::state::atomic::{self, Replacement};
use crate::state::manifest::InstalledFile;

/// One file a source install puts in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileContent {
    Bytes(Vec<u8>, u32),
    Symlink(String),
}

impl FileContent {
    pub fn fingerprint(&self) -> String {
        let (kind, bytes) = match self {
            FileContent::Bytes(b, mode) => (format!("file {mode:o}"), b.as_slice()),
            FileContent::Symlink(t) => ("symlink".to_string(), t.as_bytes()),
        };
        format!("{kind} {:016x}", crate::unit_text::fnv1a(bytes))
    }

    /// Whether `path` already holds exactly this.
    pub fn is_at(&self, path: &Path) -> bool {
        match self {
            FileContent::Bytes(bytes, mode) => {
                fs::symlink_metadata(path).is_ok_and(|m| {
                    m.is_file() && m.permissions().mode() & 0o7777 == *mode && m.len() == bytes.len() as u64
                }) && fs::read(path).is_ok_and(|b| &b == bytes)
            }
            FileContent::Symlink(target) => fs::read_link(path).is_ok_and(|t| t == Path::new(target)),
        }
    }
}

pub fn fingerprint_of(path: &Path) -> Option<String> {
    let meta = fs::symlink_metadata(path).ok()?;
    let content = if meta.file_type().is_symlink() {
        FileContent::Symlink(fs::read_link(path).ok()?.to_string_lossy().into_owned())
    } else {
        FileContent::Bytes(fs::read(path).ok()?, meta.permissions().mode() & 0o7777)
    };
    Some(content.fingerprint())
}

/// Written atomically, like berth's other state.
pub fn write(path: &Path, content: &FileContent) -> io::Result<()> {
    atomic::replace(
        path,
        &match content {
            FileContent::Bytes(bytes, mode) => Replacement::File(bytes, *mode),
            FileContent::Symlink(target) => Replacement::Symlink(target),
        },
    )
}

/// Removes `path` (gone already is fine) and its drop-in or wants
/// directory when that is left empty.
pub fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
    // Drop-in and wants directories install created: gone when empty.
    if let Some(dir) = path.parent()
        && dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(".d") || n.ends_with(".wants"))
    {
        let _ = fs::remove_dir(dir);
    }
    Ok(())
}

/// What [`remove_if_unchanged`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    Removed,
    /// Not there any more.
    Absent,
    /// Changed since install wrote it: left in place.
    Changed,
}

/// Removes a file install wrote, only if it still holds what install wrote.
pub fn remove_if_unchanged(f: &InstalledFile) -> io::Result<Removal> {
    match fingerprint_of(&f.path) {
        None => Ok(Removal::Absent),
        Some(fp) if fp == f.fingerprint => remove(&f.path).map(|()| Removal::Removed),
        Some(_) => Ok(Removal::Changed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_files_are_recognized_and_fingerprinted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b.service");
        let content = FileContent::Bytes(b"[Unit]\n".to_vec(), 0o644);
        assert!(!content.is_at(&path));
        write(&path, &content).unwrap();
        assert!(content.is_at(&path));
        assert_eq!(fingerprint_of(&path), Some(content.fingerprint()));
        assert!(!FileContent::Bytes(b"[Unit]\n".to_vec(), 0o755).is_at(&path));
        let link = dir.path().join("a/x.wants/l");
        let target = FileContent::Symlink("../b.service".into());
        write(&link, &target).unwrap();
        assert!(target.is_at(&link));
        remove(&link).unwrap();
        assert!(
            !dir.path().join("a/x.wants").exists(),
            "an emptied .wants directory goes too"
        );
    }

    #[test]
    fn only_unchanged_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.service");
        let content = FileContent::Bytes(b"[Unit]\n".to_vec(), 0o644);
        write(&path, &content).unwrap();
        let recorded = InstalledFile {
            path: path.clone(),
            fingerprint: content.fingerprint(),
        };
        fs::write(&path, "[Unit]\n# an admin's edit\n").unwrap();
        assert_eq!(remove_if_unchanged(&recorded).unwrap(), Removal::Changed);
        assert!(path.exists());
        write(&path, &content).unwrap();
        assert_eq!(remove_if_unchanged(&recorded).unwrap(), Removal::Removed);
        assert_eq!(remove_if_unchanged(&recorded).unwrap(), Removal::Absent);
    }
}
