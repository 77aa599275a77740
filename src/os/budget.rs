//! The memory budget: what the process may still use before something takes
//! it away (the machine runs short, a memory cgroup's or a job object's
//! limit is reached, or iOS's jetsam steps in), and the figure that said so.
//!
//! Each platform reads its own figures (`sys::read_budget`): Linux and
//! Android `MemAvailable` and the memory cgroups (`cgroup.rs`), Windows the
//! available physical memory and the job object's limits, macOS the host's
//! VM statistics, iOS `os_proc_available_memory`. What they find is told in
//! the same types, so that the loader decides the same way everywhere.

use std::fmt;

/// Where a budget figure was read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(dead_code)] // each platform makes only its own variants
pub(crate) enum Source {
    /// `MemAvailable` in `/proc/meminfo`: the machine's estimate.
    MemAvailable,
    /// A cgroup v1 memory limit, less `memory.usage_in_bytes`.
    CgroupV1 {
        /// The cgroup, as the hierarchy names it (`/NAME`, `/` for the root).
        path: String,
        /// The limit's file (`memory.limit_in_bytes`).
        file: &'static str,
    },
    /// A cgroup v2 memory limit, less `memory.current`.
    CgroupV2 {
        /// The cgroup, as the hierarchy names it (`/a/b`).
        path: String,
        /// The limit's file (`memory.max` or `memory.high`).
        file: &'static str,
    },
    // The variants below are made only on their platforms.
    /// Windows: `GlobalMemoryStatusEx`'s available physical memory.
    AvailablePhysical,
    /// Windows: a limit of the job object the process runs in
    /// (`QueryInformationJobObject`, `JobObjectExtendedLimitInformation`),
    /// less what the job or the process has committed.
    JobObject {
        /// `JobMemoryLimit` or `ProcessMemoryLimit`.
        limit: &'static str,
    },
    /// macOS: the host's free, inactive and purgeable pages
    /// (`host_statistics64(HOST_VM_INFO64)`), what the kernel can hand out
    /// without paging anything in use out.
    HostVmStatistics,
    /// iOS: `os_proc_available_memory()`, what the app may still allocate
    /// before jetsam ends it.
    ProcAvailableMemory,
}

impl fmt::Display for Source {
    /// `MemAvailable`, `cgroup v1 /NAME memory.limit_in_bytes`,
    /// `cgroup v2 /a/b memory.max`: enough to find the file by hand.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::MemAvailable => f.write_str("MemAvailable"),
            Source::CgroupV1 { path, file } => write!(f, "cgroup v1 {path} {file}"),
            Source::CgroupV2 { path, file } => write!(f, "cgroup v2 {path} {file}"),
            Source::AvailablePhysical => f.write_str("GlobalMemoryStatusEx ullAvailPhys"),
            Source::JobObject { limit } => write!(f, "job object {limit}"),
            Source::HostVmStatistics => f.write_str("host_statistics64 HOST_VM_INFO64"),
            Source::ProcAvailableMemory => f.write_str("os_proc_available_memory"),
        }
    }
}

/// How many bytes the process may still use, and the figure that decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Budget {
    /// The bytes left: 0 when usage is at or past a limit (never negative).
    pub bytes: u64,
    /// The tightest figure, the one `bytes` comes from.
    pub source: Source,
    /// For a cgroup's figure, what went into it.
    pub counted: Option<Counted>,
}

/// The parts of a cgroup's figure: the limit less the usage, with the
/// page cache the kernel would reclaim first given back, or the model's
/// own cached pages where they are more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counted {
    /// The limit.
    pub limit: u64,
    /// The cgroup's usage, page cache included.
    pub usage: u64,
    /// Its inactive file pages.
    pub reclaimable: u64,
    /// The model's own pages in the page cache (at most the usage).
    pub own_cached: u64,
}

/// The outcome of reading the budget.
///
/// There is no "unlimited": a machine's memory is finite, so when no figure
/// at all could be read the answer is that nothing is known, not that
/// everything is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BudgetReading {
    /// The least of every figure that could be read.
    Limited {
        /// The budget.
        budget: Budget,
        /// What could not be read and so was left out of the minimum, each
        /// as "file: why". Empty when every figure present was read; absent
        /// files that simply mean "no limit here" are not listed.
        unread: Vec<String>,
    },
    /// No figure could be read at all (no `/proc`, not Linux).
    Unreadable {
        /// Every failure, joined.
        why: String,
    },
}

impl BudgetReading {
    /// The budget, if one could be read.
    pub(crate) fn budget(&self) -> Option<&Budget> {
        match self {
            BudgetReading::Limited { budget, .. } => Some(budget),
            BudgetReading::Unreadable { .. } => None,
        }
    }
}

impl BudgetReading {
    /// The least of `found` (on a tie, the first named), with the notes of
    /// what could not be read; `Unreadable` when nothing was found.
    pub(crate) fn least(found: Vec<Budget>, unread: Vec<String>) -> BudgetReading {
        let least = found
            .into_iter()
            .reduce(|a, b| if b.bytes < a.bytes { b } else { a });
        match least {
            Some(budget) => BudgetReading::Limited { budget, unread },
            None => BudgetReading::Unreadable {
                why: if unread.is_empty() {
                    "no memory figure found".to_string()
                } else {
                    unread.join("; ")
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_name_the_call_or_file_to_look_at() {
        assert_eq!(
            Source::JobObject {
                limit: "JobMemoryLimit"
            }
            .to_string(),
            "job object JobMemoryLimit"
        );
        assert_eq!(
            Source::AvailablePhysical.to_string(),
            "GlobalMemoryStatusEx ullAvailPhys"
        );
    }

    #[test]
    fn the_least_figure_decides_and_the_first_wins_a_tie() {
        let b = |bytes, source| Budget {
            bytes,
            source,
            counted: None,
        };
        let r = BudgetReading::least(
            vec![
                b(10, Source::AvailablePhysical),
                b(
                    4,
                    Source::JobObject {
                        limit: "JobMemoryLimit",
                    },
                ),
                b(
                    4,
                    Source::JobObject {
                        limit: "ProcessMemoryLimit",
                    },
                ),
            ],
            vec![],
        );
        assert_eq!(
            r.budget().unwrap().source,
            Source::JobObject {
                limit: "JobMemoryLimit"
            }
        );
        assert!(matches!(
            BudgetReading::least(vec![], vec!["x: y".into()]),
            BudgetReading::Unreadable { why } if why == "x: y"
        ));
    }

    #[test]
    fn read_budget_on_this_machine_is_readable() {
        let r = crate::os::read_budget(0);
        assert!(r.budget().is_some(), "{r:?}");
    }
}
