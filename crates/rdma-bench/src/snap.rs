//! `-snap`: the server does the per-packet work of E6's Snap-like
//! baseline, a software transport in the style of Google's Snap on plain
//! SEND/RECV. For each message it copies the payload into the
//! application's data structure and the completion into a log of its
//! own, then walks 8 nodes of a linked list of 4 KiB nodes far larger
//! than any cache, as the original baseline does.

use crate::verbs::Completion;

/// Bytes of one node of the list.
const NODE: usize = 4096;
/// Nodes walked per message.
pub const WALK: usize = 8;
/// Completions the log keeps (a ring).
const LOG: usize = 4096;

/// One server thread's baseline state.
pub struct SnapWork {
    /// The list: each node's first 8 bytes name the next node, in a
    /// random cycle through all of them (so the walk defeats prefetching).
    nodes: Vec<u8>,
    at: usize,
    log: Vec<Completion>,
    logged: usize,
}

impl SnapWork {
    /// A list of `mib` MiB, its cycle drawn from `seed`.
    pub fn new(mib: usize, seed: u64) -> SnapWork {
        let count = (mib * 1024 * 1024 / NODE).max(2);
        let mut order: Vec<usize> = (0..count).collect();
        // Fisher-Yates with a small xorshift: no cryptography needed.
        let mut state = seed | 1;
        for i in (1..count).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            order.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let mut nodes = vec![0u8; count * NODE];
        for (i, &node) in order.iter().enumerate() {
            let next = order[(i + 1) % count] as u64;
            nodes[node * NODE..node * NODE + 8].copy_from_slice(&next.to_le_bytes());
        }
        SnapWork { nodes, at: order[0], log: Vec::with_capacity(LOG), logged: 0 }
    }

    /// The work for one received message: its payload copied into the
    /// current node (after the link), its completion logged, 8 nodes
    /// walked. Returns the node it stopped at, so none of it is dead code.
    pub fn per_message(&mut self, payload: &[u8], completion: &Completion) -> usize {
        let room = (NODE - 8).min(payload.len());
        let start = self.at * NODE + 8;
        self.nodes[start..start + room].copy_from_slice(&payload[..room]);
        if self.log.len() < LOG {
            self.log.push(*completion);
        } else {
            self.log[self.logged % LOG] = *completion;
        }
        self.logged += 1;
        for _ in 0..WALK {
            self.at = self.next(self.at);
        }
        self.at
    }
}

impl SnapWork {
    fn next(&self, node: usize) -> usize {
        let link = &self.nodes[node * NODE..node * NODE + 8];
        u64::from_le_bytes(link.try_into().expect("8 bytes")) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_one_cycle_and_each_message_walks_8_links() {
        let mut work = SnapWork::new(1, 7); // 256 nodes
        let start = work.at;
        let (mut at, mut seen) = (start, std::collections::HashSet::new());
        for _ in 0..256 {
            assert!(seen.insert(at), "node {at} twice");
            at = work.next(at);
        }
        assert_eq!(at, start, "the cycle closes after every node");
        let eight_on = (0..WALK).fold(start, |at, _| work.next(at));
        let completion = Completion { wr_id: 1, status: 0, is_recv: true };
        assert_eq!(work.per_message(&[0xab; 100], &completion), eight_on);
        assert_eq!(&work.nodes[start * NODE + 8..start * NODE + 108], &[0xab; 100]);
        assert_eq!(work.logged, 1);
    }
}
