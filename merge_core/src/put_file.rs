//! A whole object into place: the local blob store's `put` in one call, so the
//! caller's thread gives up the GIL once for the folder, the write, the fsyncs
//! and the rename instead of taking it back after each system call (under a
//! busy event loop each of those waits was the cost, not the I/O).

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::errors::MergeError;

/// The object's mode: every tenant's data, readable by the service alone.
const FILE_MODE: u32 = 0o600;
/// Its folders' mode.
const DIR_MODE: u32 = 0o700;

/// Writes `data` to `staged` (a new 0600 file beside `path`), fsyncs it when
/// `fsync` is set, renames it over `path`, then fsyncs `path`'s folder and each
/// of `folders`, in order (the caller's folders whose entries are not durable
/// yet). `path`'s folder and any missing parent are made 0700 first; an existing
/// one with looser bits is tightened.
///
/// Before the rename any error removes `staged`: no partial file is left, and
/// `path` is untouched. After it, `path` holds the bytes and the error is one
/// of the folder fsyncs.
pub fn put_file(
    path: &Path,
    staged: &Path,
    data: &[u8],
    fsync: bool,
    folders: &[PathBuf],
) -> Result<(), MergeError> {
    let folder = path.parent().unwrap_or(Path::new("/"));
    private_dir(folder)?;
    write_staged(staged, data, fsync)?;
    if let Err(e) = fs::rename(staged, path) {
        let _ = fs::remove_file(staged);
        return Err(MergeError::io(None, staged, "rename", e));
    }
    if fsync {
        sync_dir(folder)?;
        for parent in folders {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

/// A new file at `staged` holding `data`; removed again on any error after it was
/// made (a name taken already is someone else's and stays).
fn write_staged(staged: &Path, data: &[u8], fsync: bool) -> Result<(), MergeError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(staged)
        .map_err(|e| MergeError::io(None, staged, "open", e))?;
    let filled =
        file.write_all(data).map_err(|e| MergeError::io(None, staged, "write", e)).and_then(
            |()| match fsync {
                true => file.sync_all().map_err(|e| MergeError::io(None, staged, "fsync", e)),
                false => Ok(()),
            },
        );
    if filled.is_err() {
        drop(file);
        let _ = fs::remove_file(staged);
    }
    filled
}

/// Makes `folder` (and missing parents) 0700; tightens an existing one.
fn private_dir(folder: &Path) -> Result<(), MergeError> {
    match DirBuilder::new().mode(DIR_MODE).create(folder) {
        // The mode given to mkdir is filtered by the umask; chmod's is not.
        Ok(()) => set_mode(folder),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = fs::metadata(folder).map_err(|e| MergeError::io(None, folder, "stat", e))?;
            if meta.is_dir() && meta.permissions().mode() & 0o077 != 0 {
                set_mode(folder)?;
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match folder.parent() {
            Some(parent) if parent != folder => {
                private_dir(parent)?;
                private_dir(folder)
            }
            _ => Err(MergeError::io(None, folder, "mkdir", e)),
        },
        Err(e) => Err(MergeError::io(None, folder, "mkdir", e)),
    }
}

fn set_mode(folder: &Path) -> Result<(), MergeError> {
    fs::set_permissions(folder, fs::Permissions::from_mode(DIR_MODE))
        .map_err(|e| MergeError::io(None, folder, "chmod", e))
}

fn sync_dir(folder: &Path) -> Result<(), MergeError> {
    fs::File::open(folder)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| MergeError::io(None, folder, "fsync", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("put_file_{name}_{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn puts_the_bytes_0600_in_new_0700_folders_and_leaves_no_staged_file() {
        let root = scratch("new");
        let path = root.join("files/f1/u1");
        let staged = root.join("files/f1/.u1.x.tmp");
        put_file(&path, &staged, b"hello", true, &[root.join("files"), root.clone()]).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"hello");
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&root.join("files")), 0o700);
        assert_eq!(mode(&root.join("files/f1")), 0o700);
        assert!(!staged.exists());
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn replaces_an_existing_object_and_tightens_its_folder() {
        let root = scratch("replace");
        let folder = root.join("k");
        fs::create_dir(&folder).unwrap();
        fs::set_permissions(&folder, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(folder.join("o"), b"old").unwrap();
        put_file(&folder.join("o"), &folder.join(".o.tmp"), b"new", false, &[]).unwrap();
        assert_eq!(fs::read(folder.join("o")).unwrap(), b"new");
        assert_eq!(mode(&folder), 0o700);
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_staged_name_taken_fails_before_anything_changes() {
        let root = scratch("taken");
        let (path, staged) = (root.join("o"), root.join(".o.tmp"));
        fs::write(&path, b"old").unwrap();
        fs::write(&staged, b"someone else's").unwrap();
        let err = put_file(&path, &staged, b"new", true, &[]).unwrap_err();
        assert!(matches!(err, MergeError::Io { op: "open", .. }), "{err}");
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(fs::read(&staged).unwrap(), b"someone else's");
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_failed_rename_removes_the_staged_file() {
        let root = scratch("rename");
        let path = root.join("o");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("inside"), b"x").unwrap(); // a non-empty folder: rename fails
        let staged = root.join(".o.tmp");
        let err = put_file(&path, &staged, b"new", true, &[]).unwrap_err();
        assert!(matches!(err, MergeError::Io { op: "rename", .. }), "{err}");
        assert!(!staged.exists());
        fs::remove_dir_all(root).unwrap();
    }
}
