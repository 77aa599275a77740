//! Data checks: NaN and infinity in tensor data, as llama.cpp's
//! `--check-tensors` finds them with ggml's `ggml_validate_row_data`.
//!
//! Float tensors (F32, F16, BF16, F64, the 8-bit floats, C64) are checked
//! element by element; quantized tensors in their float scale fields: `d`
//! everywhere, also `m`/`dmin` where the block has a minimum, the packed f16
//! scale of IQ1_M, and MXFP4's E8M0 exponent (0xFF, E8M0's NaN code, is
//! rejected as ggml does). The quantized values themselves are small integers
//! or code-book indices and cannot be NaN. Integer and bool tensors, NVFP4
//! (whose UE4M3 scales decode to a finite value for every code) and the
//! sub-byte floats F4, F6_E2M3 and F6_E3M2 (no NaN or infinity codes) have
//! nothing to check.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::scalar;
use crate::error::{Error, Result};
use crate::types::TensorType;

/// What [`check_tensors`] looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckStats {
    /// Tensors checked.
    pub tensors: usize,
    /// Bytes of tensor data checked.
    pub bytes: u64,
    /// Worker threads used.
    pub threads: usize,
}

/// The first bad value in a run of whole elements or blocks: its index
/// within the run, the field and the value.
#[derive(Clone, Copy, Debug)]
struct Fault {
    index: usize,
    field: &'static str,
    value: f64,
}

/// How a type's bytes are checked.
#[derive(Clone, Copy, Debug)]
enum Plan {
    /// Nothing can be non-finite.
    Nothing,
    /// Every element is a float (or two, for C64).
    Floats,
    /// Each block holds float fields at these byte offsets.
    Fields(&'static [(&'static str, usize, Field)]),
    /// IQ1_M: an f16 scale packed into the top nibbles of four u16s at byte 48.
    Iq1m,
}

/// The encoding of a block field.
#[derive(Clone, Copy, Debug)]
enum Field {
    F16,
    F32,
    /// E8M0 exponent: 0xFF is NaN.
    E8m0,
}

const D0: &[(&str, usize, Field)] = &[("d", 0, Field::F16)];
const DM: &[(&str, usize, Field)] = &[("d", 0, Field::F16), ("m", 2, Field::F16)];
const DS: &[(&str, usize, Field)] = &[("d", 0, Field::F16), ("s", 2, Field::F16)];
const D_DMIN: &[(&str, usize, Field)] = &[("d", 0, Field::F16), ("dmin", 2, Field::F16)];

fn plan(ty: TensorType) -> Plan {
    use TensorType as T;
    // Field offsets follow ggml's block structs (ggml-common.h), as the
    // block types in `crate::buffer` and `super::blocks` lay them out.
    match ty {
        T::F32
        | T::F16
        | T::BF16
        | T::F64
        | T::C64
        | T::F8_E4M3
        | T::F8_E5M2
        | T::F8_E4M3FNUZ
        | T::F8_E5M2FNUZ
        | T::F8_E8M0 => Plan::Floats,
        T::Q1_0
        | T::Q2_0
        | T::Q4_0
        | T::Q5_0
        | T::Q8_0
        | T::IQ2_XXS
        | T::IQ2_XS
        | T::IQ2_S
        | T::IQ3_XXS
        | T::IQ3_S
        | T::IQ1_S
        | T::IQ4_NL
        | T::IQ4_XS => Plan::Fields(D0),
        T::Q4_1 | T::Q5_1 => Plan::Fields(DM),
        T::Q8_1 => Plan::Fields(DS),
        T::Q4_K | T::Q5_K => Plan::Fields(D_DMIN),
        T::Q2_K => Plan::Fields(&[("d", 80, Field::F16), ("dmin", 82, Field::F16)]),
        T::Q3_K => Plan::Fields(&[("d", 108, Field::F16)]),
        T::Q6_K => Plan::Fields(&[("d", 208, Field::F16)]),
        T::Q8_K => Plan::Fields(&[("d", 0, Field::F32)]),
        T::TQ1_0 => Plan::Fields(&[("d", 52, Field::F16)]),
        T::TQ2_0 => Plan::Fields(&[("d", 64, Field::F16)]),
        T::MXFP4 => Plan::Fields(&[("e", 0, Field::E8m0)]),
        T::IQ1_M => Plan::Iq1m,
        T::NVFP4
        | T::I8
        | T::I16
        | T::I32
        | T::I64
        | T::U8
        | T::U16
        | T::U32
        | T::U64
        | T::Bool
        // OCP's 4- and 6-bit floats have no NaN or infinity codes.
        | T::F4
        | T::F6_E2M3
        | T::F6_E3M2 => Plan::Nothing,
    }
}

