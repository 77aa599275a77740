//! Memory figures from `/proc/self/status`.
//!
//! Only where procfs is the kernel's (Linux, Android): elsewhere every
//! figure is `None`, and a file that happens to be at that path (on
//! Windows `C:\proc\self\status`, or the host's under Wine) is not read.

/// Whether `/proc/self` is this process's, as the kernel reports it.
const PROCFS: bool = cfg!(any(target_os = "linux", target_os = "android"));

/// The text of `/proc/self/NAME`, where there is a procfs.
fn read_proc_self(name: &str) -> Option<String> {
    if !PROCFS {
        return None;
    }
    std::fs::read_to_string(format!("/proc/self/{name}")).ok()
}

/// The process's memory, in kB as the kernel reports it; `None` where the
/// line is absent (older kernels, other platforms).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemStatus {
    /// Resident anonymous memory (`RssAnon`): heap, owned buffers.
    pub rss_anon_kib: Option<u64>,
    /// Resident file-backed memory (`RssFile`): mapped page cache, the binary.
    pub rss_file_kib: Option<u64>,
    /// Peak resident set size (`VmHWM`).
    pub vm_hwm_kib: Option<u64>,
}

impl MemStatus {
    /// Read `/proc/self/status` now; all `None` if it cannot be read.
    pub fn read() -> MemStatus {
        read_proc_self("status")
            .map(|s| MemStatus::parse(&s))
            .unwrap_or_default()
    }

    /// Parse the text of a `/proc/<pid>/status` file (`Key:   1234 kB` lines).
    pub fn parse(text: &str) -> MemStatus {
        let mut m = MemStatus::default();
        for line in text.lines() {
            let Some((key, rest)) = line.split_once(':') else {
                continue;
            };
            let slot = match key {
                "RssAnon" => &mut m.rss_anon_kib,
                "RssFile" => &mut m.rss_file_kib,
                "VmHWM" => &mut m.vm_hwm_kib,
                _ => continue,
            };
            *slot = rest.split_whitespace().next().and_then(|v| v.parse().ok());
        }
        m
    }
}

/// Page faults taken by the whole process so far (all threads), from
/// `/proc/self/stat`: the counts `getrusage(RUSAGE_SELF)` reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Faults served without I/O (`minflt`).
    pub minor: u64,
    /// Faults that read from storage (`majflt`).
    pub major: u64,
}

impl Faults {
    /// Read `/proc/self/stat` now; `None` if it cannot be read.
    pub fn read() -> Option<Faults> {
        Faults::parse(&read_proc_self("stat")?)
    }

    /// Parse a `/proc/<pid>/stat` line: after the `(comm)` field, which may
    /// hold spaces and parentheses, minflt is the 8th field and majflt the 10th.
    pub fn parse(text: &str) -> Option<Faults> {
        let rest = &text[text.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().take(10).collect();
        Some(Faults {
            minor: f.get(7)?.parse().ok()?,
            major: f.get(9)?.parse().ok()?,
        })
    }

    /// The faults taken since `earlier`.
    pub fn since(self, earlier: Faults) -> Faults {
        Faults {
            minor: self.minor.saturating_sub(earlier.minor),
            major: self.major.saturating_sub(earlier.major),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fault_counts_after_an_awkward_comm() {
        let line = "4242 (we ird) x) S 1 4242 4242 0 -1 4194304 1234 0 56 0 7 8 0 0 20 0 1 0";
        assert_eq!(
            Faults::parse(line),
            Some(Faults {
                minor: 1234,
                major: 56
            })
        );
        assert_eq!(Faults::parse("no parenthesis"), None);
        if cfg!(target_os = "linux") && !emulated() {
            // A fresh anonymous map takes a fault on each page's first write.
            let mut m = memmap2::MmapMut::map_anon(64 << 12).unwrap();
            let a = Faults::read().unwrap();
            for i in (0..m.len()).step_by(4096) {
                m[i] = 1;
            }
            std::hint::black_box(&m);
            assert!(Faults::read().unwrap().since(a).minor >= 64);
        }
    }

    /// Whether this runs under a user-mode emulator (qemu-user): the
    /// kernel, as `/proc/sys/kernel/arch` names it, is of another
    /// architecture. qemu-user writes its own `/proc/self/stat`, with zero
    /// fault counts, so the live half of the test cannot run there.
    fn emulated() -> bool {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/arch").unwrap_or_default();
        let emulated = !kernel.trim().is_empty() && kernel.trim() != std::env::consts::ARCH;
        if emulated {
            eprintln!("fault counts from /proc/self/stat not checked: an emulator writes them");
        }
        emulated
    }

    #[test]
    fn parses_the_three_lines() {
        let text = "Name:\tweightmap\nVmHWM:\t    9000 kB\nVmRSS:\t    8000 kB\n\
                    RssAnon:\t    1234 kB\nRssFile:\t    5678 kB\nRssShmem:\t       0 kB\n";
        assert_eq!(
            MemStatus::parse(text),
            MemStatus {
                rss_anon_kib: Some(1234),
                rss_file_kib: Some(5678),
                vm_hwm_kib: Some(9000)
            }
        );
        assert_eq!(MemStatus::parse("VmHWM: junk\n"), MemStatus::default());
    }

    #[test]
    fn reads_this_process() {
        if cfg!(target_os = "linux") {
            let m = MemStatus::read();
            assert!(m.rss_anon_kib.is_some() && m.vm_hwm_kib.is_some());
        }
    }
}
