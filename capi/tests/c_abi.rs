//! The C test program (`tests/c/capi_test.c`), compiled with the system C
//! compiler (`cc`, or `$CC`) against `include/weightmap.h` and the static
//! library, run on the committed fixtures with expectations taken from
//! their JSON manifests; then once more under AddressSanitizer.
//!
//! Skipped, with a visible message, when there is no C compiler (CI
//! installs one); `WM_REQUIRE_CC=1` makes a missing compiler a failure.
//!
//! For another target, `.ci/cross.sh` names a cross toolchain: the program
//! is then compiled with `WM_CAPI_CROSS_CC` against `WM_CAPI_CROSS_LIB`
//! (the target's static library, or a DLL's import library, whose DLL is
//! put beside the program), with `WM_CAPI_CROSS_LINK`'s libraries, and run
//! through `WM_CAPI_CROSS_RUNNER` (wine, qemu): the C ABI checked on the
//! target, from this host test.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use weightmap::TensorType;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "-".into();
    }
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The type of a manifest tensor: GGUF manifests give ggml's id, safetensors
/// manifests the dtype.
fn tensor_type(t: &Value) -> TensorType {
    if let Some(id) = t["ggml_type_id"].as_u64() {
        return TensorType::from_ggml_id(id as u32).expect("a ggml type");
    }
    let dtype = t["dtype"].as_str().expect("a dtype");
    *TensorType::ALL
        .iter()
        .find(|ty| ty.name().eq_ignore_ascii_case(dtype))
        .unwrap_or_else(|| panic!("no weightmap type named {dtype}"))
}

/// The expectation records for one fixture (see the C program's comment).
fn expect_file(out: &mut String, name: &str) {
    let path = root().join("testdata").join(name);
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(path.with_extension(format!(
            "{}.json",
            path.extension().unwrap().to_str().unwrap()
        )))
        .unwrap(),
    )
    .unwrap();
    let gguf = manifest["format"] == "gguf";
    let tensors = manifest["tensors"].as_array().unwrap();
    let path = path.canonicalize().unwrap();
    writeln!(
        out,
        "FILE {} {}",
        hex(path.to_str().unwrap().as_bytes()),
        tensors.len()
    )
    .unwrap();
    for t in tensors {
        let ty = tensor_type(t);
        let mut shape: Vec<u64> = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        if !gguf {
            shape.reverse(); // numpy order to ggml order
        }
        let mut ne = [1u64; 4];
        ne[..shape.len()].copy_from_slice(&shape);
        let mut nb = [ty.type_size(), 0, 0, 0];
        nb[1] = nb[0] * (ne[0] / ty.block_size());
        nb[2] = nb[1] * ne[1];
        nb[3] = nb[2] * ne[2];
        writeln!(
            out,
            "T {} {} {} {} {} {} {} {} {} {} {} {} {}",
            hex(t["name"].as_str().unwrap().as_bytes()),
            ty.ggml_id().map_or(-1, i64::from),
            shape.len(),
            ne[0],
            ne[1],
            ne[2],
            ne[3],
            nb[0],
            nb[1],
            nb[2],
            nb[3],
            t["nbytes"],
            t["offset"]
        )
        .unwrap();
    }
    let empty = serde_json::Map::new();
    let md = manifest["metadata"].as_object().unwrap_or(&empty);
    for (key, v) in md {
        let k = hex(key.as_bytes());
        if !gguf {
            writeln!(out, "S {k} {}", hex(v.as_str().unwrap().as_bytes())).unwrap();
            continue;
        }
        let value = &v["value"];
        match v["type"].as_str().unwrap() {
            "UINT8" | "UINT16" | "UINT32" | "UINT64" | "INT8" | "INT16" | "INT32" | "INT64" => {
                if let Some(u) = value.as_u64() {
                    writeln!(out, "U {k} {u}").unwrap();
                }
            }
            "FLOAT32" | "FLOAT64" => {
                writeln!(out, "F {k} {}", value.as_f64().unwrap().to_bits()).unwrap();
            }
            "STRING" => {
                writeln!(out, "S {k} {}", hex(value.as_str().unwrap().as_bytes())).unwrap();
            }
            "ARRAY" => {
                let items = value.as_array().unwrap();
                writeln!(out, "A {k} {}", items.len()).unwrap();
                if v["elem_type"] == "STRING" {
                    for (i, s) in items.iter().enumerate() {
                        writeln!(out, "AS {k} {i} {}", hex(s.as_str().unwrap().as_bytes()))
                            .unwrap();
                    }
                }
            }
            _ => {}
        }
    }
}