/// The first index in `bytes`, `W`-byte elements, where `bad` holds.
///
/// Elements are tested 64 at a time with a branch-free OR (which the
/// compiler vectorizes) and only a group that has a bad one is searched.
#[inline(always)]
fn first_bad<const W: usize>(bytes: &[u8], bad: impl Fn([u8; W]) -> bool) -> Option<usize> {
    const GROUP: usize = 64;
    let elem = |c: &[u8]| <[u8; W]>::try_from(c).expect("chunks_exact yields W bytes");
    for (g, group) in bytes.chunks(GROUP * W).enumerate() {
        let any = group
            .chunks_exact(W)
            .fold(false, |acc, c| acc | bad(elem(c)));
        if any {
            let i = group.chunks_exact(W).position(|c| bad(elem(c)))?;
            return Some(g * GROUP + i);
        }
    }
    None
}

fn f16_bad(h: u16) -> bool {
    h & 0x7C00 == 0x7C00
}

/// The first non-finite element of a float type.
fn scan_floats(ty: TensorType, bytes: &[u8]) -> Option<Fault> {
    use TensorType as T;
    let at = |index: usize, value: f64| Fault {
        index,
        field: "",
        value,
    };
    let le16 = |b: &[u8], i: usize, w: usize| u16::from_le_bytes([b[i * w], b[i * w + 1]]);
    match ty {
        T::F32 => {
            let i = first_bad::<4>(bytes, |c| {
                u32::from_le_bytes(c) & 0x7F80_0000 == 0x7F80_0000
            })?;
            let v = f32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().ok()?);
            Some(at(i, f64::from(v)))
        }
        T::F16 => {
            let i = first_bad::<2>(bytes, |c| f16_bad(u16::from_le_bytes(c)))?;
            Some(at(i, f64::from(scalar::fp16(le16(bytes, i, 2)))))
        }
        T::BF16 => {
            let i = first_bad::<2>(bytes, |c| u16::from_le_bytes(c) & 0x7F80 == 0x7F80)?;
            Some(at(i, f64::from(scalar::bf16(le16(bytes, i, 2)))))
        }
        T::F64 => {
            const EXP: u64 = 0x7FF0_0000_0000_0000;
            let i = first_bad::<8>(bytes, |c| u64::from_le_bytes(c) & EXP == EXP)?;
            Some(at(
                i,
                f64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().ok()?),
            ))
        }
        T::C64 => {
            // A complex number: two f32s; report the number and which part.
            let j = first_bad::<4>(bytes, |c| {
                u32::from_le_bytes(c) & 0x7F80_0000 == 0x7F80_0000
            })?;
            let v = f32::from_le_bytes(bytes[j * 4..j * 4 + 4].try_into().ok()?);
            Some(Fault {
                index: j / 2,
                field: if j % 2 == 0 { "re" } else { "im" },
                value: f64::from(v),
            })
        }
        T::F8_E4M3 | T::F8_E5M2 | T::F8_E4M3FNUZ | T::F8_E5M2FNUZ | T::F8_E8M0 => {
            let decode: fn(u8) -> f32 = match ty {
                T::F8_E4M3 => |x| scalar::E4M3FN.to_f32(x),
                T::F8_E5M2 => scalar::e5m2,
                T::F8_E4M3FNUZ => |x| scalar::E4M3FNUZ.to_f32(x),
                T::F8_E5M2FNUZ => |x| scalar::E5M2FNUZ.to_f32(x),
                _ => scalar::e8m0,
            };
            let i = first_bad::<1>(bytes, |c| !decode(c[0]).is_finite())?;
            Some(at(i, f64::from(decode(bytes[i]))))
        }
        _ => None,
    }
}

