//! The shape of a network of switches: which host hangs on which switch,
//! which switches are linked, how each switch numbers its ports, and the
//! routes that follow (shortest paths; every equal next hop under ECMP).
//! The lab and the simulator both build their switches from it, so a
//! topology routes the same on the wire and in simulation.

use std::collections::VecDeque;
use std::net::IpAddr;

use crate::routes::{Prefix, Routes};

/// What one switch port is joined to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortPeer {
    Host(usize),
    /// The other switch and its port on the same link.
    Switch {
        switch: usize,
        port: usize,
    },
}

/// Switches, hosts on them and links between them; ports are numbered on
/// each switch with its hosts first (in host order), then its links (in
/// link order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Graph {
    pub switches: usize,
    /// The switch each host is attached to.
    pub host_switch: Vec<usize>,
    /// Switch-to-switch links, as (a, b).
    pub links: Vec<(usize, usize)>,
}

impl Graph {
    /// What each port of `switch` is joined to, in port order.
    pub fn ports(&self, switch: usize) -> Vec<PortPeer> {
        let mut ports: Vec<PortPeer> =
            (0..self.host_switch.len()).filter(|&h| self.host_switch[h] == switch).map(PortPeer::Host).collect();
        for (i, &(a, b)) in self.links.iter().enumerate() {
            let other = match switch {
                s if s == a => b,
                s if s == b => a,
                _ => continue,
            };
            ports.push(PortPeer::Switch { switch: other, port: self.link_port(other, i) });
        }
        ports
    }

    /// The port of `switch` on link number `link`.
    pub fn link_port(&self, switch: usize, link: usize) -> usize {
        let hosts = self.host_switch.iter().filter(|&&s| s == switch).count();
        hosts + self.links[..link].iter().filter(|&&(a, b)| a == switch || b == switch).count()
    }

    /// The routes of `switch` to every host's addresses (`addrs[h]`).
    pub fn routes(&self, switch: usize, addrs: &[Vec<IpAddr>], ecmp: bool) -> Routes {
        let ports = self.ports(switch);
        let mut routes = Routes::default();
        for (h, host_addrs) in addrs.iter().enumerate() {
            let to = self.distances_to(self.host_switch[h]);
            let mut next: Vec<usize> = ports
                .iter()
                .enumerate()
                .filter_map(|(port, peer)| match *peer {
                    PortPeer::Host(x) if x == h => Some(port),
                    PortPeer::Switch { switch: n, .. } if to[n].saturating_add(1) == to[switch] => Some(port),
                    _ => None,
                })
                .collect();
            if !ecmp {
                next.truncate(1);
            }
            if !next.is_empty() {
                for &addr in host_addrs {
                    routes.add(Prefix::host(addr), next.clone());
                }
            }
        }
        routes
    }

    /// Hops from every switch to `target` (usize::MAX if unreachable).
    pub fn distances_to(&self, target: usize) -> Vec<usize> {
        let mut dist = vec![usize::MAX; self.switches];
        dist[target] = 0;
        let mut queue = VecDeque::from([target]);
        while let Some(s) = queue.pop_front() {
            for &(a, b) in &self.links {
                let n = match s {
                    x if x == a => b,
                    x if x == b => a,
                    _ => continue,
                };
                if dist[n] == usize::MAX {
                    dist[n] = dist[s] + 1;
                    queue.push_back(n);
                }
            }
        }
        dist
    }

    /// A switch that cannot reach switch 0, if any.
    pub fn unreachable(&self) -> Option<usize> {
        if self.switches == 0 {
            return None;
        }
        self.distances_to(0).iter().position(|&d| d == usize::MAX)
    }

    /// A link that closes a loop, if the links have one (union-find: a
    /// link whose ends are already joined).
    pub fn loop_link(&self) -> Option<(usize, usize)> {
        let mut parent: Vec<usize> = (0..self.switches).collect();
        fn root(parent: &[usize], mut x: usize) -> usize {
            while parent[x] != x {
                x = parent[x];
            }
            x
        }
        for &(a, b) in &self.links {
            let (ra, rb) = (root(&parent, a), root(&parent, b));
            if ra == rb {
                return Some((a, b));
            }
            parent[ra] = rb;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two leaves, two spines, a host on each leaf.
    fn leaf_spine() -> Graph {
        Graph { switches: 4, host_switch: vec![0, 1], links: vec![(0, 2), (0, 3), (1, 2), (1, 3)] }
    }

    #[test]
    fn ports_number_hosts_then_links() {
        let g = leaf_spine();
        assert_eq!(
            g.ports(0),
            [PortPeer::Host(0), PortPeer::Switch { switch: 2, port: 0 }, PortPeer::Switch { switch: 3, port: 0 }]
        );
        assert_eq!(g.ports(2), [PortPeer::Switch { switch: 0, port: 1 }, PortPeer::Switch { switch: 1, port: 1 }]);
    }

    #[test]
    fn routes_take_every_shortest_path_under_ecmp() {
        let g = leaf_spine();
        let addrs: Vec<Vec<IpAddr>> = vec![vec!["10.0.0.1".parse().unwrap()], vec!["10.0.0.2".parse().unwrap()]];
        let to_b = addrs[1][0];
        let ecmp = g.routes(0, &addrs, true);
        let used: std::collections::BTreeSet<usize> = (0..64).filter_map(|f| ecmp.lookup(to_b, f, 1)).collect();
        assert_eq!(used, [1, 2].into());
        let single = g.routes(0, &addrs, false);
        let used: std::collections::BTreeSet<usize> = (0..64).filter_map(|f| single.lookup(to_b, f, 1)).collect();
        assert_eq!(used, [1].into());
        assert_eq!(g.routes(2, &addrs, true).lookup(to_b, 0, 0), Some(1));
        assert_eq!(g.loop_link(), Some((1, 3)));
        assert_eq!(g.unreachable(), None);
    }
}
