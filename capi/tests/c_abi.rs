//! The C test program (`tests/c/capi_test.c`), compiled with the system C
//! compiler (`cc`, or `$CC`) against `include/weightmap.h` and the static
//! library, run on the committed fixtures with expectations taken from
//! their JSON manifests; then once more under AddressSanitizer.
//!
//! Skipped, with a visible message, when there is no C compiler (CI
//! installs one); `WM_REQUIRE_CC=1` makes a missing compiler a failure.

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

fn compiler() -> Option<String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let ok = Command::new(&cc)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(cc)
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

fn build_and_run(cc: &str, dir: &Path, expect: &Path, sanitize: bool) -> Result<String, String> {
    let capi = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = dir.join(if sanitize {
        "capi_test_asan"
    } else {
        "capi_test"
    });
    let mut cmd = Command::new(cc);
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"])
        .arg("-I")
        .arg(capi.join("include"))
        .arg(capi.join("tests/c/capi_test.c"));
    if sanitize {
        cmd.args(["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]);
    }
    cmd.arg(static_lib())
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe);
    let built = cmd.output().unwrap();
    if !built.status.success() {
        return Err(format!(
            "compiling failed: {:?}\n{}",
            cmd,
            String::from_utf8_lossy(&built.stderr)
        ));
    }
    let run = Command::new(&exe)
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
    let Some(cc) = compiler() else {
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
    expect.push_str("END\n");
    let path = dir.path().join("expect.txt");
    std::fs::write(&path, &expect).unwrap();

    let out = build_and_run(&cc, dir.path(), &path, false).unwrap_or_else(|e| panic!("{e}"));
    print!("{out}");
    assert!(out.contains(" passed, 0 failed"), "{out}");

    // Once under AddressSanitizer (and UBSan), when the compiler has it.
    let probe = Command::new(&cc)
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
    let out = build_and_run(&cc, dir.path(), &path, true).unwrap_or_else(|e| panic!("{e}"));
    print!("under ASan: {out}");
}

/// The README's "From C and C++" example compiles as it stands and runs.
#[test]
fn readme_c_example_builds_and_runs() {
    let Some(cc) = compiler() else {
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
    let exe = dir.path().join("readme");
    let built = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("include"))
        .arg(&src)
        .arg(static_lib())
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let run = Command::new(&exe)
        .arg(root().join("testdata/tiny-llama.gguf"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success());
    assert!(
        out.starts_with("1 layers\ntoken_embd.weight type 0 ne0 8\n"),
        "{out}"
    );
    let missing = Command::new(&exe)
        .arg("/nonexistent.gguf")
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent.gguf"));
}