/// Read a field of `block`; `None` if it is finite.
fn bad_field(block: &[u8], off: usize, f: Field) -> Option<f64> {
    let v = match f {
        Field::F16 => {
            let h = u16::from_le_bytes([*block.get(off)?, *block.get(off + 1)?]);
            if !f16_bad(h) {
                return None;
            }
            f64::from(scalar::fp16(h))
        }
        Field::F32 => {
            let b = block.get(off..off + 4)?;
            let v = f32::from_le_bytes(b.try_into().ok()?);
            if v.is_finite() {
                return None;
            }
            f64::from(v)
        }
        Field::E8m0 => {
            if *block.get(off)? != 0xFF {
                return None;
            }
            f64::NAN
        }
    };
    Some(v)
}

/// The first non-finite value in `bytes`, whole elements or blocks of `ty`,
/// indexed in elements (float types) or blocks (quantized types).
fn scan(ty: TensorType, bytes: &[u8]) -> Option<Fault> {
    // Bytes per block are small constants (at most 292).
    let block_bytes = ty.type_size() as usize;
    match plan(ty) {
        Plan::Nothing => None,
        Plan::Floats => scan_floats(ty, bytes),
        Plan::Fields(fields) => bytes
            .chunks_exact(block_bytes)
            .enumerate()
            .find_map(|(i, b)| {
                fields.iter().find_map(|&(name, off, f)| {
                    bad_field(b, off, f).map(|value| Fault {
                        index: i,
                        field: name,
                        value,
                    })
                })
            }),
        Plan::Iq1m => bytes
            .chunks_exact(block_bytes)
            .enumerate()
            .find_map(|(i, b)| {
                // ggml's iq1m_scale_t: the top nibble of each of the four
                // u16 in `scales` (byte 48), lowest first.
                let sc = |k: usize| u16::from_le_bytes([b[48 + 2 * k], b[49 + 2 * k]]);
                let h = (sc(0) >> 12)
                    | ((sc(1) >> 8) & 0x00F0)
                    | ((sc(2) >> 4) & 0x0F00)
                    | (sc(3) & 0xF000);
                f16_bad(h).then(|| Fault {
                    index: i,
                    field: "scale",
                    value: f64::from(scalar::fp16(h)),
                })
            }),
    }
}

/// Check that `bytes`, whole blocks of `ty` (the data of tensor `name`), hold
/// no NaN or infinity: in every element of a float tensor, in the scale
/// fields of every block of a quantized one (see
/// [the module docs](crate::quant#data-checks) for which fields).
///
/// ```
/// use weightmap::{quant, TensorType};
/// let mut data: Vec<u8> = [1.0f32, 2.0, f32::NAN].iter().flat_map(|v| v.to_le_bytes()).collect();
/// let e = quant::check_data("w", TensorType::F32, &data).unwrap_err();
/// assert_eq!(e.to_string(), "tensor 'w' (f32): element 2 is NaN");
/// data.truncate(8);
/// assert!(quant::check_data("w", TensorType::F32, &data).is_ok());
/// ```
///
/// # Errors
/// - [`Error::NonFiniteData`] naming the tensor and the first bad element
///   or block.
/// - [`Error::RaggedBlocks`] if `bytes` is not a whole number of blocks.
pub fn check_data(name: &str, ty: TensorType, bytes: &[u8]) -> Result<()> {
    whole_blocks(ty, bytes)?;
    match scan(ty, bytes) {
        None => Ok(()),
        Some(f) => Err(fault_error(name, ty, 0, f)),
    }
}

fn whole_blocks(ty: TensorType, bytes: &[u8]) -> Result<usize> {
    let block_bytes = ty.type_size() as usize;
    if bytes.len() % block_bytes != 0 {
        return Err(Error::RaggedBlocks {
            ty,
            nbytes: bytes.len(),
            block_bytes,
        });
    }
    Ok(block_bytes)
}

fn fault_error(name: &str, ty: TensorType, base: usize, f: Fault) -> Error {
    let unit = if ty.is_quantized() {
        "block"
    } else {
        "element"
    };
    Error::NonFiniteData {
        tensor: name.to_owned(),
        ty,
        unit,
        index: base.saturating_add(f.index) as u64,
        field: f.field,
        value: f.value,
    }
}

