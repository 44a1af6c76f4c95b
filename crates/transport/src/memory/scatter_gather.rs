//! Walking scatter/gather lists: a message is the concatenation of its
//! SGEs, and each packet copies one stretch of it.

use super::{Access, AccessFault, FileRanges, MemoryTable, PdId};
use crate::by_reference::Body;
use crate::work_request::Sge;

/// Checks every element of a list and returns the list's total length.
pub(crate) fn validate_list(table: &MemoryTable, pd: PdId, sges: &[Sge], need: Access) -> Result<u64, AccessFault> {
    let mut total = 0u64;
    for sge in sges {
        table.check(pd, sge.lkey, sge.addr, sge.length as usize, need)?;
        total += u64::from(sge.length);
    }
    Ok(total)
}

/// Calls `visit` for each piece of the list that covers message bytes
/// `[offset, offset + len)`, with the piece's view and its offset within
/// that range.
fn walk<'t>(
    table: &'t MemoryTable,
    pd: PdId,
    sges: &[Sge],
    offset: u64,
    len: usize,
    need: Access,
    mut visit: impl FnMut(super::MemoryView<'t>, usize),
) -> Result<(), AccessFault> {
    let mut skip = offset;
    let mut done = 0usize;
    for sge in sges {
        if done == len {
            break;
        }
        let sge_len = u64::from(sge.length);
        if skip >= sge_len {
            skip -= sge_len;
            continue;
        }
        let take = ((sge_len - skip) as usize).min(len - done);
        let view = table.check(pd, sge.lkey, sge.addr + skip, take, need)?;
        visit(view, done);
        done += take;
        skip = 0;
    }
    if done == len { Ok(()) } else { Err(AccessFault::OutOfBounds) }
}

/// Copies message bytes `[offset, offset + dst.len())` out of a gather list.
pub(crate) fn gather(
    table: &MemoryTable,
    pd: PdId,
    sges: &[Sge],
    offset: u64,
    dst: &mut [u8],
) -> Result<(), AccessFault> {
    let len = dst.len();
    walk(table, pd, sges, offset, len, Access::empty(), |view, at| view.read(&mut dst[at..at + view.len()]))
}

/// Appends where message bytes `[offset, offset + len)` of a gather list
/// lie in files peers can map to `out`: `Ok(false)` if some lie in memory
/// that is not shared.
pub(crate) fn shared_ranges(
    table: &MemoryTable,
    pd: PdId,
    sges: &[Sge],
    offset: u64,
    len: usize,
    out: &mut FileRanges,
) -> Result<bool, AccessFault> {
    let mut shared = true;
    walk(table, pd, sges, offset, len, Access::empty(), |view, _| shared = shared && view.shared_ranges(out))?;
    Ok(shared)
}

/// Places payload `body` at message bytes `[offset, offset + body.len())`
/// of a scatter list, which must grant local write.
pub(crate) fn scatter(table: &MemoryTable, pd: PdId, sges: &[Sge], offset: u64, body: Body) -> Result<(), AccessFault> {
    walk(table, pd, sges, offset, body.len(), Access::LOCAL_WRITE, |view, at| body.place(at, &view))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{DmaBuffer, Registration};
    use std::sync::Arc;

    #[test]
    fn gathers_and_scatters_across_elements() {
        let mut table = MemoryTable::new();
        let pd = PdId(0);
        let buffer = Arc::new(DmaBuffer::from_bytes(b"0123456789abcdef"));
        let keys = table
            .register(
                Registration { pd, buffer: buffer.clone(), offset: 0, len: 16, iova: 100, access: Access::LOCAL_WRITE },
                &mut crate::entropy::Entropy::from_u64(1).into_draw(),
            )
            .unwrap();
        let sges = [
            Sge { addr: 102, length: 3, lkey: keys.lkey }, // "234"
            Sge { addr: 110, length: 0, lkey: 0 },
            Sge { addr: 110, length: 4, lkey: keys.lkey }, // "abcd"
        ];
        assert_eq!(validate_list(&table, pd, &sges, Access::LOCAL_WRITE), Ok(7));
        let mut out = [0u8; 4];
        gather(&table, pd, &sges, 1, &mut out).unwrap();
        assert_eq!(&out, b"34ab");
        scatter(&table, pd, &sges, 2, Body::Bytes(b"XYZ")).unwrap();
        assert_eq!(
            buffer.to_vec(),
            b"0123456789YZcdef"
                .to_vec()
                .iter()
                .enumerate()
                .map(|(i, &c)| if i == 4 { b'X' } else { c })
                .collect::<Vec<_>>()
        );
        assert_eq!(gather(&table, pd, &sges, 5, &mut out), Err(AccessFault::OutOfBounds));
    }
}
