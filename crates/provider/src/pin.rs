//! Registration pins memory, as a NIC's driver does: the kernel's
//! `ib_umem_get` faults every page of a region in and holds it before the
//! device may touch it. softrnic cannot hold pages, but it makes them
//! present, so that the first packets into a fresh region (a WRITE, a
//! receive) are not stopped by hundreds of page faults inside the
//! engine's pass: 256 MiB registered fresh for a benchmark stalled the
//! engine for about 200 ms, past the peer's retransmission timeout.

use softrnic_transport::Access;

/// Makes the pages of `[addr, addr + len)` present (writable ones for a
/// region that may be written). Best effort: a kernel before Linux 5.14,
/// memory the process may not write, or a lack of memory leaves the pages
/// to be faulted in when first used, as before.
pub fn pin(addr: *mut u8, len: usize, access: Access) {
    if len == 0 {
        return;
    }
    let page = rustix::param::page_size();
    let start = addr as usize & !(page - 1);
    let end = (addr as usize).saturating_add(len).next_multiple_of(page);
    let writes = access.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
    let advice = if writes { libc::MADV_POPULATE_WRITE } else { libc::MADV_POPULATE_READ };
    // SAFETY: populating changes no byte of memory and no mapping: it
    // faults in the pages of the caller's own range (rounded out to whole
    // pages, which are mapped wherever the range is).
    unsafe { libc::madvise(start as *mut libc::c_void, end - start, advice) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of fresh memory become present when it is pinned, and only
    /// then (mincore asks the kernel which are).
    #[test]
    fn pinning_makes_every_page_present() {
        let page = rustix::param::page_size();
        let len = 256 * page;
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        let present = || {
            let mut pages = vec![0u8; len / page];
            // SAFETY: the range is the mapping above; `pages` has a byte per page.
            assert_eq!(unsafe { libc::mincore(addr, len, pages.as_mut_ptr()) }, 0);
            pages.iter().filter(|&&p| p & 1 != 0).count()
        };
        assert_eq!(present(), 0, "untouched memory has no pages yet");
        pin(addr as *mut u8, len, Access::LOCAL_WRITE | Access::REMOTE);
        assert_eq!(present(), len / page);
        // SAFETY: the mapping made above, not used again.
        unsafe { libc::munmap(addr, len) };
    }
}