/// Bytes per unit of work: big tensors are split so that every thread has
/// work, small ones are one unit each.
const CHUNK_BYTES: usize = 4 << 20;

/// The most threads [`check_tensors`] starts.
const MAX_THREADS: usize = 8;

/// One unit of work: a range of whole blocks of one tensor.
struct Job {
    tensor: usize,
    start: usize,
    end: usize,
}

/// [`check_data`] over many tensors, in parallel on a small pool of scoped
/// threads (one per available core, at most 8), big tensors split into
/// 4 MiB pieces of whole blocks.
///
/// `threads` worker threads check them; 0 means the available parallelism
/// (at most 4).
///
/// The error is always the first bad value in iteration order, whatever
/// the threads' timing: pieces after a bad one are skipped, pieces before
/// it are still checked.
///
/// ```
/// use weightmap::{quant, TensorType};
/// # fn main() -> weightmap::Result<()> {
/// let ok = vec![0u8; 64];
/// let mut q8 = vec![0u8; 34 * 4];
/// q8[34 * 3..34 * 3 + 2].copy_from_slice(&0x7C00u16.to_le_bytes()); // d = +inf
/// let stats = quant::check_tensors([("a", TensorType::F16, &ok[..])], 0)?;
/// assert_eq!((stats.tensors, stats.bytes), (1, 64));
/// let e = quant::check_tensors([("a", TensorType::F16, &ok[..]), ("q", TensorType::Q8_0, &q8[..])], 0)
///     .unwrap_err();
/// assert_eq!(e.to_string(), "tensor 'q' (q8_0): block 3 has d = inf");
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`check_data`], for the first bad tensor.
pub fn check_tensors<'a, I>(tensors: I, threads: usize) -> Result<CheckStats>
where
    I: IntoIterator<Item = (&'a str, TensorType, &'a [u8])>,
{
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS)),
        n => n,
    };
    let tensors: Vec<(&str, TensorType, &[u8])> = tensors.into_iter().collect();
    let mut jobs = Vec::new();
    let mut bytes = 0u64;
    for (i, &(_, ty, data)) in tensors.iter().enumerate() {
        let block_bytes = whole_blocks(ty, data)?;
        bytes = bytes.saturating_add(data.len() as u64);
        if matches!(plan(ty), Plan::Nothing) {
            continue;
        }
        let step = (CHUNK_BYTES / block_bytes).max(1) * block_bytes;
        let mut start = 0;
        while start < data.len() {
            let end = start.saturating_add(step).min(data.len());
            jobs.push(Job {
                tensor: i,
                start,
                end,
            });
            start = end;
        }
    }
    let threads = threads.clamp(1, jobs.len().max(1));

    // Jobs are taken in order; `stop` is the first job known to be bad, and
    // no job after it is started. Every job before it still runs, so the
    // fault kept is the first in order.
    let next = AtomicUsize::new(0);
    let stop = AtomicUsize::new(usize::MAX);
    let first: Mutex<Option<(usize, Error)>> = Mutex::new(None);
    let work = || loop {
        let j = next.fetch_add(1, Ordering::Relaxed);
        if j >= jobs.len() || j > stop.load(Ordering::Relaxed) {
            return;
        }
        let job = &jobs[j];
        let (name, ty, data) = tensors[job.tensor];
        let Some(f) = scan(ty, &data[job.start..job.end]) else {
            continue;
        };
        let base = job.start / ty.type_size() as usize;
        stop.fetch_min(j, Ordering::Relaxed);
        // A poisoned lock means another worker panicked; its panic is
        // re-raised by the scope, so the value here does not matter.
        if let Ok(mut slot) = first.lock() {
            if slot.as_ref().map_or(true, |(k, _)| j < *k) {
                *slot = Some((j, fault_error(name, ty, base, f)));
            }
        }
    };
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(work);
            }
        });
    }
    let first = first.into_inner().unwrap_or_else(|p| p.into_inner());
    match first {
        Some((_, e)) => Err(e),
        None => Ok(CheckStats {
            tensors: tensors.len(),
            bytes,
            threads,
        }),
    }
}
