//! Backend buffers: placement refusals, typed views of every supported
//! element type, the simulated device, owned buffer alignment.

use half::{bf16, f16};
use weightmap::buffer::{place, BufferType, BufferUsage, CpuBufferType, SimDeviceBufferType};
use weightmap::quant::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use weightmap::{Element, Error, TensorInfo, TensorTable, TensorType};

/// A one-tensor table (owned: a `TensorInfo` borrows its table).
fn info(ty: TensorType, n_elements: u64) -> TensorTable {
    let mut w = weightmap::gguf::Writer::new(32);
    let nbytes = ty.bytes_for(n_elements).unwrap() as usize;
    w.tensor("t", ty, &[n_elements], vec![0; nbytes]);
    let bytes = w.to_bytes();
    weightmap::gguf::GgufHeader::parse(&bytes)
        .unwrap()
        .tensors()
        .clone()
}

fn first(t: &TensorTable) -> TensorInfo<'_> {
    t.get(0).unwrap()
}

#[test]
fn cpu_buffers_are_aligned_for_every_power_of_two() {
    for shift in 0..=16 {
        let a = 1usize << shift;
        let bt = CpuBufferType::with_alignment(a).unwrap();
        for size in [1usize, 31, 4096, 100_000] {
            let buf = bt.alloc_buffer(size).unwrap();
            assert_eq!(buf.base_addr() % a, 0, "alignment {a}, size {size}");
            assert_eq!(buf.size(), size);
            assert!(buf.host_bytes().unwrap().iter().all(|&b| b == 0));
        }
    }
    for bad in [0usize, 3, 48, 100] {
        assert!(matches!(
            CpuBufferType::with_alignment(bad),
            Err(Error::InvalidAlignment { alignment }) if alignment == bad
        ));
    }
    let zero = CpuBufferType::new().alloc_buffer(0).unwrap();
    assert_eq!(zero.size(), 0);
    assert_eq!(zero.host_bytes().unwrap().len(), 0);
}

#[test]
fn placement_outside_the_buffer_or_misaligned_is_refused() {
    let buf = CpuBufferType::new().alloc_buffer(256).unwrap();
    assert_eq!(place(buf.as_ref(), "a", 0, 256, 32).unwrap().len, 256);
    assert_eq!(
        place(buf.as_ref(), "empty", 256, 0, 32).unwrap().offset,
        256
    );
    assert!(matches!(
        place(buf.as_ref(), "a", 224, 64, 32),
        Err(Error::OutOfBuffer {
            offset: 224,
            len: 64,
            buffer_size: 256
        })
    ));
    assert!(matches!(
        place(buf.as_ref(), "a", usize::MAX, 2, 1),
        Err(Error::OutOfBuffer { .. })
    ));
    match place(buf.as_ref(), "w", 16, 16, 32) {
        Err(Error::MisalignedPlacement {
            tensor,
            address,
            alignment,
        }) => {
            assert_eq!(tensor, "w");
            assert_eq!(address, buf.base_addr() + 16);
            assert_eq!(alignment, 32);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        place(buf.as_ref(), "w", 0, 1, 24),
        Err(Error::InvalidAlignment { alignment: 24 })
    ));
    // A range that ends exactly at the buffer's end is in; one byte more is out.
    let mut small = CpuBufferType::new().alloc_buffer(15).unwrap();
    assert!(small.set(10, &[0; 5]).is_ok());
    assert!(matches!(
        small.set(10, &[0; 6]),
        Err(Error::OutOfBuffer { .. })
    ));
}

#[test]
fn owned_buffer_set_get_memset_clear() {
    let mut buf = CpuBufferType::new().alloc_buffer(64).unwrap();
    assert!(buf.owns_memory());
    assert_eq!(buf.usage(), BufferUsage::Any);
    buf.set_usage(BufferUsage::Compute);
    assert_eq!(buf.usage(), BufferUsage::Compute);
    buf.set(8, &[1, 2, 3, 4]).unwrap();
    buf.memset(12, 4, 9).unwrap();
    let mut out = [0u8; 8];
    buf.get(8, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3, 4, 9, 9, 9, 9]);
    assert!(matches!(
        buf.set(62, &[0; 4]),
        Err(Error::OutOfBuffer { .. })
    ));
    assert!(matches!(
        buf.get(61, &mut out),
        Err(Error::OutOfBuffer { .. })
    ));
    assert!(matches!(
        buf.memset(60, 5, 0),
        Err(Error::OutOfBuffer { .. })
    ));
    buf.clear(7).unwrap();
    assert!(buf.host_bytes().unwrap().iter().all(|&b| b == 7));
}

