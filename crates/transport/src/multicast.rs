//! Multicast groups: which UD QPs of a shard a datagram sent to a group
//! reaches (`ibv_attach_mcast`).
//!
//! In RoCEv2 a multicast group is an IP multicast address (its GID the
//! address, IPv4-mapped for IPv4), and a datagram for it carries the
//! destination QP number 0xFFFFFF; each UD QP attached to the group takes
//! a copy, as the IBTA's multicast rules have it. Getting the datagram to
//! every device whose QPs joined is the datapath's part (IP multicast, the
//! kernel fanning it out to every socket that joined); this is the shard's.

use std::net::IpAddr;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::error::{Result, VerbsError};
use crate::limits::{MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH};

pub use softrnic_wire::bth::MULTICAST_QPN;

/// Is `addr` an IP multicast address (224.0.0.0/4, ff00::/8; an
/// IPv4-mapped one counts as its IPv4 address)?
pub fn is_multicast(addr: IpAddr) -> bool {
    addr.to_canonical().is_multicast()
}

/// The UD QPs of one shard attached to each group.
#[derive(Debug, Default)]
pub struct MulticastGroups {
    members: FxHashMap<IpAddr, SmallVec<[u32; 4]>>,
}

impl MulticastGroups {
    /// Attaches QP `qpn` to `group` (canonical: IPv4 as IPv4). Attaching
    /// twice changes nothing, as verbs has it. Returns whether the QP is
    /// the group's first on this shard (the datapath must join it).
    pub fn attach(&mut self, qpn: u32, group: IpAddr) -> Result<bool> {
        let group = group.to_canonical();
        if !group.is_multicast() {
            return Err(VerbsError::invalid(format!("{group} is not a multicast address (224.0.0.0/4 or ff00::/8)")));
        }
        if !self.members.contains_key(&group) && self.members.len() >= MAX_MCAST_GRP as usize {
            return Err(VerbsError::OutOfResources(format!("{MAX_MCAST_GRP} multicast groups")));
        }
        let members = self.members.entry(group).or_default();
        let first = members.is_empty();
        if !members.contains(&qpn) {
            if members.len() >= MAX_MCAST_QP_ATTACH as usize {
                return Err(VerbsError::OutOfResources(format!("{MAX_MCAST_QP_ATTACH} QPs in group {group}")));
            }
            members.push(qpn);
        }
        Ok(first)
    }

    /// Detaches QP `qpn` from `group`. Returns whether the group has no
    /// QP of this shard left (the datapath may leave it).
    pub fn detach(&mut self, qpn: u32, group: IpAddr) -> Result<bool> {
        let group = group.to_canonical();
        let members = self.members.get_mut(&group).filter(|m| m.contains(&qpn));
        let Some(members) = members else {
            return Err(VerbsError::invalid(format!("QP {qpn:#x} is not attached to {group}")));
        };
        members.retain(|q| *q != qpn);
        let last = members.is_empty();
        if last {
            self.members.remove(&group);
        }
        Ok(last)
    }

    /// Detaches QP `qpn` from every group (it is being destroyed); returns
    /// the groups it leaves empty on this shard.
    pub fn detach_everywhere(&mut self, qpn: u32) -> Vec<IpAddr> {
        let mut emptied = Vec::new();
        self.members.retain(|group, members| {
            members.retain(|q| *q != qpn);
            let keep = !members.is_empty();
            if !keep {
                emptied.push(*group);
            }
            keep
        });
        emptied
    }

    /// The QPs attached to `group`.
    pub fn members(&self, group: IpAddr) -> &[u32] {
        self.members.get(&group.to_canonical()).map_or(&[], |m| &m[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_join_and_leave_and_the_first_and_last_are_told() {
        let mut groups = MulticastGroups::default();
        let group: IpAddr = "239.1.2.3".parse().unwrap();
        let mapped: IpAddr = "::ffff:239.1.2.3".parse().unwrap();
        assert_eq!(groups.attach(7, group), Ok(true));
        assert_eq!(groups.attach(7, mapped), Ok(false), "the same group, by its GID; attached once");
        assert_eq!(groups.attach(8, group), Ok(false));
        assert_eq!(groups.members(mapped), [7, 8]);
        assert_eq!(groups.detach(7, group), Ok(false));
        assert!(groups.detach(7, group).is_err(), "not attached any more");
        assert_eq!(groups.detach(8, mapped), Ok(true));
        assert!(groups.members(group).is_empty());
        assert!(groups.attach(9, "127.0.0.1".parse().unwrap()).is_err(), "not multicast");
        assert_eq!(groups.attach(9, "ff0e::1".parse().unwrap()), Ok(true));
        assert_eq!(groups.attach(9, group), Ok(true));
        let mut emptied = groups.detach_everywhere(9);
        emptied.sort();
        assert_eq!(emptied, [group, "ff0e::1".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn a_shard_holds_so_many_groups_and_members() {
        let mut groups = MulticastGroups::default();
        let group: IpAddr = "239.1.2.3".parse().unwrap();
        for qpn in 0..MAX_MCAST_QP_ATTACH {
            groups.attach(qpn, group).unwrap();
        }
        assert!(matches!(groups.attach(MAX_MCAST_QP_ATTACH, group), Err(VerbsError::OutOfResources(_))));
        assert_eq!(groups.attach(0, group), Ok(false), "one already there attaches again");
        for n in 1..MAX_MCAST_GRP {
            groups.attach(0, IpAddr::from([239, 0, (n >> 8) as u8, n as u8])).unwrap();
        }
        assert!(matches!(groups.attach(0, "239.9.9.9".parse().unwrap()), Err(VerbsError::OutOfResources(_))));
    }
}
