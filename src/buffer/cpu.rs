//! The CPU buffer type: owned aligned buffers and non-owning mapped buffers.

use std::alloc::Layout;
use std::ptr::NonNull;

use super::interface::{check_alignment, check_range, Buffer, BufferType, BufferUsage, HostRegion};
use crate::error::{Error, Result};
use crate::os::AnonMap;
use crate::page_plan::plan::owned_buffer_alignment;

/// The CPU buffer type: host memory, 32-byte alignment by default (ggml's
/// tensor alignment), configurable to any power of two.
///
/// ```
/// use weightmap::buffer::{Buffer, BufferType, CpuBufferType};
/// # fn main() -> weightmap::Result<()> {
/// let bt = CpuBufferType::with_alignment(64)?; // AVX-512
/// let mut buf = bt.alloc_buffer(256)?;
/// buf.set(64, &[1, 2, 3])?;
/// let mut out = [0u8; 3];
/// buf.get(64, &mut out)?;
/// assert_eq!(out, [1, 2, 3]);
/// assert_eq!(buf.base_addr() % 64, 0);
/// assert!(CpuBufferType::with_alignment(48).is_err());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuBufferType {
    alignment: usize,
    huge_pages: bool,
}

impl CpuBufferType {
    /// ggml's tensor alignment.
    pub const DEFAULT_ALIGNMENT: usize = 32;

    /// The default CPU buffer type (32-byte alignment).
    pub fn new() -> Self {
        CpuBufferType {
            alignment: Self::DEFAULT_ALIGNMENT,
            huge_pages: true,
        }
    }

    /// A CPU buffer type with another alignment (64 for AVX-512, 4096 for pages).
    ///
    /// # Errors
    /// [`Error::InvalidAlignment`] unless `alignment` is a nonzero power of two.
    pub fn with_alignment(alignment: usize) -> Result<Self> {
        Ok(CpuBufferType {
            alignment: check_alignment(alignment)?,
            huge_pages: true,
        })
    }

    /// Whether the buffers this type maps (those of at least
    /// [`CpuBuffer::MAP_THRESHOLD`] bytes) are in transparent huge pages:
    /// started on a huge-page boundary and advised `MADV_HUGEPAGE` (Linux
    /// and Android, where THP is `madvise` or `always`). A hint: where the
    /// kernel has no huge pages to give, or none at all, the buffer is the
    /// same, in base pages.
    ///
    /// On by default. Decode reads every weight per token, and reads them
    /// faster from huge pages than from base pages (ARCHITECTURE.md, "Huge
    /// pages for the weights"), for as long as the weights live. Filling a buffer also pays the kernel's per-page work (fault,
    /// zeroing, memory-cgroup charge, LRU insertion) once per 512 base
    /// pages. Against it: a virtual machine that hands freed memory back to
    /// its host (free page reporting) gives out huge pages from exactly the
    /// blocks it handed back, which the host faults in again on first touch,
    /// so loads there can be slower. Figures for both: BENCHMARKS.md,
    /// "Transparent huge pages for owned buffers". `huge_pages(false)`
    /// (`weightmap load --no-huge-pages`) turns it off.
    ///
    /// ```
    /// use weightmap::buffer::{BufferType, CpuBufferType};
    /// # fn main() -> weightmap::Result<()> {
    /// assert!(CpuBufferType::new().wants_huge_pages());
    /// let bt = CpuBufferType::new().huge_pages(false);
    /// assert!(!bt.wants_huge_pages());
    /// let buf = bt.alloc(4 << 20)?; // mapped, base pages
    /// assert_eq!(buf.bytes().len(), 4 << 20);
    /// # Ok(()) }
    /// ```
    pub fn huge_pages(mut self, yes: bool) -> Self {
        self.huge_pages = yes;
        self
    }

    /// Whether [`CpuBufferType::huge_pages`] is on.
    pub fn wants_huge_pages(&self) -> bool {
        self.huge_pages
    }

    /// Allocate an owned buffer (the concrete type, not boxed).
    ///
    /// # Errors
    /// [`Error::Alloc`] if the memory cannot be had.
    pub fn alloc(&self, size: usize) -> Result<CpuBuffer> {
        CpuBuffer::new(size, self.alignment, self.huge_pages)
    }
}