#[test]
fn simulated_device_round_trips_bytes_and_hides_them() {
    let dev = SimDeviceBufferType::new(128, 4096).unwrap();
    assert!(!dev.is_host());
    assert_eq!(dev.alignment(), 128);
    let mut buf = dev.alloc_buffer(1024).unwrap();
    assert!(buf.host_bytes().is_none());
    assert!(buf.host_bytes_mut().is_none());
    assert!(!buf.is_host());
    let data: Vec<u8> = (0..=255).collect();
    buf.set(128, &data).unwrap();
    let mut out = vec![0u8; 256];
    buf.get(128, &mut out).unwrap();
    assert_eq!(out, data);
    buf.clear(0xAB).unwrap();
    buf.get(128, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 0xAB));
    // Placement on a device checks offsets against the device alignment.
    assert!(place(buf.as_ref(), "t", 256, 64, 128).is_ok());
    assert!(matches!(
        place(buf.as_ref(), "t", 64, 64, 128),
        Err(Error::MisalignedPlacement { address: 64, .. })
    ));
    assert!(matches!(
        dev.alloc_buffer(4097),
        Err(Error::BufferTooLarge {
            size: 4097,
            max: 4096,
            ..
        })
    ));
}

fn check_view<T: Element + PartialEq + std::fmt::Debug>(ty: TensorType, n: u64, expect_len: usize) {
    let table = info(ty, n);
    let info = first(&table);
    let buf = CpuBufferType::new().alloc(info.nbytes as usize).unwrap();
    let v: &[T] = info.view(buf.bytes()).unwrap();
    assert_eq!(v.len(), expect_len, "{ty}");
    assert_eq!(std::mem::size_of_val(v), info.nbytes as usize);
}

#[test]
fn views_of_every_supported_element_type() {
    check_view::<f32>(TensorType::F32, 8, 8);
    check_view::<f64>(TensorType::F64, 8, 8);
    check_view::<f16>(TensorType::F16, 8, 8);
    check_view::<bf16>(TensorType::BF16, 8, 8);
    check_view::<i8>(TensorType::I8, 8, 8);
    check_view::<i16>(TensorType::I16, 8, 8);
    check_view::<i32>(TensorType::I32, 8, 8);
    check_view::<i64>(TensorType::I64, 8, 8);
    check_view::<BlockQ4_0>(TensorType::Q4_0, 64, 2);
    check_view::<BlockQ4_1>(TensorType::Q4_1, 64, 2);
    check_view::<BlockQ5_0>(TensorType::Q5_0, 64, 2);
    check_view::<BlockQ5_1>(TensorType::Q5_1, 64, 2);
    check_view::<BlockQ8_0>(TensorType::Q8_0, 64, 2);
    check_view::<BlockQ8_1>(TensorType::Q8_1, 64, 2);
    check_view::<BlockQ2K>(TensorType::Q2_K, 512, 2);
    check_view::<BlockQ3K>(TensorType::Q3_K, 512, 2);
    check_view::<BlockQ4K>(TensorType::Q4_K, 512, 2);
    check_view::<BlockQ5K>(TensorType::Q5_K, 512, 2);
    check_view::<BlockQ6K>(TensorType::Q6_K, 512, 2);
    check_view::<BlockQ8K>(TensorType::Q8_K, 512, 2);
}

#[test]
fn view_values_come_from_the_bytes() {
    let table = info(TensorType::F16, 2);
    let info = first(&table);
    let mut buf = CpuBufferType::new().alloc(4).unwrap();
    buf.bytes_mut()[..2].copy_from_slice(&f16::from_f32(1.5).to_le_bytes());
    buf.bytes_mut()[2..].copy_from_slice(&f16::from_f32(-2.0).to_le_bytes());
    let v: &[f16] = info.view(buf.bytes()).unwrap();
    assert_eq!(v, [f16::from_f32(1.5), f16::from_f32(-2.0)]);

    let table = info_q8();
    let info = first(&table);
    let mut buf = CpuBufferType::new().alloc(34).unwrap();
    buf.bytes_mut()[..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
    buf.bytes_mut()[2] = 0xFF;
    let b: &[BlockQ8_0] = info.view(buf.bytes()).unwrap();
    assert_eq!(b[0].d, f16::from_f32(0.25));
    assert_eq!(b[0].qs[0], -1);
}

fn info_q8() -> TensorTable {
    info(TensorType::Q8_0, 32)
}

#[test]
fn wrong_type_or_ragged_size_or_misaligned_view_is_an_error() {
    let f32_table = info(TensorType::F32, 4);
    let f32_info = first(&f32_table);
    let buf = CpuBufferType::new().alloc(64).unwrap();
    assert!(matches!(
        f32_info.view::<f16>(&buf.bytes()[..16]),
        Err(Error::ViewType {
            expected: "f16",
            found: TensorType::F32,
            ..
        })
    ));
    assert!(matches!(
        f32_info.view::<BlockQ4_0>(&buf.bytes()[..16]),
        Err(Error::ViewType { .. })
    ));
    // 15 bytes are not a whole number of f32.
    assert!(matches!(
        f32_info.view::<f32>(&buf.bytes()[..15]),
        Err(Error::ViewLayout { nbytes: 15, .. })
    ));
    // An address one byte off is not aligned for f32.
    assert!(matches!(
        f32_info.view::<f32>(&buf.bytes()[1..17]),
        Err(Error::ViewLayout { .. })
    ));
    // u8 views cover the byte-sized types.
    let mut u8_info = f32_info;
    u8_info.ty = TensorType::Bool;
    assert_eq!(u8_info.view::<u8>(&buf.bytes()[..3]).unwrap().len(), 3);
}
