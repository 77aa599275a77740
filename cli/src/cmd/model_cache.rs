//! bench's model cache: the default synthetic model, generated once and
//! reused while its bytes match the digest recorded when it was written.
//!
//! * **Where.** `$WEIGHTMAP_CACHE`, else `target/weightmap-cache` under the
//!   current directory, else the user's cache directory
//!   (`$XDG_CACHE_HOME/weightmap` or `~/.cache/weightmap`; Windows:
//!   `%LOCALAPPDATA%\weightmap`), else `<temp>/weightmap-cache-<uid>`
//!   (Windows: `%TEMP%\weightmap-cache`, the temporary directory being the
//!   user's own there). Whichever it is, it must pass the transform
//!   cache's rules (`weightmap::cache::ensure_private_dir`): on Unix this
//!   user's, closed to other users' writes (and made private if others
//!   could read it), on a path no other user can redirect, so another user
//!   cannot plant files or links in it. Windows has no mode bits and a
//!   directory's owner is often a group (Administrators) rather than the
//!   user, so there the directory's inherited ACL is relied on, as for any
//!   file the user creates.
//! * **How.** The model is written by [`crate::synth`] under a unique
//!   temporary name and renamed into place; then a sidecar `MODEL.sha256`
//!   (`sha256sum` format) is written the same way. Two benches racing on an
//!   empty cache each generate and rename; the generator is deterministic,
//!   so both renames leave the same bytes.
//! * **Reuse.** Only if the sidecar exists and the file's sha256 matches it;
//!   anything else (missing, truncated, corrupted) is regenerated.
//! * **Page cache.** A model just generated is dropped from the page cache,
//!   so that the bench reads it as it would a stored model.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use crate::outfile::OutFile;
use crate::synth::{GenSpec, GENERATOR_VERSION};
use sha2::{Digest, Sha256};
use weightmap::Format;

use super::gen::generate_with_progress;
use super::{human_bytes, CliError, CliResult};

/// The default model for `format`, generated into the cache if missing or
/// if its bytes do not match its recorded digest.
pub fn default_model(format: Format) -> CliResult<PathBuf> {
    let spec = GenSpec {
        format,
        ..GenSpec::default()
    };
    cached_model(&spec, &cache_dir()?)
}

/// The model `spec` describes, in `dir`: reused if its digest matches,
/// else generated.
fn cached_model(spec: &GenSpec, dir: &Path) -> CliResult<PathBuf> {
    let key = Sha256::digest(format!("weightmap gen v{GENERATOR_VERSION} {spec:?}").as_bytes());
    let ext = match spec.format {
        Format::Gguf => "gguf",
        Format::Safetensors => "safetensors",
    };
    let name = format!("default-{}.{ext}", &format!("{key:x}")[..16]);
    let path = dir.join(&name);
    let sidecar = dir.join(format!("{name}.sha256"));
    let shown = std::path::absolute(&path).unwrap_or_else(|_| path.clone());
    let model_existed = fs::symlink_metadata(&path).is_ok();
    match verify(&path, &sidecar) {
        Ok(true) => {
            eprintln!("bench: using the cached default model {}", shown.display());
            return Ok(path);
        }
        Ok(false) => {}
        Err(CliError::Msg(e)) => eprintln!("bench: not reusing {}: {e}", shown.display()),
        Err(e) => return Err(e),
    }
    let plan = crate::synth::plan(spec)?;
    eprintln!(
        "bench: generating the default model ({} of tensors) at {}",
        human_bytes(plan.tensor_bytes),
        shown.display()
    );
    if let Err(e) = generate_with_progress(spec, &path, "bench: generating") {
        // Where a rename cannot replace a file another process has open
        // (Windows), a bench racing this one that put the model in place
        // first, and is reading it, makes this rename fail. A model that
        // appeared while this one was generated was renamed in whole, by
        // the same deterministic generator: take it.
        let appeared = || !model_existed && fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
        let interrupted = || super::signals::stop_flag().load(std::sync::atomic::Ordering::SeqCst);
        if !sys::RENAME_OVER_AN_OPEN_FILE_FAILS || !appeared() || interrupted() {
            return Err(e);
        }
        eprintln!(
            "bench: another bench wrote {} first; using it",
            shown.display()
        );
    }
    let digest = sha256_file(&path)?;
    if let Err(e) = write_digest(&sidecar, &format!("{digest}  {name}\n")) {
        // Likewise for the digest: a racer's, read or written as this one
        // was renamed over it, is as good if it matches.
        if !sys::RENAME_OVER_AN_OPEN_FILE_FAILS || !verify(&path, &sidecar).is_ok_and(|ok| ok) {
            return Err(e);
        }
    }
    // The generator's writes leave the page cache in folios the size of
    // its write calls, mostly base pages, where a model read from storage
    // lands in large folios that map as huge pages (ARCHITECTURE.md, "Huge
    // pages for the weights"). Drop them, so that bench's warm-up read
    // fills the cache as reading a stored model does. Where the platform
    // cannot drop a file's pages, the runs find the generator's.
    let _ = weightmap::evict(&path);
    Ok(path)
}

/// Write `line` to `sidecar` through an [`OutFile`].
fn write_digest(sidecar: &Path, line: &str) -> CliResult {
    let out = OutFile::create(sidecar)?;
    out.file()
        .write_all(line.as_bytes())
        .map_err(|e| CliError::msg(format!("write {}: {e}", sidecar.display())))?;
    out.commit()?;
    Ok(())
}