/// Say that a check was skipped, on the process's stderr itself, which the
/// test harness does not capture, so the line shows even when tests pass.
fn skipped(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {what}");
}

/// How a C program is built and run: the host's compiler and static
/// library, or a cross toolchain's (see the module's comment).
struct Toolchain {
    cc: String,
    lib: PathBuf,
    link: Vec<String>,
    runner: Vec<String>,
    cross: bool,
}

impl Toolchain {
    /// The cross toolchain the environment names, or the host's compiler
    /// (`cc`, or `$CC`) if it answers.
    fn find() -> Option<Toolchain> {
        let words = |v: &str| -> Vec<String> {
            std::env::var(v)
                .unwrap_or_default()
                .split_whitespace()
                .map(String::from)
                .collect()
        };
        if let Ok(cc) = std::env::var("WM_CAPI_CROSS_CC") {
            let lib = PathBuf::from(std::env::var("WM_CAPI_CROSS_LIB").expect("WM_CAPI_CROSS_LIB"));
            assert!(lib.exists(), "{} was not built", lib.display());
            return Some(Toolchain {
                cc,
                lib,
                link: words("WM_CAPI_CROSS_LINK"),
                runner: words("WM_CAPI_CROSS_RUNNER"),
                cross: true,
            });
        }
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let ok = Command::new(&cc)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        ok.then(|| Toolchain {
            cc,
            lib: static_lib(),
            link: ["-lpthread", "-ldl", "-lm"].map(String::from).to_vec(),
            runner: Vec::new(),
            cross: false,
        })
    }

    /// Compile `src` (with `flags`) into `exe`, linked with the library.
    fn build(&self, src: &Path, flags: &[&str], exe: &Path) -> Result<(), String> {
        let capi = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut cmd = Command::new(&self.cc);
        cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-I"])
            .arg(capi.join("include"))
            .arg(src)
            .args(flags)
            .arg(&self.lib)
            .args(&self.link)
            .arg("-o")
            .arg(exe);
        let built = cmd.output().unwrap();
        if !built.status.success() {
            return Err(format!(
                "compiling failed: {:?}\n{}",
                cmd,
                String::from_utf8_lossy(&built.stderr)
            ));
        }
        // A DLL's import library (`libNAME.dll.a`): the DLL goes beside
        // the program, where Windows looks first.
        let name = self.lib.file_name().unwrap().to_str().unwrap();
        if let Some(dll) = name.strip_prefix("lib").and_then(|n| n.strip_suffix(".a")) {
            if dll.ends_with(".dll") {
                let from = self.lib.with_file_name(dll);
                std::fs::copy(&from, exe.with_file_name(dll))
                    .map_err(|e| format!("{}: {e}", from.display()))?;
            }
        }
        Ok(())
    }

    /// A command that runs `exe` on the target.
    fn run(&self, exe: &Path) -> Command {
        match self.runner.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(exe);
                c
            }
            None => Command::new(exe),
        }
    }
}

/// The static library cargo built for this test: the package's lib target
/// is built with all its crate types, into the directory of this test's
/// executable (`target/<profile>/deps`).
fn static_lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libweightmap_capi.a");
    assert!(lib.exists(), "{} was not built", lib.display());
    lib
}

fn build_and_run(
    tc: &Toolchain,
    dir: &Path,
    expect: &Path,
    sanitize: bool,
) -> Result<String, String> {
    let capi = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = dir.join(if sanitize {
        "capi_test_asan.exe"
    } else {
        "capi_test.exe"
    });
    let flags: &[&str] = if sanitize {
        &["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    } else {
        &[]
    };
    tc.build(&capi.join("tests/c/capi_test.c"), flags, &exe)?;
    let run = tc
        .run(&exe)
        .arg(expect)
        .env(
            "ASAN_OPTIONS",
            "detect_leaks=1:abort_on_error=0:exitcode=23",
        )
        .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr);
    if !run.status.success() || !stderr.is_empty() {
        return Err(format!(
            "{} failed ({}):\n{stdout}\n{stderr}",
            exe.display(),
            run.status
        ));
    }
    Ok(stdout)
}