impl Default for CpuBufferType {
    fn default() -> Self {
        Self::new()
    }
}

impl BufferType for CpuBufferType {
    fn name(&self) -> &str {
        "CPU"
    }
    fn alignment(&self) -> usize {
        self.alignment
    }
    fn is_host(&self) -> bool {
        true
    }
    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn Buffer>> {
        Ok(Box::new(self.alloc(size)?))
    }
    fn supports_host_ptr(&self) -> bool {
        true
    }
    fn buffer_from_host_ptr(
        &self,
        region: HostRegion,
        alignment: usize,
    ) -> Result<Box<dyn Buffer>> {
        Ok(Box::new(MappedBuffer::new(region, alignment)?))
    }
}

/// An owned, aligned, zero-initialised host buffer.
///
/// Below [`CpuBuffer::MAP_THRESHOLD`] bytes the memory comes from the global
/// allocator (`alloc_zeroed` with the buffer's aligned `Layout`): a 256-byte
/// norm copied out of a mapping costs no system call. From the threshold up
/// it is an anonymous private mapping: page-aligned, zeroed lazily by the
/// kernel (no up-front memset of a 1 GiB buffer), returned to the system on
/// drop. The loader's reading threads prefault the pages they fill, each
/// its own piece in one call, so the kernel's zeroing runs in parallel.
/// Alignments above the page size are met by over-allocating the mapping.
#[derive(Debug)]
pub struct CpuBuffer {
    mem: Memory,
    size: usize,
    alignment: usize,
    usage: BufferUsage,
}

/// Where a [`CpuBuffer`]'s bytes live.
#[derive(Debug)]
enum Memory {
    /// A zero-byte buffer has no memory.
    Empty,
    /// A block from the global allocator.
    Heap(HeapBlock),
    /// An anonymous mapping.
    Map(AnonMap),
}

/// A zeroed block from the global allocator, freed on drop: a `Box<[u8]>`
/// with an alignment of the caller's choosing.
#[derive(Debug)]
struct HeapBlock {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a HeapBlock owns its block exclusively, like a `Box<[u8]>`: it
// hands out `&[u8]` only through `&self` and `&mut [u8]` only through
// `&mut self`, so moving it or sharing references across threads is as
// sound as for a box.
unsafe impl Send for HeapBlock {}
// SAFETY: as for Send.
unsafe impl Sync for HeapBlock {}

impl HeapBlock {
    /// `size` (nonzero) zeroed bytes at a multiple of `alignment` (a power of two).
    fn zeroed(size: usize, alignment: usize) -> Result<HeapBlock> {
        let failed = || Error::Alloc {
            size,
            source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
        };
        // Fails if size rounded up to the alignment overflows isize.
        let layout = Layout::from_size_align(size, alignment).map_err(|_| failed())?;
        debug_assert!(layout.size() > 0);
        // SAFETY: `layout` has a nonzero size: `CpuBuffer::new` handles 0
        // bytes without memory and only asks for more.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(failed)?;
        Ok(HeapBlock { ptr, layout })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is a live allocation of `layout.size()` bytes, all
        // initialised (zeroed when allocated), owned by `self` and borrowed
        // with it.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for HeapBlock {
    fn drop(&mut self) {
        // SAFETY: `ptr` was allocated by the global allocator with `layout`
        // and is freed only here, once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl CpuBuffer {
    /// Buffers of this many bytes or more are anonymous mappings; smaller
    /// ones come from the global allocator. Below this size the allocator
    /// is cheaper (it makes no system call per buffer); from it up the two
    /// cost the same, since glibc maps blocks this large itself, and the
    /// mapping frees on drop whatever the allocator would keep. Chosen from
    /// `cargo bench --bench cpu_buffer`: BENCHMARKS.md, "Owned CPU buffers:
    /// heap or anonymous map".
    pub const MAP_THRESHOLD: usize = 256 << 10;

    fn new(size: usize, alignment: usize, huge_pages: bool) -> Result<CpuBuffer> {
        let alignment = check_alignment(alignment)?;
        let mem = if size == 0 {
            Memory::Empty
        } else if size < Self::MAP_THRESHOLD || !crate::os::SUPPORTED {
            Memory::Heap(HeapBlock::zeroed(size, alignment)?)
        } else {
            Self::map(size, alignment, huge_pages)?
        };
        Ok(CpuBuffer {
            mem,
            size,
            alignment,
            usage: BufferUsage::Any,
        })
    }

    /// An anonymous mapping of `size` bytes (and slack for an alignment
    /// above the page size), advised `MADV_HUGEPAGE` if `huge_pages` and
    /// then started on a huge-page boundary, so that every whole huge page
    /// of the buffer can be one (the slack before it is never touched, so
    /// never resident).
    fn map(size: usize, alignment: usize, huge_pages: bool) -> Result<Memory> {
        let alignment = owned_buffer_alignment(alignment, huge_pages);
        let map = AnonMap::new(size, alignment, huge_pages)
            .map_err(|source| Error::Alloc { size, source })?;
        Ok(Memory::Map(map))
    }

    /// The buffer's bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.mem {
            Memory::Empty => &[],
            Memory::Heap(b) => b.bytes(),
            Memory::Map(map) => map.bytes(),
        }
    }

