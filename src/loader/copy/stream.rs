//! The stream path: read the header, then every tensor into owned buffers,
//! one per buffer type, in parallel, directly from storage where that wins.

use std::fs::File;

use crate::error::Result;
use crate::format::{read_header, read_header_at};
use crate::page_plan::{PrefetchDecision, Reread, RereadRefusal};

use super::place::{add, copy_group, plan, Group, Placed, ReadCtx};
use super::read::{Progress, ReadSrc};
use crate::loader::loaded::Loaded;
use crate::loader::options::DirectIo;
use crate::loader::options::LoadOptions;
use crate::loader::report::{DirectOutcome, PlacementKind, ReadReport};
use crate::loader::source::{check_range, open_checked, Source};

/// Whether this load may read directly, or why not.
fn direct_wanted(file: &File, opts: &LoadOptions) -> std::result::Result<(), DirectOutcome> {
    match opts.direct_io {
        DirectIo::Off => Err(DirectOutcome::Off),
        _ if !crate::os::DIRECT_IO => Err(DirectOutcome::NotApplicable {
            reason: "no direct I/O on this platform".into(),
        }),
        DirectIo::On => Ok(()),
        DirectIo::Auto => match crate::os::residency_estimate_of(file) {
            // From a warm cache, a copy out of it beats a read from storage.
            Ok(r) if r.fraction() >= 0.5 => Err(DirectOutcome::Skipped {
                reason: format!(
                    "{:.0}% of the file is in the page cache",
                    r.fraction() * 100.0
                ),
            }),
            Ok(_) => Ok(()),
            Err(e) => Err(DirectOutcome::NotApplicable {
                reason: format!("residency unknown: {e}"),
            }),
        },
    }
}

/// The open file behind `src` (none for memory), its validated header,
/// where the header starts in the file, and whether direct reads are
/// wanted (only for a file opened by path), or why not.
struct Opened {
    file: Option<File>,
    header: crate::format::Header,
    base: u64,
    wanted: std::result::Result<(), DirectOutcome>,
}

/// Open `src` and validate its header, read in growing prefixes, never
/// past it.
fn open_and_read_header(src: &Source<'_>, opts: &LoadOptions) -> Result<Opened> {
    let label = src.label();
    let path = label.as_path();
    let mut wanted = Err(DirectOutcome::NotApplicable {
        reason: "not a file opened by path".into(),
    });
    let (file, header, base) = match src {
        Source::Path(p) => {
            let (file, meta) = open_checked(p)?;
            wanted = direct_wanted(&file, opts);
            if wanted.is_ok() {
                // Only the header's own pages go through the page cache.
                crate::os::advise_no_readahead(&file);
            }
            let header = read_header(&file, meta.len(), p)?;
            (Some(file), header, 0)
        }
        Source::Range { file, offset, len } => {
            check_range(file, *offset, *len, path)?;
            let header = read_header_at(file, *offset, *len, path)?;
            let f = file
                .try_clone()
                .map_err(|e| crate::error::Error::io("dup", path, e))?;
            (Some(f), header, *offset)
        }
        Source::Memory(m) => {
            let bytes = (**m).as_ref();
            if bytes.is_empty() {
                return Err(crate::error::Error::EmptyFile {
                    path: label.clone(),
                });
            }
            (None, crate::format::Header::parse(bytes)?, 0)
        }
    };
    Ok(Opened {
        file,
        header,
        base,
        wanted,
    })
}

/// Load `src` into owned buffers: validate the header (read in growing
/// prefixes, never past it), then read each tensor once into its place. A
/// file range reads only that range
/// (buffered: direct reads reopen the file by path); memory is copied.
pub(crate) fn stream_source(src: &Source<'_>, opts: &LoadOptions) -> Result<Loaded> {
    let label = src.label();
    let path = label.as_path();
    let Opened {
        file,
        header,
        base,
        wanted,
    } = open_and_read_header(src, opts)?;
    let infos = header.tensors();
    let mut groups: Vec<Group> = Vec::new();
    for (i, t) in infos.iter().enumerate() {
        add(&mut groups, &opts.target(&t), i)?;
    }
    if groups.is_empty() {
        // No tensors: one empty buffer of the default type.
        groups.push(Group {
            bt: opts.buffer_type.clone(),
            tensors: Vec::new(),
        });
    }
    // Plan every buffer first, so progress knows the total.
    let mut plans = Vec::with_capacity(groups.len());
    let mut total = 0u64;
    let mut host = 0u64;
    let mut why_not = wanted.clone().err();
    for g in &groups {
        let (layout, bytes, not) = plan(g.bt.as_ref(), infos, &g.tensors, wanted.is_ok())?;
        if let Some(reason) = not {
            why_not.get_or_insert(DirectOutcome::NotApplicable { reason });
        }
        total += bytes;
        if g.bt.is_host() {
            host += bytes;
        }
        plans.push(layout);
    }
    // Before any buffer is allocated: the copies held in host memory must
    // fit the budget, or the load is refused rather than OOM-killed.
    let own_cached = file
        .as_ref()
        .map_or(0, |f| crate::loader::budget::cached_bytes(opts, f, host));
    let budget = crate::loader::budget::current(opts, own_cached);
    crate::loader::budget::check(host, "the stream path's copy of the tensors", &budget, opts)?;
    let progress = Progress::new(opts.progress.clone(), total);
    let threads = opts.threads();
    let read_src = match (&file, src) {
        (Some(f), _) => ReadSrc::File { file: f, base },
        (None, Source::Memory(m)) => ReadSrc::Memory((**m).as_ref()),
        (None, _) => unreachable!("a file source has an open file"),
    };
    let ctx = ReadCtx {
        src: read_src,
        direct_path: match src {
            Source::Path(p) => Some(p),
            _ => None,
        },
        path,
        staging_bytes: opts.staging_bytes,
        threads,
        direct_threads: opts.direct_threads(),
        progress: &progress,
    };
    let mut placed = Placed::new(infos.len())?;
    let mut used_direct = false;
    for (g, layout) in groups.iter().zip(plans) {
        let f = copy_group(&ctx, g.bt.as_ref(), infos, &g.tensors, layout)?;
        match f.direct {
            Some(DirectOutcome::Used) => used_direct = true,
            Some(o) => {
                why_not.get_or_insert(o);
            }
            None => {}
        }
        placed.push(f.buffer, &g.tensors, f.placements, PlacementKind::Copied);
    }
    let (buffers, buffer_reports, slots) = placed.finish();
    let direct = match why_not {
        Some(o) => o,
        None if used_direct => DirectOutcome::Used,
        None => DirectOutcome::Off,
    };
    Ok(Loaded {
        budget,
        path: label.clone(),
        header,
        buffers,
        buffer_reports,
        slots,
        map: None,
        prefetcher: None,
        prefetch: PrefetchDecision::NotMapped,
        whole_and_expert_bytes: (0, 0),
        random_access: Vec::new(),
        streamed: Vec::new(),
        huge_pages: false,
        reread: match opts.reread_small_folios {
            true => Reread::Refused(RereadRefusal::NotMapped),
            false => Reread::Off,
        },
        copied: Vec::new(),
        read: Some(ReadReport {
            threads: if used_direct {
                ctx.direct_threads
            } else {
                threads
            },
            direct,
        }),
    })
}
