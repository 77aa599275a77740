//! The stream path: read the header, then every tensor into owned buffers,
//! one per buffer type.

use std::path::Path;

use crate::error::Result;
use crate::format::read_header;
use crate::prefetch::PrefetchDecision;

use super::place::{add, copy_group, Group, Placed};
use super::report::PlacementKind;
use super::weights::{HeaderBytes, Loaded};
use super::{open_checked, LoadOptions};

/// Load `path` into owned buffers: validate the header (read in growing
/// prefixes, never past it), then read each tensor once into its place.
pub(crate) fn stream_path(path: &Path, opts: &LoadOptions) -> Result<Loaded> {
    let (file, meta) = open_checked(path)?;
    let (header, header_bytes) = read_header(&file, meta.len(), path)?;
    let infos = header.tensors();
    let mut groups: Vec<Group> = Vec::new();
    for (i, t) in infos.iter().enumerate() {
        add(&mut groups, opts.target(t), i);
    }
    if groups.is_empty() {
        // No tensors: one empty buffer of the default type.
        groups.push(Group {
            bt: opts.buffer_type.clone(),
            tensors: Vec::new(),
        });
    }
    let mut placed = Placed::new(infos.len());
    for g in &groups {
        let (buffer, placements) = copy_group(
            &file,
            path,
            g.bt.as_ref(),
            infos,
            &g.tensors,
            opts.staging_bytes,
        )?;
        placed.push(buffer, &g.tensors, placements, PlacementKind::Copied);
    }
    let (buffers, buffer_reports, slots) = placed.finish();
    Ok(Loaded {
        path: path.to_owned(),
        header,
        header_bytes: HeaderBytes::Owned(header_bytes),
        buffers,
        buffer_reports,
        slots,
        map: None,
        prefetcher: None,
        prefetch: PrefetchDecision::NotMapped,
        random_access: Vec::new(),
        copied: Vec::new(),
    })
}