#[test]
fn c_program_checks_fixtures_and_error_paths() {
    let Some(tc) = Toolchain::find() else {
        assert!(
            std::env::var_os("WM_REQUIRE_CC").is_none(),
            "WM_REQUIRE_CC is set and there is no C compiler"
        );
        skipped("c_program_checks_fixtures_and_error_paths: no C compiler (cc) found");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut expect = String::new();
    // tiny-llama.gguf first: the error-path checks use it.
    for f in [
        "tiny-llama.gguf",
        "quant-types.gguf",
        "align8.gguf",
        "empty.gguf",
        "tiny.safetensors",
        "bf16.safetensors",
        "odd-offsets.safetensors",
    ] {
        expect_file(&mut expect, f);
    }
    let misaligned = root().join("testdata/align8.gguf").canonicalize().unwrap();
    writeln!(
        expect,
        "MISALIGNED {}",
        hex(misaligned.to_str().unwrap().as_bytes())
    )
    .unwrap();
    // Each run (plain, then ASan) fills its own cache.
    let cache = |name: &str| {
        let d = dir.path().join(name);
        format!(
            "CACHE {} {}\n",
            hex(d.to_str().unwrap().as_bytes()),
            u8::from(!tc.cross)
        )
    };
    let expect_asan = format!("{expect}{}END\n", cache("cache-asan"));
    expect.push_str(&cache("cache"));
    expect.push_str("END\n");
    let path = dir.path().join("expect.txt");
    std::fs::write(&path, &expect).unwrap();

    let out = build_and_run(&tc, dir.path(), &path, false).unwrap_or_else(|e| panic!("{e}"));
    print!("{out}");
    assert!(out.contains(" passed, 0 failed"), "{out}");
    if tc.cross {
        return; // the sanitizers are the host compiler's
    }
    let cc = &tc.cc;

    // Once under AddressSanitizer (and UBSan), when the compiler has it.
    let probe = Command::new(cc)
        .args(["-fsanitize=address", "-x", "c", "-", "-o"])
        .arg(dir.path().join("probe"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .unwrap()
                .write_all(b"int main(void){return 0;}\n")?;
            c.wait()
        });
    if !probe.is_ok_and(|s| s.success()) {
        skipped(&format!(
            "the AddressSanitizer run: {cc} cannot link -fsanitize=address"
        ));
        return;
    }
    let path = dir.path().join("expect-asan.txt");
    std::fs::write(&path, &expect_asan).unwrap();
    let out = build_and_run(&tc, dir.path(), &path, true).unwrap_or_else(|e| panic!("{e}"));
    print!("under ASan: {out}");
}

/// The README's "From C and C++" example compiles as it stands and runs.
#[test]
fn readme_c_example_builds_and_runs() {
    let Some(tc) = Toolchain::find() else {
        assert!(
            std::env::var_os("WM_REQUIRE_CC").is_none(),
            "WM_REQUIRE_CC is set and there is no C compiler"
        );
        skipped("readme_c_example_builds_and_runs: no C compiler (cc) found");
        return;
    };
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme.find("```c\n").expect("a ```c block in README.md") + 5;
    let len = readme[start..].find("```").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("readme.c");
    std::fs::write(&src, &readme[start..start + len]).unwrap();
    let exe = dir.path().join("readme.exe");
    tc.build(&src, &[], &exe).unwrap_or_else(|e| panic!("{e}"));
    let run = tc
        .run(&exe)
        .arg(root().join("testdata/tiny-llama.gguf"))
        .output()
        .unwrap();
    // Windows' C library writes text as CRLF.
    let out = String::from_utf8_lossy(&run.stdout).replace("\r\n", "\n");
    assert!(run.status.success());
    assert!(
        out.starts_with("1 layers\ntoken_embd.weight type 0 ne0 8\n"),
        "{out}"
    );
    let missing = tc.run(&exe).arg("/nonexistent.gguf").output().unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent.gguf"));
}