/// Whether `path` is a regular file whose sha256 is the one `sidecar`
/// records. `Ok(false)` when either is missing.
fn verify(path: &Path, sidecar: &Path) -> CliResult<bool> {
    let recorded = match fs::read_to_string(sidecar) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(CliError::msg(format!("read {}: {e}", sidecar.display()))),
    };
    let Some(want) = recorded.split_whitespace().next() else {
        return Ok(false);
    };
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(CliError::msg(format!("stat {}: {e}", path.display()))),
    }
    let got = sha256_file(path)?;
    if got != want {
        eprintln!(
            "bench: {} does not match its recorded sha256; regenerating",
            path.display()
        );
        return Ok(false);
    }
    Ok(true)
}

/// The file's sha256, as lowercase hex.
fn sha256_file(path: &Path) -> CliResult<String> {
    let err = |e: io::Error| CliError::msg(format!("read {}: {e}", path.display()));
    let mut f = File::open(path).map_err(err)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(err(e)),
        }
    }
    Ok(format!("{:x}", h.finalize()))
}

/// The cache directory (see the module docs), created if missing.
pub fn cache_dir() -> CliResult<PathBuf> {
    if let Some(d) = std::env::var_os("WEIGHTMAP_CACHE").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        return owned_dir(&d).map(|()| d);
    }
    let local = Path::new("target").join("weightmap-cache");
    if writable(&local) {
        return Ok(local);
    }
    let user = weightmap::cache::user_cache_dir();
    if let Some(d) = user.filter(|d| writable(d)) {
        return Ok(d);
    }
    let tmp = std::env::temp_dir().join(sys::temp_name());
    owned_dir(&tmp).map(|()| tmp)
}

/// Create `dir` if missing and check it by the transform cache's rules
/// (`weightmap::cache::ensure_private_dir`: no other user may write in it
/// or redirect its path; one others could read is made private).
fn owned_dir(dir: &Path) -> CliResult<()> {
    weightmap::cache::ensure_private_dir(dir).map_err(|e| {
        CliError::msg(format!(
            "cache directory {}: {e}; set WEIGHTMAP_CACHE to a directory of your own",
            dir.display()
        ))
    })
}

#[cfg(unix)]
mod sys {
    /// A rename replaces a file others have open (they keep the old one).
    pub const RENAME_OVER_AN_OPEN_FILE_FAILS: bool = false;

    /// The temporary-directory fallback's name: one per user.
    pub fn temp_name() -> String {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        format!("weightmap-cache-{uid}")
    }
}

#[cfg(windows)]
mod sys {
    /// `MoveFileExW` cannot replace a file another process has open (std's
    /// retry with POSIX semantics can, on NTFS since Windows 10 1709 only).
    pub const RENAME_OVER_AN_OPEN_FILE_FAILS: bool = true;

    /// The temporary-directory fallback's name: `%TEMP%` is the user's own.
    pub fn temp_name() -> String {
        "weightmap-cache".to_owned()
    }
}

/// Whether `dir` is (or can be made) a directory of this user's that it
/// can create files in.
fn writable(dir: &Path) -> bool {
    if owned_dir(dir).is_err() {
        return false;
    }
    OutFile::create(&dir.join(".probe")).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use weightmap::TensorType;

    fn small() -> GenSpec {
        GenSpec {
            size: 1 << 20,
            tensors: 12,
            vocab: 300,
            types: vec![TensorType::F32, TensorType::Q8_0],
            ..GenSpec::default()
        }
    }

    #[test]
    fn two_racing_benches_on_an_empty_cache_both_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let spec = small();
        let d = dir.path().to_owned();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (spec, d) = (spec.clone(), d.clone());
                std::thread::spawn(move || cached_model(&spec, &d).map_err(|e| format!("{e:?}")))
            })
            .collect();
        let paths: Vec<PathBuf> = threads
            .into_iter()
            .map(|t| t.join().unwrap().unwrap())
            .collect();
        assert_eq!(paths[0], paths[1]);
        let sidecar = format!("{}.sha256", paths[0].display());
        assert!(verify(&paths[0], Path::new(&sidecar)).unwrap());
        let names: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "the model and its digest only: {names:?}");
    }

    #[test]
    fn a_corrupted_cache_file_is_regenerated() {
        let dir = tempfile::tempdir().unwrap();
        let spec = small();
        let path = cached_model(&spec, dir.path()).unwrap();
        let good = fs::read(&path).unwrap();
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0x55; // same size, different bytes
        fs::write(&path, &bad).unwrap();
        let sidecar = PathBuf::from(format!("{}.sha256", path.display()));
        assert!(!verify(&path, &sidecar).unwrap());
        assert_eq!(cached_model(&spec, dir.path()).unwrap(), path);
        assert_eq!(fs::read(&path).unwrap(), good);
        // A missing digest is not trusted either.
        fs::remove_file(&sidecar).unwrap();
        assert!(!verify(&path, &sidecar).unwrap());
    }

    #[test]
    fn a_file_where_the_directory_should_be_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, b"x").unwrap();
        assert!(owned_dir(&file).is_err());
        assert!(owned_dir(&dir.path().join("a/b")).is_ok());
        assert!(dir.path().join("a/b").is_dir());
    }

    #[cfg(unix)]
    #[test]
    fn a_shared_or_foreign_directory_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(owned_dir(&open).is_err(), "others may write in it");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&open, &link).unwrap();
        assert!(owned_dir(&link).is_err(), "a link to it is refused too");
        let readable = dir.path().join("readable");
        fs::create_dir(&readable).unwrap();
        fs::set_permissions(&readable, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(owned_dir(&readable).is_ok());
        let mode = fs::metadata(&readable).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "made private");
    }
}
