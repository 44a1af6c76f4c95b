//! `softrnic devinfo`: what `ibv_devinfo` shows, for a softrnic device.

use std::net::{IpAddr, Ipv4Addr};
use std::time::SystemTime;

use clap::Args;
use softrnic_engine::counters_file;
use softrnic_transport::limits::*;
use softrnic_wire::ROCEV2_UDP_PORT;

#[derive(Args, Debug, Clone)]
pub struct DevinfoArgs {
    /// The device's address (default: SOFTRNIC_ADDR, else 127.0.0.1).
    #[arg(long)]
    pub addr: Option<IpAddr>,
}

/// The RoCEv2 GID of an address: IPv4 addresses map into ::ffff:0:0/96.
pub fn gid(addr: IpAddr) -> String {
    let v6 = match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    v6.segments().iter().map(|s| format!("{s:04x}")).collect::<Vec<_>>().join(":")
}

pub fn run(args: &DevinfoArgs) -> Result<(), String> {
    let addr = match args.addr {
        Some(a) => a,
        None => crate::addr::from_env()?.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    };
    println!("hca_id: softrnic0");
    println!("\ttransport:\t\t\tInfiniBand (RoCEv2 over UDP, by softrnic)");
    println!("\tnode_guid:\t\t\t{}", &gid(addr).replace(':', "")[16..]);
    println!("\tvendor_part_id:\t\t\t0");
    println!("\tmax_qp:\t\t\t\t{MAX_QP}");
    println!("\tmax_qp_wr:\t\t\t{MAX_QP_WR}");
    println!("\tmax_sge:\t\t\t{MAX_SGE}");
    println!("\tmax_mr:\t\t\t\t{MAX_MR}");
    println!("\tmax_mw:\t\t\t\t{MAX_MW}");
    println!("\tmax_cq:\t\t\t\t{MAX_CQ}");
    println!("\tmax_cqe:\t\t\t{MAX_CQE}");
    println!("\tmax_qp_rd_atom:\t\t\t{MAX_RD_ATOMIC}");
    println!("\tmax_qp_init_rd_atom:\t\t{MAX_RD_ATOMIC}");
    println!("\tatomic_cap:\t\t\tATOMIC_HCA");
    println!("\tmax_mcast_grp:\t\t\t{MAX_MCAST_GRP}");
    println!("\tmax_mcast_qp_attach:\t\t{MAX_MCAST_QP_ATTACH}");
    println!("\t\tport:\t1");
    println!("\t\t\tstate:\t\t\tPORT_ACTIVE (4)");
    println!("\t\t\tmax_mtu:\t\t{MAX_MTU} (5)");
    println!("\t\t\tactive_mtu:\t\t4096 (5)");
    println!("\t\t\tlink_layer:\t\tEthernet");
    println!("\t\t\taddress:\t\t{addr} (UDP {ROCEV2_UDP_PORT})");
    println!("\t\t\tGID[  0]:\t\t{}, RoCE v2", gid(addr));
    let path = counters_file::path(addr);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let age = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .map(|d| format!("{:.1} s ago", d.as_secs_f64()))
                .unwrap_or_default();
            println!("\t\t\tcounters ({}, published {age}):", path.display());
            for line in text.lines() {
                if let Some((name, value)) = line.split_once(' ') {
                    println!("\t\t\t\t{name:<24}{value}");
                }
            }
        }
        Err(_) => println!("\t\t\tcounters:\t\tnone yet (no device has run on {addr})"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_are_ipv4_mapped() {
        assert_eq!(gid("127.0.0.2".parse().unwrap()), "0000:0000:0000:0000:0000:ffff:7f00:0002");
    }
}