    /// The buffer's bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.mem {
            Memory::Empty => &mut [],
            Memory::Heap(b) => b.bytes_mut(),
            Memory::Map(map) => map.bytes_mut(),
        }
    }

    /// Whether the bytes are an anonymous mapping (a buffer of at least
    /// [`CpuBuffer::MAP_THRESHOLD`] bytes) rather than a heap block.
    pub fn is_mapped(&self) -> bool {
        matches!(self.mem, Memory::Map(_))
    }
}

impl Buffer for CpuBuffer {
    fn type_name(&self) -> &str {
        "CPU"
    }
    fn size(&self) -> usize {
        self.size
    }
    fn alignment(&self) -> usize {
        self.alignment
    }
    fn usage(&self) -> BufferUsage {
        self.usage
    }
    fn set_usage(&mut self, usage: BufferUsage) {
        self.usage = usage;
    }
    fn owns_memory(&self) -> bool {
        true
    }
    fn is_host(&self) -> bool {
        true
    }
    fn base_addr(&self) -> usize {
        match &self.mem {
            // A zero-byte buffer has no memory; like `NonNull::dangling`, its
            // address is its alignment, so zero-byte placements in it pass.
            Memory::Empty => self.alignment,
            Memory::Heap(b) => b.bytes().as_ptr() as usize,
            Memory::Map(map) => map.bytes().as_ptr() as usize,
        }
    }
    fn host_bytes(&self) -> Option<&[u8]> {
        Some(self.bytes())
    }
    fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        Some(self.bytes_mut())
    }
    fn set(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        let r = check_range(offset, data.len(), self.size)?;
        self.bytes_mut()[r].copy_from_slice(data);
        Ok(())
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = check_range(offset, out.len(), self.size)?;
        out.copy_from_slice(&self.bytes()[r]);
        Ok(())
    }
    fn memset(&mut self, offset: usize, len: usize, value: u8) -> Result<()> {
        let r = check_range(offset, len, self.size)?;
        self.bytes_mut()[r].fill(value);
        Ok(())
    }
}

/// A non-owning CPU buffer over a byte range of a file mapping (ggml's
/// `CPU_Mapped` buffer from `ggml_backend_cpu_buffer_from_ptr`).
///
/// It holds its [`HostRegion`], and so the mapping, and every byte view
/// borrows the buffer, so no view can outlive the mapping. It is neither
/// `Clone` nor hands out the mapping: it lives inside the `Weights` that
/// made it, which the load's `# Safety` contract covers. Dropping it frees
/// nothing but its handle. It is read-only: writes return [`Error::ReadOnly`].
///
/// ```compile_fail
/// // A mapped buffer cannot be cloned out of the weights that own it.
/// fn keep(b: &weightmap::buffer::MappedBuffer) -> weightmap::buffer::MappedBuffer {
///     b.clone()
/// }
/// ```
#[derive(Debug)]
pub struct MappedBuffer {
    region: HostRegion,
    alignment: usize,
    usage: BufferUsage,
}

