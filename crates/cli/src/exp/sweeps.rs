//! The sweeps of e1, e2 and e9: points whose roles are real processes,
//! `rdma_bench` over softrnic's `libibverbs.so.1`, `softrnic careful`, and
//! the peers a user would compare with.

use std::time::Duration;

use super::figure::Reference;
use super::roles::{Program, Role};
use super::sweep::{Point, Setup, Sweep};
use crate::careful;

pub static E1: Sweep = Sweep {
    id: "e1",
    name: "latency",
    params: &["size"],
    measured: &["percentile", "latency_ns", "mean_ns"],
    x: "percentile",
    y: "latency_ns",
    x_log: false,
    y_log: false,
    x_label: "percentile",
    y_label: "round trip (ns)",
    references: e1_references,
    points: e1_points,
    deadline,
};

pub static E2: Sweep = Sweep {
    id: "e2",
    name: "throughput",
    params: &["pack_size", "qps", "engine_threads"],
    measured: &["gbps"],
    x: "pack_size",
    y: "gbps",
    x_log: true,
    y_log: false,
    x_label: "packet size (B)",
    y_label: "Gb/s (all QPs, data verified)",
    references: e2_references,
    points: e2_points,
    deadline,
};

pub static E9: Sweep = Sweep {
    id: "e9",
    name: "careful",
    params: &[],
    measured: &["size", "mbps"],
    x: "size",
    y: "mbps",
    x_log: true,
    y_log: true,
    x_label: "message size (B)",
    y_label: "Mb/s (half the RTT taken off)",
    references: e9_references,
    points: e9_points,
    deadline: |quick| if quick { Duration::from_secs(180) } else { Duration::from_secs(1800) },
};

fn deadline(quick: bool) -> Duration {
    if quick { Duration::from_secs(90) } else { Duration::from_secs(600) }
}

/// An rdma_bench pair: server on `server`, client on `client`, each on
/// softrnic's library with `env` added.
fn rdma_bench_pair(setup: &Setup, i: usize, client_args: &[String], env: &[(&str, &str)]) -> Result<Vec<Role>, String> {
    setup.check_rdma_bench()?;
    let (server, client, port) = setup.endpoints(i);
    let limit = deadline(setup.quick).as_secs().to_string();
    let common = ["-serverIp", &server, "-port", &port.to_string(), "-auto_exit_sec", &limit].map(str::to_string);
    let role = |name, addr: &str, node: &str, extra: &[String]| {
        let args: Vec<String> =
            common.iter().cloned().chain(["-nodeId".into(), node.into()]).chain(extra.iter().cloned()).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut role =
            Role::new(name, Program::Built("rdma_bench"), &args).on_softrnic_lib().env("SOFTRNIC_ADDR", addr);
        for (k, v) in env {
            role = role.env(k, v);
        }
        role
    };
    Ok(vec![role("server", &server, "0", &[]), role("client", &client, "1", client_args)])
}

fn e1_points(setup: &Setup) -> Result<Vec<Point>, String> {
    let (iterations, packets) = if setup.quick { ("20", "100") } else { ("500", "100") };
    let args: Vec<String> = ["-outstanding", "1", "-packSize", "1024", "-iterations", iterations, "-numPack", packets]
        .map(str::to_string)
        .into();
    let mut points = Vec::new();
    for (config, datapath) in [("softrnic-udp", "udp"), ("softrnic-shm", "shm")] {
        points.push(Point {
            config: config.to_string(),
            params: vec!["1024".into()],
            roles: rdma_bench_pair(setup, points.len(), &args, &[("SOFTRNIC_DATAPATH", datapath)])?,
            unavailable: None,
            read: Box::new(read_rdma_bench_latency),
        });
    }
    // The floor: a spinning raw UDP ping-pong (sockperf), round trips too.
    let sockperf = || Program::OnPath("sockperf");
    let (server, _, port) = setup.endpoints(points.len());
    let seconds = if setup.quick { "1" } else { "5" };
    let port = port.to_string();
    points.push(Point {
        config: "raw-udp".into(),
        params: vec!["1024".into()],
        roles: vec![
            Role::new("server", sockperf(), &["server", "-i", &server, "-p", &port, "--nonblocked"]).until_stopped(),
            Role::new(
                "client",
                sockperf(),
                &["ping-pong", "-i", &server, "-p", &port, "-m", "1024", "-t", seconds, "--nonblocked", "--full-rtt"],
            ),
        ],
        unavailable: setup.missing("sockperf").then(|| "raw UDP needs sockperf: apt-get install sockperf".to_string()),
        read: Box::new(read_sockperf),
    });
    Ok(points)
}

