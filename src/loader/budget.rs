//! The memory budget of a load ([`Budget`]): read once when the load starts
//! (or taken from [`LoadOptions::budget`], else from `$WEIGHTMAP_BUDGET`),
//! then every memory decision is made against it.

use std::fs::File;

use crate::error::{Error, Result};
use crate::os::{read_budget, BudgetReading};
use crate::page_plan::plan::MemReader;
use crate::size::parse_size;

use super::options::LoadOptions;
use super::report::Budget;

/// The variable that holds every load whose options set no budget to the
/// budget it gives (a byte count, [`parse_size`]), in place of the
/// system's: for a runtime the user cannot change the code of (llama.cpp's
/// `--weightmap`), to leave room for the rest of the machine.
pub(crate) const BUDGET_VAR: &str = "WEIGHTMAP_BUDGET";

/// A budget fixed before anything is read: `opts`', else the variable's
/// (`Err` naming what is wrong with it). `None`: the system's is read.
fn fixed(opts: &LoadOptions) -> Option<(std::result::Result<u64, String>, &'static str)> {
    if let Some(bytes) = opts.budget {
        return Some((Ok(bytes), "LoadOptions::budget"));
    }
    let value = std::env::var_os(BUDGET_VAR)?;
    let parsed =
        parse_size(&value.to_string_lossy()).map_err(|why| format!("${BUDGET_VAR}: {why}"));
    Some((parsed, BUDGET_VAR))
}

/// The budget `opts` or `$WEIGHTMAP_BUDGET` give, or the system's, for a
/// load of a model whose bytes are `own_cached` in the page cache already
/// (a restart, a second process): those count as the model's resident
/// pages, not as used.
pub(crate) fn current(opts: &LoadOptions, own_cached: u64) -> Budget {
    match fixed(opts) {
        Some((Ok(bytes), source)) => {
            return Budget {
                bytes: Some(bytes),
                source: source.into(),
                ..Budget::default()
            }
        }
        // A budget the user meant to fix but wrote wrongly is reported as
        // unreadable, not replaced by the system's without a word.
        Some((Err(why), _)) => {
            return Budget {
                bytes: None,
                source: format!("unreadable: {why}"),
                ..Budget::default()
            }
        }
        None => {}
    }
    match read_budget(own_cached) {
        BudgetReading::Limited { budget, .. } => Budget {
            bytes: Some(budget.bytes),
            source: budget.source.to_string(),
            limit: budget.counted.map(|c| c.limit),
            usage: budget.counted.map(|c| c.usage),
            reclaimable: budget.counted.map(|c| c.reclaimable),
            own_cached: budget.counted.map(|c| c.own_cached),
        },
        BudgetReading::Unreadable { why } => Budget {
            bytes: None,
            source: format!("unreadable: {why}"),
            ..Budget::default()
        },
    }
}

/// About how many of the `len` bytes of a model in `file` are in the page
/// cache, by the sampled residency (0 where it cannot be told), for a
/// reading of the system's budget; 0 without sampling where `opts` fix the
/// budget, which then reads nothing.
pub(crate) fn cached_bytes(opts: &LoadOptions, file: &File, len: u64) -> u64 {
    if fixed(opts).is_some() {
        return 0;
    }
    crate::os::residency_estimate_of(file).map_or(0, |r| (r.fraction() * len as f64) as u64)
}

/// The budget a mapped load is held to, read once as it starts (the model
/// `own_cached` bytes warm), and how a background prefetch reads it again
/// while it runs: the figure `opts` fixed, or the system's then (a
/// cgroup's usage moves as the prefetch fills the page cache; what it
/// reads lands on the inactive list, counted as reclaimable).
pub(crate) fn read_once(opts: &LoadOptions, own_cached: u64) -> (Budget, MemReader) {
    let budget = match &opts.shard_of_model {
        // One file of several: the model's, read once for all.
        Some(model) => model.budget.clone(),
        None => current(opts, own_cached),
    };
    (budget, reader(opts, own_cached))
}

fn reader(opts: &LoadOptions, own_cached: u64) -> MemReader {
    match fixed(opts) {
        Some((bytes, _)) => {
            let bytes = bytes.ok();
            std::sync::Arc::new(move || bytes)
        }
        None => std::sync::Arc::new(move || read_budget(own_cached).budget().map(|b| b.bytes)),
    }
}

/// Refuse `needed` bytes for `what` when they are more than `budget` holds,
/// unless `opts` say to go ahead. A budget that could not be read refuses
/// nothing.
pub(crate) fn check(
    needed: u64,
    what: &'static str,
    budget: &Budget,
    opts: &LoadOptions,
) -> Result<()> {
    match budget.bytes {
        Some(b) if needed > b && !opts.ignore_budget => Err(Error::OverBudget {
            what,
            needed,
            budget: b,
            budget_source: budget.source.clone(),
        }),
        _ => Ok(()),
    }
}

/// How a copy made after the load (`TensorRef::to_owned_tensor`) is held
/// to the budget: against the figure the load's options fixed, or else the
/// system's at the time of the copy (usage has moved since the load); not
/// at all with `ignore_budget`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CopyRule {
    fixed: Option<u64>,
    ignore: bool,
}

impl CopyRule {
    pub(crate) fn of(opts: &LoadOptions) -> CopyRule {
        CopyRule {
            fixed: opts.budget,
            ignore: opts.ignore_budget,
        }
    }

    /// Refuse `needed` bytes for `what` when the budget holds fewer.
    pub(crate) fn check(self, needed: u64, what: &'static str) -> Result<()> {
        if self.ignore {
            return Ok(());
        }
        let opts = match self.fixed {
            Some(b) => LoadOptions::default().budget(b),
            None => LoadOptions::default(),
        };
        check(needed, what, &current(&opts, 0), &opts)
    }
}
