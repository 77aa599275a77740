//! Never abort, never clobber: the `weightmap` command run in child
//! processes, some under `RLIMIT_AS`, against hostile destinations, huge
//! sizes, signals and files that change under it.
//!
//! Address-space limits, device nodes, FIFOs, symlinks, signals sent with
//! kill(2) and truncating a mapped file are Unix's: those tests are
//! `#[cfg(unix)]`; the rest run everywhere.

use std::fs;
use std::path::{Path, PathBuf};
#[cfg(unix)]
use std::process::Stdio;
use std::process::{Command, Output};
#[cfg(unix)]
use std::time::Duration;

/// `weightmap ARGS` in `dir`.
fn wm(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weightmap"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run weightmap")
}

/// `weightmap ARGS` in `dir` with its address space limited to `limit` bytes.
#[cfg(unix)]
fn wm_limited(dir: &Path, limit: u64, args: &[&str]) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_weightmap"));
    cmd.args(args).current_dir(dir);
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls setrlimit, which is async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let r = libc::rlimit {
                rlim_cur: limit as libc::rlim_t,
                rlim_max: limit as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().expect("run weightmap")
}

/// The run failed with status 1 and exactly one `error: ` line on stderr;
/// returns that line.
fn one_error(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "status {:?}, stderr: {stderr}",
        out.status
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "stderr: {stderr}");
    assert!(lines[0].starts_with("error: "), "stderr: {stderr}");
    lines[0].to_owned()
}

/// Names in `dir` ending in `.tmp`.
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".tmp"))
        .collect()
}

const SMALL: [&str; 6] = ["--size", "2M", "--vocab", "1000", "--tensors", "20"];

fn gen_args<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["gen", out];
    v.extend_from_slice(extra);
    v
}

// ---- item 1: gen's output file ---------------------------------------------

#[test]
fn gen_refuses_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::create_dir(d.join("subdir")).unwrap();
    let line = one_error(&wm(d, &gen_args("subdir", &SMALL)));
    assert!(line.contains("not a regular file"), "{line}");
    assert!(line.contains("a directory"), "{line}");
    assert!(d.join("subdir").is_dir());
    assert!(temp_files(d).is_empty());
}

#[cfg(windows)]
#[test]
fn gen_refuses_the_null_device() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let line = one_error(&wm(d, &gen_args("NUL", &SMALL)));
    assert!(line.contains("not a regular file"), "{line}");
    assert!(temp_files(d).is_empty());
}

#[cfg(unix)]
#[test]
fn gen_refuses_device_fifo_directory_and_symlink_to_device() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A character device of our own where we may make one (root), else /dev/null.
    let full = d.join("full");
    let c = std::ffi::CString::new(full.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(1, 7)) } == 0;
    let device = if made {
        "full".to_owned()
    } else {
        "/dev/null".to_owned()
    };
    let fifo = d.join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    fs::create_dir(d.join("subdir")).unwrap();
    std::os::unix::fs::symlink("/dev/null", d.join("to-null")).unwrap();
    for target in [device.as_str(), "fifo", "subdir", "to-null"] {
        let line = one_error(&wm(d, &gen_args(target, &SMALL)));
        assert!(line.contains("not a regular file"), "{target}: {line}");
    }
    if made {
        let t = fs::symlink_metadata(&full).unwrap().file_type();
        assert!(t.is_char_device(), "the device node is still there");
    }
    assert!(fs::symlink_metadata(d.join("to-null"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(temp_files(d).is_empty());
}

#[cfg(unix)]
#[test]
fn gen_never_writes_through_a_planted_temp_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join("victim.txt"), b"precious").unwrap();
    std::os::unix::fs::symlink("victim.txt", d.join("out.gguf.tmp")).unwrap();
    std::os::unix::fs::symlink("victim.txt", d.join(".out.gguf.tmp")).unwrap();
    let out = wm(d, &gen_args("out.gguf", &SMALL));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(fs::read(d.join("victim.txt")).unwrap(), b"precious");
    let bytes = fs::read(d.join("out.gguf")).unwrap();
    assert!(weightmap::Header::parse(&bytes).is_ok());
    // Only the planted links end in .tmp.
    assert_eq!(temp_files(d).len(), 2);
}

#[test]
fn gen_replaces_a_regular_file_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join("m.gguf"), b"old").unwrap();
    assert!(wm(d, &gen_args("m.gguf", &SMALL)).status.success());
    assert!(fs::metadata(d.join("m.gguf")).unwrap().len() > 1 << 20);
    assert!(temp_files(d).is_empty());
}