/// rdma_bench's E1 block to rows: (percentile, ns, mean ns).
fn read_rdma_bench_latency(text: &str) -> Result<Vec<Vec<String>>, String> {
    let mean = text
        .lines()
        .find_map(|l| l.strip_prefix("[Mean    =")?.split(',').next()?.trim().parse::<f64>().ok())
        .ok_or("no [Mean = ...] line")?;
    let mut rows = Vec::new();
    for (label, p) in [
        ("5th percentile", 5),
        ("25th percentile", 25),
        ("50th percentile (median)", 50),
        ("75th percentile", 75),
        ("95th percentile", 95),
    ] {
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(label)?.strip_prefix(": ")?.strip_suffix(" ns")?.parse::<u64>().ok())
            .ok_or_else(|| format!("no {label} line"))?;
        rows.push(vec![p.to_string(), value.to_string(), format!("{mean:.1}")]);
    }
    if !text.contains("Data verification success") {
        return Err("the server did not verify the data".into());
    }
    Ok(rows)
}

/// sockperf's percentiles (µs, full round trips with --full-rtt) to rows.
fn read_sockperf(text: &str) -> Result<Vec<Vec<String>>, String> {
    let usec = |key: &str| -> Option<f64> {
        text.lines().find_map(|l| l.split(key).nth(1)?.split_whitespace().next()?.parse().ok())
    };
    let mean = text
        .lines()
        .find_map(|l| {
            l.split("avg-rtt=")
                .nth(1)
                .or_else(|| l.split("avg-lat=").nth(1))?
                .split(|c: char| !c.is_ascii_digit() && c != '.')
                .next()?
                .parse::<f64>()
                .ok()
        })
        .ok_or("no sockperf summary (avg-rtt)")?;
    let mut rows = Vec::new();
    for p in [25, 50, 75] {
        let v = usec(&format!("percentile {p}.000 =")).ok_or_else(|| format!("no sockperf percentile {p}"))?;
        rows.push(vec![p.to_string(), format!("{:.0}", v * 1000.0), format!("{:.1}", mean * 1000.0)]);
    }
    Ok(rows)
}

fn e1_references() -> Vec<Reference> {
    vec![
        Reference::Line { name: "FPGA NIC, median (published)", y: 3170.0 },
        Reference::Line { name: "ConnectX RoCE, mean (published)", y: 3230.0 },
        Reference::Line { name: "Soft-RoCE, mean (published)", y: 24_070.0 },
    ]
}

fn e2_points(setup: &Setup) -> Result<Vec<Point>, String> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let many = (cores / 2).clamp(2, 8);
    let (sizes, qps, engines, iterations): (&[u32], &[u32], Vec<usize>, &str) = match setup.quick {
        true => (&[64, 1024], &[1, 2], vec![1], "10"),
        false => (&[64, 128, 256, 512, 1024, 2048], &[1, 8], vec![1, many], "100"),
    };
    let mut points = Vec::new();
    for &engine_threads in &engines {
        for &q in qps {
            for &size in sizes {
                let args: Vec<String> = [
                    "-threads",
                    &q.to_string(),
                    "-packSize",
                    &size.to_string(),
                    "-outstanding",
                    "48",
                    "-iterations",
                    iterations,
                    "-numPack",
                    "1000",
                ]
                .map(str::to_string)
                .into();
                let threads = engine_threads.to_string();
                points.push(Point {
                    config: format!("qps={q},engines={engine_threads}"),
                    params: vec![size.to_string(), q.to_string(), threads.clone()],
                    roles: rdma_bench_pair(setup, points.len(), &args, &[("SOFTRNIC_ENGINE_THREADS", &threads)])?,
                    unavailable: None,
                    read: Box::new(move |text| read_verified_gbps(text, q)),
                });
            }
        }
    }
    Ok(points)
}

/// The sum of rdma_bench's verification lines, one per QP (the seeds'
/// "Gpbs" spelling read too).
fn read_verified_gbps(text: &str, qps: u32) -> Result<Vec<Vec<String>>, String> {
    let rates: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("Data verification success"))
        .filter_map(|l| l.split("throughput [").nth(1)?.split(']').next()?.parse().ok())
        .collect();
    if rates.len() != qps as usize {
        return Err(format!("{} verification lines for {qps} QPs", rates.len()));
    }
    Ok(vec![vec![format!("{:.4}", rates.iter().sum::<f64>())]])
}

