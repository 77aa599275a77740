//! What a runtime announces it reads next ([`Need`]), and
//! [`Weights::prefetch`] and [`Weights::prefetch_likely`], which check
//! every announcement or guess and hand the mapped bytes to the page plan's
//! announcer to read ahead; and [`Weights::follow_runtime_mapping`], for a
//! runtime that computes on its own mapping of the file.

use std::sync::Arc;

use super::weights::Weights;
use crate::error::{Error, Result};
use crate::page_plan::announce::Announced;

/// What a runtime reads next (C: `wm_need`): a whole tensor, or, of a
/// tensor whose outermost dimension counts experts (ggml's
/// `ffn_*_exps`, `ne[2] = n_expert`), only the slices of `experts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need<'a> {
    /// The tensor's index, as [`Weights::tensor_at`] takes it.
    pub tensor: usize,
    /// The experts whose slices are read, as a router gives their ids;
    /// empty for the whole tensor.
    pub experts: &'a [i32],
}

impl Need<'static> {
    /// The whole tensor `tensor`.
    pub fn tensor(tensor: usize) -> Need<'static> {
        Need {
            tensor,
            experts: &[],
        }
    }
}

impl<'a> Need<'a> {
    /// Of tensor `tensor`, the slices of `experts` only.
    pub fn experts(tensor: usize, experts: &'a [i32]) -> Need<'a> {
        Need { tensor, experts }
    }
}

impl Weights {
    /// Announce what the runtime reads next: their reads are queued
    /// (`MADV_WILLNEED`) and this returns without waiting for them. A thread
    /// of the weights' queues them, except the expert slices of weights
    /// over the budget, which this call queues itself, so that they are on
    /// their way before the runtime computes on them. Where even the tensors
    /// read whole exceed the budget ([`ResidencyPlan::StreamAll`](crate::ResidencyPlan::StreamAll)), a
    /// tensor announced whole is not read ahead: the compute reads it in
    /// order, and the fault path streams it. Every announcement is checked
    /// before any is acted on. Tensors in owned memory (the stream path,
    /// copies) are there already, and need nothing.
    ///
    /// A model that fits in memory gains little: its pages stay cached. A
    /// model larger than memory gains most, as each page fault alone would
    /// read around itself (the device's read-ahead) and evict what the next
    /// token needs.
    ///
    /// ```
    /// use weightmap::{gguf::Writer, LoadOptions, Need, TensorType, Weights};
    /// # fn main() -> weightmap::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("moe.gguf");
    /// let mut w = Writer::new(32);
    /// w.tensor("blk.0.ffn_up_exps.weight", TensorType::F32, &[8, 2, 4], vec![0; 256]);
    /// w.write_with(std::fs::File::create(&path).unwrap(), |_, _| {}).unwrap();
    /// // SAFETY: nothing modifies or truncates the file while `weights` lives.
    /// let weights = unsafe { Weights::load(&path, &LoadOptions::default())? };
    /// let up = weights.tensor_index("blk.0.ffn_up_exps.weight").unwrap();
    /// // The router chose experts 3 and 1.
    /// weights.prefetch(&[Need::experts(up, &[3, 1])])?;
    /// assert!(weights.prefetch(&[Need::experts(up, &[4])]).is_err());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::TensorIndex`] for a tensor that is not there,
    /// [`Error::NoSuchExpert`] for an expert the tensor does not hold; then
    /// nothing is read ahead.
    pub fn prefetch(&self, needs: &[Need<'_>]) -> Result<()> {
        let announced = self.announced(needs)?;
        if !announced.is_empty() {
            self.announcer().announce(announced);
        }
        Ok(())
    }

    /// Announce what the runtime expects to read but is not sure of: a
    /// predictor's guess of the experts a router will choose (C:
    /// `wm_prefetch_likely`). Read ahead with the device's spare time and
    /// the budget's spare room only, never before, or at the cost of, what
    /// [`Weights::prefetch`] announced:
    /// - a guess is read only when no announcement waits to be, a piece
    ///   (a tensor, an expert's slice) at a time, each once the reads
    ///   before it are in: an announcement that comes meanwhile goes
    ///   first;
    /// - over the budget, guessed slices take only room nobody holds: not
    ///   that of the slices in use, nor of those kept from past
    ///   announcements;
    /// - a later [`Weights::prefetch`] of the same tensor supersedes its
    ///   guesses: those it does not name are the first to go.
    ///
    /// Returns at once; where the weights' thread cannot run, nothing is
    /// read. Needs are checked as [`Weights::prefetch`] checks them.
    ///
    /// ```
    /// use weightmap::{gguf::Writer, LoadOptions, Need, TensorType, Weights};
    /// # fn main() -> weightmap::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("moe.gguf");
    /// let mut w = Writer::new(32);
    /// w.tensor("blk.1.ffn_up_exps.weight", TensorType::F32, &[8, 2, 4], vec![0; 256]);
    /// w.write_with(std::fs::File::create(&path).unwrap(), |_, _| {}).unwrap();
    /// // SAFETY: nothing modifies or truncates the file while `weights` lives.
    /// let weights = unsafe { Weights::load(&path, &LoadOptions::default())? };
    /// let up = weights.tensor_index("blk.1.ffn_up_exps.weight").unwrap();
    /// // A predictor expects layer 1's router to choose experts 0 and 2.
    /// weights.prefetch_likely(&[Need::experts(up, &[0, 2])])?;
    /// // The router chose 2 and 3.
    /// weights.prefetch(&[Need::experts(up, &[2, 3])])?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Weights::prefetch`]; then nothing is read ahead.
    pub fn prefetch_likely(&self, needs: &[Need<'_>]) -> Result<()> {
        let guessed = self.announced(needs)?;
        if !guessed.is_empty() {
            self.announcer().guess(guessed);
        }
        Ok(())
    }

    /// Tell the weights that the runtime computes on its own mapping of
    /// the same file (llama.cpp's `mmap`, with weightmap's hook announcing
    /// for it), where it holds tensor `tensor` at `data` (C:
    /// `wm_follow_mapping`). From then on the access advice the page plan
    /// gives that tensor's file (each expert tensor's at its first
    /// announcement, and the advice it gave the tensors at load, given again
    /// now) is given to the runtime's pages too, and each slice the
    /// plan releases is paged out of them (`MADV_PAGEOUT`; Linux 5.4+, and
    /// for a file's pages only in a process that owns the file or may write
    /// it). Without this, over the budget, every page the runtime touched
    /// would stay until the kernel's reclaim took something, by recency:
    /// the kernel drops no page another mapping holds. The advice never
    /// changes what the runtime's memory holds, so a mapping unmapped later
    /// costs nothing but a stray hint. Calling it again for the same
    /// mapping is cheap; a tensor in owned memory (the stream path, a copy)
    /// needs nothing.
    ///
    /// ```
    /// use weightmap::{gguf::Writer, LoadOptions, TensorType, Weights};
    /// # fn main() -> weightmap::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("moe.gguf");
    /// let mut w = Writer::new(32);
    /// w.tensor("blk.0.ffn_up_exps.weight", TensorType::F32, &[8, 2, 4], vec![0; 256]);
    /// w.write_with(std::fs::File::create(&path).unwrap(), |_, _| {}).unwrap();
    /// // SAFETY: nothing modifies or truncates the file while `weights` lives.
    /// let weights = unsafe { Weights::load(&path, &LoadOptions::default())? };
    /// let up = weights.tensor_index("blk.0.ffn_up_exps.weight").unwrap();
    /// // A heap copy is no mapping of the file, and is refused.
    /// let copy = weights.tensor_at(up).unwrap().to_vec()?;
    /// assert!(weights.follow_runtime_mapping(up, copy.as_ptr()).is_err());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::TensorIndex`] for a tensor that is not there;
    /// [`Error::Io`] unless the process's maps show, where `data` puts the
    /// file, a read-only mapping of it at the same offsets (Linux and
    /// Android: `InvalidInput`), and on every other platform
    /// (`Unsupported`).
    pub fn follow_runtime_mapping(&self, tensor: usize, data: *const u8) -> Result<()> {
        if self.tensor_at(tensor).is_none() {
            return Err(Error::TensorIndex {
                index: tensor as u64,
                count: self.len(),
            });
        }
        let Some((_, range)) = self.mapped_range_at(tensor) else {
            return Ok(());
        };
        // The runtime's address of the file's offset 0, the view's (a
        // wrapping difference: a wrong one fails the check), and the span
        // of the tensors the page plan advises and releases.
        let at = (data as usize).wrapping_sub(range.start as usize);
        let (map, span) = self.mapped_extent_at(tensor).expect("mapped above");
        let span = (span.start as usize, span.end as usize);
        let news = map.follow(at, span.0, span.1).map_err(|source| Error::Io {
            op: "following the runtime's mapping of",
            path: self.path_of(tensor).to_owned(),
            source,
        })?;
        if news {
            // The load's advice first, then each expert tensor's own, given
            // again at its next announcement.
            self.advise_again(tensor);
            self.announcer().forget_advised();
        }
        Ok(())
    }

    /// The mapped ranges `needs` name, by mapping, every need checked.
    fn announced(&self, needs: &[Need<'_>]) -> Result<Vec<Announced>> {
        let mut announced: Vec<Announced> = Vec::new();
        for need in needs {
            let Some(t) = self.tensor_at(need.tensor) else {
                return Err(Error::TensorIndex {
                    index: need.tensor as u64,
                    count: self.len(),
                });
            };
            let info = t.info();
            let mut slices = Vec::with_capacity(need.experts.len());
            for &e in need.experts {
                let range = u64::try_from(e).ok().and_then(|e| info.expert_range(e));
                let range = range.ok_or_else(|| Error::NoSuchExpert {
                    tensor: info.name.to_owned(),
                    expert: i64::from(e),
                    experts: info.experts(),
                })?;
                // File ranges of a validated tensor, which is mapped when
                // they are used: inside the mapping, so within usize.
                slices.push((range.start as usize, range.end as usize));
            }
            // Owned memory (the stream path, a copy) needs nothing.
            let Some((map, whole)) = self.mapped_range_at(need.tensor) else {
                continue;
            };
            let whole = (whole.start as usize, whole.end as usize);
            let a = match announced.iter().position(|a| Arc::ptr_eq(&a.map, map)) {
                Some(i) => &mut announced[i],
                None => {
                    announced.push(Announced {
                        map: Arc::clone(map),
                        whole: Vec::new(),
                        experts: Vec::new(),
                    });
                    announced.last_mut().expect("just pushed")
                }
            };
            if slices.is_empty() {
                a.whole.push(whole);
                continue;
            }
            // One entry a tensor, each expert once: a batch's tokens may
            // name the same tensor and expert more than once.
            match a.experts.iter_mut().find(|(t, _)| *t == whole) {
                Some((_, known)) => known.extend(slices),
                None => a.experts.push((whole, slices)),
            }
        }
        for a in &mut announced {
            for (_, slices) in &mut a.experts {
                slices.sort_unstable();
                slices.dedup();
            }
        }
        Ok(announced)
    }
}