#[test]
fn gen_size_below_the_minimum_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let line = one_error(&wm(d, &["gen", "m.gguf", "--size", "0"]));
    assert!(line.contains("smallest model"), "{line}");
    assert!(line.contains("107.9 MiB"), "{line}");
    let help = wm(d, &["gen", "--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("107.9 MiB"));
    assert!(!d.join("m.gguf").exists());
    assert!(temp_files(d).is_empty());
}

#[cfg(unix)]
#[test]
fn gen_sigterm_removes_the_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let child = Command::new(env!("CARGO_BIN_EXE_weightmap"))
        .args(["gen", "big.gguf", "--size", "8G", "--vocab", "1000"])
        .current_dir(d)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait (bounded) until data is being written.
    let mut started = false;
    for _ in 0..2000 {
        if temp_files(d)
            .iter()
            .any(|p| fs::metadata(p).is_ok_and(|m| m.len() > 1 << 20))
        {
            started = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: kill with a pid of our own child is a plain syscall.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(started, "the writer never started");
    let line = one_error(&out);
    assert!(line.contains("interrupted"), "{line}");
    assert!(temp_files(d).is_empty(), "{:?}", temp_files(d));
    assert!(!d.join("big.gguf").exists());
}

// ---- item 3: streaming writers ---------------------------------------------

#[test]
fn gen_16t_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for format in ["gguf", "safetensors"] {
        let line = one_error(&wm(d, &["gen", "x", "--size", "16T", "--format", format]));
        assert!(line.contains("bytes free"), "{line}");
        assert!(temp_files(d).is_empty());
        assert!(!d.join("x").exists());
    }
}

#[cfg(unix)]
#[test]
fn gen_writes_a_tensor_larger_than_its_address_space() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    const LIMIT: u64 = 160 << 20;
    for (name, format) in [("one.gguf", "gguf"), ("one.safetensors", "safetensors")] {
        // One f32 token embedding of about 200 MiB, written under a 160 MiB
        // address-space limit.
        let out = wm_limited(
            d,
            LIMIT,
            &[
                "gen",
                name,
                "--size",
                "200M",
                "--tensors",
                "1",
                "--vocab",
                "8192",
                "--types",
                "f32",
                "--format",
                format,
            ],
        );
        assert!(out.status.success(), "{format}: {out:?}");
        let h = weightmap::Header::read(d.join(name)).unwrap();
        let t = &h.tensors().get(0).unwrap();
        assert!(t.nbytes > LIMIT, "{format}: tensor of {} bytes", t.nbytes);
        fs::remove_file(d.join(name)).unwrap();
    }
}

// ---- item 7: SIGBUS ---------------------------------------------------------

#[cfg(unix)]
#[test]
fn load_hashes_on_a_file_truncated_under_its_mapping_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let gen = wm(
        d,
        &[
            "gen",
            "big.gguf",
            "--size",
            "256M",
            "--tensors",
            "12",
            "--vocab",
            "1000",
            "--types",
            "f32",
        ],
    );
    assert!(gen.status.success(), "{gen:?}");
    let path = d.join("big.gguf");
    let child = Command::new(env!("CARGO_BIN_EXE_weightmap"))
        .args([
            "load",
            "big.gguf",
            "--mode",
            "mmap",
            "--no-fallback",
            "--hashes",
        ])
        .current_dir(d)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait (bounded) for the mapping to appear, then truncate the file
    // while the child hashes its tensors (seconds of work in a debug build).
    let maps = format!("/proc/{}/maps", child.id());
    let canon = fs::canonicalize(&path).unwrap();
    for _ in 0..3000 {
        if fs::read_to_string(&maps).is_ok_and(|m| m.contains(&*canon.to_string_lossy())) {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(50));
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let line = one_error(&out);
    assert_eq!(line, "error: big.gguf changed while mapped (truncated?)");
}

// ---- item 6: reporting ------------------------------------------------------

/// No control character but the newline reaches the terminal.
fn assert_no_controls(text: &[u8]) {
    let s = String::from_utf8_lossy(text);
    let bad: Vec<char> = s.chars().filter(|c| c.is_control() && *c != '\n').collect();
    assert!(bad.is_empty(), "control characters {bad:?} in {s}");
}

#[test]
fn text_output_escapes_control_characters_in_names() {
    use weightmap::gguf::Writer;
    use weightmap::TensorType;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let evil = "\u{1b}]0;pwned\u{7}\u{0}\u{9b}x";
    let mut w = Writer::new(32);
    w.kv_str(evil, evil);
    w.tensor(evil, TensorType::F32, &[2], vec![0; 8]);
    fs::write(d.join("evil.gguf"), w.to_bytes()).unwrap();
    let out = wm(d, &["inspect", "evil.gguf"]);
    assert!(out.status.success(), "{out:?}");
    assert_no_controls(&out.stdout);
    assert!(String::from_utf8_lossy(&out.stdout).contains("\\e]0;pwned"));
    let out = wm(d, &["load", "evil.gguf", "--hashes"]);
    assert!(out.status.success(), "{out:?}");

    // An error naming the tensor: escaped as well.
    let mut w = Writer::new(32);
    w.tensor(evil, TensorType::F32, &[2], vec![0; 8]);
    w.tensor(evil, TensorType::F32, &[2], vec![0; 8]);
    fs::write(d.join("dup.gguf"), w.to_bytes()).unwrap();
    let out = wm(d, &["validate", "dup.gguf"]);
    let line = one_error(&out);
    assert!(line.contains("duplicate tensor name"), "{line}");
    assert_no_controls(&out.stderr);
}