impl MappedBuffer {
    /// A buffer viewing `region`, whose tensors sit at multiples of
    /// `alignment`.
    ///
    /// # Errors
    /// [`Error::InvalidAlignment`] for a bad alignment.
    pub fn new(region: HostRegion, alignment: usize) -> Result<Self> {
        Ok(MappedBuffer {
            region,
            alignment: check_alignment(alignment)?,
            usage: BufferUsage::Weights,
        })
    }

    /// The viewed bytes.
    pub fn bytes(&self) -> &[u8] {
        self.region.bytes()
    }

    /// Where the buffer starts in the mapping (and so in the file).
    pub fn file_start(&self) -> usize {
        self.region.file_start()
    }

    fn read_only(&self) -> Error {
        Error::ReadOnly {
            buffer: "CPU_Mapped".into(),
        }
    }
}

impl Buffer for MappedBuffer {
    fn type_name(&self) -> &str {
        "CPU_Mapped"
    }
    fn size(&self) -> usize {
        self.region.len()
    }
    fn alignment(&self) -> usize {
        self.alignment
    }
    fn usage(&self) -> BufferUsage {
        self.usage
    }
    fn set_usage(&mut self, usage: BufferUsage) {
        self.usage = usage;
    }
    fn owns_memory(&self) -> bool {
        false
    }
    fn is_host(&self) -> bool {
        true
    }
    fn base_addr(&self) -> usize {
        self.region.addr()
    }
    fn host_bytes(&self) -> Option<&[u8]> {
        Some(self.bytes())
    }
    fn set(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        check_range(offset, data.len(), self.size())?;
        Err(self.read_only())
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = check_range(offset, out.len(), self.size())?;
        out.copy_from_slice(&self.bytes()[r]);
        Ok(())
    }
    fn memset(&mut self, offset: usize, len: usize, _value: u8) -> Result<()> {
        check_range(offset, len, self.size())?;
        Err(self.read_only())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::{prefault_for_write, Mapping};
    use std::io::Write;
    use std::sync::Arc;

    #[test]
    fn small_buffers_are_heap_blocks_large_ones_mappings() {
        for alignment in [1, 32, 64, 4096, 1 << 16] {
            let bt = CpuBufferType::with_alignment(alignment).unwrap();
            for size in [
                1,
                256,
                4097,
                CpuBuffer::MAP_THRESHOLD - 1,
                CpuBuffer::MAP_THRESHOLD,
            ] {
                for prefault in [false, true] {
                    let mut b = CpuBuffer::new(size, alignment, false).unwrap();
                    if prefault {
                        prefault_for_write(b.bytes_mut());
                    }
                    let what = format!("{size} bytes at {alignment}, prefaulted {prefault}");
                    assert_eq!(b.is_mapped(), size >= CpuBuffer::MAP_THRESHOLD, "{what}");
                    assert_eq!(b.base_addr() % alignment, 0, "{what}");
                    assert_eq!(b.bytes().len(), size, "{what}");
                    assert!(b.bytes().iter().all(|&x| x == 0), "{what}: zeroed");
                    b.memset(0, size, 0xA5).unwrap();
                    b.set(size - 1, &[7]).unwrap();
                    let mut last = [0u8; 1];
                    b.get(size - 1, &mut last).unwrap();
                    assert_eq!(last, [7], "{what}");
                    assert_eq!(b.bytes()[size - 1], 7, "{what}");
                    assert_eq!(b.bytes()[0], if size == 1 { 7 } else { 0xA5 }, "{what}");
                }
            }
            assert_eq!(bt.alloc(0).unwrap().base_addr(), alignment);
        }
        // A size the aligned layout cannot hold is an error, not a panic.
        assert!(matches!(
            HeapBlock::zeroed(usize::MAX - 8, 32),
            Err(Error::Alloc { .. })
        ));
    }

    /// Resident pages of `bytes` (whole pages inside it).
    fn resident_pages(bytes: &[u8]) -> u64 {
        crate::os::memory_residency(bytes).unwrap().resident_pages
    }

    #[test]
    fn prefault_maps_the_whole_pages_it_is_given_and_no_others() {
        let page = crate::os::page_size();
        let mut b = CpuBuffer::new(64 * page, page, false).unwrap();
        assert!(b.is_mapped());
        if !crate::os::page_advice_is_observable("prefault") {
            prefault_for_write(&mut b.bytes_mut()[10 * page + 100..30 * page + 100]);
            assert!(b.bytes().iter().all(|&x| x == 0), "contents unchanged");
            return;
        }
        assert_eq!(resident_pages(b.bytes()), 0, "a fresh mapping is lazy");
        // From the middle of page 10 to the middle of page 30: pages 11..30.
        prefault_for_write(&mut b.bytes_mut()[10 * page + 100..30 * page + 100]);
        assert_eq!(resident_pages(b.bytes()), 19);
        assert_eq!(resident_pages(&b.bytes()[..11 * page]), 0);
        assert_eq!(resident_pages(&b.bytes()[30 * page..]), 0);
        // Less than a page: nothing.
        prefault_for_write(&mut b.bytes_mut()[40 * page + 1..41 * page + 1]);
        assert_eq!(resident_pages(b.bytes()), 19);
        // Last, since reading maps every page (to the zero page).
        assert!(b.bytes().iter().all(|&x| x == 0), "contents unchanged");
    }

    /// The `VmFlags` line of the mapping holding `addr`, from
    /// /proc/self/smaps.
    #[cfg(target_os = "linux")]
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split(' ').next().unwrap_or("");
            if let Some((lo, hi)) = range.split_once('-') {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = (lo..hi).contains(&addr);
                    continue;
                }
            }
            if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return flags.trim().to_string();
                }
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn huge_pages_advise_the_mapping_by_default_and_not_when_turned_off() {
        if crate::os::transparent_huge_pages() == crate::os::TransparentHugePages::Absent {
            return; // a kernel without THP refuses the advice
        }
        if !crate::os::page_advice_is_observable("huge_pages") {
            let b = CpuBufferType::new()
                .huge_pages(true)
                .alloc(8 << 20)
                .unwrap();
            assert!(b.bytes().iter().all(|&x| x == 0));
            return;
        }
        let size = 8 << 20;
        let huge = CpuBufferType::new().alloc(size).unwrap();
        let plain = CpuBufferType::new().huge_pages(false).alloc(size).unwrap();
        let small = CpuBufferType::new().huge_pages(true).alloc(4096).unwrap();
        assert!(huge.is_mapped() && plain.is_mapped() && !small.is_mapped());
        let has_hg = |b: &CpuBuffer| {
            vm_flags(b.bytes().as_ptr() as usize)
                .split(' ')
                .any(|f| f == "hg")
        };
        assert!(
            has_hg(&huge),
            "{}",
            vm_flags(huge.bytes().as_ptr() as usize)
        );
        assert!(!has_hg(&plain));
        assert!(huge.bytes().iter().all(|&x| x == 0));
        // Started on a huge-page boundary, whatever the alignment asked.
        assert_eq!(huge.bytes().as_ptr() as usize % crate::os::huge_page(), 0);
        assert_eq!(huge.base_addr() % CpuBufferType::DEFAULT_ALIGNMENT, 0);
    }

    #[test]
    fn a_mapped_buffer_refuses_every_write() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&[7u8; 4096]).unwrap();
        // SAFETY: the temporary file is not changed while mapped.
        let map = Arc::new(unsafe { Mapping::map(f.as_file()) }.unwrap());
        let region = HostRegion::new(Arc::clone(&map), 64, 1024).unwrap();
        assert!(HostRegion::new(Arc::clone(&map), 4000, 200).is_err());
        let mut b = CpuBufferType::new()
            .buffer_from_host_ptr(region, 32)
            .unwrap();
        assert!(matches!(b.set(0, &[1]), Err(Error::ReadOnly { .. })));
        assert!(matches!(b.memset(0, 1, 0), Err(Error::ReadOnly { .. })));
        assert!(matches!(b.clear(0), Err(Error::ReadOnly { .. })));
        assert!(b.host_bytes_mut().is_none());
        assert!(matches!(b.set(2000, &[1]), Err(Error::OutOfBuffer { .. })));
        let mut out = [0u8; 4];
        b.get(10, &mut out).unwrap();
        assert_eq!(out, [7; 4]);
        assert_eq!(
            (b.size(), b.alignment(), b.owns_memory()),
            (1024, 32, false)
        );
        assert_eq!(b.base_addr(), map.addr() + 64);
    }
}