fn e2_references() -> Vec<Reference> {
    vec![
        Reference::Point { name: "FPGA NIC, 1 core, 64 B (published)", x: 64.0, y: 6.06 },
        Reference::Point { name: "ConnectX RoCE, 64 B (published)", x: 64.0, y: 1.39 },
        Reference::Point { name: "Soft-RoCE, 64 B (published)", x: 64.0, y: 0.10 },
    ]
}

fn e9_points(setup: &Setup) -> Result<Vec<Point>, String> {
    use careful::Transport::{Send, Tcp, Write};
    let mut points = Vec::new();
    // softrnic over each of its wires (UDP sockets, or the shared-memory
    // wire between devices on one host), and the kernel's TCP.
    for (transport, datapath) in
        [(Send, Some("udp")), (Write, Some("udp")), (Send, Some("shm")), (Write, Some("shm")), (Tcp, None)]
    {
        let (server, client, port) = setup.endpoints(points.len());
        let port = port.to_string();
        let name = careful::name(transport);
        let mut client_args = vec![
            "careful",
            "--client",
            "--addr",
            &client,
            "--server-addr",
            &server,
            "--port",
            &port,
            "--transport",
            name,
        ];
        if setup.quick {
            client_args.push("--quick");
        }
        let mut roles = vec![
            Role::new(
                "server",
                Program::Built("softrnic"),
                &["careful", "--server", "--addr", &server, "--port", &port],
            ),
            Role::new("client", Program::Built("softrnic"), &client_args),
        ];
        if let Some(datapath) = datapath {
            roles = roles.into_iter().map(|r| r.env("SOFTRNIC_DATAPATH", datapath)).collect();
        }
        points.push(Point {
            config: datapath.map_or(name.to_string(), |d| format!("{name}-{d}")),
            params: vec![],
            roles,
            unavailable: None,
            read: Box::new(|text| {
                Ok(careful::parse_lines(text)
                    .into_iter()
                    .map(|(size, mbps)| vec![size.to_string(), format!("{mbps:.2}")])
                    .collect())
            }),
        });
    }
    Ok(points)
}

fn e9_references() -> Vec<Reference> {
    vec![
        Reference::Point { name: "sockets on 1 GbE, 128 B (published)", x: 128.0, y: 890.0 },
        Reference::Point { name: "sockets on 100 Gb InfiniBand, 64 KiB (published)", x: 65536.0, y: 18_300.0 },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rdma_bench_and_sockperf_output() {
        let bench = "$ rdma_bench ...\nData verification success, thread [0], duration [0.5]s, throughput [0.9] Gbps\n\
                     5th percentile: 4487 ns\n25th percentile: 5271 ns\n50th percentile (median): 5711 ns\n\
                     75th percentile: 6131 ns\n95th percentile: 7603 ns\n[Mean    =     6378.431, StdDeviation   =     6483.502]\n";
        let rows = read_rdma_bench_latency(bench).unwrap();
        assert_eq!(rows[2], ["50", "5711", "6378.4"]);
        let two = "Data verification success, thread [0], duration [0.1]s, throughput [0.25] Gbps\n\
                   Data verification success, thread [1], duration [0.1]s, throughput [0.5] Gpbs\n";
        assert_eq!(read_verified_gbps(two, 2).unwrap(), [["0.7500"]]);
        assert!(read_verified_gbps(two, 3).is_err());
        let sockperf = "sockperf: ====> avg-rtt=9.120 (std-dev=1.2)\nsockperf: ---> percentile 75.000 =   10.100\n\
                        sockperf: ---> percentile 50.000 =    9.000\nsockperf: ---> percentile 25.000 =    8.500\n";
        assert_eq!(read_sockperf(sockperf).unwrap()[1], ["50", "9000", "9120.0"]);
    }

    #[test]
    fn every_sweep_has_a_number_a_name_and_its_figure_columns() {
        for e in [&E1, &E2, &E9] {
            let columns: Vec<&str> = e.params.iter().chain(e.measured).copied().collect();
            assert!(columns.contains(&e.x) && columns.contains(&e.y), "{}", e.id);
            assert!(e.id.starts_with('e') && !e.name.is_empty());
        }
    }
}
