//! Buffers for collectives, allocated the way the kernel's copies like them best.

use std::collections::TryReserveError;

use bytemuck::Pod;

/// A zeroed buffer of `len` elements for collectives, in the manner of `MPI_Alloc_mem` or
/// `ncclMemAlloc`: a plain `Vec<T>`, to pass to any call and drop as any, whose memory the
/// kernel is asked to back with 2 MiB transparent huge pages before anything touches it.
///
/// Every datagram is copied by the kernel out of the root's buffer and into every leaf's,
/// a chunk at a time (4 KiB between hosts); on 4 KiB pages each of those copies also walks the page tables, and a
/// buffer of tens of MiB misses the TLB throughout. Where the kernel's setting
/// (`/sys/kernel/mm/transparent_hugepage/enabled`) is `madvise`, as on Debian and Ubuntu, a
/// plain `vec![0; n]` gets 4 KiB pages and this gets 2 MiB ones: on loopback 16 and 64 MiB
/// operations took 2-14 % less time on them, and in the namespace lab a 64 MiB Broadcast's
/// median goodput rose 9 % (BENCHMARKS.md, twenty-ninth round). Under
/// `always` every large `Vec` gets them anyway; under `never` (or on a kernel without them)
/// this is a plain zeroed `Vec`.
///
/// Only the whole 2 MiB pages inside the allocation are advised: up to 2 MiB at either end,
/// and buffers of less than 2 MiB, stay on small pages. The memory is zeroed (and so faulted
/// in) before this returns. An error where the allocator refuses the request (more than an
/// allocation may hold, or the address space is short); under Linux's overcommit a request
/// it grants can still exceed the memory there is, and the zeroing then ends the process
/// (the OOM killer), as any allocation's first touch would.
///
/// ```
/// let buf: Vec<f32> = ringcast::alloc_buffer(3 << 20).unwrap();
/// assert_eq!(buf.len(), 3 << 20);
/// assert!(buf.iter().all(|&x| x == 0.0));
/// ```
pub fn alloc_buffer<T: Pod>(len: usize) -> Result<Vec<T>, TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)?;
    if let Err(e) = ringcast_transport_rocev2_udp::advise_huge_pages(v.spare_capacity_mut()) {
        tracing::debug!(error = %e, len, "no transparent huge pages for a buffer");
    }
    v.resize(len, T::zeroed());
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_zeroed_and_as_long_as_asked() {
        let v: Vec<u64> = alloc_buffer(5 << 20).unwrap();
        assert_eq!(v.len(), 5 << 20);
        assert!(v.iter().all(|&x| x == 0));
        assert_eq!(v.as_ptr().align_offset(std::mem::align_of::<u64>()), 0);
        assert!(alloc_buffer::<u8>(0).unwrap().is_empty());
        assert_eq!(alloc_buffer::<u16>(3).unwrap(), [0, 0, 0]);
    }

    #[test]
    fn a_buffer_too_large_is_an_error_not_an_abort() {
        assert!(alloc_buffer::<u64>(usize::MAX / 4).is_err());
    }
}