#[test]
fn an_oversized_safetensors_header_length_has_its_own_message() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for len in [100_000_001u64, 1 << 63, u64::MAX] {
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{\"a\":{}}");
        fs::write(d.join("big.safetensors"), &bytes).unwrap();
        for cmd in ["validate", "inspect"] {
            let line = one_error(&wm(d, &[cmd, "big.safetensors"]));
            assert!(
                line.contains(&format!("header length {len} exceeds the limit")),
                "{line}"
            );
        }
    }
}

// ---- item 4: allocation failure is an error ---------------------------------

/// A GGUF with `n` one-element f32 tensors, written with the crate's writer.
#[cfg(unix)]
fn many_tensors(path: &Path, n: usize) {
    use weightmap::gguf::Writer;
    use weightmap::TensorType;
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    for i in 0..n {
        w.tensor_deferred(&format!("blk.{i}.w"), TensorType::F32, &[8]);
    }
    let f = std::io::BufWriter::new(fs::File::create(path).unwrap());
    w.write_with(f, |_, _| {}).unwrap();
}

/// A GGUF whose header is about 30 MB: one long string value.
#[cfg(unix)]
fn big_header(path: &Path) {
    use weightmap::gguf::Writer;
    use weightmap::TensorType;
    let mut w = Writer::new(32);
    w.kv_str("general.notes", &"x".repeat(30_000_000));
    w.tensor("a", TensorType::F32, &[8], vec![0; 32]);
    let f = std::io::BufWriter::new(fs::File::create(path).unwrap());
    w.write_with(f, |_, _| {}).unwrap();
}

/// Under each limit, the command succeeds or exits 1 with one error line:
/// never a signal (an abort is SIGABRT, status 134 from a shell).
#[cfg(unix)]
fn never_aborts(d: &Path, file: &str, limits: &[u64]) -> Vec<(u64, String, Option<i32>)> {
    let mut seen = Vec::new();
    for &limit in limits {
        for args in [
            vec!["validate", file],
            vec!["load", file],
            vec!["load", file, "--mode", "stream"],
            vec!["inspect", file],
            vec!["inspect", file, "--json"],
        ] {
            let out = wm_limited(d, limit, &args);
            let what = format!("{args:?} under {} MiB", limit >> 20);
            assert!(
                out.status.code().is_some(),
                "{what}: killed by {:?}",
                out.status
            );
            if !out.status.success() {
                let line = one_error(&out);
                assert!(
                    line.contains("out of memory") || line.contains("allocat"),
                    "{what}: {line}"
                );
            }
            seen.push((limit >> 20, args.join(" "), out.status.code()));
        }
    }
    seen
}

#[cfg(unix)]
#[test]
fn a_million_tensors_under_rlimit_as_is_an_error_not_an_abort() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    many_tensors(&d.join("many.gguf"), 1_000_000);
    let seen = never_aborts(d, "many.gguf", &[48 << 20, 96 << 20, 160 << 20]);
    // The smallest limit is below the header itself: that one must fail.
    assert!(seen.iter().any(|s| s.2 == Some(1)), "{seen:?}");
}

/// A safetensors file with `n` one-element f32 tensors, packed.
#[cfg(unix)]
fn many_safetensors(path: &Path, n: usize) {
    use std::io::Write;
    let mut json = String::from("{");
    for i in 0..n {
        if i > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            "\"blk.{i}.w\":{{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[{},{}]}}",
            4 * i,
            4 * i + 4
        ));
    }
    json.push('}');
    let mut f = std::io::BufWriter::new(fs::File::create(path).unwrap());
    f.write_all(&(json.len() as u64).to_le_bytes()).unwrap();
    f.write_all(json.as_bytes()).unwrap();
    f.write_all(&vec![0u8; 4 * n]).unwrap();
    f.flush().unwrap();
}

#[cfg(unix)]
#[test]
fn many_safetensors_entries_under_rlimit_as_is_an_error_not_an_abort() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // 300,000 entries, every one misaligned (the data section starts at an
    // odd offset), so the mapped load copies them all and lists them.
    many_safetensors(&d.join("many.safetensors"), 300_000);
    let seen = never_aborts(
        d,
        "many.safetensors",
        &[24 << 20, 48 << 20, 72 << 20, 96 << 20],
    );
    assert!(seen.iter().any(|s| s.2 == Some(1)), "{seen:?}");
}

#[cfg(unix)]
#[test]
fn a_30_mb_header_under_rlimit_as_is_an_error_not_an_abort() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    big_header(&d.join("big.gguf"));
    let seen = never_aborts(d, "big.gguf", &[24 << 20, 40 << 20, 64 << 20]);
    assert!(seen.iter().any(|s| s.2 == Some(1)), "{seen:?}");
}
